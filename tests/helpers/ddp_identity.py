"""DDP gradients with the comms recorder's bucket hook (--ddp-bucket-hook) against those without
it, bit for bit, in every DDP configuration that changes how buckets are reduced: a scenario of
helpers/comms_ranks.run_ranks, run on 3 ranks by test_ddp_gradients_unchanged_by_bucket_hook.py
and on 2 ranks in test_comms_records_on_ranks.py's group of ranks."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from helpers.comms_ranks import ToyNet, finish_recorder, scenario_result, start_recorder

SMALL_BUCKETS = 600 / 2**20  # bucket_cap_mb that splits ToyNet into several buckets

IDENTITY_CONFIGS = {
    "default": dict(),
    "no_sync_small_buckets": dict(ddp=dict(bucket_cap_mb=SMALL_BUCKETS), accum=3),
    # Gradients stay bucket views across steps: DDP divides them in place instead of multiplying.
    "bucket_view_keep_grads": dict(ddp=dict(gradient_as_bucket_view=True,
                                            bucket_cap_mb=SMALL_BUCKETS),
                                   set_to_none=False, accum=2),
    "bucket_view_set_to_none": dict(ddp=dict(gradient_as_bucket_view=True), set_to_none=True),
    "batched_grad_copy": dict(ddp=dict(batched_grad_copy=True, gradient_as_bucket_view=True),
                              set_to_none=False),
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
    for _step in range(2):
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
                     "ddp_records": sum(r["source"] == "ddp" and r["op"] == "all_reduce"
                                        for r in records)}
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
    out["always_multiply_mismatched"] = compare_runs(baselines["bucket_view_keep_grads"],
                                                     always_multiply)
    return out


def check_identity(results, world):
    """Every configuration run on `world` ranks trained bit-identically under the bucket hook,
    with its buckets recorded; on 3 ranks, the two hooks that must differ did."""
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
