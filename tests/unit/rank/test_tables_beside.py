"""A run's one trace has some of its tables (its HTA summary, comm events, FLOP tables and
one-rank critical path) computed in one forked child beside the rest of its reduction
(analysis.rank.reduction.rank_tables, `path_beside`): the tables taken are those computed here,
and a failure there is the failure computing it here gives."""

from __future__ import annotations

import os
import sys

import pandas as pd
import pytest

from analysis.core.contracts import ReducedTableFailed
from analysis.core.forked import ForkedResult
from analysis.rank import flops
from analysis.rank.reduction import BESIDE, rank_tables
from analysis.run.loading import load_run_path
from helpers.flops_run import MM_FLOPS, write_flops_run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
                                reason="tables are computed beside on Linux with two cores")


@pytest.fixture
def trace(tmp_path):
    return load_run_path(write_flops_run(tmp_path / "run"), use_cache=False).ranks[0]


def test_the_tables_computed_beside_are_the_ones_computed_here(trace):
    beside = rank_tables(trace, only_trace=True, path_beside=True)
    here = rank_tables(trace, only_trace=True)
    assert all(isinstance(getattr(beside, name), ForkedResult) for name in BESIDE)
    assert beside.take("step_flops")["flops_per_step"].tolist() == [MM_FLOPS]
    for name in ("step_flops", "op_roofline"):
        pd.testing.assert_frame_equal(beside.take(name), here.take(name))
    for name in ("critical_path_steps", "critical_path_segments"):
        pd.testing.assert_frame_equal(getattr(beside.take("critical_path"), name),
                                      getattr(here.take("critical_path"), name))
    assert beside.take("critical_path").what_if == here.take("critical_path").what_if
    assert repr(beside.take("hta")) == repr(here.take("hta"))  # NaN is not NaN once sent
    pd.testing.assert_frame_equal(beside.take("comm_events"), here.take("comm_events"))
    assert not isinstance(beside.per_step, ForkedResult)  # the rest computed here


def test_a_table_that_fails_beside_fails_where_it_is_taken_and_alone(trace, monkeypatch):
    def broken(trace):
        raise ValueError("no ops")

    monkeypatch.setattr(flops, "rank_flops_tables", broken)
    beside = rank_tables(trace, only_trace=True, path_beside=True)
    for name in ("step_flops", "op_roofline"):
        with pytest.raises(ReducedTableFailed, match="ValueError: no ops"):
            beside.take(name, "rank 0")
    assert len(beside.take("critical_path").critical_path_steps) == 1


def test_only_a_runs_one_trace_has_tables_beside(trace):
    reduced = rank_tables(trace, only_trace=False, path_beside=True)
    assert not any(isinstance(getattr(reduced, name), ForkedResult) for name in BESIDE)
