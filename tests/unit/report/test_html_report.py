"""The standalone HTML report (analysis.report.html): its numbers, its escaping, its size for 8
ranks x
20 steps, and the page rendered in headless Chromium (skipped where Chromium is absent)."""

import io
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.crossrank.report_tables import rank_bars
from analysis.report.html import write_html_report
from analysis.report.html.browser import dump_dom, find_chromium, screenshot
from analysis.report.html.page import SECTIONS, chosen_steps
from analysis.report.progress import Progress
from analysis.run.analysed_run import open_run
from helpers.launch import DATA
from helpers.synthetic import TraceBuilder, trace_name

EVIL = "<script>alert('x&y')</script>_kernel"
needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="chromium is not installed (apt-get install chromium)")


def _step_frame(rows):
    return pd.DataFrame(rows, columns=["rank", "step", "step_ns", "compute_only_ns",
                                       "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns"])


def test_bars_split_exposed_comm_into_waiting_and_transfer_and_add_up_to_the_step():
    per_step = _step_frame([(0, 1, 10e6, 4e6, 5e6, 0, 0, 1e6), (0, 2, 20e6, 4e6, 14e6, 1e6, 0, 1e6),
                            (1, 1, 10e6, 9e6, 0, 0, 0, 1e6), (1, 2, 20e6, 9e6, 2e6, 0, 8e6, 1e6)])
    waits = pd.DataFrame({"rank": [0, 0, 1], "step": [1, 2, 2],
                          "wait_for_peers_ms": [3.0, 20.0, 0.5]})
    bars = rank_bars(per_step, waits).set_index("rank")
    # rank 0: waiting = min(wait, exposed comm): step 1 3 ms of 5, step 2 14 ms of 14 (capped)
    assert bars.loc[0, "waiting"] == pytest.approx((3 + 14) / 2)
    assert bars.loc[0, "transfer"] == pytest.approx((2 + 0) / 2)
    assert bars.loc[1, "waiting"] == pytest.approx(0.5 / 2)
    assert bars.loc[1, "memcpy"] == pytest.approx(4.0)
    parts = ["compute", "overlap", "transfer", "waiting", "memcpy", "idle"]
    assert bars[parts].sum(axis=1).tolist() == pytest.approx([15.0, 15.0])
    plain = rank_bars(per_step, None).set_index("rank")
    assert plain.loc[0, "comm"] == pytest.approx(9.5) and "waiting" not in plain.columns


def test_bars_leave_communication_unsplit_when_a_step_that_communicated_has_no_waits():
    per_step = _step_frame([(0, 1, 10e6, 4e6, 5e6, 0, 0, 1e6),
                            (0, 2, 20e6, 4e6, 14e6, 1e6, 0, 1e6)])
    waits = pd.DataFrame({"rank": [0], "step": [1], "wait_for_peers_ms": [3.0]})
    bars = rank_bars(per_step, waits).set_index("rank")
    # step 2's 14 ms of communication is not known to be transfer: nothing is called transfer
    assert "transfer" not in bars.columns and "waiting" not in bars.columns
    assert bars.loc[0, "comm"] == pytest.approx((5 + 14) / 2)


def test_chosen_steps_are_the_slowest_median_and_fastest_by_the_mean_over_ranks():
    per_step = _step_frame([(r, s, t, 0, 0, 0, 0, 0) for r in (0, 1)
                            for s, t in ((1, 5), (2, 9), (3, 7), (4, 1), (5, 8))])
    assert chosen_steps(per_step) == {"slowest": 2, "median": 3, "fastest": 4}
    two = _step_frame([(0, 1, 5, 0, 0, 0, 0, 0), (0, 2, 9, 0, 0, 0, 0, 0)])
    assert chosen_steps(two) == {"slowest": 2, "fastest": 1}


def _gpu_run(folder: Path, ranks: int, steps: int, kernels_per_step: int, name=None) -> Path:
    for rank in range(ranks):
        trace = TraceBuilder(rank=rank, world_size=ranks)
        for step in range(steps):
            start = 1000 + step * 10_000
            trace.step(step, start, start + 9_000)
            width = 8_000 // kernels_per_step
            for k in range(kernels_per_step):
                at = start + 200 + k * width + rank * 3
                trace.kernel(name or f"gemm_{k % 7}", at, at + width // 2)
            trace.nccl(start + 8_300, start + 8_900)
        trace.write(folder / trace_name(rank))
    return folder


def _report(run: Path, out: Path) -> dict:
    report = open_run(run, use_cache=False).report
    return write_html_report(report, out)


def test_kernel_names_from_a_trace_are_escaped(tmp_path):
    run = _gpu_run(tmp_path / "run", 2, 3, 4, name=EVIL)
    page = tmp_path / "report.html"
    _report(run, page)
    html = page.read_text()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#x27;x&amp;y&#x27;)&lt;/script&gt;_kernel" in html
    assert html.count("<script>") == 1  # the report's own


def test_the_report_of_8_ranks_and_20_steps_stays_under_5_mb(tmp_path):
    run = _gpu_run(tmp_path / "run", 8, 20, 200)
    result = _report(run, tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text()
    assert 0 < result["bytes"] < 5e6
    assert all(f'id="{key}"' in html for key in SECTIONS)
    assert all(f">rank {r}<" in html for r in range(8))


def test_progress_shows_only_on_a_terminal_and_never_on_stdout(capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    shown, piped = Terminal(), io.StringIO()
    for stream in (shown, piped):
        with Progress(stream, delay=0) as progress:
            for done in range(1, 4):
                progress(done, 3)
            assert list(progress.over([1, 2], "analysing")) == [1, 2]
    assert "parsing traces" in shown.getvalue() and "analysing" in shown.getvalue()
    assert piped.getvalue() == ""
    assert capsys.readouterr().out == ""
    late = Terminal()
    with Progress(late) as progress:  # the default delay: a quick task shows nothing
        progress(1, 1)
    assert late.getvalue() == ""


def _distinct_colours(png: Path) -> int:
    from PIL import Image
    with Image.open(png) as image:
        return len(image.convert("RGB").getcolors(maxcolors=1 << 24))


@needs_chromium
@pytest.mark.slow
@pytest.mark.parametrize("source", ["hta/trace_filter", "escaped"])
def test_the_report_renders_in_headless_chromium(source, tmp_path):
    run = DATA / source if source != "escaped" else _gpu_run(tmp_path / "run", 2, 3, 4, EVIL)
    page = tmp_path / "report.html"
    _report(run, page)
    dom, console_errors = dump_dom(page)
    assert console_errors == []
    assert 'data-ready="yes"' in dom  # the report's script ran to its end
    assert re.search(r'<pre id="js-errors"></pre>', dom)
    for key in SECTIONS:
        assert f'<section id="{key}">' in dom
    assert all(f">rank {r}<" in dom for r in (0, 1))
    assert dom.count("<script>") == 1
    if source == "escaped":  # the name is text in the page, not an element
        assert "&lt;script&gt;alert('x&amp;y')&lt;/script&gt;_kernel" in dom
    png = screenshot(page, tmp_path / "report.png")
    assert _distinct_colours(png) > 20
