"""The host's cores under a what-if (docs/critical-path.md, "The host's cores").

Ranks that compute on the host (`device_type` "cpu") need their CPU time on the CPUs they may
use. A change that takes the idle time out of a step does not take out the work: where the
ranks slept or waited in turn, they compute at once after it and share the cores. So a step
cannot be shorter than its ranks' CPU time over the CPUs they share:

    bound(step) = max over groups G of  sum over ranks r of G of cpu'(r, step) / cpus(G)

the groups being each rank (the CPUs of its affinity mask) and each host's ranks (the union of
their masks); cpu(r, step) is the rank's process CPU time in the step (its step record's
`cpu_ns`), cpu' what the change leaves of it:

- `rank_on_time` (rank R's host work at the others' median): R's CPU at most the median of the
  other ranks' in that step;
- `pipeline_bubble_theoretical` (a stage's host work shortened): the stage's CPU less the host
  work taken off it (the most one thread's work gives back);
- every other change (a transfer overlapped or faster, an idle gap's cause removed): the same
  CPU time (a data loader's work done elsewhere is still done on the host).

A change's saving in a step is then at most the measured step less the bound. Ranks on a device
are left out (their process CPU time counts the driver's spin-waits, which are not work), and so
is a host where a rank lacks the records.

Below the bound, `on_shared_cores` serves each change's host work and transfers on the host's
cores at once (processor sharing): each busy thread gets min(1, cpus / busy threads) of a core,
so ranks that worked in turn where measured slow each other once a change runs them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from analysis.core.dag import propagate
from analysis.crossrank.step_graph import END_OF_OP, ISSUE, START, STEP_END, StepGraph
from analysis.crossrank.what_if import ON_TIME, Change
from analysis.crossrank.what_if_pipeline import BUBBLE
from analysis.rank.flops import run_start_of

# The nodes whose durations are a rank's host work (a step's start after the previous end, the
# work before an issue, the work after the last op).
HOST_WORK = (START, ISSUE, STEP_END)


@dataclass
class HostCores:
    """Per host-computing rank and step its CPU time (`cpu`: rank, step, cpu_ns), and the groups
    of ranks that share CPUs: (ranks, the CPUs they may use, the host's name); `sharing`: the
    host-computing ranks parted by the CPUs they share (ranks whose masks overlap, as one), each
    part with the CPUs of its masks, for processor sharing (empty: no sharing)."""

    cpu: pd.DataFrame
    groups: list[tuple[tuple[int, ...], int, str]]
    sharing: list[tuple[tuple[int, ...], int]] = field(default_factory=list)

    @cached_property
    def by_step(self) -> pd.DataFrame:
        """`cpu` as a table: a row per step, a column per rank, NaN where a rank has none."""
        return self.cpu.pivot(index="step", columns="rank", values="cpu_ns")

    @cached_property
    def group_columns(self) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int]]]:
        """The groups as positions among by_step's columns, found once for every change: (each
        lone rank's column, its CPUs; each larger group's columns and CPUs); a group with a rank
        without CPU times is left out."""
        position = {rank: at for at, rank in enumerate(self.by_step.columns)}
        alone, alone_cpus, shared = [], [], []
        for members, cpus, _ in self.groups:
            if not all(m in position for m in members):
                continue
            if len(members) == 1:
                alone.append(position[members[0]])
                alone_cpus.append(cpus)
            else:
                shared.append((np.array([position[m] for m in members]), cpus))
        return np.array(alone, dtype=np.int64), np.array(alone_cpus, dtype=np.float64), shared


def _rank_cpu(rank: int, steps: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rank's CPU time per step (its step records' `cpu_ns`), None where none has it."""
    if steps is None or "cpu_ns" not in steps.columns:
        return None
    frame = steps[["step", "cpu_ns"]].dropna()
    # a step recorded twice (a restarted attempt writing on) counts once, as last recorded
    frame = frame[frame["cpu_ns"] >= 0].drop_duplicates("step", keep="last")
    if frame.empty:
        return None
    return pd.DataFrame({"rank": rank, "step": frame["step"].to_numpy("int64"),
                         "cpu_ns": frame["cpu_ns"].to_numpy("float64")})


