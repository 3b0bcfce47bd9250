"""The per-rank reduction: every table and summary of one rank that the run-wide analyses need,
computed from its events alone (docs/analysis.md, "Large runs and Dask").

`rank_tables(trace)` runs where the rank's file is parsed (a local worker process or a Dask
worker; a rank of several profiler windows once they are merged), through the one load of
analysis.run.loading. Its RankTables (analysis.core.contracts) is the only source of these
tables: every run-wide analysis takes them from it (RankTrace.table), whether or not the rank
still holds its events, so that no trace is decoded twice and no table has a second path. A
table that fails there is recorded as failed, and the analysis that takes it reports that
failure.
"""

from __future__ import annotations

import dataclasses
from functools import cache, partial

import numpy as np
import pandas as pd

from analysis.core.contracts import RankTables
from analysis.core.forked import can_fork, forked_results
from analysis.core.step_spec import PathWindow
from analysis.rank import flops, issuers
from analysis.rank import one_rank_path as critical_path
from analysis.rank.comm import comm_ops as communication
from analysis.rank.comm import event_ops as comm_events
from analysis.rank.comm.kernel_names import named_kernels
from analysis.rank.hta import hta_rank_summary
from analysis.rank.idle import idle_gaps
from analysis.rank.pipeline_schedule import rank_schedule
from analysis.rank.step_breakdown import breakdown_per_step, kind_and_layers
from analysis.rank.step_evidence import host_op_spans, step_evidence

# The columns of the communication events that crossrank.frames.ops_from_events reads.
OP_EVENT_COLUMNS = ["name", "ts_ns", "end_ns", "stream", "is_gpu", "collective", "in_nelems",
                    "out_nelems", "comm_dtype", "group_size", "pg_name", "input_dims",
                    "input_type"]


