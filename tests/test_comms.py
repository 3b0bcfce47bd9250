"""Tests of tracer.comms: records of every way an op is issued, DDP bit-identity, fallbacks.

Multi-rank checks run each scenario once in a group of gloo CPU ranks started with
torch.multiprocessing (one group of 2 ranks and one of 3 for the whole module); every rank
writes what it saw to a JSON file and the tests below assert on it. Single-process checks use
a 1-rank gloo group in the pytest process.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from tracer import schema
from tracer.comms import CommsRecorder
from tracer.jsonl import JsonlWriter

F32 = 4  # bytes per float32 element
SPAWN_DEADLINE_S = 240


# ---- helpers shared by ranks and tests ----------------------------------------------------------
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


def run_ranks(world_size, scenario_names, folder=None, timeout_s=SPAWN_DEADLINE_S):
    """Runs `scenario_names` in order on `world_size` gloo ranks; returns {rank: {scenario: result}}."""
    folder = str(folder) if folder is not None else tempfile.mkdtemp(prefix="ranktrace-comms-")
    context = mp.start_processes(_rank_main, args=(world_size, folder, scenario_names),
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


def _rank_main(rank, world_size, folder, scenario_names):
    torch.manual_seed(1234)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), world_size),
                            rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    results = {}
    try:
        for name in scenario_names:
            started = time.perf_counter()
            try:
                results[name] = {"ok": SCENARIOS[name](rank, world_size, folder)}
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            results[name]["seconds"] = time.perf_counter() - started
            dist.barrier()
    finally:
        with open(os.path.join(folder, f"results.rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


def scenario_result(results, name, rank):
    outcome = results[rank][name]
    assert "error" not in outcome, f"rank {rank} scenario {name} failed:\n{outcome['error']}"
    return outcome["ok"]


# ---- 2-rank scenarios ---------------------------------------------------------------------------
def scenario_c10d(rank, world, folder):
    recorder, writer, step = start_recorder(folder, rank, "c10d")
    peer = 1 - rank
    x = torch.arange(15, dtype=torch.float32).reshape(3, 5) + rank
    dist.all_reduce(x)                                                         # 60 B
    step.value = 1
    dist.all_reduce(torch.ones(7, dtype=torch.float64), async_op=True).wait()  # 56 B async
    dist.all_gather([torch.empty(6) for _ in range(world)], torch.ones(6))     # out 2*24 B
    dist.all_gather_into_tensor(torch.empty(world * 4), torch.ones(4))         # out 32 B
    dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world))          # in 24 B
    dist.reduce_scatter(torch.empty(5), [torch.ones(5) for _ in range(world)])  # in 40 B
    dist.broadcast(torch.ones(9, dtype=torch.int32), src=0)                    # 36 B
    dist.reduce(torch.ones(11), dst=1)                                         # 44 B
    dist.all_to_all_single(torch.empty(8), torch.ones(8))                      # in 32 B
    dist.all_to_all([torch.empty(2) for _ in range(world)], [torch.ones(2) for _ in range(world)])  # in 16 B
    dist.gather(torch.ones(3), [torch.empty(3) for _ in range(world)] if rank == 0 else None, dst=0)  # 2*12 B
    dist.scatter(torch.empty(2), [torch.ones(2) for _ in range(world)] if rank == 0 else None, src=0)  # 2*8 B
    step.value = 2
    payload = torch.full((10,), float(rank), dtype=torch.float16)            # 20 B
    if rank == 0:
        dist.send(payload, dst=peer)
        work = dist.irecv(torch.empty(12, dtype=torch.bfloat16), src=peer)     # 24 B
        work.wait()
    else:
        dist.recv(torch.empty(10, dtype=torch.float16), src=peer)
        dist.isend(torch.ones(12, dtype=torch.bfloat16), dst=peer).wait()
    ops = [dist.P2POp(dist.isend, torch.ones(13), peer),                     # 52 B
           dist.P2POp(dist.irecv, torch.empty(13), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    with dist.distributed_c10d._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(torch.ones(3))
        dist.all_reduce(torch.ones(5))                                         # 12 B + 20 B
    cm.wait()
    dist.barrier()
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    counts = {"ops": recorder.ops, "bytes": recorder.bytes}
    records = finish_recorder(recorder, writer)
    return {"records": records, "counts": counts, "error": recorder.error, "gathered": gathered,
            "received_ok": True}


class BiasFreeMLP(nn.Module):
    """Weights of 512, 2048, 3072 and 960 bytes: each one fills its own small bucket."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16, bias=False)   # 128 elements
        self.b = nn.Linear(16, 32, bias=False)  # 512
        self.c = nn.Linear(32, 24, bias=False)  # 768
        self.d = nn.Linear(24, 10, bias=False)  # 240

    def forward(self, x):
        return self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))


