"""`python -m ranktrace.watch` in a pipe, started before a synthetic run that a thread writes:
plain lines, the late rank named, the phase, the end; and the `c` key's ask, answered as a
rank answers it."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from benchmarks.watch_cost import SyntheticRun
from helpers.launch import start_module
from ranktrace.watch.command import Watcher
from ranktrace.watch.options import WatchOptions
from tracer import schema
from tracer.capture.capture_requests import FileLog

STEPS = 90


def write_run(folder, started: threading.Event) -> None:
    """3 ranks of 20 ms steps, two all-reduces issued 10 and 11 ms into each; rank 2 issues
    them 80 ms late from step 30 (steps then 100 ms), so the others wait [10, 90) and
    [11, 91): 81 ms. Written faster than real time, a step every 10 ms."""
    started.wait(30)
    run = SyntheticRun(str(folder), 3, step_ms=20.0, ops_per_step=2, slow_rank=2, slow_from=30,
                       slow_ms=80.0, sample_hz=0)
    run.start()
    for _ in range(STEPS):
        run.write_step()
        time.sleep(0.01)
    run.end()


@pytest.mark.slow
def test_plain_text_in_a_pipe(tmp_path):
    traces = tmp_path / "traces"
    watch = start_module("ranktrace.watch", "--interval", "0.2", traces, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    started = threading.Event()
    writer = threading.Thread(target=write_run, args=(traces / "run", started), daemon=True)
    writer.start()
    try:
        first = watch.stdout.readline()
        started.set()
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    lines = [first] + out.splitlines()
    assert watch.returncode == 0, err
    assert first.endswith(f"waiting for a run to start in {traces}\n")
    assert "\x1b" not in out  # no colour, no cursor movement
    assert any("ranks wait for rank 2: 81.0 ms" in line for line in lines)
    assert any(line.endswith("phase: step 30: 20.0 -> 100.0 ms a step (x5.00)") for line in lines)
    assert any(line.endswith("rank 2 ended: ok") for line in lines)
    assert lines[-1].startswith(f"ranktrace watch: run: every rank has ended (3 ranks: 3 ok) "
                                f"at step {STEPS - 1}; 100.0 ms a step at the end; ranks wait "
                                f"for rank 2: 81.0 ms a step")


def answer_asks(folder: str, first_step: int, stop: threading.Event) -> None:
    """What a live rank does with python -m tracer.capture's ask: a request answering it."""
    asks = FileLog(folder, schema.CAPTURE_ASK_FILE, schema.CaptureAsk)
    while not stop.is_set():
        for number, _ in asks.read_new():
            FileLog(folder).append(schema.CaptureRequest(
                trigger="on_demand", trigger_step=first_step - 2, first_step=first_step,
                steps=3, t_ns=time.time_ns(), ask=number))
        time.sleep(0.01)


def test_the_c_key_asks_every_rank_for_a_capture(tmp_path):
    run = SyntheticRun(str(tmp_path / "run"), 2, sample_hz=0)
    run.start()
    for _ in range(5):
        run.write_step()
    run.flush()
    watcher = Watcher(WatchOptions(paths=(str(tmp_path),)))
    watcher.tick(0.0)
    stop = threading.Event()
    rank = threading.Thread(target=answer_asks, args=(run.folder, 12, stop), daemon=True)
    rank.start()
    try:
        watcher.ask_capture()
        watcher.asking.join(15)
    finally:
        stop.set()
    assert watcher.status == "capture: every rank profiles steps 12-14 (ask 0)"
    assert os.path.exists(os.path.join(run.folder, schema.CAPTURE_ASK_FILE.format(index=0)))
    watcher.tick(1.0)
    [window] = watcher.model.view().captures
    assert (window.first_step, window.steps, window.trigger) == (12, 3, "on_demand")
    run.end()
    watcher.ask_capture()
    watcher.asking.join(15)
    assert watcher.status.startswith("capture: the run in ") and "has ended" in watcher.status
