"""Run a training script under the ranktrace tracer.

    ranktrace record [tracer options] SCRIPT [script args]
    torchrun --nproc-per-node 2 --no-python ranktrace record [tracer options] SCRIPT [args]
    torchrun --nproc-per-node 2 -m tracer.record [tracer options] SCRIPT [script args]

The script runs unchanged as `__main__`, with the `sys.argv`, `sys.path[0]` and `__file__` it
would have without the tracer; its output, traceback and exit code come through as they are.
Each rank writes into one shared run folder (see docs/trace-format.md) and ends with one summary
line on stderr. Options: `--help` or docs/tracer.md.
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import importlib.machinery
import os
import pkgutil
import runpy
import signal
import sys
import types
import zipfile

from tracer.options.config import ConfigError, resolve
from tracer.session.launcher import Launcher
from tracer.session.rank_session import Session
from tracer.session.run_folder import LaunchInfo, RunDirError
from tracer.session.script_end import ScriptOutcome, exit_code_of, hide_tracer_frames


# ---- running the script ----------------------------------------------------------------------
def run_script(script: str, script_args: list[str]) -> ScriptOutcome:
    """Run `script` as __main__ with the argv, sys.path[0] and __file__ Python would give it."""
    path = os.path.abspath(script)
    sys.argv = [script, *script_args]
    try:
        if os.path.isdir(path) or zipfile.is_zipfile(path):
            sys.path[0] = path
            runpy.run_path(path, run_name="__main__")
        else:
            sys.path[0] = os.path.dirname(path)
            _exec_as_main(path)
    except SystemExit as exc:
        return ScriptOutcome(exit_code=exit_code_of(exc), system_exit=exc)
    except BaseException as exc:
        return ScriptOutcome(exit_code=130 if isinstance(exc, KeyboardInterrupt) else 1,
                             exception=exc)
    return ScriptOutcome(exit_code=0)


def why_not_runnable(script: str) -> tuple[str, int] | None:
    """(Python's own message, its exit code) when `python SCRIPT` would not even start."""
    path = os.path.abspath(script)
    if not os.path.exists(path):
        return f"can't open file {path!r}: [Errno 2] No such file or directory", 2
    if os.path.isdir(path) or zipfile.is_zipfile(path):
        # What runpy.run_path looks for: __main__ as its importer finds it (.py, .pyc, package).
        importer = pkgutil.get_importer(path)
        try:
            found = importer is not None and importer.find_spec("__main__") is not None
        except Exception:
            found = False
        if not found:
            return f"can't find '__main__' module in {path!r}", 1
    return None


def _exec_as_main(path: str) -> None:
    # runpy.run_path would set sys.argv[0] to the absolute path; Python keeps it as typed.
    with open(path, "rb") as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = builtins
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        code = compile(source, path, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


_exit_by_sigint = False


def _final_exit() -> None:
    # Registered before the script's own atexit handlers, so it runs after all of them: an
    # uncaught KeyboardInterrupt ends Python by SIGINT once everything else is done.
    if _exit_by_sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def report_and_exit(outcome: ScriptOutcome, session: Session | None) -> None:
    """Print the script's traceback, then our summary, then exit as the script would have."""
    global _exit_by_sigint
    exc = outcome.exception
    if exc is not None:
        # The hook prints the exception's own __traceback__ when it has one, not the argument.
        hide_tracer_frames(exc, {__file__})
        sys.excepthook(type(exc), exc, exc.__traceback__)
    if session is not None:
        session.print_summary()
    if outcome.system_exit is not None:
        raise outcome.system_exit
    if isinstance(exc, KeyboardInterrupt):
        _exit_by_sigint = True
    sys.exit(outcome.exit_code)


def main(argv: list[str] | None = None, prog: str = "python -m tracer.record") -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # --help: printed, SystemExit(0)
        config, script, script_args = resolve(argv, prog=prog)
    except ConfigError as exc:
        print(f"ranktrace: error: {exc}", file=sys.stderr)
        sys.exit(2)
    unrunnable = why_not_runnable(script)
    if unrunnable is not None:
        message, exit_code = unrunnable
        print(f"ranktrace: error: {message}", file=sys.stderr)
        sys.exit(exit_code)
    launch = LaunchInfo.from_env()
    session = Session(config, script, script_args, launch, make_launcher=Launcher)
    session.watch_sigterm()
    atexit.register(_final_exit)
    try:
        session.open()
    except RunDirError as exc:
        print(f"ranktrace: error: rank{launch.rank}: {exc}; the script was not run",
              file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # a bug of ours must not cost the user their training run
        print(f"ranktrace: rank{launch.rank}: tracer setup failed ({type(exc).__name__}: {exc});"
              f" running the script without tracing", file=sys.stderr, flush=True)
        session.abandon()
        session = None
    outcome = ScriptOutcome(exit_code=1)
    try:
        outcome = run_script(script, script_args)
    finally:
        if session is not None:
            session.finish(outcome)
    report_and_exit(outcome, session)


if __name__ == "__main__":
    main()
