"""How the script ended, the lines a rank prints on stderr when its run ends, whether its
files are worth keeping, and the script's traceback as it would be untraced."""

from __future__ import annotations

import runpy
import sys
import types
from dataclasses import dataclass

from tracer import schema

# Printed when a run ended without one step: the step clock never started, which the analysis
# needs for everything per step.
NO_STEPS_HINT = ("no training step was marked: no torch.optim optimizer stepped. If the loop "
                 "updates weights by hand, call tracer.step() at the end of each step "
                 "(`import tracer`; it does nothing untraced); see docs/tracer.md, Steps")
NOT_KEPT = "nothing recorded (no steps, comm ops or traces), run files removed"


@dataclass
class ScriptOutcome:
    """How the script ended: normally, by sys.exit, or by an exception."""

    exit_code: int
    system_exit: SystemExit | None = None
    exception: BaseException | None = None

    @property
    def status(self) -> str:
        if isinstance(self.exception, KeyboardInterrupt):
            return "interrupted"
        return "ok" if self.exit_code == 0 else "failed"

    @property
    def exception_text(self) -> str | None:
        exc = self.exception
        return None if exc is None else f"{type(exc).__name__}: {exc}"


def exit_code_of(exc: SystemExit) -> int:
    """The exit code Python gives `sys.exit(code)`."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # Python prints a non-integer code and exits with 1


# The frames above the script's first one when the tracer runs it: the command and runpy.
_LEADING_FILES = {runpy.__file__, "<frozen runpy>"}


def _is_tracer_frame(frame) -> bool:
    module = frame.f_globals.get("__name__")
    return isinstance(module, str) and (module == "tracer" or module.startswith("tracer."))


def _script_traceback(tb, leading_files: set[str]):
    """The traceback as Python would print it untraced: from the script's first frame on, and
    without the tracer's frames in between (the collective wrappers, the DDP hook labeller, the
    wrapper of a function the script started a rank with), which do not exist untraced."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in leading_files
                              or tb.tb_frame.f_code.co_filename in _LEADING_FILES):
        tb = tb.tb_next
    kept = []
    while tb is not None:
        if not _is_tracer_frame(tb.tb_frame):
            kept.append(tb)
        tb = tb.tb_next
    tb = None
    for entry in reversed(kept):
        tb = types.TracebackType(tb, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return tb


def hide_tracer_frames(exc: BaseException, leading_files: set[str] = frozenset()) -> None:
    """`exc`'s traceback without the tracer's frames (and without leading frames of
    `leading_files` or runpy), and so the traceback of every exception chained to it or grouped
    in it, each of which Python prints with its own."""
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = _script_traceback(current.__traceback__, leading_files)
        todo += [current.__cause__, current.__context__, *getattr(current, "exceptions", ())]


def say_lines(text: str) -> None:
    """`text` and its newline on stderr in one write: ranks that share a stderr (the ranks a
    script starts itself) never run their lines together, as print's two writes could."""
    stream = sys.stderr
    stream.write(text + "\n")
    stream.flush()


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def recorded_anything(run_end: schema.RunEnd, parts_keep_it: bool) -> bool:
    """Whether a run left anything to analyse. A script that only printed its --help, failed its
    own argument parsing or could not be compiled leaves none: its files would only make the
    analysis pick it instead of the last real run. `parts_keep_it`: a part wrote something that
    alone is worth keeping (a memory snapshot)."""
    return bool(run_end.steps or run_end.windows or run_end.comm_ops or parts_keep_it
                or run_end.untraced_processes)


def summary_lines(run_end: schema.RunEnd, run_dir: str, kept: bool) -> list[str]:
    """The summary line, then a hint when no step was marked (see below)."""
    prefix = f"ranktrace: rank{run_end.rank}"
    lag = ("" if run_end.samples_missed_pct is None
           else f" samples_missed={run_end.samples_missed_pct:g}%")
    lines = [f"{prefix} {run_end.status} steps={run_end.steps} windows={run_end.windows} "
             f"samples={run_end.samples}{lag} comm_ops={run_end.comm_ops} "
             f"bytes_written={format_bytes(run_end.bytes_written)} errors={run_end.errors} "
             f"-> {run_dir if kept else NOT_KEPT}"]
    # A failed start that recorded nothing (the script's own argument error, a syntax error)
    # needs no advice about steps, nor does a script whose training ran in processes it
    # started itself (said when they started).
    if (run_end.steps == 0 and (kept or run_end.status == "ok")
            and not run_end.untraced_processes):
        lines.append(f"{prefix} {NO_STEPS_HINT}")
    return lines
