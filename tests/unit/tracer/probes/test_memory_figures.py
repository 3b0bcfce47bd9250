"""Memory per step and CUDA memory snapshots (tracer.probes.memory) with a scripted stand-in for
torch.cuda: peaks reset every step, nothing touched before the script initialises CUDA, RSS
readings matched to the steps by time, one dump per out-of-memory error, a write failure
reported once."""

from __future__ import annotations

from tracer import schema
from tracer.probes.memory import MAX_RSS_READINGS, HostStepMemory, MemorySnapshots, StepMemory

MIB = 1 << 20
# One 20 MiB segment as torch.cuda.memory._snapshot() gives it with history on: a 12 MiB tensor
# allocated from the script (a Python frame under C++ ones), 8 MiB cached free.
SEGMENT = {
    "device": 1, "address": 0x7F0000000000, "total_size": 20 * MIB,
    "allocated_size": 12 * MIB, "active_size": 12 * MIB, "requested_size": 12 * MIB - 100,
    "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
    "frames": [],
    "blocks": [
        {"address": 0x7F0000000000, "size": 12 * MIB, "requested_size": 12 * MIB - 100,
         "state": "active_allocated",
         "frames": [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator"},
                    {"filename": "/home/u/train.py", "line": 42, "name": "forward"},
                    {"filename": "/home/u/train.py", "line": 90, "name": "main"}]},
        {"address": 0x7F0000C00000, "size": 8 * MIB, "requested_size": 0, "state": "inactive",
         "frames": []}],
}


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
                return {"segments": [SEGMENT], "device_traces": [[]], "n": fake.snapshots_taken}

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
    """psutil.Process's memory_info() with an RSS the test sets."""

    def __init__(self, rss=12345):
        self.rss = rss

    def memory_info(self):
        return type("Info", (), {"rss": self.rss})


def test_step_memory_reports_peaks_per_step_and_resets_them():
    cuda = FakeCuda()
    memory = StepMemory(cuda=cuda, process=FakeProcess())
    assert memory.take() == {"cuda_peak_allocated_bytes": 100, "cuda_peak_reserved_bytes": 200,
                             "cuda_total_bytes": 1000}
    assert memory.take()["cuda_peak_allocated_bytes"] == 300
    assert cuda.resets == [1, 1]
    assert memory.rss() == 12345


def test_step_memory_without_cuda_does_nothing_at_a_step_end():
    from tracer.options.config import TracerConfig
    from tracer.parts.part import Part
    from tracer.probes.memory import open_step_memory

    class Setup:
        def __init__(self, use_cuda):
            self.use_cuda = use_cuda
            self.config = TracerConfig()

        def build(self, cls, *args):
            return cls(*args)

    host = open_step_memory(Setup(use_cuda=False))
    # The session calls only the hooks a part overrides: none on the training thread here.
    assert type(host).step_fields is Part.step_fields
    gpu = open_step_memory(Setup(use_cuda=True))
    assert type(gpu).step_fields is StepMemory.step_fields
    assert "rss_bytes" not in gpu.step_fields()  # RSS is never read on the training thread


def test_step_memory_leaves_cuda_alone_until_the_script_initialises_it():
    cuda = FakeCuda(initialized=False)
    assert StepMemory(cuda=cuda, process=FakeProcess()).take() == {}
    assert cuda.resets == []
    real = StepMemory()  # this machine: no CUDA in use, RSS from /proc/self/statm
    import psutil

    assert real.take() == {}
    assert abs(real.rss() - psutil.Process().memory_info().rss) < 5_000_000


class Clock:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def _host_memory():
    process, clock = FakeProcess(), Clock()
    return HostStepMemory(process=process, clock=clock), process, clock


def _pass(memory, process, clock, t_ns, rss):
    clock.now, process.rss = t_ns, rss
    memory.on_worker_pass()


def _amended(memory, end_ns):
    record = schema.StepRecord(step=0, start_ns=end_ns - 5, end_ns=end_ns)
    memory.amend_step_record(record)
    return record.rss_bytes, record.rss_t_ns


