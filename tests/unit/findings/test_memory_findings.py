"""The memory findings and the verdict's memory line (analysis.findings.memory_findings), on rank
figures built with known values: each finding's threshold, its evidence in numbers, and advice
that follows the category that makes the difference or fills the peak."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from analysis.core.contracts import FINDING_COLUMNS, MEASURE_CUDA, MEASURE_RSS, RankMemory
from analysis.findings.memory_findings import (
    ADVICE,
    FRAGMENTED,
    GROWS,
    IMBALANCE,
    NEAR_FULL,
    NO_CATEGORIES,
    UNKNOWN_DIFFERENCE,
    memory_findings,
    memory_verdict_line,
    with_memory_findings,
)

MIB = 1 << 20
GIB = 1 << 30
NONE = dict.fromkeys(("parameter", "gradient", "optimizer_state", "activation", "temporary",
                      "input", "other"), 0)


def _rss(rank, peak, **changes):
    figure = RankMemory(
        rank=rank, measure=MEASURE_RSS, steps=199, first_step=1, last_step=199, peak_bytes=peak,
        peak_step=150, reserved_bytes=math.nan, device_total_bytes=math.nan,
        headroom_pct=math.nan, growth_bytes_per_step=0.0, growth_from_step=None,
        noise_bytes=262144.0, steps_to_full=math.nan, full_at_step=None,
        categories_at_peak=None, categories_steps=None, categories_peak_bytes=math.nan)
    return dataclasses.replace(figure, **changes)


def _cuda(rank, peak, reserved, total=80 * GIB, **changes):
    return _rss(rank, peak, measure=MEASURE_CUDA, reserved_bytes=reserved,
                device_total_bytes=total, headroom_pct=(total - reserved) / total * 100,
                **changes)


def _named(findings, name):
    return [f for f in findings if f.name == name]


def test_a_growing_rank_is_named_with_its_rate_first_step_and_when_the_device_is_full():
    growing = _cuda(1, 60 * GIB, 62 * GIB, growth_bytes_per_step=64 * MIB, growth_from_step=20,
                    steps_to_full=288.0, full_at_step=487)
    findings = memory_findings([_cuda(0, 60 * GIB, 62 * GIB), growing])
    (grows,) = _named(findings, GROWS)
    assert grows.ranks == "1" and math.isnan(grows.share_pct)
    assert grows.evidence.startswith("Rank 1's memory grows 64.00 MiB per step from step 20")
    assert "the device is full at step 487, 288 steps after the last analysed one" in \
        grows.evidence
    assert "--profile-memory" in grows.suggestion  # no categories: how to get them
    assert memory_verdict_line(findings) == (
        "Memory: rank 1 grows 64.00 MiB per step from step 20, full at step 487.")


def test_growth_advice_follows_the_category_that_grows_between_windows():
    figure = _rss(0, 900 * MIB, growth_bytes_per_step=2 * MIB, growth_from_step=20,
                  categories_at_peak=NONE,
                  categories_growth_per_step={**NONE, "activation": 2.0 * MIB})
    (grows,) = memory_findings([figure])
    assert grows.suggestion.startswith(
        "Between its profiler windows the activation tensors grow 2.00 MiB per step.")
    assert ADVICE["activation"] in grows.suggestion
    assert "device's capacity is not known here" in grows.evidence


def test_a_rank_256_mib_above_the_median_is_named_with_what_its_categories_do_not_explain():
    same = {**NONE, "parameter": 789504, "optimizer_state": 1579032}
    findings = memory_findings([_rss(0, 586 * MIB, categories_at_peak=same),
                                _rss(1, 330 * MIB, categories_at_peak=same)])
    (imbalance,) = _named(findings, IMBALANCE)
    assert imbalance.ranks == "0"
    assert imbalance.evidence == (
        "Rank 0 peaks 256.00 MiB above the median rank (rank 1: 330.00 MiB, its RSS; +78%); "
        "256.00 MiB is outside the tensors the profiler saw in its window (buffers allocated "
        "before it and unused in it, or memory outside tensors).")
    assert imbalance.suggestion == ADVICE["other"]
    assert memory_verdict_line(findings) == (
        "Memory: rank 0 peaks 256.00 MiB above the median rank (rank 1).")


def test_imbalance_advice_follows_the_category_that_makes_the_difference():
    low = {**NONE, "parameter": 2 * GIB, "optimizer_state": 4 * GIB, "activation": 6 * GIB}
    high = {**low, "optimizer_state": 12 * GIB, "activation": 7 * GIB}
    (imbalance,) = _named(memory_findings(
        [_cuda(0, 22 * GIB, 23 * GIB, categories_at_peak=high),
         _cuda(1, 12 * GIB, 13 * GIB, categories_at_peak=low),
         _cuda(2, 12 * GIB, 13 * GIB, categories_at_peak=low)],
        stages={0: 0, 1: 1, 2: 2}), IMBALANCE)
    assert "at the profiler's peak: optimizer state +8.00 GiB, activation +1.00 GiB" in \
        imbalance.evidence
    assert "rank 0 is pipeline stage 0 of 3" in imbalance.evidence
    assert imbalance.suggestion == ADVICE["optimizer_state"]


def test_small_or_relative_differences_below_the_thresholds_are_no_imbalance():
    # 31 MiB above (under 32 MiB), and 40 MiB above 1 GiB (under 10%)
    assert not memory_findings([_rss(0, 331 * MIB), _rss(1, 300 * MIB)])
    assert not memory_findings([_rss(0, GIB + 40 * MIB), _rss(1, GIB)])
    assert not memory_findings([_rss(0, 300 * MIB)])  # one rank: no median to compare


def test_a_device_over_90_percent_full_gets_the_advice_of_its_largest_category():
    full = _cuda(2, 70 * GIB, 74 * GIB,
                 categories_at_peak={**NONE, "activation": 40 * GIB, "parameter": 10 * GIB})
    findings = memory_findings([full, _cuda(3, 70 * GIB, 70 * GIB)])
    (near,) = _named(findings, NEAR_FULL)
    assert near.ranks == "2"
    assert near.evidence == (
        "1 rank(s) use more than 90% of the device at their peak; rank 2: 92.5% (74.00 GiB of "
        "80.00 GiB, peak allocated 70.00 GiB); the largest share at the profiler's peak: "
        "activation 40.00 GiB.")
    assert near.suggestion.endswith(ADVICE["activation"])
    assert not _named(findings, FRAGMENTED)  # 4 GiB reserved above allocated: 5% of 80


def test_reserved_far_above_allocated_is_fragmentation_with_expandable_segments():
    findings = memory_findings([_cuda(0, 40 * GIB, 52 * GIB)])
    (fragmented,) = _named(findings, FRAGMENTED)
    assert fragmented.evidence.startswith(
        "Rank 0's allocator reserves 52.00 GiB for a peak of 40.00 GiB allocated: 12.00 GiB "
        "(15% of the device)")
    assert "expandable_segments:True" in fragmented.suggestion
    assert memory_verdict_line(findings) == (
        "Memory: rank 0's allocator holds 12.00 GiB reserved but unused.")


def test_a_clean_run_has_no_memory_finding_and_no_verdict_line():
    findings = memory_findings([_cuda(0, 40 * GIB, 41 * GIB), _cuda(1, 40 * GIB, 41 * GIB)])
    assert findings == [] and memory_verdict_line(findings) is None


def test_an_imbalance_without_categories_says_how_to_get_them():
    (imbalance,) = memory_findings([_rss(0, 586 * MIB), _rss(1, 330 * MIB)])
    assert imbalance.evidence == ("Rank 0 peaks 256.00 MiB above the median rank (rank 1: "
                                     "330.00 MiB, its RSS; +78%).")
    assert imbalance.suggestion.startswith(UNKNOWN_DIFFERENCE)
    assert imbalance.suggestion.endswith(NO_CATEGORIES)


def test_memory_findings_follow_the_bottlenecks_and_replace_their_near_capacity():
    table = pd.DataFrame([
        {"finding": "exposed communication", "share_pct": 20.0, "evidence": "e",
         "suggestion": "s", "ranks": "0-1", "ms_per_step": 4.0},
        {"finding": NEAR_FULL, "share_pct": math.nan, "evidence": "from the ranks table",
         "suggestion": "s", "ranks": "2", "ms_per_step": math.nan}], columns=FINDING_COLUMNS)
    full = memory_findings([_cuda(2, 70 * GIB, 75 * GIB)])
    combined = with_memory_findings(table, full)
    assert combined["finding"].tolist() == ["exposed communication", NEAR_FULL]
    assert combined["evidence"].iloc[1] == full[0].evidence
    assert math.isnan(combined["ms_per_step"].iloc[1])
    grows = memory_findings([_rss(0, 586 * MIB, growth_bytes_per_step=2.0 * MIB,
                                  growth_from_step=20)])
    kept = with_memory_findings(table, grows)
    assert kept["finding"].tolist() == ["exposed communication", NEAR_FULL, GROWS]
    assert with_memory_findings(table, []) is table and with_memory_findings(None, full) is None