def _comm_events(trace, hosts: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rank's communication events as the cross-rank pass takes them: kernels named from
    their host ops (analysis.rank.comm.kernel_names), and only what ops_from_events reads: on a
    rank with communication kernels those kernels (they are its ops), else every event (gloo's
    ops and the host calls that issued them). `hosts`: kernel_host_ops of the events, where
    the caller has it."""
    comm = named_kernels(trace.events, hosts)
    kernels = comm["is_gpu"].astype(bool)
    rows = np.flatnonzero(kernels.to_numpy()) if kernels.any() else None
    index = comm.index if rows is None else comm.index[rows]
    # Built column by column: selecting the rows and columns of the frame, then converting its
    # categoricals, costs several times more for the few rows kept.
    return pd.DataFrame({column: _plain_column(comm[column], rows, index)
                         for column in OP_EVENT_COLUMNS if column in comm.columns}, index=index)


def _plain_column(column: pd.Series, rows, index) -> pd.Series:
    """The column's values at `rows` (all for None) on `index`, a categorical as objects: a
    thousand ranks' categoricals, each with its own categories, cost more to concatenate than
    their few rows."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype(object)
    if rows is None:
        return column
    if isinstance(column.dtype, np.dtype):
        # dtype given: pandas would read text in an object array as its string dtype.
        return pd.Series(column.to_numpy()[rows], index=index, dtype=column.dtype, copy=False)
    return pd.Series(column.array.take(rows), index=index, copy=False)


# The per-rank tables: concatenated over ranks by analysis.run.
RANK_TABLES = {"per_step": breakdown_per_step, "idle_gaps": idle_gaps,
               "comm_ops": communication.comm_ops,
               # FLOPs per step and the ops summed by op (docs/mfu.md): analysis.run's mfu and
               # roofline tables.
               "step_flops": lambda trace: flops.rank_flops_tables(trace)["step_flops"],
               "op_roofline": lambda trace: flops.rank_flops_tables(trace)["op_roofline"]}
# The per-rank summaries: combined across ranks by the analysis that needs each.
RANK_SUMMARIES = {
    "hta": hta_rank_summary,  # analysis.rank.hta.hta_temporal_breakdown
    "pipeline_schedule": rank_schedule,  # analysis.rank.pipeline_schedule.detect
    "ddp_accumulation": lambda trace: issuers.ddp_accumulation([trace]),  # ddp_accumulation
    "comm_events": _comm_events,  # analysis.crossrank.run_frames.run_frames
    "event_count": lambda trace: len(trace.events),
    # analysis.run's path of a run of one traced rank (rank_tables says where it is built).
    "critical_path": lambda trace, events=None, window=None: critical_path.analyse(
        trace, events, window=window),
    # analysis.findings.stop_diagnosis: the collectives of every step of a trace, for the stop
    # diagnosis of a run folder without comm records (rank_tables says where it is built).
    "stop_trace_ops": lambda trace: comm_events.ops_from_events(
        trace.events, _every_step(trace), _every_step(trace), trace.rank, trace.world_size),
    # analysis.findings.late_evidence: what the cause tests of a late rank compare, per step
    # (rank_tables says where it is built).
    "step_evidence": step_evidence,
    # analysis.crossrank.culprit: what a named straggler ran while the others waited.
    "host_spans": host_op_spans,
}


def rank_tables(trace, only_trace: bool = False, run_folder: bool = False,
                path_beside: bool = False, path_window: PathWindow | None = None) -> RankTables:
    """The tables and summaries computed from one rank's events alone (RANK_TABLES and
    RANK_SUMMARIES); one that fails is named in the result's `failed` ({name: "ExceptionType:
    message"}) instead, and RankTables.take raises that failure where the table is taken.

    What only some runs need is built where it may be needed, since the events are not read
    again: the one-rank critical path where the rank may be the run's only traced one (the run
    has one trace file, `only_trace`, or the trace names no world size above 1); the trace's
    collectives of every step for a rank of a run folder (`run_folder`) whose records hold no
    comm op (traced with --no-comms), the only ranks whose stop diagnosis reads them; the
    evidence of a late rank and of a straggler (step_evidence, host_spans) unless the run's one
    trace has no records (no other rank to be late against).

    `path_beside`: a run's one trace has its critical path, the slowest of them, and its FLOP
    tables (BESIDE) computed in a forked child on the machine's second core
    (analysis.core.forked) while the rest are computed here, and the analyses after them; their
    values are ForkedResults until they are taken. `path_window`: the one-rank critical path's
    windows (--window, --instance)."""
    builds = {**RANK_TABLES, **RANK_SUMMARIES}
    if path_window is not None:
        builds["critical_path"] = partial(builds["critical_path"], window=path_window)
    found: dict = {}
    failed: dict = {}
    # The kernels' host ops found once, for the ops and the cross-rank pass both (before the
    # fork: the child beside builds the comm events from it too).
    join = _kernel_join(trace.events)
    if not (only_trace or (trace.world_size or 1) <= 1):
        del builds["critical_path"]
    elif path_beside and only_trace and can_fork() and trace.events is not None:
        found.update(forked_results(_beside(trace, builds, join)))
    records = getattr(trace, "records", None)
    if not run_folder or records is None or len(records.comms):
        del builds["stop_trace_ops"]
    if only_trace and records is None:
        # The only rank of the run, without records of others: its cross-rank pass names no
        # straggler and no late rank.
        del builds["step_evidence"], builds["host_spans"]
    kind_layers = _kind_and_layers(trace)
    if kind_layers is not None:
        # The activity layers found once, for the per-step breakdown and the idle gaps both.
        builds["per_step"] = lambda trace: breakdown_per_step(trace, kind_layers)
        builds["idle_gaps"] = lambda trace: idle_gaps(trace, kind_layers)
    flop_tables = _flop_tables(trace) if "step_flops" in builds else None
    if flop_tables is not None:
        # The ops' FLOPs found once, for the FLOPs per step and the roofline both.
        builds["step_flops"] = lambda trace: flop_tables["step_flops"]
        builds["op_roofline"] = lambda trace: flop_tables["op_roofline"]
    if join is not None:
        builds["comm_ops"] = lambda trace: communication.comm_ops(trace, join)
    if "comm_events" in builds:
        builds["comm_events"] = partial(_joined_comm_events, join=join)
    for name, build in builds.items():
        try:
            found[name] = build(trace)
        except Exception as exc:  # noqa: BLE001  (raised where the table is taken)
            failed[name] = f"{type(exc).__name__}: {exc}"
    return RankTables(**found, failed=failed)


# Computed beside the rest for a run's one trace (rank_tables' `path_beside`), in this order,
# each sent as soon as it is computed: first the two summaries analysis.run takes early (the HTA
# summary, third; the comm events, for the cross-rank pass, fifth), in the time the rest of the
# reduction takes here, then the tables it takes last (the FLOP tables after the cross-rank
# pass, the critical path after every other rank table).
BESIDE = ("hta", "comm_events", "step_flops", "op_roofline", "critical_path")


def _beside(trace, builds: dict, join: comm_events.KernelJoin | None) -> dict:
    """BESIDE's builds, removed from `builds`, each a function of nothing: on the rank's events
    as they are now (the caller drops them once the rank is reduced), the FLOP tables from one
    rank_flops_tables, the comm events from the caller's KernelJoin `join`."""
    path, hta = builds["critical_path"], builds["hta"]
    for name in BESIDE:
        del builds[name]
    with_events = dataclasses.replace(trace, events=trace.events)
    flop_tables = cache(partial(flops.rank_flops_tables, with_events))
    return {"hta": partial(hta, with_events),
            "comm_events": partial(_joined_comm_events, with_events, join),
            "step_flops": lambda: flop_tables()["step_flops"],
            "op_roofline": lambda: flop_tables()["op_roofline"],
            "critical_path": partial(path, with_events, events=trace.events)}


def _joined_comm_events(trace, join: comm_events.KernelJoin | None) -> pd.DataFrame:
    """_comm_events from the kernels' host ops where their KernelJoin `join` could be made
    (None: it failed, and _comm_events finds them itself)."""
    if join is None:
        return _comm_events(trace)
    return _comm_events(trace, comm_events.kernel_host_ops(trace.events, join))


def _every_step(trace):
    """Every ProfilerStep span of the trace, before --steps selection."""
    return trace.all_steps if trace.all_steps is not None else trace.steps


def _kind_and_layers(trace) -> tuple | None:
    """step_breakdown.kind_and_layers of the trace; None where it fails: each table then
    calls its own function without it, which raises that failure as its own (or has no step
    to need it)."""
    try:
        return kind_and_layers(trace)
    except Exception:  # noqa: BLE001
        return None


def _flop_tables(trace) -> dict | None:
    """flops.rank_flops_tables of the trace; None where it fails (each table then computes it
    again, and fails where it did)."""
    try:
        return flops.rank_flops_tables(trace)
    except Exception:  # noqa: BLE001
        return None


def _kernel_join(events) -> comm_events.KernelJoin | None:
    """The events' KernelJoin; None where it fails (each table that needs it then computes it
    again, and fails where it did)."""
    try:
        return comm_events.KernelJoin(events)
    except Exception:  # noqa: BLE001
        return None