def test_each_step_gets_the_last_rss_reading_taken_by_its_end():
    memory, process, clock = _host_memory()
    _pass(memory, process, clock, 1000, 100)
    memory.on_sample(schema.DeviceSample(t_ns=1100, source="psutil", rss_bytes=110), step=3)
    memory.on_sample(schema.DeviceSample(t_ns=1300, source="psutil", rss_bytes=130), step=5)
    _pass(memory, process, clock, 1200, 120)  # the samples came in after this pass's reading
    # a step that ends before the first reading gets it; then the last reading by each end,
    # never a later one (the script may be freeing its memory after its last step)
    assert [_amended(memory, end) for end in (990, 1000, 1060, 1199, 1240, 1400)] == [
        (100, 1000), (100, 1000), (100, 1000), (110, 1100), (120, 1200), (130, 1300)]


def test_step_records_wait_until_the_readings_around_their_end_are_in():
    memory, process, clock = _host_memory()
    assert memory.steps_known_until() == 0  # before any pass: every record waits
    _pass(memory, process, clock, 1000, 100)
    assert memory.steps_known_until() == 0  # the samples up to this pass come at its end
    _pass(memory, process, clock, 1200, 120)
    assert memory.steps_known_until() == 1000
    _pass(memory, process, clock, 1400, 140)
    assert memory.steps_known_until() == 1200


def test_a_sample_without_rss_adds_no_reading_and_nvml_runs_read_on_passes_only():
    memory, process, clock = _host_memory()
    memory.on_sample(schema.DeviceSample(t_ns=500, source="nvml", mem_used_bytes=7), step=0)
    assert _amended(memory, 500) == (None, None)  # no reading at all: the fields stay absent
    _pass(memory, process, clock, 800, 80)
    assert _amended(memory, 500) == (80, 800)  # before the first reading: that one


def test_rss_readings_are_bounded_and_consumed_by_the_steps():
    memory, process, clock = _host_memory()
    for n in range(MAX_RSS_READINGS + 10):
        memory.add_reading(n * 10, n)
    assert len(memory._readings) == MAX_RSS_READINGS
    assert _amended(memory, 20_005) == (2000, 20_000)
    assert memory._readings[0] == (20_000, 2000)  # earlier readings serve no later step


def test_step_memory_without_rss_reader_neither_waits_nor_amends():
    memory = HostStepMemory(process=FakeProcess())
    memory._rss = None  # a platform where neither /proc nor psutil works
    memory.on_worker_pass()
    assert memory.steps_known_until() is None
    assert _amended(memory, 10) == (None, None)


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
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rank2.step3.memory_snapshot.jsonl", "rank2.step3.memory_snapshot.pickle"]
    snaps.finish()  # no --memory-snapshot: no end-of-run dump
    assert len(list(tmp_path.iterdir())) == 2


def test_oom_snapshot_is_also_written_as_a_record_read_without_unpickling(tmp_path):
    from tracer import schema

    cuda = FakeCuda()
    snaps, errors, observers = _snapshots(tmp_path, cuda, record_history=False)
    snaps.start()
    observers[0](1, 64 * MIB, 12 * MIB, 3 * MIB)  # asked 64 MiB with 12 allocated, 3 free
    path = tmp_path / "rank2.step3.memory_snapshot.jsonl"
    record = schema.decoder(schema.MemorySnapshotRecord).decode(path.read_bytes())
    assert (record.rank, record.step, record.reason, record.device_total_bytes) == (
        2, 3, "oom", 1000)
    assert record.oom == schema.OutOfMemory(device=1, requested_bytes=64 * MIB,
                                            device_allocated_bytes=12 * MIB,
                                            device_free_bytes=3 * MIB)
    [segment] = record.segments
    assert (segment.total_size, segment.allocated_size, segment.segment_type) == (
        20 * MIB, 12 * MIB, "large")
    live, cached = segment.blocks
    assert (live.size, live.requested_size, live.state) == (12 * MIB, 12 * MIB - 100,
                                                            "active_allocated")
    # Python frames only, innermost first; the C++ frame is counted as left out
    assert [(f.file, f.line, f.function) for f in live.frames] == [
        ("/home/u/train.py", 42, "forward"), ("/home/u/train.py", 90, "main")]
    assert record.frames_dropped == 1
    assert (cached.state, cached.frames) == ("inactive", [])
    assert snaps.bytes_written == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert errors == []


def test_snapshot_write_failure_is_reported_once(tmp_path):
    cuda = FakeCuda()
    snaps, errors, _ = _snapshots(tmp_path / "gone", cuda, record_history=False)
    assert snaps.dump() is None and snaps.dump() is None
    assert len(errors) == 1 and errors[0][0] == "memory_snapshot"
    assert "No such file or directory" in errors[0][1]
