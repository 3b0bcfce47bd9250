"""The session driving parts through the registry (tracer.session.rank_session,
tracer.session.part_registry): the build, start, stop and close orders, run_start and run_end
fields, a failing part noted once, a new part with no change to the session, a part switched off
or not importable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.tracer_files import read_jsonl
from tracer import schema
from tracer.options.config import TracerConfig
from tracer.parts.part import Part
from tracer.session import part_registry
from tracer.session.part_registry import PartEntry


# ---- the registry and the session's loops over it -------------------------------------------
def _records(session, name: str) -> list[dict]:
    return read_jsonl(Path(session.run_dir) / f"rank0.{name}.jsonl")


class ToyFile(Part):
    """A part that writes down each call the session makes on it in `events`."""

    def __init__(self, name, events, run_dir):
        self.name, self.events, self.run_dir = name, events, run_dir

    def on_step_record(self, record, notes):
        self.events.append(("record", record.step))

    def close(self):
        self.events.append(("close", self.name))


class ToyObserver(ToyFile):
    """... and one that starts and stops, as a part that observes the script does."""

    def start(self):
        manifest = (Path(self.run_dir) / "rank0.manifest.jsonl.tmp").read_text()
        self.events.append(("start", self.name, '"run_start"' in manifest))

    def on_script_end(self, clean, on_main):
        self.events.append(("stop", self.name))

    def on_step_record(self, record, notes):
        pass


def toy_entry(name, events, cls=ToyObserver, **entry_options) -> PartEntry:
    def build(setup):
        events.append(("build", name))
        return setup.build(cls, name, events, setup.run_dir)

    return PartEntry(name, build, **entry_options)


def test_parts_are_built_started_stopped_and_closed_in_the_registrys_orders(
        session_in_process):
    events = []
    entries = [toy_entry("file", events, ToyFile),
               toy_entry("early", events, start_order=2, close_order=2),
               toy_entry("late", events, start_order=1, close_order=3),
               toy_entry("window", events, start_order=3, starts_last=True, close_order=1)]
    session = session_in_process(entries)
    for _ in range(2):
        session.manual_step()
    session.close("ok", 0)
    assert events == [
        ("build", "file"), ("build", "early"), ("build", "late"), ("build", "window"),
        # start_order; the one that starts last does so once run_start is written
        ("start", "late", False), ("start", "early", False), ("start", "window", True),
        # close_order, before the last records are written
        ("stop", "window"), ("stop", "early"), ("stop", "late"),
        ("record", 0), ("record", 1),
        # then every part closes its files, in the registry's order
        ("close", "file"), ("close", "early"), ("close", "late"), ("close", "window")]


def test_the_registry_keeps_the_orders_the_tracer_has_always_used():
    entries = part_registry.REGISTRY

    def by(order):
        return [e.name for e in sorted((e for e in entries if getattr(e, order) is not None),
                                       key=lambda e: getattr(e, order))]

    assert [e.name for e in entries] == ["steps", "comms", "flight", "sampler", "scalars",
                                          "memory", "memory_snapshot", "profiler", "spawn_watch",
                                          "clock", "peak"]
    assert by("start_order") == ["clock", "comms", "spawn_watch", "sampler", "memory_snapshot",
                                 "profiler"]
    # After run_start: the profiler (setting up the rest stays out of its first window) and the
    # clock sync (its record comes after run_start when a session opens in a process group).
    assert [e.name for e in entries if e.starts_last] == ["profiler", "clock"]
    # The profiler's open window is exported first; the clock sync's wrapper goes last; the
    # Flight Recorder's last drain writes to the comms part's files before they close.
    assert by("close_order") == ["profiler", "spawn_watch", "flight", "comms", "sampler",
                                 "clock"]
    options = {f for f, kind in TracerConfig.__annotations__.items() if kind == "bool"}
    assert {e.off_option for e in entries} - {None} <= options


def test_a_part_built_through_the_registry_gives_its_run_start_and_run_end_fields(
        session_in_process):
    session = session_in_process(no_sampler=False, sample_hz=100.0)
    for _ in range(3):
        time.sleep(0.05)
        session.manual_step()
    session.close("ok", 0)
    run_start, *_, run_end = _records(session, "manifest")
    samples = _records(session, "samples")
    assert run_start["sampler_source"] == "psutil" and run_start["sampler_reason"]
    assert run_end["samples"] == len(samples) > 0
    assert run_end["steps"] == len(_records(session, "steps")) == 3
    # the parts that were off still give run_end its counts
    assert (run_end["windows"], run_end["comm_ops"]) == (0, 0)
    assert "ddp_buckets" not in run_start  # no comms recorder, no field


def test_a_failing_part_is_noted_once_and_not_called_again_while_training_goes_on(
        session_in_process, capsys):
    class FailsAtFirstStep(ToyObserver):
        calls = 0

        def on_step(self):
            FailsAtFirstStep.calls += 1
            raise RuntimeError("boom")

        def run_end_fields(self):
            return {"samples_missed_pct": 12.5}  # what it did before it failed still counts

    events = []
    session = session_in_process([*part_registry.REGISTRY,
                                  toy_entry("toy", events, FailsAtFirstStep)])
    for _ in range(4):
        session.manual_step()
    session.close("ok", 0)
    assert FailsAtFirstStep.calls == 1
    assert session.in_use("toy") is None and session.in_use("steps") is not None
    assert ("stop", "toy") not in events and ("close", "toy") in events
    errors = [r for r in _records(session, "manifest") if r["kind"] == "error"]
    assert [(e["part"], e["message"]) for e in errors] == [
        ("toy", "RuntimeError: boom; toy is off")]
    run_end = _records(session, "manifest")[-1]
    assert (run_end["steps"], run_end["errors"], run_end["samples_missed_pct"]) == (4, 1, 12.5)
    assert len(_records(session, "steps")) == 4
    tracer_lines = [line for line in capsys.readouterr().err.splitlines() if "toy" in line]
    assert tracer_lines == ["ranktrace: rank0 toy: RuntimeError: boom; toy is off"]


def test_a_new_part_adds_its_fields_with_no_change_to_the_session(session_in_process,
                                                                   monkeypatch):
    """What a new part takes: its module (here, this test), its entry, its schema fields."""
    class StepRecord(schema.StepRecord, omit_defaults=True):
        toy_mark: int | None = None

    class RunEnd(schema.RunEnd, tag="run_end", tag_field="kind", omit_defaults=True):
        toy_steps: int = 0

    monkeypatch.setattr(schema, "StepRecord", StepRecord)
    monkeypatch.setattr(schema, "RunEnd", RunEnd)

    class StepCounter(Part):
        name = "toy"

        def __init__(self):
            self.steps = 0

        def step_fields(self):
            return {"toy_mark": 10 + self.steps}

        def on_step(self):
            self.steps += 1

        def run_end_fields(self):
            return {"toy_steps": self.steps}

    monkeypatch.setattr(part_registry, "REGISTRY", list(part_registry.REGISTRY))
    part_registry.register(PartEntry("toy", lambda setup: setup.build(StepCounter)))
    with pytest.raises(ValueError, match="registered already"):
        part_registry.register(PartEntry("toy", lambda setup: None))
    session = session_in_process()
    for _ in range(3):
        session.manual_step()
    session.close("ok", 0)
    steps = _records(session, "steps")
    assert [s["toy_mark"] for s in steps] == [10, 11, 12]
    assert _records(session, "manifest")[-1]["toy_steps"] == 3


def test_a_part_switched_off_or_not_importable_is_left_out_and_the_rest_goes_on(
        session_in_process, capsys):
    events = []
    session = session_in_process(
        [*part_registry.REGISTRY, toy_entry("toy", events, off_option="no_scalars"),
         PartEntry("missing", "no_such_module:open_it")])
    session.manual_step()
    session.close("ok", 0)
    assert events == []  # --no-scalars is on in this fixture: never built
    message = ("no_such_module unavailable (ModuleNotFoundError: No module named "
               "'no_such_module'); this part is off")
    errors = [r for r in _records(session, "manifest") if r["kind"] == "error"]
    assert [(e["part"], e["message"]) for e in errors] == [("missing", message)]
    assert f"ranktrace: rank0 missing: {message}" in capsys.readouterr().err.splitlines()
    run_end = _records(session, "manifest")[-1]
    assert (run_end["steps"], run_end["windows"]) == (1, 0)  # no profiler: no windows
