"""Who waits for whom, live, from the comms records as they come (docs/viewing.md, "Who waits
for whom").

An op is one instance on every member of its group: a collective by (group, position), native
ops (read from torch's Flight Recorder) in a namespace of their own, a send and its recv by
(group, sender, receiver, position). An instance is settled once every member's record has come
(a group's size of them; 2 for p2p). On rank 0's clock (each rank's clock_sync offset taken
off), a member's **arrival** is its issue time; the **last arrival** is the latest, and its
rank the instance's **last arriver**; a member waits `[arrival, last arrival)`. Per rank and
step (the step of the instance's lowest member), its **wait** is the length of the union of
those intervals (two buckets waited on at once are waited once) and its **lateness** the most it
arrived after the first member of a collective. The rank the others wait for in a step is the
last arriver of the step's collective whose arrivals spread the most (p2p ops add to the waits
only: a pipeline's stages wait for each other by design).

Pure: records in, numbers out; nothing here reads a file or a clock.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

from tracer import schema

# Instances waiting for a member's record, at most (a rank that died leaves its peers' halves).
MAX_PENDING = 20000
# Steps whose waits are kept (the view's medians use the recent ones: recent_steps).
KEPT_STEPS = 512
P2P_OPS = ("send", "recv")
# However many steps the recent ones must be at least, they reach back no further than this.
MAX_RECENT_S = 30.0


def within_recent(taken: int, spanned_s: float, at_least: int, window_s: float) -> bool:
    """Whether one more (older) step belongs to the recent steps, once `taken` of them span
    `spanned_s`: those of the last `window_s`, and at least the last `at_least` unless they
    would reach back beyond MAX_RECENT_S."""
    return (taken == 0 or spanned_s < window_s
            or (taken < at_least and spanned_s < MAX_RECENT_S))


@dataclass
class StepWaits:
    """One step's settled instances."""

    intervals: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    late_ns: dict[int, int] = field(default_factory=dict)  # rank -> its most lateness
    spread_ns: int = -1  # the largest spread of an instance of the step
    last_rank: int | None = None  # that instance's last arriver
    first_ns: int | None = None  # the first arrival at any of its instances

    def add(self, arrivals: dict[int, int], collective: bool = True) -> None:
        """One settled instance; a p2p one (`collective` False) adds its waits only: in a
        pipeline the stages wait for each other by design."""
        first, last = min(arrivals.values()), max(arrivals.values())
        self.first_ns = first if self.first_ns is None else min(self.first_ns, first)
        for rank, t in arrivals.items():
            if t < last:
                self.intervals.setdefault(rank, []).append((t, last))
            if collective:
                self.late_ns[rank] = max(self.late_ns.get(rank, 0), t - first)
            else:
                self.late_ns.setdefault(rank, 0)
        if not collective:
            return
        last_rank = min(r for r, t in arrivals.items() if t == last)
        if last - first > self.spread_ns:
            self.spread_ns, self.last_rank = last - first, last_rank

    def wait_ns(self, rank: int) -> int:
        """The length of the union of `rank`'s waiting intervals."""
        total, reach = 0, None
        for start, end in sorted(self.intervals.get(rank, ())):
            if reach is None or start > reach:
                total += end - start
                reach = end
            elif end > reach:
                total += end - reach
                reach = end
        return total


def instance_key(rank: int, record: schema.CommRecord) -> tuple | None:
    """The key one instance has on every member; None where the records cannot tell it."""
    if record.position is None:
        return None  # written before positions existed
    if record.op in P2P_OPS:
        if record.source == schema.NATIVE_SOURCE or record.peer is None:
            return None  # native p2p positions count every p2p op of the group, not per peer
        sender, receiver = (rank, record.peer) if record.op == "send" else (record.peer, rank)
        return (record.pg, "p2p", sender, receiver, record.position)
    return (record.pg, record.source == schema.NATIVE_SOURCE, record.position)