class WideMLP(nn.Module):
    """Three 512 KiB weights, for DDP's default 1 MiB first bucket."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 256, bias=False),
                                    nn.Linear(256, 512, bias=False))

    def forward(self, x):
        return self.layers(x)


def scenario_ddp_buckets(rank, world, folder):
    from torch.nn.parallel import DistributedDataParallel as DDP
    recorder, writer, step = start_recorder(folder, rank, "ddp_buckets", ddp_bucket_hook=True)
    torch.manual_seed(0)
    small = DDP(BiasFreeMLP(), bucket_cap_mb=256 / 2**20)  # 256 B cap: one weight per bucket
    for i in range(3):
        step.value = i
        small(torch.randn(4, 8)).sum().backward()
    torch.manual_seed(0)
    wide = DDP(WideMLP())  # default caps: 1 MiB first bucket, then 25 MiB
    for i in range(3, 5):
        step.value = i
        wide(torch.randn(2, 256)).sum().backward()
    records = finish_recorder(recorder, writer)
    return {"records": records, "error": recorder.error,
            "first_bucket_bytes": dist._DEFAULT_FIRST_BUCKET_BYTES}


def scenario_ddp_user_hooks(rank, world, folder):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    recorder, writer, step = start_recorder(folder, rank, "ddp_user_hooks",
                                             ddp_bucket_hook=True)
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.buffer().nbytes)
        return default_hooks.allreduce_hook(state, bucket)

    torch.manual_seed(0)
    early = DDP(BiasFreeMLP(), bucket_cap_mb=256 / 2**20)
    early.register_comm_hook(None, counting_hook)  # before the first forward
    torch.manual_seed(0)
    late = DDP(BiasFreeMLP(), bucket_cap_mb=256 / 2**20)
    late(torch.randn(2, 8)).sum().backward()       # our default hook reduces this one
    late.register_comm_hook(None, counting_hook)   # our hook hands its slot over
    calls_before = len(calls)
    late(torch.randn(2, 8)).sum().backward()
    calls_late = len(calls) - calls_before
    second_register_error = None
    try:
        late.register_comm_hook(None, counting_hook)
    except Exception as exc:
        second_register_error = type(exc).__name__ + ": " + str(exc)
    torch.manual_seed(0)
    builtin = DDP(BiasFreeMLP())
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    step.value = 7
    early(torch.randn(2, 8)).sum().backward()
    builtin(torch.randn(2, 8)).sum().backward()
    records = finish_recorder(recorder, writer)
    return {"records": records, "error": recorder.error, "calls": calls, "calls_late": calls_late,
            "second_register_error": second_register_error}


def scenario_dtensor(rank, world, folder):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    recorder, writer, step = start_recorder(folder, rank, "dtensor")
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 6))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    step.value = 1
    x = torch.randn(4, 8, requires_grad=True)
    out = model(x)
    out.sum().backward()
    step.value = 2
    out = model(x)
    out.sum().backward()
    records = finish_recorder(recorder, writer)
    return {"records": records, "error": recorder.error, "out_shape": list(out.shape),
            "x_grad_finite": bool(torch.isfinite(x.grad).all())}


def scenario_pipeline(rank, world, folder):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    recorder, writer, step = start_recorder(folder, rank, "pipeline")
    torch.manual_seed(rank)
    stage = PipelineStage(nn.Linear(8, 8), stage_index=rank, num_stages=world, device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x = torch.randn(6, 8)
    target = torch.randn(6, 8)
    for i in range(2):
        step.value = i
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=target, losses=losses)
    records = finish_recorder(recorder, writer)
    return {"records": records, "error": recorder.error}


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


SMALL_BUCKETS = 600 / 2**20  # bucket_cap_mb that splits ToyNet into several buckets

IDENTITY_CONFIGS = {
    "default": dict(),
    "no_sync_small_buckets": dict(ddp=dict(bucket_cap_mb=SMALL_BUCKETS), accum=3),
    # Gradients stay bucket views across steps: DDP divides them in place instead of multiplying.
    "bucket_view_keep_grads": dict(ddp=dict(gradient_as_bucket_view=True, bucket_cap_mb=SMALL_BUCKETS),
                                   set_to_none=False, accum=2),
    "bucket_view_set_to_none": dict(ddp=dict(gradient_as_bucket_view=True), set_to_none=True),
    "batched_grad_copy": dict(ddp=dict(batched_grad_copy=True, gradient_as_bucket_view=True), set_to_none=False),
    "static_graph": dict(ddp=dict(static_graph=True)),
    "find_unused": dict(ddp=dict(find_unused_parameters=True), unused=True),
    "amp_bf16": dict(amp=True, accum=2),
}


def train_for_identity(config, rank, recorder=None, hook=None, mode_override=None):
    """Two optimizer steps (the second runs on DDP's rebuilt buckets); returns every step's
    gradients and the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    net = ToyNet(with_unused=config.get("unused", False))
    model = DDP(net, **config.get("ddp", {}))
    if hook is not None:
        model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(100 + rank)
    accum = config.get("accum", 1)
    grads = []
    for step in range(2):
        optimizer.zero_grad(set_to_none=config.get("set_to_none", True))
        for micro in range(accum):
            x = torch.randn(7, 13, generator=generator) * 3.7
            last = micro == accum - 1
            with nullcontext() if last else model.no_sync():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.get("amp", False)):
                    loss = model(x).float().pow(2).mean() / accum
                if mode_override is not None:  # the hook exists once the first forward ran
                    recorder.ddp.default_reductions[model.reducer].mode = mode_override
                loss.backward()
        grads.append([p.grad.clone() if p.grad is not None else None for p in net.parameters()])
        optimizer.step()
    return grads, [p.detach().clone() for p in net.parameters()]


