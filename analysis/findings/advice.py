"""What to do about each bottleneck: the suggestion texts, chosen by the evidence.

Advice must fit what produced the cost: the code that issued a collective (analysis.rank.issuers),
what the run already does (no_sync, its pipeline schedule), the host activity of an idle gap.
docs/report.md lists each suggestion with the finding it belongs to.
"""

from __future__ import annotations

from analysis.rank import issuers

# host_activity -> (finding label, what the host was doing, suggestion)
IDLE_CAUSES = {
    "data_loading": (
        "data loading", "loading data",
        "Feed the device faster: raise DataLoader num_workers (one per spare CPU core), set "
        "pin_memory=True with .to(device, non_blocking=True), persistent_workers=True and a "
        "larger prefetch_factor; move decoding and augmentation out of the training process.",
    ),
    "synchronisation": (
        "synchronisation", "waiting for the device (a synchronisation)",
        "Remove host-device syncs from the step: .item(), .cpu(), .tolist(), printing tensors, "
        "torch.cuda.synchronize(), nonzero() or boolean-mask indexing; log metrics every N steps "
        "or accumulate them on the device.",
    ),
    "launch_bound": (
        "launch bound", "still launching the kernels (launch bound)",
        "Kernels finish faster than the host launches them: capture the step in CUDA graphs "
        "(torch.compile(mode=\"reduce-overhead\")), fuse small ops with torch.compile, or raise "
        "the per-rank batch size so each kernel does more work.",
    ),
    "waiting_for_peers": (
        "waiting for peers", "waiting for other ranks to reach a collective",
        "This rank sat idle until the other members of its collectives arrived: the "
        "Cross-rank section gives each rank's wait per step and names a rank only when it is "
        "late often enough; balance the work or the data across ranks.",
    ),
    "other": (
        "other host work", "doing other work",
        "The device waited while the host ran something else: look at the host timeline in "
        "these gaps (Python between steps, checkpointing, logging, evaluation) and move it off "
        "the critical path or run it less often.",
    ),
}

# On CPU traces there is no device: an idle gap is time in which no op ran on the training
# threads, and the advice speaks of the host alone (no pinned memory, no device syncs, no kernels).
CPU_IDLE_CAUSES = {
    "data_loading": (
        "data loading", "loading data",
        "Load data faster: raise DataLoader num_workers (on cores the training threads do not "
        "use), persistent_workers=True and a larger prefetch_factor; move decoding and "
        "augmentation out of the training process.",
    ),
    "synchronisation": (
        "synchronisation", "waiting on a synchronisation",
        "Remove waits from the step: .item(), .tolist() and printing tensors every step, "
        "blocking waits on asynchronous work; log metrics every N steps.",
    ),
    "launch_bound": (
        "host overhead", "between ops (dispatch overhead)",
        "The ops are short next to the framework's overhead between them: fuse them with "
        "torch.compile, or raise the per-rank batch size so each op does more work.",
    ),
    "waiting_for_peers": IDLE_CAUSES["waiting_for_peers"],
    "other": (
        "other host work", "doing other work",
        "No op ran on the training threads while the process did something else: look at the "
        "host timeline in these gaps (Python between ops or steps, checkpointing, logging, "
        "evaluation) and move it off the critical path or run it less often.",
    ),
}


def idle_cause(activity: str, kind: str) -> tuple[str, str, str]:
    """(finding label, what the host was doing, suggestion) of an idle gap's host activity, in
    the words of a GPU trace ("gpu") or a CPU trace (any other kind)."""
    causes = IDLE_CAUSES if kind == "gpu" else CPU_IDLE_CAUSES
    return causes.get(activity, causes["other"])


# ---- exposed communication: advice by who issued the top collective ----------------------------
_DDP_ALL_REDUCE = (
    "Hide DDP's gradient all-reduce under backward: avoid find_unused_parameters=True (or set "
    "static_graph=True), set gradient_as_bucket_view=True, and halve its bytes with the "
    "bf16_compress_hook comm hook."
)
SPLIT_BUCKET_BYTES = 4 << 20  # one bucket from this size up: splitting it can overlap backward


def ddp_bucket_text(buckets: dict | None) -> str:
    """What bucket_cap_mb can do, from the evidence of ddp_buckets: with several buckets a step,
    tune it; with one large bucket, a smaller cap lets its first parts overlap backward; with one
    small bucket or no evidence, nothing is said."""
    if not buckets:
        return ""
    per_step, size = buckets["per_step"], buckets.get("bytes")
    if per_step > 1.05:
        return (f" With {per_step:.1f} gradient all-reduces per step (DDP buckets), tune "
                f"bucket_cap_mb: smaller buckets start earlier in backward, larger ones pay less "
                f"latency.")
    if size is not None and size >= SPLIT_BUCKET_BYTES:
        return (f" All gradients go in one {size / 2**20:.1f} MiB bucket, sent when backward "
                f"ends: a smaller bucket_cap_mb splits it so that its first parts overlap "
                f"backward.")
    return ""
