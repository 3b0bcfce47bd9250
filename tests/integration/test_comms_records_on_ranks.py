"""Tests of tracer.comms on 2 gloo ranks: records of every way an op is issued (c10d, p2p,
coalesced and object collectives, DDP buckets and user hooks, DTensor, pipeline stages), and DDP
gradients bit for bit the same under the bucket hook on 2 ranks.

Every scenario runs once in one group of 2 ranks started with torch.multiprocessing
(tests/helpers/comms_ranks.py); every rank writes what it saw to a JSON file and the tests below
assert on it. The bit-identity of DDP gradients (tests/helpers/ddp_identity.py) runs last, on its
own seeds; on 3 ranks: test_ddp_gradients_unchanged_by_bucket_hook.py. Single-process checks of
the recorder: test_comms_recorder.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers.comms_ranks import finish_recorder, run_ranks, scenario_result, start_recorder
from helpers.ddp_identity import check_identity, scenario_identity

F32 = 4  # bytes per float32 element


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
    dist.all_to_all([torch.empty(2) for _ in range(world)],
                    [torch.ones(2) for _ in range(world)])                     # in 16 B
    dist.gather(torch.ones(3), [torch.empty(3) for _ in range(world)] if rank == 0 else None,
                dst=0)                                                         # 2*12 B
    dist.scatter(torch.empty(2), [torch.ones(2) for _ in range(world)] if rank == 0 else None,
                 src=0)                                                        # 2*8 B
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
        self.layers = nn.Sequential(nn.Linear(256, 512, bias=False),
                                    nn.Linear(512, 256, bias=False),
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


def scenario_fsdp(rank, world, folder):
    """FSDP1 and FSDP2 units (one forward and backward each), then a plain all-gather."""
    recorder, writer, step = start_recorder(folder, rank, "fsdp")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    torch.manual_seed(0)
    step.value = 1
    fsdp1 = FullyShardedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                                   nn.Linear(16, 3)),
                                     device_id=torch.device("cpu"))
    fsdp1(torch.randn(4, 8)).sum().backward()
    step.value = 2
    fsdp2 = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(fsdp2[0], mesh=mesh)
    fully_shard(fsdp2, mesh=mesh)
    fsdp2(torch.randn(4, 8)).sum().backward()
    step.value = 3
    dist.all_gather_single(torch.empty(world * 5), torch.ones(5))
    records = finish_recorder(recorder, writer)
    return {"records": records, "error": recorder.error}


def scenario_pipeline(rank, world, folder):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    recorder, writer, step = start_recorder(folder, rank, "pipeline")
    torch.manual_seed(rank)
    stage = PipelineStage(nn.Linear(8, 8), stage_index=rank, num_stages=world,
                          device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2,
                             loss_fn=lambda out, target: ((out - target) ** 2).mean())
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




@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    scenarios = {"c10d": scenario_c10d, "ddp_buckets": scenario_ddp_buckets,
                 "ddp_user_hooks": scenario_ddp_user_hooks, "dtensor": scenario_dtensor,
                 "pipeline": scenario_pipeline, "fsdp": scenario_fsdp,
                 "identity": scenario_identity}
    return run_ranks(2, scenarios, tmp_path_factory.mktemp("two_ranks"))


def test_ddp_gradients_bit_identical_two_ranks(two_ranks):
    check_identity(two_ranks, 2)


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
        collectives = [r for r in records
                       if r["source"] == "c10d" and r["op"] != "barrier"][:len(EXPECTED_C10D)]
        got = [(r["op"], r["bytes"], r["dtype"], r["source"], r["async_op"], r["step"])
               for r in collectives]
        assert got == EXPECTED_C10D
        assert all(r["pg"] == "0" and r["pg_size"] == 2 and r["timing"] == "host"
                   for r in collectives)
        barriers = [r for r in records if r["op"] == "barrier"]
        assert len(barriers) == 1 and barriers[0]["bytes"] == 0 and barriers[0]["busbw_gbps"] == 0.0


def test_p2p_records_bytes_and_peer(two_ranks):
    for rank in (0, 1):
        peer = 1 - rank
        records = sorted(scenario_result(two_ranks, "c10d", rank)["records"],
                         key=lambda r: r["start_ns"])
        p2p = [(r["op"], r["bytes"], r["dtype"], r["peer"], r["async_op"], r["step"])
               for r in records if r["source"] == "p2p" and r["dtype"] not in ("int64", "uint8")]
        first, second = ("send", "recv") if rank == 0 else ("recv", "send")
        single = [(first, 20, "float16", peer, False, 2), (second, 24, "bfloat16", peer, True, 2)]
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
        assert [(r["op"], r["dtype"]) for r in after_barrier] == [("all_gather", "int64"),
                                                                  ("all_gather", "uint8")]
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
        # The file is in completion order.
        records = sorted(result["records"], key=lambda r: r["start_ns"])
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
        # DDP's initial sync
        assert [r["bytes"] for r in broadcasts] == [sum(weights), 3 * half_mib]
        assert {r["issuer"] for r in ddp + broadcasts} == {"ddp"}


def test_ddp_user_hooks_are_called_and_labelled(two_ranks):
    for rank in (0, 1):
        result = scenario_result(two_ranks, "ddp_user_hooks", rank)
        assert result["error"] is None
        # Four buckets after the rebuild, through the handed-over slot.
        assert result["calls_late"] == 4
        assert "can only be called once" in result["second_register_error"]
        at_seven = [r for r in result["records"] if r["step"] == 7 and r["op"] == "all_reduce"]
        assert all(r["source"] == "ddp" and r["issuer"] == "ddp" for r in at_seven)
        total = (16 * 8 + 32 * 16 + 24 * 32 + 10 * 24) * F32
        # `early` (user hook, first backward: one bucket), `builtin` (ALLREDUCE twin, one bucket).
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
        assert sorted(r["bytes"] for r in scatters) == sorted([16 * 8 * F32, 16 * F32,
                                                               6 * 16 * F32])


def test_pipeline_p2p_records(two_ranks):
    microbatch_bytes = 3 * 8 * F32
    for rank in (0, 1):
        result = scenario_result(two_ranks, "pipeline", rank)
        assert result["error"] is None
        activations = [r for r in result["records"]
                       if r["dtype"] == "float32" and r["source"] == "p2p"]
        for step in (0, 1):
            ops = sorted((r["op"], r["bytes"], r["peer"]) for r in activations if r["step"] == step)
            # Rank 0 sends activations forward and receives their gradients back.
            assert ops == ([("recv", microbatch_bytes, 1 - rank)] * 2
                           + [("send", microbatch_bytes, 1 - rank)] * 2)




def test_fsdp_units_collectives_are_named_fsdp1_and_fsdp2(two_ranks):
    # FSDP1 flattens 8*16 + 16 + 16*3 + 3 = 195 parameters, padded to 196 for 2 ranks. FSDP2
    # shards each parameter along dim 0, padded to 2 ranks: the inner unit's 16x8 weight and 16
    # bias (144 elements), the root's 3x16 weight and 3 bias padded to 4 rows (64 + 4 = 68).
    for rank in (0, 1):
        result = scenario_result(two_ranks, "fsdp", rank)
        assert result["error"] is None
        named = sorted((r["step"], r["op"], r["bytes"] // F32, r.get("issuer"))
                       for r in result["records"] if r["op"] in ("all_gather", "reduce_scatter"))
        assert named == [
            (1, "all_gather", 196, "fsdp1"), (1, "reduce_scatter", 196, "fsdp1"),
            # forward: the root, then the inner unit; backward: the inner unit again
            (2, "all_gather", 68, "fsdp2"), (2, "all_gather", 144, "fsdp2"),
            (2, "all_gather", 144, "fsdp2"),
            (2, "reduce_scatter", 68, "fsdp2"), (2, "reduce_scatter", 144, "fsdp2"),
            (3, "all_gather", 10, None),  # the script's own: no unit has this size
        ]
        assert all(r["source"] == "c10d" for r in result["records"] if r["step"] in (1, 2, 3)
                   and r["op"] in ("all_gather", "reduce_scatter"))
