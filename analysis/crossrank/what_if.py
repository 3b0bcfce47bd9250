"""What-if answers on the step graph: nodes shortened, every step propagated again, the step
ends compared (docs/critical-path.md).

- `rank_on_time`: rank R's host work before each of its issues set to the median of the other
  members' work before the same instance, and its work after its last op to its step's end to
  the other ranks' median in that step (where that is shorter);
- `transfer_overlapped`: a collective's transfer (op, group, size bucket) set to 0;
- `transfer_at_busbw`: that transfer at a given bus bandwidth (where that is shorter);
- the pipeline's (what_if_pipeline) and the idle gaps' (what_if_idle) changes, passed in.

saved_ms_per_step = the mean over analysed steps (a change's own steps where it names them) of
the step's own saving: (latest step end measured - latest step end predicted), less that of the
step before where the graph is chained and the steps follow each other; predicted_step_ms = the
mean measured step time (every rank and analysed step) - saved_ms_per_step. Every change is
propagated at once, one column per change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.dag import propagate
from analysis.crossrank.step_graph import END_OF_OP, ISSUE, StepGraph
from analysis.rank.comm.comm_ops import size_bucket
from tracer import schema

WHAT_IF_KEYS = ["change", "kind", "ranks", "saved_ms_per_step", "predicted_step_ms",
                "assumptions"]
# The changes asked of a run of many ranks or groups: the ranks that caused most wait and the
# groups with most transfer.
MOST_CHANGES = 16
IGNORED = ("contention for cores, memory bandwidth or links, caches and clock error between "
           "ranks are not modelled")
# ... and what is said in its place where the ranks compute on the host (what_if_cores).
IGNORED_ON_SHARED_CORES = (
    "each rank's host work and transfers are threads served by the host's cores at once "
    "(processor sharing); memory bandwidth, links, caches and clock error between ranks are "
    "not modelled")
ON_TIME = "rank_on_time"


@dataclass
class Change:
    """One what-if question: its row (change, kind, ranks, assumptions), every node's duration
    under it, and the analysed steps its saving is measured over (None: all of them)."""

    about: dict
    duration: np.ndarray
    steps: np.ndarray | None = None


def nodes_of_ops(graph: StepGraph, kind: int) -> np.ndarray:
    """The node of `kind` (ISSUE or END_OF_OP) of each row of graph.ops."""
    nodes = np.flatnonzero(graph.kind == kind)
    return nodes[np.argsort(graph.op_row[nodes], kind="stable")]


def rank_on_time(graph: StepGraph, rank: int, duration: np.ndarray) -> np.ndarray:
    """Durations with `rank`'s work before each collective it issues at most the other
    members' median before the same instance (p2p ops are left alone: pipeline stages do
    different work), and its work after its last op to the end of a step with a collective
    of its at most the median of the other ranks' in that step."""
    issues = nodes_of_ops(graph, ISSUE)
    ops = graph.ops
    mine = (ops["rank"].to_numpy() == rank) & ~ops["op"].isin(P2P_OPS).to_numpy()
    changed = duration.copy()
    _at_most_median(changed, duration, issues, ops["instance"].to_numpy(), mine, ~mine)
    # The tail of its step: a rank that ends a step late starts the next late (on the chained
    # graph, its peers then wait for it at the next step's first collective).
    ends = graph.step_ends
    step, on_rank = graph.step[ends], graph.rank[ends] == rank
    own_tail = on_rank & np.isin(step, ops.loc[mine, "step"].to_numpy())
    _at_most_median(changed, duration, ends, step, own_tail, ~on_rank)
    return changed


def _at_most_median(changed: np.ndarray, duration: np.ndarray, nodes: np.ndarray,
                    group: np.ndarray, own: np.ndarray, others: np.ndarray) -> None:
    """Set each of `nodes` where `own` to the median duration of the nodes where `others` of
    its `group`, where that is shorter (in `changed`)."""
    work = pd.Series(duration[nodes])
    median = pd.Series(group[own]).map(work[others].groupby(group[others]).median()
                                       ).to_numpy(dtype="float64")
    mine = nodes[own]
    shorter = np.isfinite(median) & (median < duration[mine])
    changed[mine[shorter]] = np.rint(median[shorter]).astype(np.int64)


def _groups(ops: pd.DataFrame) -> pd.Series:
    labels = {b: size_bucket(b)[0] for b in ops["bytes"].unique()}
    return ops["op"].astype(str) + " on group " + ops["pg"].astype(str) + " (" + \
        ops["bytes"].map(labels) + ")"


