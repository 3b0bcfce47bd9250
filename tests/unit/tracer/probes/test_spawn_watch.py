"""The spawn watch (tracer.probes.spawn_watch): the processes torch.multiprocessing.spawn and
start_processes start are counted and said once, untraced; the script's call goes through as
it was made, and closing puts torch's very function back."""

from __future__ import annotations

import sys

import pytest
import torch.multiprocessing as mp

from tracer.probes import spawn_watch
from tracer.probes.spawn_watch import SpawnWatch

SPAWN_MODULE = sys.modules["torch.multiprocessing.spawn"]


@pytest.fixture
def started(monkeypatch):
    """A torch whose start_processes starts nothing but notes its arguments (`calls`), and a
    started watch over it noting what it is told (`told`)."""
    calls = []

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        calls.append((fn, args, nprocs, join, daemon, start_method))
        return "the context"

    monkeypatch.setattr(SPAWN_MODULE, "start_processes", start_processes)
    monkeypatch.setattr(mp, "start_processes", start_processes)
    told = []
    watch = SpawnWatch(lambda nprocs, method: told.append((nprocs, method)))
    watch.start()
    yield watch, start_processes, calls, told
    watch.close()


def work(rank):
    pass


def test_spawn_and_start_processes_are_counted_and_go_through_unchanged(started):
    watch, original, calls, told = started
    assert mp.spawn(work, args=(1,), nprocs=3, join=False) == "the context"
    assert mp.start_processes(work, (), 2, True, True, "fork") == "the context"
    assert calls == [(work, (1,), 3, False, False, "spawn"), (work, (), 2, True, True, "fork")]
    assert told == [(3, "spawn"), (2, "fork")]
    assert watch.run_end_fields() == {"untraced_processes": 5}


def test_closing_puts_torchs_very_function_back_in_both_modules(started):
    watch, original, _, _ = started
    assert mp.start_processes is not original
    assert SPAWN_MODULE.start_processes is mp.start_processes
    assert mp.start_processes.__wrapped__ is original
    watch.close()
    assert mp.start_processes is original and SPAWN_MODULE.start_processes is original
    mp.spawn(work, nprocs=4, join=False)
    assert watch.run_end_fields() == {"untraced_processes": 0}  # no longer watched


def test_a_failing_note_never_stops_the_processes_from_starting(started):
    watch, _, calls, _ = started

    def broken(nprocs, method):
        raise RuntimeError("note")

    watch.on_start = broken
    mp.spawn(work, nprocs=2, join=False)
    assert len(calls) == 1 and watch.processes == 2


def test_the_line_says_the_processes_are_untraced_and_how_to_trace_them(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    spawn_watch._say_untraced(2, "spawn")
    assert capsys.readouterr().err == (
        "ranktrace: torch.multiprocessing started 2 process(es) (start method spawn); they are "
        "not traced, only this process is: launch the ranks with torchrun -m tracer.record to "
        "trace each one\n")