def host_cores(ranks) -> HostCores | None:
    """The CPU time and CPU groups of a run's ranks (analysis.ingest's RankTrace: records with
    a run_start and step records), None where no rank computes on the host with them."""
    start_of = {int(t.rank): run_start_of(t) for t in ranks or []}
    computing = _host_computing(start_of)
    cpu, starts = [], {}
    for trace in ranks or []:
        rank = int(trace.rank)
        used = _rank_cpu(rank, trace.records.steps) if rank in computing else None
        if used is not None:
            cpu.append(used)
            starts[rank] = computing[rank]
    if not cpu:
        return None
    groups = [((rank,), len(start.cpu_ids) if start.cpu_ids else int(start.cpus), start.host)
              for rank, start in sorted(starts.items())]
    hosts: dict[str, list[int]] = {}
    for rank, start in starts.items():
        hosts.setdefault(start.host, []).append(rank)
    for host, members in hosts.items():
        on_host = [r for r, s in start_of.items() if s is not None and s.host == host]
        if len(members) < 2 or len(on_host) != len(members):
            continue  # one rank, or a rank of the host without the records: no host bound
        masks = [starts[r].cpu_ids for r in members]
        shared = (len(set().union(*masks)) if all(masks)
                  else max(int(starts[r].cpus or 0) for r in members))
        if shared:
            groups.append((tuple(sorted(members)), shared, host))
    return HostCores(pd.concat(cpu, ignore_index=True), groups, _sharing_parts(computing))


def _host_computing(start_of: dict) -> dict:
    """The ranks (rank -> run_start) that compute on the host and say which CPUs they may use
    (a mask, or a count): the bound and processor sharing take only these."""
    return {rank: start for rank, start in start_of.items()
            if start is not None and start.device_type == "cpu"
            and (start.cpu_ids or start.cpus)}


def _sharing_parts(computing: dict) -> list[tuple[tuple[int, ...], int]]:
    """The host-computing ranks (`computing`: _host_computing's) of each host parted by
    overlapping masks (each part with the CPUs of the union of its masks); a host where a rank
    has no mask is one part, on the most CPUs any of its ranks may use."""
    hosts: dict[str, dict[int, object]] = {}
    for rank, start in computing.items():
        hosts.setdefault(start.host, {})[rank] = start
    parts = []
    for starts in hosts.values():
        if not all(start.cpu_ids for start in starts.values()):
            parts.append((tuple(sorted(starts)), max(int(s.cpus or 0) for s in starts.values())))
            continue
        merged: list[tuple[set[int], set[int]]] = []  # (ranks, CPUs)
        for rank, start in sorted(starts.items()):
            ranks, cpus = {rank}, set(start.cpu_ids)
            for other in [m for m in merged if m[1] & cpus]:
                merged.remove(other)
                ranks |= other[0]
                cpus |= other[1]
            merged.append((ranks, cpus))
        parts += [(tuple(sorted(ranks)), len(cpus)) for ranks, cpus in merged]
    return sorted(p for p in parts if p[1] > 0)


def _removed_host_work(graph: StepGraph, duration: np.ndarray) -> pd.Series:
    """The host work a change took off each (rank, step), ns."""
    nodes = np.flatnonzero(np.isin(graph.kind, HOST_WORK))
    cut = (graph.duration[nodes] - duration[nodes]).clip(min=0)
    frame = pd.DataFrame({"rank": graph.rank[nodes], "step": graph.step[nodes], "cut": cut})
    return frame.groupby(["rank", "step"])["cut"].sum()


def _cpu_left(cores: HostCores, graph: StepGraph, kind: str, ranks: list[int],
              duration: np.ndarray) -> pd.DataFrame:
    """Per (rank, step): the CPU time a change of `kind` on `ranks` leaves, ns (a table, rank
    by step)."""
    table = cores.by_step.copy()
    if kind == ON_TIME:
        for rank in ranks:
            others = table.drop(columns=[rank], errors="ignore")
            if rank in table.columns and others.shape[1]:
                table[rank] = np.fmin(table[rank], others.median(axis=1, skipna=True))
    elif kind == BUBBLE:
        cut = _removed_host_work(graph, duration).unstack("rank")
        cut = cut.reindex(index=table.index, columns=table.columns).fillna(0)
        table = (table - cut).clip(lower=0)
    return table


