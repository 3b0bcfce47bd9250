"""The profiler driver (tracer.probes.profiler): CUDA activity only with a GPU, and a
torch.profiler object only around its windows, each window one trace of its steps."""

from __future__ import annotations

import torch
import torch.profiler as tp

from helpers.tracer_files import load_trace
from tracer.options.config import TracerConfig
from tracer.probes.profiler import ProfilerDriver


def test_profiler_asks_for_cuda_activity_only_with_a_gpu(tmp_path, monkeypatch):
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
    driver = ProfilerDriver(TracerConfig(skip_first=2, wait=1, warmup=1, active=2, windows=2),
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
