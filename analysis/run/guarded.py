"""One part of a run's analysis at a time, each failure costing that part only: the part that
raises becomes one problem naming it and is marked unavailable, and the rest is still analysed
(docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from analysis.core.contracts import failure_text

T = TypeVar("T")


class Guarded:
    """The problems and the unavailable parts met by the parts run through it so far."""

    def __init__(self):
        self.problems: list[str] = []
        self.unavailable: dict[str, str] = {}

    def part(self, key: str | None, build: Callable[[], T], problem: str) -> T | None:
        """build(), or None where it raises: `problem` (with `{why}`, the failure as the report
        names it) joins the problems, and unavailable[key] says why (a part of a rank's table,
        `key` None, leaves the table available)."""
        try:
            return build()
        except Exception as exc:  # one part's failure must not cost the others
            why = failure_text(exc)
            self.problems.append(problem.format(why=why))
            if key is not None:
                self.unavailable[key] = why
            return None

    def table(self, name: str, build: Callable[[], T]) -> T | None:
        """part() of the run's table `name`: "<name> table failed: <why>"."""
        return self.part(name, build, f"{name} table failed: {{why}}")
