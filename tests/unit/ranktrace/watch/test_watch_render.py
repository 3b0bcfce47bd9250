"""Drawing the view (ranktrace.watch.render): what fits a 100x30 terminal with 256 ranks, the
order of the rows, the sparkline, and text from a run folder that must not steer the
terminal."""

from __future__ import annotations

import io

from rich.console import Console

from ranktrace.watch import render
from ranktrace.watch.model import RankRow, WatchView
from ranktrace.watch.waits import WaitedFor


def row(rank: int, late: float, step_ms: float = 10.0, state: str = "running") -> RankRow:
    return RankRow(rank=rank, host="h", step=100, step_ms=step_ms, last_ms=step_ms,
                   wait_ms=0.0, wait_share=0.0, late_ms=late, memory_bytes=1 << 30,
                   memory_kind="RSS", samples_per_s=None, state=state)


def view(rows, run_name="run", problems=()) -> WatchView:
    return WatchView(run_name=run_name, world_size=len(rows), rows=rows,
                     waited_for=WaitedFor(rank=7, wait_ms=60.0, steps_last=20, steps=20),
                     job_step_ms=10.0, newest_step=100, phases=[], captures=[],
                     series=[10.0, 10.0, 70.0], series_steps=(1, 100),
                     series_range=(10.0, 70.0), problems=list(problems),
                     problem_count=len(problems), ended=False)


def drawn(shown: WatchView, width=100, height=30) -> str:
    console = Console(file=io.StringIO(), width=width, height=height, color_system=None,
                      force_terminal=False)
    console.print(render.frame(shown, width, height, "traces/run"))
    return console.file.getvalue()


def test_256_ranks_fit_a_100_by_30_terminal_latest_first():
    rows = [row(r, late=float(r == 7) * 60.0 + r / 1000) for r in range(256)]
    text = drawn(view(rows))
    lines = text.splitlines()
    assert len(lines) <= 30 and max(map(len, lines)) <= 100
    ranks = [int(line.split()[0]) for line in lines
             if line[:5].strip().isdigit() and "more ranks" not in line]
    assert ranks[:3] == [7, 255, 254]  # by lateness, the latest first
    assert ranks[-1] == 0  # and the earliest last
    hidden = 256 - len(ranks)
    assert f"{hidden} more ranks: step 10.0-10.0 ms, late" in text
    assert "ranks wait for rank 7: 60.0 ms a step (last to arrive in 20 of the last 20" in text


def test_a_few_ranks_are_all_shown_by_rank():
    rows = [row(r, late=5.0 - r) for r in range(4)]
    chosen = render.chosen_rows(rows, room=20)
    assert [r.rank for r in chosen] == [0, 1, 2, 3]
    over = [row(r, late=float(r)) for r in range(33)]
    chosen = render.chosen_rows(over, room=40)
    assert [r if isinstance(r, str) else r.rank for r in chosen] == [
        *range(32, 12, -1), "2 more ranks: step 10.0-10.0 ms, late 11.0-12.0 ms",
        *range(10, -1, -1)]


def test_text_from_the_run_folder_cannot_steer_the_terminal():
    evil = "run\x1b[2J\x07"
    text = drawn(view([row(0, 0.0, state="ok")], run_name=evil,
                      problems=["rank 0: tracer part 'x' failed: \x1b]0;title\x07"]))
    assert "\x1b" not in text and "\x07" not in text
    assert "run\\u001b[2J\\u0007" in text
    assert "\x1b" not in render.plain_line(view([row(0, 0.0)], run_name=evil), "12:00:00")


def test_the_sparkline_is_as_high_as_each_share_of_the_largest():
    assert render.sparkline([0.0, 1.0, 2.0, 4.0, 8.0], 5) == "▁▂▃▅█"
    assert render.sparkline([1.0] * 10 + [8.0] * 10, 4) == "▂▂██"  # squeezed by the largest