def compare_runs(a, b):
    """Number of gradient or parameter elements that differ in any bit."""
    (grads_a, params_a), (grads_b, params_b) = a, b
    mismatched = 0
    for step_a, step_b in zip(grads_a, grads_b):
        for ga, gb in zip(step_a, step_b):
            if ga is None or gb is None:
                mismatched += int((ga is None) != (gb is None))
                continue
            mismatched += int((ga.view(torch.int32) != gb.view(torch.int32)).sum())
    for pa, pb in zip(params_a, params_b):
        mismatched += int((pa.view(torch.int32) != pb.view(torch.int32)).sum())
    return mismatched


# Two ranks divide exactly (x * 0.5 == x / 2), so only a few configurations run there.
TWO_RANK_IDENTITY = ("default", "no_sync_small_buckets", "bucket_view_keep_grads", "amp_bf16")


def scenario_identity(rank, world, folder):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    out = {}
    baselines = {}
    for name in TWO_RANK_IDENTITY if world == 2 else tuple(IDENTITY_CONFIGS):
        config = IDENTITY_CONFIGS[name]
        baselines[name] = train_for_identity(config, rank)
        recorder, writer, step = start_recorder(folder, rank, f"identity_{name}",
                                                 ddp_bucket_hook=True)
        traced = train_for_identity(config, rank, recorder)
        records = finish_recorder(recorder, writer)
        out[name] = {"mismatched": compare_runs(baselines[name], traced), "error": recorder.error,
                     "ddp_records": sum(r["source"] == "ddp" and r["op"] == "all_reduce" for r in records)}
    if world == 2:
        return out
    # The comparison can fail: torch's own "same as no hook" allreduce_hook divides instead of
    # multiplying by 1/n, and a hook that always multiplies misses DDP's in-place division of
    # gradients that already are bucket views.
    out["allreduce_hook_mismatched"] = compare_runs(
        baselines["default"],
        train_for_identity(IDENTITY_CONFIGS["default"], rank, hook=default_hooks.allreduce_hook))
    recorder, writer, _ = start_recorder(folder, rank, "identity_always_multiply",
                                         ddp_bucket_hook=True)
    always_multiply = train_for_identity(IDENTITY_CONFIGS["bucket_view_keep_grads"], rank, recorder,
                                         mode_override="multiply")
    finish_recorder(recorder, writer)
    out["always_multiply_mismatched"] = compare_runs(baselines["bucket_view_keep_grads"], always_multiply)
    return out