def step_bounds(cores: HostCores, graph: StepGraph, change: Change,
                numbers: np.ndarray) -> np.ndarray:
    """Per analysed step of `numbers`: the least step time (ms) the host's cores allow under
    `change`, NaN where no group has every rank's CPU time in that step."""
    table = _cpu_left(cores, graph, change.about["kind"], change.about.get("ranks") or [],
                      change.duration).reindex(numbers)
    values = table.to_numpy("float64") / 1e6  # ms; columns in by_step's order
    alone, alone_cpus, shared = cores.group_columns
    bound = np.full(len(numbers), np.nan)
    if len(alone):
        bound = np.fmax.reduce(values[:, alone] / alone_cpus, axis=1)
    for columns, cpus in shared:  # a sum with a rank's time unknown is NaN: no bound there
        bound = np.fmax(bound, values[:, columns].sum(axis=1) / cpus)
    return bound


# ---- processor sharing: a what-if's host work and transfers on the host's cores ----------------

# The nodes whose durations are a rank's transfers (an op's end after its last member arrived):
# each runs on a thread of the rank's process (gloo's), beside its host work.
TRANSFER_NODES = (END_OF_OP,)
# Rounds of propagate-and-stretch: the stretched timeline moves the overlaps it was found on.
SHARING_ROUNDS = 3


def _mean_speed(begin: np.ndarray, end: np.ndarray, cpus: int) -> np.ndarray:
    """Per busy interval [begin, end) of a host: the mean share of a core it gets when every
    busy interval of the host is served at once on `cpus` cores (processor sharing: each at
    min(1, cpus / busy intervals at that moment)); 1 for an empty interval."""
    times = np.concatenate([begin, end])
    base = times.min() if len(times) else 0
    order = np.argsort(times, kind="stable")
    points = (times[order] - base).astype(np.float64)  # ns since the first: exact in a float
    busy = np.cumsum(np.concatenate([np.ones(len(begin)), -np.ones(len(end))])[order])
    speed = np.minimum(1.0, cpus / np.maximum(busy[:-1], 1.0))
    # the time served by a busy interval since the first point, linear between points
    served = np.concatenate([[0.0], np.cumsum(speed * np.diff(points))])
    length = (end - begin).astype(np.float64)
    got = (np.interp((end - base).astype(np.float64), points, served)
           - np.interp((begin - base).astype(np.float64), points, served))
    return np.where(length > 0, got / np.where(length > 0, length, 1.0), 1.0)


def on_shared_cores(cores: HostCores, graph: StepGraph, durations: np.ndarray,
                    idle_ns: np.ndarray) -> np.ndarray:
    """`durations` (nodes x changes, column 0 the measured ones) with each host's work served
    by processor sharing on its cores: every rank's host work (the busy part of its START,
    ISSUE and STEP_END nodes: the node less its `idle_ns`, a data loader's wait, as its first
    part) and each transfer (END_OF_OP) is a thread on the host's cores. A node's work is its
    busy time at the share of a core it got where measured; under a change it takes that work
    over the share it gets in the change's own timeline, found in SHARING_ROUNDS rounds of
    propagating and stretching. Column 0 is the measured run: unchanged by construction."""
    groups = [(np.flatnonzero(np.isin(graph.rank, members)
                              & np.isin(graph.kind, HOST_WORK + TRANSFER_NODES)), cpus)
              for members, cpus in cores.sharing]
    groups = [(nodes, cpus) for nodes, cpus in groups if len(nodes)]
    if not groups or durations.shape[1] < 2:
        return durations
    measured = durations[:, 0]
    transfer = np.isin(graph.kind, TRANSFER_NODES)
    busy_measured = np.where(transfer, measured, np.clip(measured - idle_ns, 0, None))
    busy = np.minimum(durations, busy_measured[:, None])
    idle = durations - busy
    work = np.zeros(len(measured))
    for nodes, cpus in groups:
        top = graph.time[nodes]
        work[nodes] = busy_measured[nodes] * _mean_speed(top - busy_measured[nodes], top, cpus)
    shared = durations.astype(np.float64)
    for _ in range(SHARING_ROUNDS):
        times = propagate(graph, np.rint(shared).astype(np.int64))
        for column in range(1, durations.shape[1]):
            for nodes, cpus in groups:
                top = times[nodes, column]
                length = np.rint(shared[nodes, column] - idle[nodes, column]).astype(np.int64)
                speed = _mean_speed(top - length, top, cpus)
                stretched = np.where(busy[nodes, column] > 0,
                                     work[nodes] * busy[nodes, column]
                                     / np.maximum(busy_measured[nodes], 1) / speed, 0.0)
                shared[nodes, column] = idle[nodes, column] + stretched
    out = np.rint(shared).astype(np.int64)
    out[:, 0] = measured
    return out