class ArrivalBook:
    """Instances as their members' records come, and each step's waits once settled."""

    def __init__(self):
        # key -> [members expected, {rank: arrival ns}, step, the rank that step is from]
        self.pending: OrderedDict[tuple, list] = OrderedDict()
        self.steps: dict[int, StepWaits] = {}
        self.settled = 0
        self.dropped = 0  # instances given up with members missing (MAX_PENDING)

    def add(self, rank: int, records: list[schema.CommRecord], offset_ns: int) -> None:
        """`rank`'s records, in file order; `offset_ns` its clock minus rank 0's."""
        for record in records:
            if record.step == 0:
                continue  # the script's set-up: start-up waits, not training
            key = instance_key(rank, record)
            if key is None:
                continue
            entry = self.pending.get(key)
            if entry is None:
                members = 2 if key[1] == "p2p" else record.pg_size
                entry = self.pending[key] = [members, {}, record.step, rank]
            elif rank < entry[3]:  # the step is the lowest member's
                entry[2], entry[3] = record.step, rank
            arrivals = entry[1]
            arrivals[rank] = record.start_ns - offset_ns
            if len(arrivals) >= entry[0]:
                del self.pending[key]
                self._settle(entry[2], arrivals, key[1] != "p2p")
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)
            self.dropped += 1

    def _settle(self, step: int, arrivals: dict[int, int], collective: bool) -> None:
        waits = self.steps.get(step)
        if waits is None:
            waits = self.steps[step] = StepWaits()
            if len(self.steps) > KEPT_STEPS:
                del self.steps[min(self.steps)]
        waits.add(arrivals, collective)
        self.settled += 1

    def recent_steps(self, at_least: int, window_s: float) -> list[int]:
        """The recent steps with settled instances (within_recent; the span from their ops'
        first arrivals), less the newest (its other instances may not have settled)."""
        steps = sorted(self.steps)[:-1]
        if not steps:
            return []
        newest = self.steps[steps[-1]].first_ns
        chosen, spanned_s = 0, 0.0
        for step in reversed(steps):
            if not within_recent(chosen, spanned_s, at_least, window_s):
                break
            chosen += 1
            spanned_s = (newest - self.steps[step].first_ns) / 1e9
        return steps[len(steps) - chosen:]


@dataclass(frozen=True)
class WaitSummary:
    """Waits over the recent steps."""

    steps: list[int]
    wait_ms: dict[int, float]  # rank -> median over the steps of its wait
    late_ms: dict[int, float]  # rank -> median over the steps of its lateness
    culprits: dict[int, int]  # step -> its last arriver (largest spread)
    others_wait_ms: dict[int, float]  # step -> median wait of the ranks but its last arriver


def summarise(book: ArrivalBook, at_least: int, window_s: float) -> WaitSummary:
    steps = book.recent_steps(at_least, window_s)
    per_rank_wait: dict[int, list[float]] = {}
    per_rank_late: dict[int, list[float]] = {}
    culprits, others = {}, {}
    for step in steps:
        waits = book.steps[step]
        ranks = waits.late_ns.keys()
        step_wait = {rank: waits.wait_ns(rank) / 1e6 for rank in ranks}
        for rank in ranks:
            per_rank_wait.setdefault(rank, []).append(step_wait[rank])
            per_rank_late.setdefault(rank, []).append(waits.late_ns[rank] / 1e6)
        if waits.last_rank is not None and len(step_wait) > 1:
            culprits[step] = waits.last_rank
            others[step] = statistics.median(w for r, w in step_wait.items()
                                             if r != waits.last_rank)
    return WaitSummary(
        steps=steps,
        wait_ms={r: statistics.median(v) for r, v in per_rank_wait.items()},
        late_ms={r: statistics.median(v) for r, v in per_rank_late.items()},
        culprits=culprits, others_wait_ms=others)


@dataclass(frozen=True)
class WaitedFor:
    """The rank the others wait for, named."""

    rank: int
    wait_ms: float  # median over the recent steps of the others' wait for it (0 where it
    # was not the last to arrive)
    steps_last: int  # recent steps in which it arrived last
    steps: int  # recent steps with settled instances


# A rank is named when it arrived last in at least this share of the recent steps (at least
# MIN_NAMED_STEPS of them), and the others' wait for it, a median over the recent steps, is at
# least max(MIN_WAIT_MS, MIN_WAIT_SHARE x the median step time): a rank that holds the job
# back by a fifth of its step, step after step. Two ranks that are each late half the time
# (the noise of a shared machine) are never named.
NAMED_SHARE = 0.75
MIN_NAMED_STEPS = 5
MIN_WAIT_MS = 0.5
MIN_WAIT_SHARE = 0.2


def waited_for(summary: WaitSummary, step_ms: float | None) -> WaitedFor | None:
    """The rank the others wait for over the recent steps; None when no rank holds them
    back more than noise does."""
    if not summary.culprits:
        return None
    counts: dict[int, int] = {}
    for rank in summary.culprits.values():
        counts[rank] = counts.get(rank, 0) + 1
    rank = max(counts, key=lambda r: (counts[r], -r))
    steps = len(summary.steps)
    if counts[rank] < max(MIN_NAMED_STEPS, NAMED_SHARE * steps):
        return None
    wait = statistics.median(summary.others_wait_ms[s] if summary.culprits.get(s) == rank
                             else 0.0 for s in summary.steps)
    if wait < max(MIN_WAIT_MS, MIN_WAIT_SHARE * (step_ms or 0.0)):
        return None
    return WaitedFor(rank=rank, wait_ms=wait, steps_last=counts[rank], steps=steps)
