"""Memory per step and CUDA memory snapshots (tracer.probes.memory) with a scripted stand-in for
torch.cuda: peaks reset every step, nothing touched before the script initialises CUDA, one dump
per out-of-memory error, a write failure reported once."""

from __future__ import annotations

from tracer.probes.memory import MemorySnapshots, StepMemory


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


def test_step_memory_without_cuda_does_nothing_at_a_step_end():
    from tracer.parts.part import Part
    from tracer.probes.memory import open_step_memory

    class Setup:
        def __init__(self, use_cuda):
            self.use_cuda = use_cuda

        def build(self, cls, *args):
            return cls(*args)

    host = open_step_memory(Setup(use_cuda=False))
    # The session calls only the hooks a part overrides: none on the training thread here.
    assert type(host).step_fields is Part.step_fields
    assert host.pass_fields()["rss_bytes"] > 0
    assert type(open_step_memory(Setup(use_cuda=True))).step_fields is StepMemory.step_fields


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