_NO_SYNC = (" Several forwards per step each end in a gradient all-reduce: wrap the non-final "
            "micro-batches of the accumulation in model.no_sync().")
_BY_ISSUER = {
    ("ddp", "broadcast"): (
        "DDP broadcasts module buffers at every forward: if they need no syncing (no BatchNorm "
        "running stats, or SyncBatchNorm), construct DDP with broadcast_buffers=False."),
    ("fsdp2", "all_gather"): (
        "FSDP2 (fully_shard) gathers parameters on the critical path: prefetch further ahead "
        "with module.set_modules_to_forward_prefetch([...]) and "
        "set_modules_to_backward_prefetch([...]); keep parameters gathered between forward and "
        "backward with reshard_after_forward=False (more memory, no backward all-gather) or an "
        "int to reshard within a smaller group; group small modules into larger fully_shard "
        "units so that fewer, larger all-gathers run."),
    ("fsdp2", "reduce_scatter"): (
        "FSDP2 (fully_shard) reduce-scatters gradients on the critical path: reduce in bf16 with "
        "MixedPrecisionPolicy(reduce_dtype=torch.bfloat16); under gradient accumulation call "
        "model.set_requires_gradient_sync(False) for the non-final micro-batches; group small "
        "modules into larger fully_shard units."),
    ("fsdp1", "all_gather"): (
        "Prefetch FSDP's parameter all-gathers: set forward_prefetch=True and "
        "backward_prefetch=BackwardPrefetch.BACKWARD_PRE, and use larger wrapping units "
        "(auto_wrap_policy) so that fewer, larger all-gathers run."),
    ("fsdp1", "reduce_scatter"): (
        "Overlap FSDP's gradient reduce-scatter with backward: "
        "backward_prefetch=BackwardPrefetch.BACKWARD_PRE and larger wrapping units; reduce in "
        "bf16 with MixedPrecision(reduce_dtype=torch.bfloat16); under gradient accumulation "
        "skip it on non-final micro-batches with model.no_sync()."),
    ("functional", "all_reduce"): (
        "These are functional collectives (tensor parallelism, DTensor): the all-reduces after "
        "RowwiseParallel layers sit on the critical path. Use sequence parallelism "
        "(SequenceParallel, loss_parallel), whose all-gathers and reduce-scatters overlap "
        "better; under torch.compile enable async tensor parallelism "
        "(torch._inductor.config._micro_pipeline_tp = True); keep the tensor-parallel group "
        "inside one node or make it smaller."),
    ("functional", "all_gather"): (
        "These are functional collectives (tensor parallelism, DTensor): overlap the gathers "
        "with the matmuls that use them (async tensor parallelism under torch.compile, "
        "torch._inductor.config._micro_pipeline_tp = True), and keep the tensor-parallel group "
        "inside one node."),
    ("c10d", "all_reduce"): (
        "These all-reduces are torch.distributed calls outside DDP and FSDP (the script's own or "
        "a library's): issue them with async_op=True and wait only where the result is needed, "
        "reduce several tensors in one call (flatten them into one buffer), and reduce metrics "
        "every N steps rather than every step."),
}
_BY_ISSUER[("functional", "reduce_scatter")] = _BY_ISSUER[("functional", "all_gather")]
_P2P_ADVICE = ("Point-to-point traffic in the step: overlap it with compute (isend/irecv "
               "issued early).")
_BY_OP = {
    "all_to_all": (
        "Overlap the all-to-all with compute by splitting it into chunks (MoE token dispatch, "
        "sharded embedding lookups), and send less (a lower MoE capacity factor, smaller or "
        "lower-precision embeddings)."),
    "barrier": "Remove barrier() from the training loop; collectives already synchronise ranks.",
    "send": _P2P_ADVICE,
    "recv": _P2P_ADVICE,
}
_BY_UNKNOWN_ISSUER = (
    "Overlap communication with compute: find the code that issues the top collective (the "
    "trace's CPU call stack around it), issue it asynchronously and early, and send less or "
    "less often."
)
_C10D = (
    "These are torch.distributed calls outside DDP and FSDP (the script's own or a library's): "
    "issue them with async_op=True and wait only where the result is needed, batch small ones "
    "into fewer calls, and run them less often where they serve logging."
)


