"""A rank's table or summary as the run-wide analyses take it: the one its reduction kept
(analysis.rank.reduction.rank_tables, run where the rank's file was parsed), the failure that
reduction recorded, or, for a rank that was not reduced, one computed from its events.

A failure is raised where the table is taken, not computed again: the rank's events were
dropped once reduced, and computing it again would decode its trace a second time to fail the
same way (docs/analysis.md, "Large runs and Dask").
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.core.events import with_events
from analysis.core.forked import ComputedElsewhereFailed, ForkedResult

# The key of a reduction's failures: {table or summary name: "ExceptionType: message"}.
FAILED = "failed"


class ReducedTableFailed(Exception):
    """A rank's table or summary that failed where its file was parsed. `why` is the failure
    as it was ("ExceptionType: message"), which the report gives as a failure computed in the
    command would be given."""

    def __init__(self, label: str, name: str, why: str):
        super().__init__(f"{label}'s {name} failed where its trace was parsed: {why}")
        self.name = name
        self.why = why


def failure_text(exc: Exception) -> str:
    """How the report names a failure: "ExceptionType: message", the reduction's own for a
    ReducedTableFailed."""
    return exc.why if isinstance(exc, ReducedTableFailed) else f"{type(exc).__name__}: {exc}"


def raise_if_failed(trace, *names: str) -> None:
    """ReducedTableFailed for the first of `names` that the rank's reduction failed to build."""
    failed = (getattr(trace, "reduced", None) or {}).get(FAILED) or {}
    for name in names:
        if name in failed:
            raise ReducedTableFailed(getattr(trace, "label", "the rank"), name, failed[name])


def reduced_table(trace, name: str, build: Callable):
    """The rank's `name`: its reduction's (None included, a summary's value; one computed beside,
    analysis.core.forked, waited for), the failure its reduction recorded (ReducedTableFailed),
    else build(the rank with its events), which reads them again only where the rank was
    neither reduced nor holds them."""
    reduced = getattr(trace, "reduced", None) or {}
    if name in reduced:
        found = reduced[name]
        if isinstance(found, ForkedResult):  # still being computed beside: waited for once
            try:
                reduced[name] = found = found.result()
            except ComputedElsewhereFailed as exc:
                del reduced[name]
                reduced.setdefault(FAILED, {})[name] = exc.why
                raise_if_failed(trace, name)
        return found
    raise_if_failed(trace, name)
    return build(with_events(trace))
