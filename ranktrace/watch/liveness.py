"""Which ranks without a run_end are gone: their process has ended (on this host), or nothing
of theirs has grown for a while (another host, whose processes cannot be checked from here)."""

from __future__ import annotations

import os
import socket

from ranktrace.watch.model import RunModel

# Ranks of the world that wrote nothing are given up this long after every other rank ended.
MISSING_GRACE_S = 10.0


def process_ended(pid: int) -> bool:
    """No process `pid` on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        pass
    return False


class Liveness:
    def __init__(self, silent_s: float, host: str | None = None):
        self.silent_s = silent_s
        self.host = host or socket.gethostname()
        self.grown_at: dict[int, float] = {}
        self.ended_once: set[int] = set()
        self.rest_ended_at: float | None = None

    def update(self, model: RunModel, grown: set[int], now: float) -> None:
        """Mark the ranks that are gone; `grown`: the ranks with new bytes in the last poll,
        `now`: a monotonic clock in seconds."""
        for rank in grown:
            self.grown_at[rank] = now
        for rank, state in model.ranks.items():
            if state.finished:
                continue
            self.grown_at.setdefault(rank, now)
            start = state.start
            if start is not None and start.host == self.host:
                # Seen ended on two polls with nothing new between: a run_end written just
                # before the process left is read in the poll between.
                if rank not in grown and process_ended(start.pid):
                    if rank in self.ended_once:
                        model.mark_gone(rank, f"its process {start.pid} ended without run_end")
                    self.ended_once.add(rank)
                else:
                    self.ended_once.discard(rank)
            elif now - self.grown_at[rank] >= self.silent_s:
                host = f" on {start.host}" if start is not None else ""
                model.mark_gone(rank, f"nothing written for {self.silent_s:g} s{host} and no "
                                      f"run_end")
        self._missing(model, now)

    def _missing(self, model: RunModel, now: float) -> None:
        missing = model.missing_ranks()
        if not missing or not model.ranks or not all(s.finished for s in model.ranks.values()):
            self.rest_ended_at = None
            return
        if self.rest_ended_at is None:
            self.rest_ended_at = now
        elif now - self.rest_ended_at >= MISSING_GRACE_S:
            for rank in missing:
                model.mark_gone(rank, "wrote nothing in the run's folders")