SCENARIOS = {
    "c10d": scenario_c10d,
    "ddp_buckets": scenario_ddp_buckets,
    "ddp_user_hooks": scenario_ddp_user_hooks,
    "dtensor": scenario_dtensor,
    "pipeline": scenario_pipeline,
    "identity": scenario_identity,
}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(2, ["c10d", "ddp_buckets", "ddp_user_hooks", "dtensor", "pipeline", "identity"],
                     tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return run_ranks(3, ["identity"], tmp_path_factory.mktemp("three_ranks"))


# ---- 2-rank tests -------------------------------------------------------------------------------
EXPECTED_C10D = [  # (op, bytes, dtype, source, async_op, step) in issue order, for both ranks
    ("all_reduce", 60, "float32", "c10d", False, 0),
    ("all_reduce", 56, "float64", "c10d", True, 1),
    ("all_gather", 2 * 6 * F32, "float32", "c10d", False, 1),
    ("all_gather", 2 * 4 * F32, "float32", "c10d", False, 1),
    ("reduce_scatter", 2 * 3 * F32, "float32", "c10d", False, 1),
    ("reduce_scatter", 2 * 5 * F32, "float32", "c10d", False, 1),
    ("broadcast", 36, "int32", "c10d", False, 1),
    ("reduce", 44, "float32", "c10d", False, 1),
    ("all_to_all", 8 * F32, "float32", "c10d", False, 1),
    ("all_to_all", 2 * 2 * F32, "float32", "c10d", False, 1),
    ("gather", 2 * 3 * F32, "float32", "c10d", False, 1),
    ("scatter", 2 * 2 * F32, "float32", "c10d", False, 1),
]


def test_c10d_records_have_hand_computed_bytes(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "c10d", rank)
        assert result["error"] is None
        records = sorted(result["records"], key=lambda r: r["start_ns"])
        collectives = [r for r in records if r["source"] == "c10d" and r["op"] != "barrier"][:len(EXPECTED_C10D)]
        got = [(r["op"], r["bytes"], r["dtype"], r["source"], r["async_op"], r["step"]) for r in collectives]
        assert got == EXPECTED_C10D
        assert all(r["pg"] == "0" and r["pg_size"] == 2 and r["timing"] == "host" for r in collectives)
        barriers = [r for r in records if r["op"] == "barrier"]
        assert len(barriers) == 1 and barriers[0]["bytes"] == 0 and barriers[0]["busbw_gbps"] == 0.0


def test_p2p_records_bytes_and_peer(two_ranks):
    for rank in (0, 1):
        peer = 1 - rank
        records = sorted(scenario_result(two_ranks, "c10d", rank)["records"], key=lambda r: r["start_ns"])
        p2p = [(r["op"], r["bytes"], r["dtype"], r["peer"], r["async_op"], r["step"])
               for r in records if r["source"] == "p2p" and r["dtype"] != "int64" and r["dtype"] != "uint8"]
        if rank == 0:
            single = [("send", 20, "float16", peer, False, 2), ("recv", 24, "bfloat16", peer, True, 2)]
        else:
            single = [("recv", 20, "float16", peer, False, 2), ("send", 24, "bfloat16", peer, True, 2)]
        batch = [("send", 52, "float32", peer, True, 2), ("recv", 52, "float32", peer, True, 2)]
        assert p2p == single + batch


def test_coalesced_and_object_collectives_record_inner_tensor_ops(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "c10d", rank)
        assert result["gathered"] == [{"rank": 0}, {"rank": 1}]
        records = sorted(result["records"], key=lambda r: r["start_ns"])
        coalesced = [r for r in records if r["op"] == "all_reduce" and r["bytes"] in (12, 20)
                     and r["dtype"] == "float32"]
        assert [r["bytes"] for r in coalesced] == [12, 20]
        assert all(r["duration_us"] > 0 for r in coalesced)
        # all_gather_object: a size exchange (int64) then the pickled payload (uint8), all_gathered.
        after_barrier = records[[r["op"] for r in records].index("barrier") + 1:]
        assert [(r["op"], r["dtype"]) for r in after_barrier] == [("all_gather", "int64"), ("all_gather", "uint8")]
        assert after_barrier[0]["bytes"] == 2 * 8


def test_counters_match_records_and_bandwidth_formula(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "c10d", rank)
        records = result["records"]
        assert result["counts"]["ops"] == len(records)
        assert result["counts"]["bytes"] == sum(r["bytes"] for r in records)
        for r in records:
            assert r["end_ns"] - r["start_ns"] == pytest.approx(r["duration_us"] * 1e3, abs=1)
            seconds = r["duration_us"] / 1e6
            if r["bytes"] and seconds > 0:
                assert r["algbw_gbps"] == pytest.approx(r["bytes"] / seconds / 1e9, rel=1e-9)
                factor = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": 0.5, "reduce_scatter": 0.5,
                          "all_to_all": 0.5, "gather": 0.5, "scatter": 0.5}.get(r["op"], 1.0)
                assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor, rel=1e-9)


def test_ddp_bucket_records_match_bucket_sizes(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "ddp_buckets", rank)
        assert result["error"] is None
        records = sorted(result["records"], key=lambda r: r["start_ns"])  # the file is in completion order
        ddp = [r for r in records if r["source"] == "ddp" and r["op"] == "all_reduce"]
        assert all(r["pg_size"] == 2 and r["async_op"] and r["dtype"] == "float32" for r in ddp)
        by_step = {}
        for r in ddp:
            by_step.setdefault(r["step"], []).append(r["bytes"])
        weights = [16 * 8 * F32, 32 * 16 * F32, 24 * 32 * F32, 10 * 24 * F32]
        # First backward: DDP starts with one bucket; then it rebuilds in gradient order.
        assert by_step[0] == [sum(weights)]
        assert sorted(by_step[1]) == sorted(weights) and sorted(by_step[2]) == sorted(weights)
        assert by_step[1] == weights[::-1]  # the last layer's gradient is ready first
        # Default caps: 1 MiB first bucket holds two 512 KiB weights, the next bucket the third.
        first = result["first_bucket_bytes"]
        assert first == 2**20
        half_mib = 512 * 256 * F32
        assert by_step[3] == [3 * half_mib]
        assert by_step[4] == [first, half_mib]
        broadcasts = [r for r in records if r["op"] == "broadcast" and r["source"] == "ddp"]
        assert [r["bytes"] for r in broadcasts] == [sum(weights), 3 * half_mib]  # DDP's initial sync


