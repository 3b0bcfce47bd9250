"""`ranktrace`: the one command, with a subcommand per task (docs/analysis.md, "Commands").

    ranktrace record | breakdown | timeline | diff | scaling | capture | sweep | watch ...

Each subcommand is the `main(argv, prog)` of its module, which also runs as `python -m MODULE`;
the module is imported only once its subcommand is chosen, so that `ranktrace breakdown` starts
as fast as `python -m analysis.breakdown`.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from analysis.core.terminal import terminal_safe


@dataclass(frozen=True)
class Subcommand:
    """One subcommand of `ranktrace`."""

    module: str  # the module whose main(argv, prog) runs it
    summary: str  # one line for `ranktrace --help`
    python_m: str  # the `python -m` form that runs it too


SUBCOMMANDS = {
    "record": Subcommand(
        "tracer.record", "run a training script under the tracer (torchrun: --no-python "
        "ranktrace record)", "python -m tracer.record"),
    "breakdown": Subcommand(
        "analysis.breakdown", "where each rank's step time goes, across ranks, and the verdict",
        "python -m analysis.breakdown"),
    "timeline": Subcommand(
        "analysis.timeline", "every rank on one clock in one Perfetto / chrome://tracing file",
        "python -m analysis.timeline"),
    "diff": Subcommand(
        "analysis.diff", "did a change help: two runs (or a capture window) compared",
        "python -m analysis.diff"),
    "scaling": Subcommand(
        "analysis.scaling", "speedup, efficiency and where it goes, over world sizes",
        "python -m analysis.scaling"),
    "capture": Subcommand(
        "tracer.capture.capture_command", "ask a running job to profile its next steps",
        "python -m tracer.capture"),
    "sweep": Subcommand(
        "ranktrace.sweep", "one traced run per world size, then the scaling report",
        "python -m tracer.sweep"),
    "watch": Subcommand(
        "ranktrace.watch.command", "a running job, live, in the terminal",
        "python -m ranktrace.watch"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: ranktrace COMMAND [options] ...", "",
             "Per-rank profiling and tracing for PyTorch parallel training.", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.summary}" for name, command in SUBCOMMANDS.items()]
    lines += ["", "`ranktrace COMMAND --help` shows a command's options and their defaults."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand argv[0] names with the rest of argv; its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        sys.stderr.write(usage())
        return 2
    if argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0
    name, rest = argv[0], argv[1:]
    command = SUBCOMMANDS.get(name)
    if command is None:
        sys.stderr.write(usage())
        print(terminal_safe(f"ranktrace: error: unknown command {name!r} (choose from "
                            f"{', '.join(SUBCOMMANDS)})"), file=sys.stderr)
        return 2
    module = importlib.import_module(command.module)
    if name == "breakdown":  # as `python -m analysis.breakdown` runs and ends (breakdown.exit_now)
        module.exit_now(module.main(rest, prog=f"ranktrace {name}", own_process=True))
    return module.main(rest, prog=f"ranktrace {name}")


def console_script() -> None:
    """The `ranktrace` console script (pyproject.toml, [project.scripts])."""
    sys.exit(main())
