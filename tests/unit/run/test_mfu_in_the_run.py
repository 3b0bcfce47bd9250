"""MFU and the roofline in the run's analysis (analysis.run's `mfu` and `roofline` tables,
docs/mfu.md): exact values on a run of known FLOPs, step time and peak; where the peak comes
from and --peak-tflops over it; the JSON document's fields, the text report's tables, the HTML
plot; one line where no FLOPs are counted; a failure that costs the two tables only."""

import contextlib
import io
import json

import pytest

from analysis import open_run
from analysis.breakdown import main
from analysis.rank import flops
from analysis.rank.flops import ROOFLINE_COLUMNS
from analysis.rank.reduction import rank_tables
from analysis.report import json_document, text_report
from analysis.report.html import write_html_report
from analysis.report.mfu import NO_FLOPS_NO_OPS, NO_FLOPS_NO_SHAPES
from helpers.flops_run import KERNEL_US, MM_BYTES, MM_FLOPS, STEP_US, write_flops_run
from helpers.launch import DATA

H100 = "NVIDIA H100 80GB HBM3"


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*map(str, args), "--full", "--no-cache", "--jobs", "1"])
    return code, out.getvalue(), err.getvalue()


def test_the_mfu_of_a_step_of_known_flops_and_peak_and_its_lost_points(tmp_path):
    run = open_run(write_flops_run(tmp_path / "run", peak=(10.0, "measured")), use_cache=False)
    assert run.problems == []
    row = run.report.mfu.iloc[0]
    assert (row["rank"], row["step"], row["step_ns"]) == (0, 1, STEP_US * 1000)
    assert row["flops_per_step"] == MM_FLOPS and row["dtype"] == "fp32"
    assert row["achieved_tflops"] == 2.0  # 2e9 FLOPs in 1 ms
    assert (row["peak_tflops"], row["peak_source"]) == (10.0, "measured")
    assert row["mfu_pct"] == 20.0  # 0.2 ms of the 1 ms step at the peak
    assert row["lost_idle_pts"] == 60.0 and row["lost_compute_pts"] == 20.0  # 0.4 ms for 0.2
    assert row["lost_transfer_pts"] == 0.0 and row["lost_waiting_pts"] == 0.0
    assert row[flops.LOST_COLUMNS].sum() == pytest.approx(100.0 - row["mfu_pct"], abs=1e-12)


def test_the_slowest_ops_against_the_roofline_of_the_ranks_peak_and_its_devices_bandwidth(
        tmp_path):
    run = open_run(write_flops_run(tmp_path / "run", peak=None, device_name=H100),
                   use_cache=False)
    mfu = run.mfu.iloc[0]
    assert (mfu["peak_tflops"], mfu["peak_source"]) == (67.0, "datasheet: H100 SXM")
    assert mfu["mfu_pct"] == pytest.approx(100 * 2.0 / 67.0)
    roof = run.roofline
    assert list(roof.columns) == ROOFLINE_COLUMNS and roof["name"].tolist() == ["aten::mm"]
    op = roof.iloc[0]
    assert (op["time_ns"], op["time_from"]) == (KERNEL_US * 1000, "device")
    assert op["achieved_tflops"] == pytest.approx(5.0)  # 2e9 FLOPs in the kernel's 0.4 ms
    assert op["intensity"] == pytest.approx(MM_FLOPS / MM_BYTES)
    assert (op["peak_tflops"], op["peak_gbps"]) == (67.0, 3350.0)
    assert op["ridge"] == pytest.approx(67e12 / 3350e9) and op["bound"] == "compute"
    assert op["pct_of_roofline"] == pytest.approx(100 * 5.0 / 67.0)


def test_peak_tflops_overrides_the_recorded_peak(tmp_path):
    folder = write_flops_run(tmp_path / "run", peak=(10.0, "measured"))
    row = open_run(folder, use_cache=False, peak_tflops=4.0).mfu.iloc[0]
    assert (row["peak_tflops"], row["peak_source"], row["mfu_pct"]) == (4.0, "option", 50.0)
    code, out, _ = _cli(folder, "--format", "json", "--peak-tflops", "4")
    assert code == 0
    record = json.loads(out)["mfu"][0]
    assert (record["peak_tflops"], record["peak_source"], record["mfu_pct"]) == (
        4.0, "option", 50.0)
    assert json.loads(out)["roofline"][0]["peak_source"] == "option"