def test_ddp_user_hooks_are_called_and_labelled(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "ddp_user_hooks", rank)
        assert result["error"] is None
        assert result["calls_late"] == 4  # four buckets after the rebuild, through the handed-over slot
        assert "can only be called once" in result["second_register_error"]
        at_seven = [r for r in result["records"] if r["step"] == 7 and r["op"] == "all_reduce"]
        assert all(r["source"] == "ddp" for r in at_seven)
        total = (16 * 8 + 32 * 16 + 24 * 32 + 10 * 24) * F32
        # `early` (user hook, first backward: one bucket) and `builtin` (ALLREDUCE twin, one bucket).
        assert sorted(r["bytes"] for r in at_seven) == [total, total]


def test_dtensor_functional_collectives_are_recorded(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "dtensor", rank)
        assert result["error"] is None and result["x_grad_finite"] and result["out_shape"] == [4, 6]
        functional = [r for r in result["records"] if r["source"] == "functional"]
        for step in (1, 2):
            ops = sorted((r["op"], r["bytes"]) for r in functional if r["step"] == step)
            # Forward: RowwiseParallel sums its [4, 6] partial output; backward: ColwiseParallel
            # sums the [4, 8] input gradient.
            assert ops == [("all_reduce", 4 * 6 * F32), ("all_reduce", 4 * 8 * F32)]
        assert all(r["pg_size"] == 2 and r["async_op"] and r["duration_us"] > 0 for r in functional)
        # distribute_tensor's scatter comes through DTensor's own `from ... import scatter`.
        scatters = [r for r in result["records"] if r["op"] == "scatter" and r["source"] == "c10d"]
        assert sorted(r["bytes"] for r in scatters) == sorted([16 * 8 * F32, 16 * F32, 6 * 16 * F32])


def test_pipeline_p2p_records(two_ranks):
    microbatch_bytes = 3 * 8 * F32
    for rank in (0, 1):
        result = scenario_result(two_ranks, "pipeline", rank)
        assert result["error"] is None
        activations = [r for r in result["records"] if r["dtype"] == "float32" and r["source"] == "p2p"]
        for step in (0, 1):
            ops = sorted((r["op"], r["bytes"], r["peer"]) for r in activations if r["step"] == step)
            if rank == 0:  # sends activations forward, receives their gradients back
                assert ops == [("recv", microbatch_bytes, 1)] * 2 + [("send", microbatch_bytes, 1)] * 2
            else:
                assert ops == [("recv", microbatch_bytes, 0)] * 2 + [("send", microbatch_bytes, 0)] * 2


def _check_identity(results, world):
    for rank in range(world):
        result = scenario_result(results, "identity", rank)
        for name in (TWO_RANK_IDENTITY if world == 2 else IDENTITY_CONFIGS):
            outcome = result[name]
            assert outcome["error"] is None, name
            assert outcome["mismatched"] == 0, f"{name}: {outcome['mismatched']} elements differ"
            assert outcome["ddp_records"] >= 2, name
        if world == 3:
            assert result["allreduce_hook_mismatched"] > 0
            assert result["always_multiply_mismatched"] > 0


def test_ddp_gradients_bit_identical_two_ranks(two_ranks):
    _check_identity(two_ranks, 2)


def test_ddp_gradients_bit_identical_three_ranks(three_ranks):
    _check_identity(three_ranks, 3)


# ---- single-process tests (1-rank gloo group in the pytest process) -----------------------------
class ListWriter:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


@pytest.fixture
def one_rank():
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture
def recorder_factory(one_rank):
    made = []

    def make(step=lambda: 0, **kwargs):
        writer = ListWriter()
        recorder = CommsRecorder(writer, step, use_cuda=False, **kwargs)
        recorder.install()
        made.append(recorder)
        return recorder, writer

    yield make
    for recorder in made:
        recorder.uninstall()


def patched_attributes():
    # Not listed: dist.reduce_scatter_tensor, a deprecated alias that calls reduce_scatter_single
    # (recorded there); wrapping it would point its deprecation warning at the wrapper.
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.tensor._collective_utils as collective_utils
    from torch.nn.parallel import DistributedDataParallel as DDP
    c10d = dist.distributed_c10d
    owners = [(dist, n) for n in ("all_reduce", "all_gather", "broadcast", "isend", "irecv", "send", "recv",
                                  "batch_isend_irecv", "barrier", "all_to_all_single",
                                  "_register_comm_hook", "_broadcast_coalesced")]
    owners += [(c10d, n) for n in ("all_reduce", "isend", "irecv", "_coalescing_manager", "all_gather_single")]
    owners += [(collective_utils, "broadcast"), (collective_utils, "scatter")]
    owners += [(funcol, n) for n in ("all_reduce", "all_gather_single", "reduce_scatter_single", "wait_tensor")]
    owners += [(dist.Work, "wait"), (DDP, "__init__"), (DDP, "_register_builtin_comm_hook")]
    return {(id(owner), name): getattr(owner, name) for owner, name in owners}


