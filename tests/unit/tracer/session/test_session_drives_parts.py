"""The tracer's parts on their own: clock offsets, memory figures and snapshots, the profiler
driver, the comms file's writer, and how a part fails; the session driving parts through the
registry."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers.tracer_files import load_trace, read_jsonl
from tracer import schema
from tracer.config import TracerConfig
from tracer.parts.part import Part
from tracer.probes.clock_sync import measure_clock_offset
from tracer.probes.memory import MemorySnapshots, StepMemory
from tracer.session import part_registry
from tracer.session.part_registry import PartEntry


# ---- clock offset ---------------------------------------------------------------------------
def test_clock_offset_is_measured_within_its_uncertainty():
    store = dist.HashStore()
    skew_ns = 7_000_000_000  # rank 1's clock runs 7 s ahead of rank 0's
    results = {}

    def rank(r, clock):
        results[r] = measure_clock_offset(store, r, 3, "ranktrace/clock/t", round_trips=5,
                                          timeout_s=10, clock=clock)

    threads = [threading.Thread(target=rank, args=(1, lambda: time.time_ns() + skew_ns)),
               threading.Thread(target=rank, args=(2, time.time_ns))]
    for t in threads:
        t.start()
    rank(0, time.time_ns)
    for t in threads:
        t.join(10)
    assert results[0] == (0, 0, 0)
    for r, true_offset in ((1, skew_ns), (2, 0)):
        offset, uncertainty, round_trips = results[r]
        assert round_trips == 5
        assert 0 < uncertainty < 1_000_000_000
        assert abs(offset - true_offset) <= uncertainty


def test_clock_sync_gives_up_instead_of_hanging():
    with pytest.raises(Exception, match="ranktrace/clock/u/1/pong0|gave up|timeout|Timeout"):
        measure_clock_offset(dist.HashStore(), 1, 2, "ranktrace/clock/u", timeout_s=0.3)


# ---- memory ---------------------------------------------------------------------------------
class FakeCuda:
    """Stands in for torch.cuda on a machine without a GPU: one device, scripted figures."""

    class OutOfMemoryError(RuntimeError):
        pass

    def __init__(self, initialized=True):
        self.initialized = initialized
        self.peaks = [(100, 200), (300, 400)]
        self.resets = []
        self.queued = []
        self.history_calls = []
        self.snapshots_taken = 0
        fake = self

        class Memory:
            @staticmethod
            def _record_memory_history(**kwargs):
                fake.history_calls.append(kwargs)

            @staticmethod
            def _snapshot():
                fake.snapshots_taken += 1
                return {"segments": [], "device_traces": [[]], "n": fake.snapshots_taken}

        self.memory = Memory

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def current_device(self):
        return 1

    def memory_stats_as_nested_dict(self, device):
        allocated, reserved = self.peaks[len(self.resets)]
        return {"allocated_bytes": {"all": {"peak": allocated, "current": 1}},
                "reserved_bytes": {"all": {"peak": reserved, "current": 2}}}

    def reset_peak_memory_stats(self, device):
        self.resets.append(device)

    def get_device_properties(self, device):
        return type("Props", (), {"total_memory": 1000})

    def _lazy_call(self, fn):
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)

    def init(self):
        self.initialized = True
        for fn in self.queued:
            fn()


class FakeProcess:
    def memory_info(self):
        return type("Info", (), {"rss": 12345})


def test_step_memory_reports_peaks_per_step_and_resets_them():
    cuda = FakeCuda()
    memory = StepMemory(cuda=cuda, process=FakeProcess())
    assert memory.take() == {"cuda_peak_allocated_bytes": 100, "cuda_peak_reserved_bytes": 200,
                             "cuda_total_bytes": 1000}
    assert memory.take()["cuda_peak_allocated_bytes"] == 300
    assert cuda.resets == [1, 1]
    assert memory.rss() == 12345


def test_step_memory_leaves_cuda_alone_until_the_script_initialises_it():
    cuda = FakeCuda(initialized=False)
    assert StepMemory(cuda=cuda, process=FakeProcess()).take() == {}
    assert cuda.resets == []
    real = StepMemory()  # this machine: no CUDA in use, RSS from /proc/self/statm
    import psutil

    assert real.take() == {}
    assert abs(real.rss() - psutil.Process().memory_info().rss) < 5_000_000


def _snapshots(tmp_path, cuda, record_history, step=lambda: 3):
    errors = []
    observers = []
    snaps = MemorySnapshots(str(tmp_path), 2, record_history, step, cuda=cuda,
                            attach_oom_observer=observers.append)
    snaps.on_failure = lambda part: errors.append((part.name, part.error))
    return snaps, errors, observers


def test_memory_history_and_oom_observer_wait_for_cuda_then_dump_once(tmp_path):
    import pickle

    cuda = FakeCuda(initialized=False)
    snaps, errors, observers = _snapshots(tmp_path, cuda, record_history=True)
    snaps.start()
    assert cuda.history_calls == [] and observers == []  # nothing touches CUDA before the script
    cuda.init()
    assert cuda.history_calls == [{"max_entries": 100_000}] and len(observers) == 1
    observers[0](0, 1 << 30, 0, 0)  # the allocator reports an OOM
    observers[0](0, 1 << 30, 0, 0)  # ... and another, caught by the script: no second dump
    oom_file = tmp_path / "rank2.step3.memory_snapshot.pickle"
    assert pickle.loads(oom_file.read_bytes())["n"] == 1
    assert cuda.snapshots_taken == 1
    snaps.current_step = lambda: 7
    snaps.finish()
    assert pickle.loads((tmp_path / "rank2.step7.memory_snapshot.pickle").read_bytes())["n"] == 2
    assert cuda.history_calls[-1] == {"enabled": None}
    assert snaps.bytes_written == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert errors == [] and not list(tmp_path.glob("*.tmp"))


def test_uncaught_oom_is_dumped_without_history_and_other_errors_are_not(tmp_path):
    cuda = FakeCuda()
    snaps, errors, observers = _snapshots(tmp_path, cuda, record_history=False)
    snaps.on_script_exception(ValueError("not memory"))
    assert list(tmp_path.iterdir()) == []
    snaps.on_script_exception(FakeCuda.OutOfMemoryError("CUDA out of memory"))
    assert [p.name for p in tmp_path.iterdir()] == ["rank2.step3.memory_snapshot.pickle"]
    snaps.finish()  # no --memory-snapshot: no end-of-run dump
    assert len(list(tmp_path.iterdir())) == 1


def test_snapshot_write_failure_is_reported_once(tmp_path):
    cuda = FakeCuda()
    snaps, errors, _ = _snapshots(tmp_path / "gone", cuda, record_history=False)
    assert snaps.dump() is None and snaps.dump() is None
    assert len(errors) == 1 and errors[0][0] == "memory_snapshot"
    assert "No such file or directory" in errors[0][1]


def test_device_name_comes_from_nvml_for_the_visible_device(monkeypatch):
    import sys
    import types

    from tracer.session.manifest import _device_name

    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda index: f"handle{index}",
        nvmlDeviceGetName=lambda handle: {"handle5": b"NVIDIA H200"}[handle])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _device_name(1) == "NVIDIA H200"  # CUDA device 1 is physical GPU 5
    assert calls == ["init", "shutdown"]
    assert _device_name(2) is None  # not visible: no name, no exception


def test_profiler_asks_for_cuda_activity_only_with_a_gpu(tmp_path, monkeypatch):
    import torch.profiler as tp

    from tracer.probes.profiler import ProfilerDriver

    seen = []

    class Recorder:
        def __init__(self, **kwargs):
            seen.append(kwargs["activities"])

        def start(self):
            pass

    monkeypatch.setattr(tp, "profile", Recorder)
    due_now = TracerConfig(skip_first=0, wait=0)  # the window starts with the first step
    for use_cuda in (False, True):
        ProfilerDriver(due_now, str(tmp_path), 0, use_cuda).start()
    assert seen == [[tp.ProfilerActivity.CPU], [tp.ProfilerActivity.CPU, tp.ProfilerActivity.CUDA]]


def test_profiler_exists_only_around_its_windows(tmp_path):
    from tracer.probes.profiler import ProfilerDriver

    driver = ProfilerDriver(TracerConfig(skip_first=2, wait=1, warmup=1, active=2, repeat=2),
                            str(tmp_path), 3, use_cuda=False)
    driver.start()
    timeline = []
    for _ in range(14):
        timeline.append((driver._profile is not None, driver.recording))
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        driver.step()
    driver.stop()
    # skip 0-1; cycles of wait, warmup, active, active: 2-5 and 6-9; then idle.
    idle, busy = (False, False), (True, True)
    assert timeline == [idle] * 3 + [busy] * 3 + [idle] + [busy] * 3 + [idle] * 4
    traces = sorted(p.name for p in tmp_path.iterdir())
    assert len(traces) == driver.windows == 2 and all(n.startswith("rank3.") for n in traces)
    steps_in = [sorted(e["name"] for e in load_trace(tmp_path / n)["traceEvents"]
                       if e.get("name", "").startswith("ProfilerStep#")) for n in traces]
    assert steps_in == [["ProfilerStep#4", "ProfilerStep#5"], ["ProfilerStep#8", "ProfilerStep#9"]]


def test_comms_writer_gives_each_steps_algbw_once(tmp_path):
    from tracer.parts.record_files import CommsWriter

    writer = CommsWriter(str(tmp_path / "c.jsonl"), "comms")
    for step, nbytes, us in ((0, 5, 1.0), (1, 1_000_000, 500.0), (1, 3_000_000, 1500.0),
                             (2, 2_000_000, 100.0)):
        writer.write(schema.CommRecord(step=step, op="all_reduce", source="c10d", pg="0",
                                       pg_size=2, dtype="float32", bytes=nbytes, start_ns=0,
                                       end_ns=1, duration_us=us, timing="host", algbw_gbps=0,
                                       busbw_gbps=0))
    assert writer.take_algbw(1) == pytest.approx(2.0)  # 4 MB in 2 ms
    assert writer.take_algbw(1) is None and writer.take_algbw(0) is None  # taken, forgotten
    assert writer.take_algbw(2) == pytest.approx(20.0)
    writer.close()
    assert len(read_jsonl(tmp_path / "c.jsonl")) == 4


def test_a_part_fails_once_with_one_line_naming_its_rank_and_tells_the_session(capsys):
    import logging

    from tracer.parts.part import Part

    root = logging.getLogger()
    handler = logging.StreamHandler()  # a script's own logging set-up doubles nothing
    root.addHandler(handler)
    told = []
    part = Part()
    part.name, part.rank, part.on_failure = "sampler", 3, told.append
    try:
        assert part.fail("first failure") and not part.fail("second failure")
    finally:
        root.removeHandler(handler)
    assert part.failed and part.error == "first failure" and told == [part]
    assert capsys.readouterr().err == "ranktrace: rank3 sampler: first failure\n"


# ---- the registry and the session's loops over it -------------------------------------------
@pytest.fixture
def session_in_process(tmp_path, monkeypatch):
    """open(entries, **options): a Session of this process over `entries` (default: the real
    registry), every optional part off unless `options` says otherwise; its worker makes no
    pass of its own, so that the closer's last pass writes every step record."""
    from tracer.parts import log
    from tracer.session.rank_session import Session
    from tracer.session.run_folder import LaunchInfo
    from tracer.steps import step_worker

    monkeypatch.setattr(step_worker, "PERIOD_S", 3600.0)
    opened = []

    def open_session(entries=None, **options):
        if entries is not None:
            monkeypatch.setattr(part_registry, "REGISTRY", list(entries))
        off = dict(no_profiler=True, no_sampler=True, no_comms=True, no_scalars=True)
        config = TracerConfig(out=str(tmp_path), run_name="run", **{**off, **options})
        session = Session(config, "train.py", [], LaunchInfo())
        session.open()
        opened.append(session)
        return session

    yield open_session
    for session in opened:
        session.close("ok", 0)  # a no-op for a test's closed session; undoes the hooks if not
    log.set_rank(None)


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
    assert [e.name for e in entries if e.starts_last] == ["profiler"]
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