def transfer_changed(graph: StepGraph, rows: np.ndarray, duration: np.ndarray,
                     busbw_gbps: float | None = None) -> np.ndarray:
    """Durations with the transfer of ops `rows` at 0, or at `busbw_gbps` (where shorter)."""
    ends = nodes_of_ops(graph, END_OF_OP)[rows]
    changed = duration.copy()
    if busbw_gbps is None:
        changed[ends] = np.minimum(duration[ends], 0)
        return changed
    ops = graph.ops.iloc[rows]
    factor = np.array([schema.bus_factor(o, n) for o, n in zip(ops["op"], ops["pg_size"])])
    at = ops["bytes"].to_numpy(dtype="float64") * factor / busbw_gbps  # ns: B / (GB/s)
    known = np.isfinite(at)
    changed[ends[known]] = np.minimum(duration[ends[known]], np.rint(at[known]).astype(np.int64))
    return changed


def _changes(graph: StepGraph, busbw_gbps: float | None) -> list[Change]:
    ops, duration = graph.ops, graph.duration
    changes = []
    caused = ops.groupby("last_rank")["wait_ns"].sum()
    for rank in caused[caused > 0].sort_values(ascending=False).index[:MOST_CHANGES]:
        shortened = rank_on_time(graph, int(rank), duration)
        if np.array_equal(shortened, duration):  # no work of its to shorten
            continue
        changes.append(Change({
            "change": f"rank {rank} on time", "kind": ON_TIME, "ranks": [int(rank)],
            "assumptions": f"rank {rank}'s host work before each op it issues set to the median "
                           f"of the other members' before the same op, and its work after its "
                           f"last op to its step's end to the other ranks' median, where "
                           f"shorter; the rest of every rank's work, and every transfer, "
                           f"unchanged; {IGNORED}"}, shortened))
    group = _groups(ops).to_numpy()
    moved = ops.assign(group=group).groupby("group")["transfer_ns"].sum()
    for name in moved[moved > 0].sort_values(ascending=False).index[:MOST_CHANGES]:
        rows = np.flatnonzero(group == name)
        ranks = sorted(int(r) for r in ops["rank"].iloc[rows].unique())
        changes.append(Change({
            "change": f"{name} transfer overlapped", "kind": "transfer_overlapped",
            "ranks": ranks,
            "assumptions": "the transfer of every such op (its end after its last member "
                           "arrived) hidden under compute, its waits unchanged; " + IGNORED},
            transfer_changed(graph, rows, duration)))
        if busbw_gbps:
            changes.append(Change({
                "change": f"{name} at {busbw_gbps:g} GB/s busbw", "kind": "transfer_at_busbw",
                "ranks": ranks,
                "assumptions": f"the transfer of every such op at bytes x bus factor / "
                               f"{busbw_gbps:g} GB/s, where shorter; " + IGNORED},
                transfer_changed(graph, rows, duration, busbw_gbps)))
    return changes


def step_ends(graph: StepGraph, times: np.ndarray) -> np.ndarray:
    """Per analysed step (sorted) and column of `times`: the latest step end."""
    ends = graph.step_ends
    steps, of_step = np.unique(graph.step[ends], return_inverse=True)
    latest = np.full((len(steps), times.shape[1]), np.iinfo(np.int64).min)
    np.maximum.at(latest, of_step, times[ends])
    return latest


def measured_step_ms(graph: StepGraph) -> float:
    """The mean measured step time of every rank and analysed step, ms."""
    steps = graph.steps
    return float((steps["end_ns"] - steps["start_ns"]).mean()) / 1e6


# Per change and analysed step (sorted step numbers): the least step time (ms) the change can
# give, NaN where none is known (what_if_cores: the host's cores).
StepBound = Callable[[Change, np.ndarray], np.ndarray]


def answers(graph: StepGraph, busbw_gbps: float | None = None,
            more: list[Change] | tuple = ()) -> list[dict]:
    """Every change's saving and predicted step time, largest saving first: the rank and
    transfer changes, then `more` (the pipeline's and idle gaps' changes)."""
    return answers_by_step(graph, busbw_gbps, more)[0]


