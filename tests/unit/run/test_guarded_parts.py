"""One part of a run's analysis failing alone (analysis.run.guarded): its failure is one problem
naming the part, the part is marked unavailable with why, and the parts after it still run."""

from analysis.core.contracts import ReducedTableFailed
from analysis.run.guarded import Guarded


def _raise(exc: Exception):
    raise exc


def test_a_failing_part_is_one_problem_and_unavailable_and_the_next_part_runs():
    guarded = Guarded()
    assert guarded.part("cross_rank", lambda: _raise(ValueError("no ops")),
                        "cross-rank analysis failed ({why}); no waits") is None
    assert guarded.table("mfu", lambda: 42) == 42
    assert guarded.problems == ["cross-rank analysis failed (ValueError: no ops); no waits"]
    assert guarded.unavailable == {"cross_rank": "ValueError: no ops"}


def test_a_table_is_named_and_a_ranks_failure_is_its_own():
    guarded = Guarded()
    failed = ReducedTableFailed("rank 1", "step_flops", "KeyError: 'flops'")
    assert guarded.table("mfu", lambda: _raise(failed)) is None
    assert guarded.problems == ["mfu table failed: KeyError: 'flops'"]
    assert guarded.unavailable == {"mfu": "KeyError: 'flops'"}


def test_a_part_of_a_ranks_rows_leaves_the_table_available():
    guarded = Guarded()
    assert guarded.part(None, lambda: _raise(OSError("gone")), "rank 0 has no rows ({why})") \
        is None
    assert guarded.problems == ["rank 0 has no rows (OSError: gone)"]
    assert guarded.unavailable == {}