@pytest.mark.parametrize("value", ["0", "-1", "inf", "fast"])
def test_peak_tflops_must_be_a_positive_number(tmp_path, value, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--peak-tflops", value])
    assert "--peak-tflops" in capsys.readouterr().err


def test_the_json_document_has_the_documented_mfu_and_roofline_fields(tmp_path):
    run = open_run(write_flops_run(tmp_path / "run"), use_cache=False, keep_events=False)
    document = json.loads(json_document.dumps(run.document()))
    assert document["schema_version"] == json_document.DOCUMENT_VERSION
    assert [list(r) for r in document["mfu"]] == [flops.MFU_COLUMNS]
    assert document["mfu"][0]["mfu_pct"] == 20.0 and document["mfu"][0]["rank"] == 0
    assert [list(r) for r in document["roofline"]] == [ROOFLINE_COLUMNS]
    assert document["roofline"][0]["bound"] is None  # no device name: no bandwidth
    assert document["roofline"][0]["pct_of_roofline"] == pytest.approx(50.0)


def test_the_text_report_has_the_mfu_table_and_the_slowest_ops(tmp_path):
    code, out, _ = _cli(write_flops_run(tmp_path / "run"))
    assert code == 0
    lines = out.splitlines()
    at = lines.index("MFU (model FLOPs utilisation)")
    header = next(line for line in lines[at:] if line.startswith("rank"))
    row = lines[lines.index(header) + 1].split()
    assert header.split()[:3] == ["rank", "steps", "FLOPs/step"]
    assert row == ["0", "1", "2", "G", "2", "10", "measured", "20.00", "0.0", "0.0", "60.0",
                   "20.0"]
    assert "Slowest ops against their roofline" in lines
    assert not any(line.startswith("MFU: ") for line in lines)


def test_the_html_report_draws_the_mfu_attribution(tmp_path):
    run = open_run(write_flops_run(tmp_path / "run"), use_cache=False)
    page = tmp_path / "report.html"
    write_html_report(run.report, page)
    html = page.read_text()
    section = html[html.index('<section id="mfu">'):]
    section = section[:section.index("</section>")]
    assert "<svg" in section and "MFU and the points it loses" in section
    assert "rank 0: MFU 20 % of step time (mean)" in section
    assert "rank 0: idle 60 % of step time (mean)" in section
    assert "rank 0: compute below roofline 20 % of step time (mean)" in section
    assert "aten::mm" in section


def test_a_run_without_shapes_says_why_in_one_line(tmp_path):
    folder = write_flops_run(tmp_path / "run", with_shapes=False)
    run = open_run(folder, use_cache=False)
    row = run.mfu.iloc[0]
    assert row["ops_without_shapes"] == 1 and row["flops_per_step"] != row["flops_per_step"]
    code, out, _ = _cli(folder)
    assert code == 0
    assert [line for line in out.splitlines() if "MFU" in line] == [f"MFU: {NO_FLOPS_NO_SHAPES}"]
    assert "Slowest ops against their roofline" not in out
    page = tmp_path / "report.html"
    write_html_report(run.report, page)
    assert "no shapes" in page.read_text()


def test_a_trace_recorded_before_shapes_and_one_without_compute_ops_say_why(tmp_path):
    _, out, _ = _cli(DATA / "ddp_cpu")
    assert [line for line in out.splitlines() if "MFU" in line] == [f"MFU: {NO_FLOPS_NO_SHAPES}"]
    _, out, _ = _cli(DATA / "hta" / "cpu_only")
    assert [line for line in out.splitlines() if "MFU" in line] == [f"MFU: {NO_FLOPS_NO_OPS}"]


def test_the_amd_sample_has_its_flops_and_no_mfu_without_a_peak():
    run = open_run(DATA / "hta" / "amd_trace", use_cache=False)
    table = run.mfu
    assert table["flops_per_step"].sum() == 327_680  # addmm and mm, both in step 1
    assert table["mfu_pct"].isna().all() and table["peak_source"].isna().all()
    with_peak = open_run(DATA / "hta" / "amd_trace", use_cache=False, peak_tflops=1e-3).mfu
    assert with_peak["mfu_pct"].notna().all()
    lost = with_peak[flops.LOST_COLUMNS].sum(axis=1)
    assert lost.tolist() == pytest.approx((100 - with_peak["mfu_pct"]).tolist(), abs=1e-9)


def test_the_ranks_flops_are_reduced_where_the_file_is_parsed(tmp_path, monkeypatch):
    folder = write_flops_run(tmp_path / "run")
    run = open_run(folder, use_cache=False, keep_events=False)
    reduced = run.ranks[0].tables
    assert reduced.step_flops["flops_per_step"].tolist() == [MM_FLOPS]
    assert reduced.op_roofline["name"].tolist() == ["aten::mm"]

    def broken(trace):
        raise ValueError("no ops")

    monkeypatch.setattr(flops, "rank_flops_tables", broken)
    found = rank_tables(run.ranks[0].with_events())
    assert found.failed == {"step_flops": "ValueError: no ops", "op_roofline": "ValueError: no ops"}
    assert all(table is not None for table in (found.per_step, found.idle_gaps, found.comm_ops))


def test_a_failure_of_the_flop_count_costs_the_mfu_and_roofline_tables_only(tmp_path,
                                                                             monkeypatch):
    def broken(trace):
        raise ValueError("no ops")

    monkeypatch.setattr(flops, "rank_flops_tables", broken)
    run = open_run(write_flops_run(tmp_path / "run"), use_cache=False)
    assert run.problems == ["mfu table failed: ValueError: no ops",
                            "roofline table failed: ValueError: no ops"]
    assert run.mfu is None and run.roofline is None and len(run.per_rank) == 1
    text = text_report.text_report(run.report)
    assert "mfu: not available (ValueError: no ops)" in text
    assert "MFU (model" not in text
    assert json.loads(json_document.dumps(run.document()))["mfu"] is None