def answers_by_step(graph: StepGraph, busbw_gbps: float | None = None,
                    more: list[Change] | tuple = (), least: StepBound | None = None,
                    shared: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> tuple[list[dict], pd.DataFrame]:
    """(answers, as `answers` gives them; per analysed step, its measured mean step over the
    ranks, `measured_ms`, and each change's own saving in it, one column per change named by
    its `change`, NaN in the steps the change does not name): the steps' savings let a stretch
    of steps (a phase, analysis.crossrank.phases) be answered on its own steps. `least`: each
    step's saving at most its measured step less the step time `least` gives for the change.
    `shared`: the durations (nodes x changes, the measured first) as the host's cores serve
    them under each change (what_if_cores.on_shared_cores), where the ranks compute there."""
    changes = _changes(graph, busbw_gbps) + list(more)
    if not changes:
        return [], pd.DataFrame(columns=["step", "measured_ms"])
    durations = np.column_stack([graph.duration] + [c.duration for c in changes])
    if shared is not None:
        durations = shared(durations)
    latest = step_ends(graph, propagate(graph, durations))
    saved_per_step = (latest[:, :1] - latest[:, 1:]) / 1e6
    numbers = np.unique(graph.step[graph.step_ends])
    if graph.chained:
        # A step's own saving: its end moved less the move it took over from the step before.
        follows = np.flatnonzero(np.diff(numbers) == 1) + 1
        saved_per_step[follows] -= ((latest[:, :1] - latest[:, 1:]) / 1e6)[follows - 1]
    measured = measured_step_ms(graph)
    rows = []
    by_step = {"step": numbers, "measured_ms": _measured_by_step(graph, numbers)}
    for j, change in enumerate(changes):
        kept = np.ones(len(numbers), dtype=bool) if change.steps is None else np.isin(
            numbers, change.steps)
        said = change.about["assumptions"]
        if shared is not None:
            said = said.replace(IGNORED, IGNORED_ON_SHARED_CORES)
        if least is not None:
            bound = least(change, numbers)
            saved_per_step[:, j], limited = capped(saved_per_step[:, j],
                                                   by_step["measured_ms"], bound)
            said += ("; but no step shorter than its ranks' CPU time over the CPUs they share "
                     "(the host's cores)")
            if (limited & kept).any():
                said += (f": held to it in {int((limited & kept).sum())} of "
                         f"{int(kept.sum())} steps, where it is {np.nanmean(bound[kept]):.2f} ms "
                         f"a step")
        saved = float(saved_per_step[kept, j].mean()) if kept.any() else 0.0
        by_step[change.about["change"]] = np.where(kept, saved_per_step[:, j], np.nan)
        rows.append({**{k: v for k, v in change.about.items() if k != "assumptions"},
                     "saved_ms_per_step": round(saved, 3),
                     "predicted_step_ms": round(measured - saved, 3),
                     "assumptions": said})
    return ordered(rows), pd.DataFrame(by_step)


def capped(saved: np.ndarray, measured: np.ndarray, bound: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """(per step, a saving (ms) at most the measured step less `bound`, where the bound is
    known, never turned into a cost; where that limited it)."""
    room = np.maximum(measured - bound, 0.0)
    limited = np.isfinite(room) & (saved > room)
    return np.where(limited, room, saved), limited


def _measured_by_step(graph: StepGraph, numbers: np.ndarray) -> np.ndarray:
    """Per analysed step of `numbers`: the mean measured step time over its ranks, ms."""
    steps = graph.steps
    mean = ((steps["end_ns"] - steps["start_ns"]).groupby(steps["step"].to_numpy()).mean()
            / 1e6)
    return mean.reindex(numbers).to_numpy(dtype="float64")


# Two answers whose savings differ by at most this share of the larger tie: removing what made a
# rank late ("no data loading gaps on rank 1") saves what "rank 1 on time" saves, and says what
# to change where the other says only who is late.
TIE_SHARE = 0.02


def said_better(answer: dict, other: dict) -> bool:
    """Whether `other` says more precisely what `answer` changes, saving as much within
    TIE_SHARE, about one of its ranks: a cause where `answer` is "rank R on time", or the same
    kind of change on fewer ranks ("on rank 1" where `answer` is "on any rank")."""
    saved, theirs = answer["saved_ms_per_step"], other["saved_ms_per_step"]
    mine, their_ranks = set(answer.get("ranks") or []), set(other.get("ranks") or [])
    if not (theirs > 0 and theirs >= (1 - TIE_SHARE) * saved and mine & their_ranks):
        return False
    kind, their_kind = answer.get("kind"), other.get("kind")
    return ((kind == "rank_on_time" and their_kind != "rank_on_time")
            or (kind == their_kind and their_ranks < mine))


def told_order(rows: list[dict]) -> list[int]:
    """The positions of the answers `rows` in the order they are told: largest saving first
    (stable), an answer after those that say better what it changes (said_better)."""
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["saved_ms_per_step"])
    moved = True
    while moved:
        moved = False
        for at in range(len(order) - 1):
            if said_better(rows[order[at]], rows[order[at + 1]]):
                order[at], order[at + 1] = order[at + 1], order[at]
                moved = True
    return order


def ordered(rows: list[dict]) -> list[dict]:
    """The answers in told_order, each with WHAT_IF_KEYS in order."""
    return [{k: rows[i][k] for k in WHAT_IF_KEYS} for i in told_order(rows)]
