"""The memory findings and the verdict's memory line (docs/memory.md, "Findings").

Four findings, each a risk rather than a cost of step time (share_pct NaN, sorted after the
timed findings): a rank whose memory grows steadily, a rank that peaks well above the median
rank, a device more than MEMORY_FULL_PCT full, and an allocator that reserves far more than it
allocates. The advice fits the evidence: the category that makes the difference or fills the
peak (torch's memory profiler, --profile-memory) picks it; without categories the finding says
how to get them.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.core.contracts import FINDING_COLUMNS, MEASURE_CUDA, Finding, RankMemory
from analysis.crossrank.memory_balance import category_differences, median_rank
from analysis.findings.labels import rank_list

MIB = 1 << 20
GIB = 1 << 30
IMBALANCE_MIN_PCT = 10.0  # a peak this far above the median rank's ...
IMBALANCE_MIN_BYTES = 32 * MIB  # ... and by at least this much
MEMORY_FULL_PCT = 90.0
FRAGMENTATION_PCT = 10.0  # reserved above allocated by this share of the device
EXPLAINED_SHARE = 0.5  # categories that explain less of a difference leave "the rest" to name

GROWS, IMBALANCE, NEAR_FULL, FRAGMENTED = (
    "memory grows", "memory imbalance", "memory near capacity", "allocator fragmentation")

# What to try when a category fills the peak or makes the difference.
ADVICE = {
    "activation": "Recompute activations in the backward pass instead of keeping them: "
                  "activation checkpointing (torch.utils.checkpoint, or the framework's option) "
                  "on the largest blocks, or a smaller micro-batch with gradient accumulation.",
    "optimizer_state": "Shard the optimizer state across the data-parallel ranks: FSDP "
                       "(fully_shard) or ZeRO (torch.distributed.optim.ZeroRedundancyOptimizer, "
                       "DeepSpeed stage 1-2).",
    "gradient": "Free the gradients between steps: optimizer.zero_grad(set_to_none=True) (the "
                "default since torch 2.0; a script or framework that passes False keeps them "
                "through the next forward), or shard them with FSDP.",
    "parameter": "Shard the parameters (FSDP) or keep them in bf16, or balance the model's "
                 "split across ranks (pipeline or tensor parallel stages).",
    "input": "Load smaller or evenly sized batches on this rank, and free the previous batch "
             "before the next forward.",
    "temporary": "Look at the ops with the largest temporaries at the peak (a memory snapshot, "
                 "--memory-snapshot, shows their stacks); fused or in-place kernels avoid them.",
    "other": "The memory is neither parameters, gradients, optimizer state nor activations: "
             "look for buffers, caches and outputs the script keeps, with a memory snapshot "
             "(--memory-snapshot) on CUDA.",
}
UNKNOWN_DIFFERENCE = ("Find what this rank holds that the median rank does not: buffers or caches "
                      "only it keeps, work only it does (evaluation, logging or checkpointing on "
                      "one rank), a larger share of the model or of the batch.")
NO_CATEGORIES = (" Run with --profile-memory to see which kind of tensor makes the difference "
                 "(parameters, gradients, optimizer state, activations).")


def _ranks(figures: list[RankMemory]) -> str:
    return rank_list(f.rank for f in figures)


def mib(value: float) -> str:
    return f"{value / MIB:.2f} MiB" if abs(value) < GIB else f"{value / GIB:.2f} GiB"


def _measured(figure: RankMemory) -> str:
    return "PyTorch's peak allocated memory" if figure.measure == MEASURE_CUDA else "its RSS"


def _growth_advice(figure: RankMemory) -> str:
    growth = figure.categories_growth_per_step
    if growth:
        name, rate = max(growth.items(), key=lambda item: item[1])
        if rate > 0:
            return (f"Between its profiler windows the {name.replace('_', ' ')} tensors grow "
                    f"{mib(rate)} per step. " + ADVICE[name])
    where = ("take a memory snapshot (--memory-snapshot) and look at the blocks allocated late"
             if figure.measure == MEASURE_CUDA else
             "on CPU the growth may also be Python objects (tracemalloc shows them)")
    return ("Look for what each step keeps: losses or outputs appended to a list without "
            ".item() or .detach() (each keeps its autograd graph), caches keyed by step, "
            f"growing buffers; {where}." + (NO_CATEGORIES if figure.categories_at_peak is None
                                            else ""))


def memory_grows(figures: list[RankMemory]) -> list[Finding]:
    """One finding per rank whose memory grows steadily (analysis.rank.memory_growth)."""
    findings = []
    for figure in figures:
        if not figure.growth_bytes_per_step > 0:
            continue
        evidence = (f"Rank {figure.rank}'s memory grows {mib(figure.growth_bytes_per_step)} per "
                    f"step from step {figure.growth_from_step} ({_measured(figure)}, "
                    f"{mib(figure.peak_bytes)} at its peak, step {figure.peak_step})")
        if figure.full_at_step is not None:
            evidence += (f": at this rate the device is full at step {figure.full_at_step}, "
                         f"{figure.full_at_step - figure.last_step} steps after the last "
                         f"analysed one.")
        else:
            evidence += ("; the device's capacity is not known here, so neither is the step "
                         "at which it would be full." if figure.measure != MEASURE_CUDA
                         else ".")
        headline = (f"rank {figure.rank} grows {mib(figure.growth_bytes_per_step)} per step "
                    f"from step {figure.growth_from_step}"
                    + (f", full at step {figure.full_at_step}"
                       if figure.full_at_step is not None else ""))
        findings.append(Finding(GROWS, math.nan, evidence, _growth_advice(figure), str(figure.rank),
                                headline=headline))
    return findings


def _difference_text(figure: RankMemory, median: RankMemory) -> tuple[str, str]:
    """(what makes the difference, the advice that fits it)."""
    above = figure.peak_bytes - median.peak_bytes
    differences = [(n, b) for n, b in category_differences(figure, median) if b > 0]
    if figure.categories_at_peak is None or median.categories_at_peak is None:
        return "", UNKNOWN_DIFFERENCE + NO_CATEGORIES
    explained = sum(b for _, b in differences)
    parts = [f"{name.replace('_', ' ')} +{mib(b)}" for name, b in differences[:3]
             if b >= 0.05 * above]
    text = f"; at the profiler's peak: {', '.join(parts)}" if parts else ""
    if explained < EXPLAINED_SHARE * above:
        rest = above - explained
        text += (f"; {mib(rest)} is outside the tensors the profiler saw in its window "
                 f"(buffers allocated before it and unused in it, or memory outside tensors)")
        return text, ADVICE["other"]
    return text, ADVICE[differences[0][0]]


def memory_imbalance(figures: list[RankMemory], stages: dict[int, int] | None = None
                     ) -> list[Finding]:
    """One finding per rank whose peak exceeds the median rank's by IMBALANCE_MIN_PCT and
    IMBALANCE_MIN_BYTES; `stages`: rank -> pipeline stage, where the run is a pipeline."""
    median = median_rank(figures)
    if median is None or len(figures) < 2 or not median.peak_bytes > 0:
        return []
    findings = []
    for figure in sorted(figures, key=lambda f: -f.peak_bytes):
        above = figure.peak_bytes - median.peak_bytes
        if above < IMBALANCE_MIN_BYTES or above / median.peak_bytes * 100 < IMBALANCE_MIN_PCT:
            continue
        what, advice = _difference_text(figure, median)
        stage = ""
        if stages and figure.rank in stages:
            stage = (f"; rank {figure.rank} is pipeline stage {stages[figure.rank]} of "
                     f"{len(set(stages.values()))}")
        evidence = (f"Rank {figure.rank} peaks {mib(above)} above the median rank (rank "
                    f"{median.rank}: {mib(median.peak_bytes)}, {_measured(figure)}; "
                    f"+{above / median.peak_bytes * 100:.0f}%){what}{stage}.")
        headline = (f"rank {figure.rank} peaks {mib(above)} above the median rank "
                    f"(rank {median.rank})")
        findings.append(Finding(IMBALANCE, math.nan, evidence, advice, str(figure.rank),
                                headline=headline))
    return findings


def _fullest_category(figure: RankMemory) -> str | None:
    if not figure.categories_at_peak:
        return None
    name, size = max(figure.categories_at_peak.items(), key=lambda item: item[1])
    return name if size > 0 else None


def memory_near_full(figures: list[RankMemory]) -> list[Finding]:
    """Ranks whose device is more than MEMORY_FULL_PCT full at the peak (reserved memory, else
    allocated): one finding naming them, the fullest first."""
    full = sorted((f for f in figures if f.headroom_pct == f.headroom_pct
                   and 100 - f.headroom_pct > MEMORY_FULL_PCT), key=lambda f: f.headroom_pct)
    if not full:
        return []
    worst = full[0]
    used = worst.device_total_bytes * (1 - worst.headroom_pct / 100)
    evidence = (f"{len(full)} rank(s) use more than {MEMORY_FULL_PCT:g}% of the device at their "
                f"peak; rank {worst.rank}: {100 - worst.headroom_pct:.1f}% ({mib(used)} of "
                f"{mib(worst.device_total_bytes)}, peak allocated {mib(worst.peak_bytes)}).")
    category = _fullest_category(worst)
    if category is not None:
        evidence = evidence[:-1] + (f"; the largest share at the profiler's peak: "
                                    f"{category.replace('_', ' ')} "
                                    f"{mib(worst.categories_at_peak[category])}.")
        advice = "One allocation spike away from an out-of-memory error. " + ADVICE[category]
    else:
        advice = ("One allocation spike away from an out-of-memory error: activation "
                  "checkpointing, a smaller micro-batch with gradient accumulation, bf16, or "
                  "sharded optimizer state (FSDP/ZeRO)." + NO_CATEGORIES)
    headline = f"rank {worst.rank}'s device is {100 - worst.headroom_pct:.1f}% full"
    return [Finding(NEAR_FULL, math.nan, evidence, advice, _ranks(full), headline=headline)]


def allocator_fragmentation(figures: list[RankMemory]) -> list[Finding]:
    """Ranks whose allocator reserves more than FRAGMENTATION_PCT of the device above what it
    allocates at the peak (CUDA)."""
    loose = [f for f in figures if f.reserved_bytes == f.reserved_bytes
             and f.device_total_bytes > 0
             and (f.reserved_bytes - f.peak_bytes) / f.device_total_bytes * 100
             > FRAGMENTATION_PCT]
    if not loose:
        return []
    worst = max(loose, key=lambda f: f.reserved_bytes - f.peak_bytes)
    gap = worst.reserved_bytes - worst.peak_bytes
    evidence = (f"Rank {worst.rank}'s allocator reserves {mib(worst.reserved_bytes)} for a peak "
                f"of {mib(worst.peak_bytes)} allocated: {mib(gap)} "
                f"({gap / worst.device_total_bytes * 100:.0f}% of the device) is cached but "
                f"unused, too fragmented for the next allocations"
                + (f"; {len(loose)} rank(s) in all." if len(loose) > 1 else "."))
    advice = ("Let the allocator grow its segments instead of cutting new ones: "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; avoid "
              "torch.cuda.empty_cache() in the loop and allocations whose sizes change every "
              "step.")
    headline = f"rank {worst.rank}'s allocator holds {mib(gap)} reserved but unused"
    return [Finding(FRAGMENTED, math.nan, evidence, advice, _ranks(loose), headline=headline)]


def memory_findings(figures: list[RankMemory], stages: dict[int, int] | None = None
                    ) -> list[Finding]:
    """Every memory finding, in the module doc's order."""
    return [*memory_grows(figures), *memory_imbalance(figures, stages),
            *memory_near_full(figures), *allocator_fragmentation(figures)]


def memory_verdict_line(findings) -> str | None:
    """"Memory: ..." for the verdict, one clause per memory finding (its `headline`), in the
    findings' order; None without one (a run whose memory is fine adds no line)."""
    if not findings:
        return None
    return "Memory: " + "; ".join(finding.headline for finding in findings) + "."


def with_memory_findings(found: pd.DataFrame | None, findings) -> pd.DataFrame | None:
    """The bottlenecks table (FINDING_COLUMNS) with the memory `findings` after its rows; its
    own "memory near capacity" (from the ranks table) gives way to theirs where they say the
    same. None where the table failed."""
    if found is None or not findings:
        return found
    extra = pd.DataFrame([{**f.finding_row(), "ms_per_step": math.nan} for f in findings],
                         columns=FINDING_COLUMNS)
    if (extra["finding"] == NEAR_FULL).any():
        found = found[found["finding"] != NEAR_FULL]
    return pd.concat([found, extra.astype({"share_pct": "float64", "ms_per_step": "float64"})],
                     ignore_index=True)