def test_uninstall_restores_every_patched_attribute(one_rank):
    before = patched_attributes()
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False, ddp_bucket_hook=True)
    recorder.install()
    recorder.install()  # idempotent: a second install must not wrap the wrappers
    during = patched_attributes()
    changed = [key for key in before if during[key] is not before[key]]
    assert len(changed) == len(before), "every listed attribute is patched while installed"
    assert dist.all_reduce.__wrapped__ is before[(id(dist), "all_reduce")]
    recorder.uninstall()
    after = patched_attributes()
    assert all(after[key] is before[key] for key in before)
    assert recorder.error is None


def test_compiled_code_reaches_nothing_patched(one_rank):
    """Inductor's lowerings and compiled graphs hold the _c10d_functional ops: they stay torch's."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ns = torch.ops._c10d_functional
    names = ("all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor",
             "all_to_all_single", "broadcast", "wait_tensor")
    before = {name: getattr(ns, name) for name in names}
    forward = DDP.forward
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    recorder.install()
    try:
        assert all(type(getattr(ns, name)) is torch._ops.OpOverloadPacket for name in names)
        assert all(getattr(ns, name) is before[name] for name in names)
        assert DDP.forward is forward
    finally:
        recorder.uninstall()


def test_ops_work_and_are_recorded_with_step(recorder_factory):
    step = StepCounter()
    recorder, writer = recorder_factory(step)
    t = torch.arange(6, dtype=torch.float32)
    step.value = 5
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    recorder.drain(wait=True)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [(r.op, r.bytes, r.step, r.async_op, r.pg_size) for r in writer.records] == [
        ("all_reduce", 24, 5, False, 1), ("all_reduce", 24, 5, True, 1)]
    assert recorder.ops == 2 and recorder.bytes == 48


def test_recorder_failure_falls_back_with_one_line(recorder_factory, capfd, monkeypatch):
    monkeypatch.setenv("RANK", "3")  # as under torchrun: the line names the rank

    def broken_step():
        raise RuntimeError("step counter exploded")

    recorder, writer = recorder_factory(broken_step)
    t = torch.full((4,), 3.0)
    dist.all_reduce(t)
    dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    recorder.drain(wait=True)
    assert t.tolist() == [3.0] * 4
    assert writer.records == [] and recorder.ops == 0
    assert "step counter exploded" in recorder.error
    lines = [line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]
    assert lines == [f"ranktrace: rank3 comms: {recorder.error}"]


def test_bug_inside_wrapper_falls_back_to_original(recorder_factory, capfd, monkeypatch):
    recorder, writer = recorder_factory()

    def broken_begin(*args, **kwargs):
        raise KeyError("bookkeeping bug")

    monkeypatch.setattr(recorder.timing, "begin", broken_begin)
    t = torch.ones(3)
    dist.broadcast(t, src=0)
    out = torch.empty(3)
    dist.all_gather_into_tensor(out, t)
    assert out.tolist() == [1.0, 1.0, 1.0]
    assert "bookkeeping bug" in recorder.error
    assert len([line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]) == 1


def test_user_errors_propagate_unchanged_and_are_not_recorder_errors(recorder_factory):
    def error_of(call):
        try:
            call()
        except Exception as exc:
            return type(exc), str(exc), type(exc.__context__)  # no recorder error chained in
        return None

    calls = [lambda: dist.all_reduce("not a tensor"), lambda: dist.broadcast(torch.ones(2), src=3)]
    without = [error_of(call) for call in calls]
    recorder, writer = recorder_factory()
    with_recorder = [error_of(call) for call in calls]
    assert all(e is not None for e in without)
    assert with_recorder == without
    assert recorder.error is None


def test_ddp_hook_failure_keeps_gradients_identical(recorder_factory, capfd):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def run(recorder_step=None):
        if recorder_step is not None:
            recorder_factory(recorder_step, ddp_bucket_hook=True)
        torch.manual_seed(0)
        model = DDP(ToyNet())
        x = torch.randn(5, 13)
        for _ in range(2):
            model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    baseline = run()
    calls = {"n": 0}

    def step_that_fails_in_the_ddp_hook():
        calls["n"] += 1
        if calls["n"] > 1:  # the first call is DDP's initial broadcast; later ones are bucket all_reduces
            raise RuntimeError("late failure")
        return 0

    traced = run(step_that_fails_in_the_ddp_hook)
    assert all(torch.equal(a, b) for a, b in zip(baseline, traced))
    assert "late failure" in capfd.readouterr().err


def test_functional_collective_completes_at_wait_even_through_a_view(recorder_factory):
    import torch.distributed._functional_collectives as funcol
    recorder, writer = recorder_factory()
    group = dist.group.WORLD
    out = funcol.all_reduce(torch.ones(4, 6), "sum", group)
    view = out.view(24)        # AsyncCollectiveTensor re-wraps views without waiting
    total = float(view.sum())  # first real use waits
    recorder.drain()
    assert total == 24.0
    assert [(r.op, r.source, r.bytes, r.async_op) for r in writer.records] == [("all_reduce", "functional", 96, True)]
    gathered = funcol.all_gather_tensor(torch.ones(3), 0, group)
    gathered.wait()
    recorder.drain()
    assert [(r.op, r.bytes) for r in writer.records[1:]] == [("all_gather", 12)]


def test_never_waited_functional_op_is_given_up_at_close_without_waiting(recorder_factory, capfd):
    import torch.distributed._functional_collectives as funcol
    recorder, writer = recorder_factory(wait_timeout_s=30.0)
    result = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
    started = time.monotonic()
    recorder.drain(wait=True)
    waited = time.monotonic() - started
    assert writer.records == [] and recorder.ops == 0 and recorder.timing.dropped == 1
    assert waited < 30.0  # nothing to wait for: it must not sit out the timeout
    assert "1 ops never completed" in capfd.readouterr().err
    result.wait()


# ---- CUDA-event bookkeeping with fake events ----------------------------------------------------
class FakeEvent:
    """Stands in for torch.cuda.Event: the 'device' time is the host clock when record() ran."""

    created = 0
    ready = True

    def __init__(self):
        FakeEvent.created += 1
        self.t_ns = None
        self.streams = []

    def record(self, stream=None):
        self.t_ns = time.perf_counter_ns()
        self.streams.append(stream)

    def query(self):
        return FakeEvent.ready

    def elapsed_time(self, end):
        return (end.t_ns - self.t_ns) / 1e6


@pytest.fixture
def fake_events():
    FakeEvent.created = 0
    FakeEvent.ready = True
    yield FakeEvent
    FakeEvent.ready = True


def test_sync_op_is_timed_by_events_around_the_call(recorder_factory, fake_events):
    seen = []

    def factory():
        event = fake_events()
        seen.append(event)
        return event

    recorder, writer = recorder_factory(event_factory=factory)
    dist.all_reduce(torch.ones(5))
    recorder.drain()
    (record,) = writer.records
    start, end = seen
    assert record.timing == "cuda_event"
    assert record.duration_us == pytest.approx((end.t_ns - start.t_ns) / 1e3, abs=1e-3)
    assert record.end_ns - record.start_ns == int(record.duration_us * 1e3)
    assert record.algbw_gbps == pytest.approx(20 / (record.duration_us / 1e6) / 1e9)


def test_drain_never_blocks_on_unfinished_events(recorder_factory, fake_events):
    recorder, writer = recorder_factory(event_factory=fake_events)
    fake_events.ready = False
    dist.all_reduce(torch.ones(5))
    dist.all_reduce(torch.ones(5), async_op=True).wait()
    recorder.drain()
    assert writer.records == [] and recorder.ops == 2
    fake_events.ready = True
    recorder.drain()
    assert [r.async_op for r in writer.records] == [False, True]
    assert all(r.timing == "cuda_event" for r in writer.records)


def test_async_op_end_event_comes_from_the_future_callback(recorder_factory, fake_events):
    recorder, writer = recorder_factory(event_factory=fake_events)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    work.get_future().wait()  # completion, without the workload calling work.wait()
    deadline = time.monotonic() + 10
    while not writer.records and time.monotonic() < deadline:
        recorder.drain()
    assert [(r.op, r.timing, r.async_op) for r in writer.records] == [("all_reduce", "cuda_event", True)]


def test_drain_wait_gives_up_on_events_that_never_finish(recorder_factory, fake_events, capfd):
    recorder, writer = recorder_factory(event_factory=fake_events, wait_timeout_s=0.2)
    fake_events.ready = False
    dist.all_reduce(torch.ones(5))
    recorder.drain(wait=True)
    assert writer.records == [] and recorder.ops == 0 and recorder.timing.dropped == 1
    err = [line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]
    assert len(err) == 1 and "never completed" in err[0]
    assert recorder.error is None


def test_events_are_reused_once_resolved(recorder_factory, fake_events):
    recorder, writer = recorder_factory(event_factory=fake_events)
    for _ in range(50):
        dist.all_reduce(torch.ones(2))
        recorder.drain()
    assert len(writer.records) == 50
    assert fake_events.created <= 4


def functional_op(recorder, outputs):
    """What the functional-collective wrapper does for one op issued on `outputs`."""
    timing = recorder.timing
    pending = timing.begin("all_reduce", "functional", "0", 1, outputs[0],
                           sum(t.numel() * t.element_size() for t in outputs), True, None)
    timing.issued(pending)
    timing.await_functional(pending, outputs)
    return pending


def test_a_coalesced_functional_op_overwritten_before_its_wait_is_dropped_once():
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    outputs = [torch.zeros(2), torch.zeros(2)]  # 8 + 8 bytes
    functional_op(recorder, outputs)
    functional_op(recorder, outputs)  # in place on both outputs: the first op is lost, once
    assert (recorder.ops, recorder.bytes, recorder.timing.dropped) == (1, 16, 1)


def test_the_pending_cap_drops_an_op_with_all_its_outputs(monkeypatch):
    import tracer.comms.timing as timing

    monkeypatch.setattr(timing, "MAX_PENDING_FUNCTIONAL", 2)
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    first = [torch.zeros(1), torch.zeros(1)]
    functional_op(recorder, first)
    functional_op(recorder, [torch.zeros(1)])  # 3 outputs pending: the first op goes, whole
    assert (recorder.ops, recorder.timing.dropped) == (1, 1)
    assert len(recorder.timing.functional_pending) == 1
    monkeypatch.setattr(timing, "MAX_PENDING_FUNCTIONAL", 10)
    functional_op(recorder, first)  # reusing its storage finds nothing left to drop
    assert (recorder.ops, recorder.timing.dropped) == (2, 1)


def test_default_registers_no_ddp_comm_hook(recorder_factory):
    """DDP's C++ reducer reduces its buckets itself: seen in profiler windows, not recorded."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    recorder, writer = recorder_factory()
    assert recorder.ddp_buckets == "profiler windows"
    model = DDP(ToyNet())
    model(torch.randn(5, 13)).pow(2).sum().backward()
    recorder.drain(wait=True)
    assert model._get_ddp_logging_data().get("comm_hook", "") == ""
    assert [(r.op, r.source) for r in writer.records] == [("broadcast", "ddp")]  # initial sync


