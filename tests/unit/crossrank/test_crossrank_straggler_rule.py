"""The straggler rule (analysis.crossrank.culprit) over a whole run's recorded steps: how often it
names a rank in runs without one (its false-positive rate), and that it names a 25 ms straggler
in runs of 20 and 30 steps, on ranks whose arrivals carry scheduler-like noise (docs/cross-rank.md,
"Culprit and victims")."""

from fractions import Fraction
from math import comb

import numpy as np
import pandas as pd
import pytest

from analysis.crossrank import analyse
from analysis.crossrank.culprit import chance_of
from helpers.crossrank_ops import MS, frame, issue_only, op, steps_frame

STEP_NS = 100 * MS
BUCKETS = 3
SEEDS = 30  # 0 of 300 noisy runs named a rank, of 2 ranks and of 4
NAMED_SEEDS = 5


def _synced(ranks):
    return pd.DataFrame({"rank": list(range(ranks)), "offset_ns": 0, "uncertainty_ns": 1_000})


def _noisy_run(seed, ranks=2, steps=30, late_rank=None, late_ns=0, timed=True):
    """`steps` steps of BUCKETS all-reduces per rank. Each rank reaches its buckets after its
    own compute plus noise as a shared, loaded machine gives it: a few ms drawn per step and
    rank, and in one step of ten a 15 ms scheduler delay; `late_rank` is `late_ns` later
    every step. Timed ops end 1 ms after the last arrival; untimed ones are issue-only."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(steps):
        noise = rng.exponential(3 * MS, ranks) + (rng.random(ranks) < 0.1) * 15 * MS
        reach = s * STEP_NS + 40 * MS + noise + np.where(np.arange(ranks) == late_rank,
                                                          late_ns, 0)
        for k in range(BUCKETS):
            issue = reach + k * 2 * MS
            end = issue.max() + 1 * MS
            for r in range(ranks):
                rows.append(op(r, issue[r], end, step=s, size=ranks) if timed
                            else issue_only(r, issue[r], step=s, size=ranks))
    return frame(rows), steps_frame(range(ranks), range(steps), STEP_NS)


def _named(seed, **kwargs):
    ops, steps = _noisy_run(seed, **kwargs)
    ranks = kwargs.get("ranks", 2)
    table = analyse(ops, steps, _synced(ranks), ranks).stragglers
    return sorted(table.loc[table["fires"].astype(bool), "rank"].tolist())


@pytest.mark.parametrize("ranks", [2, 4])
def test_runs_without_a_straggler_name_nobody(ranks):
    # The rule's own chance level is 1e-3 per run and rank; its steadiness and share thresholds
    # keep noise further off.
    assert [seed for seed in range(SEEDS) if _named(seed, ranks=ranks)] == []


def test_issue_only_records_without_a_straggler_name_nobody():
    named = [seed for seed in range(SEEDS // 2) if _named(seed, timed=False)]
    assert named == []


@pytest.mark.parametrize("steps", [20, 30])
@pytest.mark.parametrize("timed", [True, False], ids=["timed", "issue_only"])
def test_a_25_ms_straggler_is_named_in_every_noisy_run(steps, timed):
    missed = [seed for seed in range(NAMED_SEEDS)
              if _named(seed, steps=steps, late_rank=1, late_ns=25 * MS, timed=timed) != [1]]
    assert missed == []


def test_a_straggler_among_four_ranks_is_named_and_nobody_else():
    missed = [seed for seed in range(NAMED_SEEDS)
              if _named(seed, ranks=4, late_rank=2, late_ns=25 * MS) != [2]]
    assert missed == []


def test_the_chance_of_a_culprit_holds_over_thousands_of_steps():
    # math.comb(2000, 1000) has 600 digits: summed as floats it overflowed, and the rule failed
    # on every run of more than about 1,030 clean steps
    def exact(top, steps, members):
        p = Fraction(1, members)
        return float(sum(comb(steps, k) * p ** k * (1 - p) ** (steps - k)
                         for k in range(top, steps + 1)))

    for top, steps, members in ((10, 10, 2), (56, 77, 2), (3, 20, 4), (1050, 2000, 2),
                                (1100, 2000, 2), (600, 2000, 4)):
        assert chance_of(top, steps, members) == pytest.approx(exact(top, steps, members),
                                                               rel=1e-9, abs=1e-300)
    assert chance_of(0, 2000, 2) == pytest.approx(1.0)
    assert chance_of(2000, 2000, 2) == pytest.approx(0.5 ** 2000, rel=1e-9, abs=1e-300)
