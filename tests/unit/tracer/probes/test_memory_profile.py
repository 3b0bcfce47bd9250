"""The memory categories of a profiler window (tracer.probes.memory_profile): torch's memory
profiler on a real window of a small model, the peak of a timeline built by hand, and the
writer's record and failure."""

from __future__ import annotations

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from tracer import schema
from tracer.probes.memory_profile import (
    MemoryProfileWriter,
    category_name,
    peak_of_timeline,
    window_record,
)

WIDTH = 64


def _mlp_window(optimizer_kind, active=2, **profiler_options):
    """A finished torch.profiler window over `active` steps of a 3-layer MLP (after 2 steps
    untraced) and the model's parameter count."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                          nn.Linear(WIDTH, WIDTH))
    optimizer = optimizer_kind(model.parameters(), lr=1e-3)
    batch = torch.randn(8, WIDTH)
    windows = []
    options = {"record_shapes": True, "profile_memory": True, "with_stack": True,
               **profiler_options}
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=windows.append,
                 schedule=schedule(skip_first=2, wait=0, warmup=0, active=active, repeat=1),
                 **options) as prof:
        for _ in range(2 + active):
            optimizer.zero_grad()
            model(batch).square().mean().backward()
            optimizer.step()
            prof.step()
    return windows[0], sum(p.numel() for p in model.parameters())


def test_parameters_at_the_peak_are_the_modules_parameters_under_adam():
    window, parameters = _mlp_window(torch.optim.Adam, active=3)
    record = window_record(window, rank=1, device="cpu")
    # torch's own data-flow guess adds Adam's sqrt() temporaries to these (one 64x64 float
    # tensor more at the peak); the Python tracer's parameters are exact.
    assert record.categories["parameter"] == 4 * parameters
    assert record.categories["optimizer_state"] >= 2 * 4 * parameters  # exp_avg, exp_avg_sq
    assert record.categories["gradient"] == 4 * parameters
    assert sum(record.categories.values()) == record.peak_bytes
    assert list(record.categories) == list(schema.MEMORY_CATEGORIES)
    assert (record.rank, record.device, record.first_step, record.last_step) == (1, "cpu", 2, 4)
    assert record.peak_step in (2, 3, 4)


def test_sgd_with_momentum_keeps_one_state_tensor_per_parameter():
    window, parameters = _mlp_window(lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9))
    record = window_record(window, rank=0, device="cpu")
    assert record.categories["parameter"] == 4 * parameters
    assert record.categories["optimizer_state"] == 4 * parameters


def test_category_names_fold_autograd_details_and_unknown_tensors_into_other():
    from torch.profiler._memory_profiler import Category

    assert [category_name(c) for c in Category] == [
        "input", "temporary", "activation", "gradient", "other", "parameter", "optimizer_state"]
    assert category_name(None) == "other"


def test_peak_of_a_timeline_counts_creations_versions_and_frees():
    from torch.profiler._memory_profiler import Action, Key

    cpu = Key(torch.device("cpu"))
    gpu = Key(torch.device("cuda", 0))
    kinds = {(cpu, 0): "parameter", (cpu, 1): "activation", (gpu, 0): "gradient"}
    timeline = [(-1, Action.PREEXISTING, (cpu, 0), 100),
                (5, Action.CREATE, (gpu, 0), 10_000),  # another device: left out
                (10, Action.CREATE, (cpu, 0), 50),
                (20, Action.INCREMENT_VERSION, (cpu, 0), 50),  # 50 bytes become version 1
                (30, Action.DESTROY, (cpu, 1), 50),
                (40, Action.CREATE, (cpu, 0), 20)]
    peak, t, sizes = peak_of_timeline(timeline, lambda key, version: kinds[(key, version)],
                                      torch.device("cpu"))
    assert (peak, t) == (150, 10)
    assert sizes["parameter"] == 150 and sizes["activation"] == 0


class _Profiler:
    window_listeners: list

    def __init__(self):
        self.window_listeners = []


def test_writer_records_each_window_and_a_failure_switches_only_it_off(tmp_path):
    profiler = _Profiler()
    path = tmp_path / "rank0.memory.jsonl"
    writer = MemoryProfileWriter(str(path), 0, False, {"profiler": profiler}.get)
    failures = []
    writer.on_failure = failures.append
    writer.start()
    assert profiler.window_listeners == [writer.on_window]
    window, parameters = _mlp_window(torch.optim.SGD, active=1)
    writer.on_window(window)
    writer.on_window(object())  # not a profile: torch's profiler cannot read it
    writer.close()
    [record] = [schema.decoder(schema.MemoryProfileRecord).decode(line)
                for line in path.read_bytes().splitlines()]
    assert record.categories["parameter"] == 4 * parameters
    assert failures == [writer] and "torch's memory profiler failed" in writer.error


def test_windows_1_2_4_8_are_analysed_and_the_others_left(tmp_path, monkeypatch):
    from tracer.probes import memory_profile

    analysed = []
    monkeypatch.setattr(memory_profile, "window_record",
                        lambda profile, rank, device: analysed.append(profile))
    writer = MemoryProfileWriter(str(tmp_path / "rank0.memory.jsonl"), 0, False, {}.get)
    for window in range(1, 11):
        writer.on_window(window)
    writer.close()
    assert analysed == [1, 2, 4, 8]