def test_bucket_hook_comes_from_the_config_only(one_rank, monkeypatch):
    """The tracer's options read RANKTRACE_DDP_BUCKET_HOOK; the recorder takes what they say."""
    monkeypatch.setenv("RANKTRACE_DDP_BUCKET_HOOK", "1")
    assert CommsRecorder(ListWriter(), lambda: 0, use_cuda=False).ddp_buckets == (
        "profiler windows")
    assert CommsRecorder(ListWriter(), lambda: 0, use_cuda=False,
                         ddp_bucket_hook=True).ddp_buckets == "comm hook"


def test_recorder_is_a_part_that_fails_once_and_tells_the_session(one_rank, capfd):
    from tracer.part import Part
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    told = []
    recorder.on_failure, recorder.rank = told.append, 2
    assert isinstance(recorder, Part) and recorder.name == "comms"
    recorder.start()
    assert recorder.active
    try:
        assert recorder.fail("drain", RuntimeError("boom"))
        assert not recorder.fail("a later failure the session saw")
    finally:
        recorder.close()
    assert not recorder.active and told == [recorder]
    assert recorder.error == "drain failed (RuntimeError: boom); comms recording is off"
    lines = [line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]
    assert lines == [f"ranktrace: rank2 comms: {recorder.error}"]