def exposed_suggestion(op: str, issuer: str, accumulation: str | None,
                       buckets: dict | None = None) -> str:
    """Advice for exposed time dominated by `op` as issued by `issuer` (analysis.rank.issuers);
    `accumulation` is issuers.ddp_accumulation's verdict, `buckets` the evidence of DDP's
    buckets (inputs.ddp_buckets; None where unknown)."""
    if op in _BY_OP:
        return _BY_OP[op]
    if issuer == "ddp" and op == "all_reduce":
        text = _DDP_ALL_REDUCE + ddp_bucket_text(buckets)
        if accumulation == issuers.ACCUMULATING_WITHOUT_NO_SYNC:
            text += _NO_SYNC
        return text
    if (issuer, op) in _BY_ISSUER:
        return _BY_ISSUER[(issuer, op)]
    if issuer == "c10d":
        return _C10D
    return _BY_UNKNOWN_ISSUER


def small_message_hint(issuer: str, buckets: dict | None = None) -> str:
    """The hint for time spent mostly in messages under 1 MiB. DDP's bucket_cap_mb is named only
    where DDP sends several buckets a step (`buckets`, inputs.ddp_buckets): one bucket is
    already all the gradients."""
    if issuer == "ddp" and not (buckets and buckets["per_step"] > 1.05):
        if not buckets:
            return (" Most of this time is in messages under 1 MiB, which are latency-bound: "
                    "send them less often (gradient accumulation with no_sync).")
        return (" Most of this time is in messages under 1 MiB, which are latency-bound; DDP "
                "already sends its gradients in one bucket a step, so only sending less often "
                "helps (gradient accumulation with no_sync).")
    coalesce = {"ddp": "raise DDP's bucket_cap_mb",
                "fsdp2": "larger fully_shard units", "fsdp1": "larger FSDP wrapping units"}
    how = coalesce.get(issuer, "fewer, larger collectives")
    return (" Most of this time is in messages under 1 MiB, which are latency-bound: coalesce "
            f"them ({how}).")


# ---- imbalance and stragglers -----------------------------------------------------------------
def imbalance_suggestion(variable_inputs: bool | None) -> str:
    """Balancing advice; length bucketing only where the traced input shapes vary."""
    if variable_inputs:
        return ("Work differs across ranks from step to step, and the traced input shapes vary "
                "between steps: balance the work per step (bucket samples by length, equal "
                "tokens per rank, drop_last=True) so no rank waits in the next collective.")
    return ("Work differs across ranks from step to step: find what differs (the hosts, other "
            "processes on a rank's cores, work only some ranks do such as logging or "
            "evaluation, uneven batches: drop_last=True) so no rank waits in the next "
            "collective.")


def straggler_data_text(variable_inputs: bool | None) -> str:
    """What to check of a straggler's data: longer inputs only where shapes vary."""
    if variable_inputs:
        return (", and whether its data shard carries more work (the traced input shapes vary "
                "between steps: longer sequences, larger images)")
    return ""


# ---- pipeline bubble ----------------------------------------------------------------------------
def bubble_suggestion(schedule, ranks: int, stages: int) -> str:
    """Advice for a pipeline bubble that never recommends the schedule already in use.

    p pipeline ranks with v stages each and m microbatches: GPipe and 1F1B idle
    (p-1)/(m+p-1) of the step, an interleaved schedule (p-1)/(v*m+p-1).
    """
    p, v, m = ranks, schedule.stages_per_rank or 1, schedule.microbatches
    if p < 2:
        return "Raise the number of microbatches."

    def bubble(mb: int) -> str:
        return f"{(p - 1) / (v * mb + p - 1) * 100:.0f}%"

    examples = ", ".join(f"m={mb}: {bubble(mb)}" for mb in sorted({m or p, 4 * (m or p)}))
    if v > 1:
        text = (f"Raise the number of microbatches m: this {schedule.kind or 'multi-stage'} "
                f"schedule idles (p-1)/(v*m+p-1) of the step with p={p} ranks and v={v} stages "
                f"per rank ({examples}), or give each rank more, smaller stages.")
        if not schedule.split_backward:
            text += (" A zero-bubble schedule (ScheduleInterleavedZeroBubble, "
                     "ScheduleZBVZeroBubble) also splits the backward into input and weight "
                     "parts to fill the remaining gaps.")
        return text
    text = (f"Raise the number of microbatches m: with one stage per rank the bubble is "
            f"(p-1)/(m+p-1) of the step for p={p} stages ({examples}).")
    if schedule.kind == "gpipe":
        text += (" Schedule1F1B keeps activation memory flat as m grows, where GPipe holds all "
                 "m microbatches' activations.")
    text += (" Holding several smaller stages per rank with ScheduleInterleaved1F1B "
             "divides the bubble by the stages per rank.")
    return text
