"""Helpers of the tracer.comms tests: a recorder writing to a file or to a list, and scenarios run
on a group of gloo CPU ranks started with torch.multiprocessing, each rank writing what it saw to
a JSON file (tests/integration/: test_comms_records_on_ranks.py,
test_ddp_gradients_unchanged_by_bucket_hook.py, test_comms_recorder.py;
tests/unit/tracer/comms/)."""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from tracer import schema
from tracer.comms import CommsRecorder
from tracer.parts.record_files import JsonlWriter
from workloads.common import cleanup

SPAWN_DEADLINE_S = 240


class ListWriter:
    """A comms writer that keeps the records it is given, in `records`."""

    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


class StepCounter:
    def __init__(self):
        self.value = 0

    def __call__(self):
        return self.value


def read_records(path):
    decoder = schema.decoder(schema.CommRecord)
    with open(path, "rb") as f:
        return [decoder.decode(line) for line in f if line.strip()]


def record_dict(record):
    return {f: getattr(record, f) for f in record.__struct_fields__}


def start_recorder(folder, rank, tag, **kwargs):
    writer = JsonlWriter(os.path.join(folder, f"{tag}.rank{rank}.comms.jsonl"), "comms")
    step = StepCounter()
    recorder = CommsRecorder(writer, step, use_cuda=False, **kwargs)
    recorder.install()
    return recorder, writer, step


def finish_recorder(recorder, writer):
    recorder.drain(wait=True)
    recorder.uninstall()
    writer.close()
    return [record_dict(r) for r in read_records(writer.path)]


def run_ranks(world_size, scenarios, folder=None, timeout_s=SPAWN_DEADLINE_S):
    """Runs `scenarios` ({name: function(rank, world, folder)}, module-level functions) in order
    on `world_size` gloo ranks; returns {rank: {scenario: result}}."""
    folder = str(folder) if folder is not None else tempfile.mkdtemp(prefix="ranktrace-comms-")
    context = mp.start_processes(_rank_main, args=(world_size, folder, scenarios),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {timeout_s}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    results = {}
    for rank in range(world_size):
        with open(os.path.join(folder, f"results.rank{rank}.json")) as f:
            results[rank] = json.load(f)
    return results


def _rank_main(rank, world_size, folder, scenarios):
    torch.manual_seed(1234)
    store = dist.FileStore(os.path.join(folder, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    results = {}
    try:
        for name, scenario in scenarios.items():
            started = time.perf_counter()
            try:
                results[name] = {"ok": scenario(rank, world_size, folder)}
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            results[name]["seconds"] = time.perf_counter() - started
            dist.barrier()
    finally:
        with open(os.path.join(folder, f"results.rank{rank}.json"), "w") as f:
            json.dump(results, f)
        # the workloads' own ending: a DDP scenario's reference cycles are collected before the
        # group is destroyed, or a gloo thread left to interpreter shutdown aborts the rank
        cleanup()


def scenario_result(results, name, rank):
    outcome = results[rank][name]
    assert "error" not in outcome, f"rank {rank} scenario {name} failed:\n{outcome['error']}"
    return outcome["ok"]



class ToyNet(nn.Module):
    """Biased layers and an optionally unused branch, for bit-identity runs."""

    def __init__(self, with_unused=False):
        super().__init__()
        self.fc1 = nn.Linear(13, 31)
        self.fc2 = nn.Linear(31, 17)
        self.head = nn.Linear(17, 5)
        self.unused = nn.Linear(5, 5) if with_unused else None

    def forward(self, x):
        return self.head(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