# ---- a rank crashes: the other rank's error is the one it would print untraced ------------------
def rank_error(folder, traced: bool) -> list[str]:
    """Rank 0's traceback and error line when rank 1 exits at step 3 of workloads/ddp.py."""
    import socket
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("RANKTRACE_")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # --monitor-interval 5: torchrun would otherwise stop rank 0 before it prints its error.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--monitor-interval", "5", "--nproc-per-node", "2"]
    if traced:
        command += ["-m", "tracer.record", "--out", str(folder)]
    command += [str(repo / "workloads" / "ddp.py"), "--hidden", "16", "--layers", "2",
                "--batch-size", "8", "--steps", "4", "--crash", "1:3", "--pg-timeout-s", "30"]
    result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("[rank0]:")]
    assert any("Traceback" in line for line in lines), result.stderr
    # gloo says "Connection closed by peer" or "Read error ... Connection reset by peer", as the
    # socket's end was seen, with the peer's port: the text after gloo's source line varies.
    return [re.sub(r"(tcp/pair\.cc):\d+\] .*", r"\1] <gloo transport error>", line)
            for line in lines]


def test_a_crashed_peer_gives_the_same_error_traced_and_untraced(tmp_path):
    untraced = rank_error(tmp_path, traced=False)
    assert untraced[-1].startswith("[rank0]: RuntimeError: [") and "gloo" in untraced[-1], untraced
    assert any("loss.backward()" in line for line in untraced)  # a bucket all-reduce failed
    assert rank_error(tmp_path, traced=True) == untraced
