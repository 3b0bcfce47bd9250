"""Drawing a WatchView: rich renderables for a terminal, plain lines for a pipe or a log.

Every text that comes from the run folder (names, hosts, messages) is made terminal-safe
(analysis.core.terminal) and handed to rich as Text, never as markup.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from analysis.core.terminal import terminal_safe
from ranktrace.watch.model import CaptureWindow, RankEnded, RankRow, WatchView
from ranktrace.watch.phases import PhaseChange

# Above this many ranks, or more than the terminal holds, the table shows the latest and the
# earliest ranks and one line for the rest.
MAX_ALL_RANKS = 32
SPARKS = "▁▂▃▄▅▆▇█"
SHOWN_EVENTS = 3  # phase changes and captured windows shown, the newest
# (heading, width): fixed, so that the tables above and below the line on hidden ranks align
COLUMNS = (("rank", 5), ("step", 7), ("step ms", 7), ("last ms", 7), ("wait ms", 7),
           ("wait %", 6), ("late ms", 7), ("memory", 8), ("samples/s", 9), ("state", 11))
KEYS = "c: capture on every rank   q: quit"


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 1000 else f"{value:.1f}"


def size(value: int | None) -> str:
    if value is None:
        return "-"
    if value >= 10 << 30:
        return f"{value / (1 << 30):.0f} GiB"
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return f"{value / (1 << 20):.0f} MiB"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def sparkline(values: list[float], width: int) -> str:
    """`values` squeezed to `width` characters, each a block as high as its share of the
    largest."""
    if not values or width <= 0:
        return ""
    if len(values) > width:
        per = len(values) / width
        values = [max(values[int(i * per):max(int((i + 1) * per), int(i * per) + 1)])
                  for i in range(width)]
    top = max(values) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * len(SPARKS)))] for v in values)


def phase_text(change: PhaseChange) -> str:
    return (f"step {change.step}: {ms(change.before_ms)} -> {ms(change.after_ms)} ms a step "
            f"(x{change.after_ms / change.before_ms:.2f})" if change.before_ms else
            f"step {change.step}: {ms(change.after_ms)} ms a step")


def window_text(window: CaptureWindow) -> str:
    last = window.first_step + window.steps - 1
    why = "on demand" if window.trigger == "on_demand" else "slow step"
    if window.trigger_rank is not None:
        why += f" on rank {window.trigger_rank}"
    if window.ratio is not None:
        why += f" (x{window.ratio:.1f})"
    if window.traced_ranks or window.missed_ranks:
        done = f"traced on {window.traced_ranks} rank(s)"
        if window.missed_ranks:
            done += f", missed by {window.missed_ranks}"
    else:
        done = "planned"
    return f"steps {window.first_step}-{last}: {why}, {done}"


def waited_text(view: WatchView) -> str:
    named = view.waited_for
    if named is None:
        return "no rank holds the others back"
    return (f"ranks wait for rank {named.rank}: {ms(named.wait_ms)} ms a step (last to "
            f"arrive in {named.steps_last} of the last {named.steps} steps)")


def counts_text(view: WatchView) -> str:
    states: dict[str, int] = {}
    for row in view.rows:
        states[row.state] = states.get(row.state, 0) + 1
    world = view.world_size or len(view.rows)
    parts = [f"{n} {state}" for state, n in sorted(states.items())]
    missing = world - len(view.rows)
    if missing > 0:
        parts.append(f"{missing} not seen")
    return f"{world} ranks: " + ", ".join(parts) if parts else f"{world} ranks"


def headline(view: WatchView) -> str:
    step = "-" if view.newest_step is None else str(view.newest_step)
    job = view.job_step_ms
    pace = f"{ms(job)} ms a step ({1e3 / job:.1f} steps/s)" if job else "- ms a step"
    return f"step {step}   {pace}   {counts_text(view)}"


def chosen_rows(rows: list[RankRow], room: int) -> list[RankRow | str]:
    """The rows shown in `room` lines: all, by rank, when they fit (and are at most
    MAX_ALL_RANKS); else, by lateness, the latest and the earliest ranks with a line (a str)
    on the rest between them."""
    if len(rows) <= min(MAX_ALL_RANKS, room):
        return list(rows)
    by_lateness = sorted(rows, key=lambda r: (-(r.late_ms if r.late_ms is not None else -1.0),
                                              -(r.step_ms or 0.0), r.rank))
    shown = max(2, min(room, MAX_ALL_RANKS, len(rows)) - 1)  # and the line on the rest
    latest = max(1, shown * 2 // 3)
    earliest = shown - latest
    rest = by_lateness[latest:-earliest]
    steps = [r.step_ms for r in rest if r.step_ms is not None]
    late = [r.late_ms for r in rest if r.late_ms is not None]
    summary = f"{len(rest)} more ranks"
    if steps:
        summary += f": step {ms(min(steps))}-{ms(max(steps))} ms"
    if late:
        summary += f", late {ms(min(late))}-{ms(max(late))} ms"
    return [*by_lateness[:latest], summary, *by_lateness[-earliest:]]


def _cells(row: RankRow) -> list[str]:
    share = "-" if row.wait_share is None else f"{row.wait_share * 100:.0f}%"
    return [str(row.rank), "-" if row.step is None else str(row.step), ms(row.step_ms),
            ms(row.last_ms), ms(row.wait_ms), share, ms(row.late_ms), size(row.memory_bytes),
            rate(row.samples_per_s), terminal_safe(row.state)]


def rank_table(rows: list[RankRow], named: int | None, header: bool = True) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False,
                  show_header=header)
    for name, width in COLUMNS:
        table.add_column(name, justify="left" if name == "state" else "right", no_wrap=True,
                         width=width)
    for row in rows:
        style = "bold red" if row.rank == named else ("dim" if row.state != "running" else "")
        table.add_row(*(Text(c, overflow="ellipsis") for c in _cells(row)), style=style)
    return table


def rank_tables(rows: list[RankRow | str], named: int | None) -> list[RenderableType]:
    """The table of `rows` (chosen_rows), split where a line on the hidden ranks stands."""
    parts: list[RenderableType] = []
    run: list[RankRow] = []
    for row in rows:
        if isinstance(row, str):
            parts += [rank_table(run, named, header=not parts),
                      Text("  " + row, style="dim", overflow="ellipsis", no_wrap=True)]
            run = []
        else:
            run.append(row)
    parts.append(rank_table(run, named, header=not parts))
    return parts


def frame(view: WatchView, width: int, height: int, where: str, status: str = ""
          ) -> RenderableType:
    """The whole screen for a terminal of `width` x `height`."""
    phases = view.phases[-SHOWN_EVENTS:]
    captures = view.captures[-SHOWN_EVENTS:]
    fixed = 10 + len(phases) + len(captures) + (1 if view.problems else 0)
    shown = chosen_rows(view.rows, height - fixed)
    named = view.waited_for.rank if view.waited_for else None
    title = Text("ranktrace watch  ", style="bold")
    title.append(terminal_safe(view.run_name or "-"), style="bold cyan")
    title.append(f"  {terminal_safe(where)}", style="dim")
    parts: list[RenderableType] = [title, Text(headline(view))]
    parts.append(Text(waited_text(view), style="bold red" if named is not None else "green"))
    parts += rank_tables(shown, named)
    parts.append(Text("phases: " + ("none yet" if not phases else ""), style="bold"))
    parts += [Text("  " + phase_text(p)) for p in phases]
    parts.append(Text("captured windows: " + ("none" if not captures else ""), style="bold"))
    parts += [Text("  " + window_text(w)) for w in captures]
    parts += _spark(view, width)
    if view.problems:
        parts.append(Text(f"{view.problem_count} problem(s), newest: "
                          f"{terminal_safe(view.problems[-1])}", style="yellow",
                          overflow="ellipsis", no_wrap=True))
    footer = Text(KEYS, style="dim")
    if status:
        footer.append("   " + terminal_safe(status), style="bold")
    parts.append(footer)
    return Group(*parts)


def _spark(view: WatchView, width: int) -> list[Text]:
    if not view.series:
        return [Text("step time over the run: no step yet", style="bold")]
    first, last = view.series_steps
    low, high = view.series_range
    title = Text(f"step time over the run, steps {first}-{last}: {ms(low)}-{ms(high)} ms",
                 style="bold")
    return [title, Text(sparkline(view.series, width - 2), style="cyan")]


def plain_line(view: WatchView, clock: str) -> str:
    """The one line a second of plain-text mode."""
    if not view.rows:
        return terminal_safe(f"{clock} {view.run_name or '-'}: no record read yet")
    named = view.waited_for
    waits = (f"ranks wait for rank {named.rank}: {ms(named.wait_ms)} ms" if named
             else "no rank holds the others back")
    return terminal_safe(f"{clock} {view.run_name or '-'} {headline(view)} | {waits}")


def event_line(event, clock: str) -> str:
    """A line for something that happened: a phase change, a captured window, a rank's end."""
    if isinstance(event, PhaseChange):
        text = f"phase: {phase_text(event)}"
    elif isinstance(event, CaptureWindow):
        text = f"capture: {window_text(event)}"
    elif isinstance(event, RankEnded):
        text = f"rank {event.rank} ended: {event.status}"
        if event.exit_code:
            text += f" (exit code {event.exit_code})"
        if event.why:
            text += f": {event.why}"
    else:
        text = str(event)
    return terminal_safe(f"{clock} {text}")


def summary_line(view: WatchView, left: bool = False) -> str:
    """The one line the watch ends with."""
    states = counts_text(view)
    end = "left by the user" if left else "every rank has ended"
    step = "-" if view.newest_step is None else str(view.newest_step)
    parts = [f"ranktrace watch: {view.run_name or '-'}: {end} ({states}) at step {step}"]
    if view.job_step_ms:
        parts.append(f"{ms(view.job_step_ms)} ms a step at the end")
    if view.waited_for:
        parts.append(waited_text(view))
    if view.phases:
        parts.append("phases from " + ", ".join(f"step {p.step} ({ms(p.after_ms)} ms)"
                                                for p in view.phases))
    gone = [r.rank for r in view.rows if r.state == "gone"]
    if gone:
        parts.append(f"rank(s) {', '.join(map(str, gone))} ended without run_end")
    return terminal_safe("; ".join(parts))
