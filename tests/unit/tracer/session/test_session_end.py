"""The session's end when two threads end it at once (tracer.session.rank_session): the SIGTERM
watcher, past its grace, closes while the script's end reaches the main thread (a collective
failed because its peers died of the same SIGTERM). The main thread must not let the process end
before run_end is written."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from helpers.tracer_files import read_jsonl
from tracer.parts.part import Part
from tracer.session.part_registry import PartEntry
from tracer.session.script_end import ScriptOutcome

WATCHERS_CLOSE_S = 0.5


class SlowToStop(Part):
    """A part whose stop takes WATCHERS_CLOSE_S once `entered` is set, as a loaded machine's
    close can."""

    def __init__(self, entered: threading.Event):
        self.entered = entered

    def on_script_end(self, clean, on_main):
        self.entered.set()
        time.sleep(WATCHERS_CLOSE_S)


def test_the_scripts_end_waits_for_the_run_end_a_watchers_close_is_writing(session_in_process,
                                                                           capsys):
    entered = threading.Event()
    entry = PartEntry("slow", lambda setup: setup.build(SlowToStop, entered), close_order=1)
    session = session_in_process([entry])
    session.manual_step()
    watcher = threading.Thread(target=session.close, args=("interrupted", -15),
                               kwargs={"on_main": False})
    watcher.start()
    assert entered.wait(5.0)
    started = time.monotonic()
    session.finish(ScriptOutcome(exit_code=1, exception=RuntimeError("Connection closed")))
    waited = time.monotonic() - started
    manifest = read_jsonl(Path(session.run_dir) / "rank0.manifest.jsonl")
    watcher.join()
    assert manifest[-1]["kind"] == "run_end"
    # the watcher's close, begun first, is the one written
    assert (manifest[-1]["status"], manifest[-1]["exit_code"]) == ("interrupted", -15)
    assert WATCHERS_CLOSE_S * 0.5 < waited < 5.0
    # Both threads end the run: its summary is said once.
    capsys.readouterr()
    session.print_summary()
    session.print_summary()
    said = capsys.readouterr()
    first = session.summary.splitlines()[0]
    assert (said.out + said.err).count(first) == 1


def test_a_close_on_its_own_thread_returns_at_once_with_run_end_written(session_in_process):
    session = session_in_process([])
    session.manual_step()
    started = time.monotonic()
    assert session.close_or_wait("failed", 1, "RuntimeError: x", wait_s=30.0)
    assert time.monotonic() - started < 5.0
    run_end = read_jsonl(Path(session.run_dir) / "rank0.manifest.jsonl")[-1]
    assert (run_end["status"], run_end["exit_code"], run_end["exception"]) == (
        "failed", 1, "RuntimeError: x")
    assert not session.close_or_wait("ok", 0, wait_s=30.0)  # closed already: nothing rewritten
