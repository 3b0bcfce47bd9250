"""Who issued each communication op, what the run already does, and the process groups' names.

The issuer decides which advice fits (docs/report.md, "Who issued an op"): DDP's gradient
buckets, FSDP1 or FSDP2 (`fully_shard`), functional collectives (tensor parallelism, DTensor),
point-to-point traffic, or a plain `torch.distributed` call. The evidence is what the run holds:
the tracer's `issuer` and `source` fields on its records (the tracer names DDP's and FSDP's own
ops from the units it saw built: docs/tracer.md, Collective hooks), and in Kineto traces the host
spans that torch opens around the code issuing an op (`FSDP::all_gather`,
`FullyShardedDataParallel._pre_forward`, `_c10d_functional::all_reduce`,
`DistributedDataParallel.forward`, `PP:0F1`). Both name an op with the same words: the tracer's
issuers are `schema.COMM_ISSUERS`.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS, canonical_op
from analysis.core.events import distinct_names, matches
from analysis.core.frames import flags, values_at
from tracer import schema

DDP = schema.ISSUER_DDP
FSDP1 = schema.ISSUER_FSDP1
FSDP2 = schema.ISSUER_FSDP2
FUNCTIONAL = "functional"  # torch.distributed._functional_collectives: TP, DTensor
P2P = "p2p"
C10D = "c10d"  # a torch.distributed call outside DDP and FSDP: the script's own or a library's
UNKNOWN = "unknown"
ISSUERS = (DDP, FSDP1, FSDP2, FUNCTIONAL, P2P, C10D, UNKNOWN)

# An op issued inside a host span with such a name was issued by that code.
_SPAN_MARKERS = (
    (FSDP2, re.compile(r"^FSDP::")),
    (FSDP1, re.compile(r"^FullyShardedDataParallel\.")),
    (FUNCTIONAL, re.compile(r"^_?c10d_functional::|redistribute", re.IGNORECASE)),
    (DDP, re.compile(r"^DistributedDataParallel\.forward$")),
)
# Which issuer an op outside every marked span belongs to when the rank's trace shows that
# framework at all: FSDP's collectives are plain torch.distributed calls from its hooks, DDP's
# gradient all-reduce runs in backward, outside DDP's forward span.
_RUN_LEVEL = {
    "all_gather": (FSDP2, FSDP1), "reduce_scatter": (FSDP2, FSDP1), "all_reduce": (DDP,),
}
_RECORD_SOURCES = {"ddp": DDP, "functional": FUNCTIONAL, "p2p": P2P, "c10d": C10D}
DDP_FORWARD = "DistributedDataParallel.forward"


def host_events(trace) -> pd.DataFrame:
    events = getattr(trace, "events", None)
    if not _has_host_columns(events):
        return pd.DataFrame(columns=["name", "ts_ns", "dur_ns", "pid", "tid"])
    # Only the wanted columns are copied, not every column of the events.
    return events.loc[~events["is_gpu"].fillna(False).astype(bool),
                      ["name", "ts_ns", "dur_ns", "pid", "tid"]]


def _has_host_columns(events) -> bool:
    return isinstance(events, pd.DataFrame) and not events.empty and all(
        c in events.columns for c in ("name", "ts_ns", "dur_ns", "pid", "tid", "is_gpu"))


def frameworks_seen(trace) -> set:
    """The issuers whose marker spans appear anywhere in the rank's trace."""
    names = pd.Series(host_events(trace)["name"].astype(str).unique())
    return {issuer for issuer, pattern in _SPAN_MARKERS if names.str.contains(pattern).any()}


def _enclosed(starts, ends, threads, query_ts, query_threads) -> np.ndarray:
    """Per query: is it inside any of the spans on the same (pid, tid)?"""
    result = np.zeros(len(query_ts), dtype=bool)
    query_ts = np.asarray(query_ts, dtype="float64")
    spans_of: dict = {}
    for position, thread in enumerate(threads):
        spans_of.setdefault(thread, []).append(position)
    queries_of: dict = {}
    for position, thread in enumerate(query_threads):
        queries_of.setdefault(thread, []).append(position)
    for thread, mine in spans_of.items():
        where = queries_of.get(thread)
        if not where:
            continue
        order = np.argsort(starts[mine], kind="stable")
        # Some span holds t iff the latest end among spans starting at or before t reaches t.
        latest_end = np.maximum.accumulate(ends[mine][order])
        times = query_ts[where]
        position = np.searchsorted(starts[mine][order], times, side="right") - 1
        inside = position >= 0
        inside[inside] = latest_end[position[inside]] >= times[inside]
        result[where] = inside
    return result


def _marker_spans(trace) -> list[tuple[str, np.ndarray, np.ndarray, list]]:
    """(issuer, starts, ends, (pid, tid) texts) of its marker spans on the host, for each issuer
    whose markers the trace holds, in _SPAN_MARKERS' order."""
    events = getattr(trace, "events", None)
    if not _has_host_columns(events):
        return []
    on_host = ~flags(events, "is_gpu")
    found = []
    for issuer, is_marker in zip([issuer for issuer, _ in _SPAN_MARKERS],
                                 _host_name_matches(events["name"], on_host)):
        rows = np.flatnonzero(is_marker)
        if len(rows):
            starts = values_at(events["ts_ns"], rows)
            threads = list(zip(_texts_at(events["pid"], rows), _texts_at(events["tid"], rows)))
            found.append((issuer, starts.astype("float64"),
                          (starts + values_at(events["dur_ns"], rows)).astype("float64"), threads))
    return found


def _host_name_matches(names: pd.Series, on_host: np.ndarray):
    """Per _SPAN_MARKERS pattern, on_host & matches(names, pattern, among=on_host): the
    categories that host events use found once for every pattern, a pattern that none of them
    matches costing no pass over the rows."""
    codes = names.array.codes
    categories = names.array.categories
    used = np.flatnonzero(np.bincount(codes[on_host].astype(np.intp) + 1,
                                      minlength=len(categories) + 1)[1:])
    texts = [str(categories[code]) for code in used.tolist()]
    for _, pattern in _SPAN_MARKERS:
        hits = [code for code, text in zip(used.tolist(), texts) if pattern.search(text)]
        if not hits:
            yield np.zeros(len(codes), dtype=bool)
            continue
        # A last False slot for code -1 (missing), which take() reads by wrapping around.
        table = np.zeros(len(categories) + 1, dtype=bool)
        table[hits] = True
        yield on_host & table.take(codes)


def _texts_at(column: pd.Series, rows: np.ndarray) -> list:
    """The values of a categorical column at `rows` as text, a missing one not as text (it
    names no thread)."""
    texts = np.array([str(c) for c in column.cat.categories] + [None], dtype=object)
    return texts[column.cat.codes.to_numpy()[rows]].tolist()


def issuers_of_ops(trace, op: np.ndarray, host_ts, host_pid, host_tid,
                   named: np.ndarray) -> np.ndarray:
    """The issuer of each op of the trace's events, from its op, where it was issued (host_ts,
    and host_pid and host_tid as text) and whether a torch.distributed op names it."""
    issuers = np.full(len(op), UNKNOWN, dtype=object)
    seen = set()
    marked = np.zeros(len(op), dtype=bool)
    query_threads = list(zip(host_pid, host_tid))
    for issuer, starts, ends, threads in _marker_spans(trace):
        seen.add(issuer)
        inside = _enclosed(starts, ends, threads, host_ts, query_threads)
        take = inside & ~marked
        issuers[take] = issuer
        marked |= take
    fallback = _each_op(op, lambda o: next((i for i in _RUN_LEVEL.get(o, ()) if i in seen),
                                           None))
    # Unmarked: p2p is p2p; a framework the trace shows takes its ops; a torch.distributed op
    # (record_param_comms, gloo:, nccl:) is a c10d call; a bare kernel stays unknown.
    unmarked = np.where(np.isin(op, P2P_OPS), P2P,
                        np.where(pd.notna(fallback), fallback, np.where(named, C10D, UNKNOWN)))
    issuers[~marked] = unmarked[~marked]
    return issuers


def _each_op(op: np.ndarray, function) -> np.ndarray:
    """function(o) for each op, once per distinct op (None included)."""
    try:
        codes, distinct = pd.factorize(op)
    except TypeError:  # a value that cannot be hashed
        return np.array([function(o) for o in op], dtype=object)
    results = np.empty(len(distinct) + 1, dtype=object)
    for position, value in enumerate([*distinct.tolist(), None]):
        results[position] = function(value)
    return results[codes]


def issuers_from_records(comms_source: pd.Series, ops: pd.Series, trace,
                         recorded: pd.Series | None = None) -> pd.Series:
    """The issuer of each recorded op: the tracer's `recorded` issuer (CommRecord.issuer: DDP
    or FSDP) where it names one; else its source, with c10d all-gathers and reduce-scatters
    given to FSDP when the rank's trace shows FSDP's spans (records written before the issuer
    field)."""
    seen = frameworks_seen(trace)
    if recorded is None:
        recorded = pd.Series(None, index=comms_source.index, dtype=object)
    result = []
    for source, op, named in zip(comms_source, ops, recorded):
        if isinstance(named, str) and named in schema.COMM_ISSUERS:
            result.append(named)
            continue
        issuer = _RECORD_SOURCES.get(source if isinstance(source, str) else "", UNKNOWN)
        if issuer == C10D:
            issuer = next((i for i in _RUN_LEVEL.get(op, ()) if i in seen and i != DDP), C10D)
        result.append(issuer)
    return pd.Series(result, index=comms_source.index, dtype=object)


# ---- gradient accumulation under DDP ------------------------------------------------------------
NO_SYNC_USED = "no_sync"  # some DDP forwards were followed by no gradient all-reduce
ACCUMULATING_WITHOUT_NO_SYNC = "accumulating"  # several forwards per step, each all-reduced
NO_ACCUMULATION = "none"  # one DDP forward per step


def ddp_accumulation(traces) -> str | None:
    """What the DDP forwards in the traces say about gradient accumulation; None when the traces
    hold no DDP forward (records alone cannot tell).

    Each DDP forward opens a window up to the next forward on its thread (or its ProfilerStep's
    end); a window with no all-reduce started in it means that backward skipped the gradient
    sync, i.e. `no_sync()`.
    """
    verdicts = []
    for trace in traces or []:
        events = getattr(trace, "events", None)
        if not _has_host_columns(events):
            continue
        if DDP_FORWARD not in distinct_names(events["name"]):
            continue  # told from the names alone: the usual case on a run without DDP
        on_host = ~flags(events, "is_gpu")
        is_forward = on_host & matches(events["name"], lambda n: n == DDP_FORWARD)
        if not is_forward.any():
            continue
        forward_ts = _float_values(events["ts_ns"], is_forward)
        reduce_ts = np.sort(_all_reduce_starts(events, flags(events, "is_comm") & on_host))
        step_spans = getattr(trace, "all_steps", None)
        if not isinstance(step_spans, pd.DataFrame) or step_spans.empty:
            step_spans = getattr(trace, "steps", None)
        verdicts.append(_accumulation_of(forward_ts, reduce_ts, step_spans))
    return strongest_verdict(verdicts)


def run_ddp_accumulation(traces) -> str | None:
    """ddp_accumulation over the run, from each rank's own verdict (its reduction's)."""
    return strongest_verdict([trace.table("ddp_accumulation") for trace in traces or []])


def strongest_verdict(verdicts) -> str | None:
    """The run's verdict from its ranks' (None where a rank cannot tell): a skipped sync
    anywhere, else accumulation anywhere, else none."""
    for verdict in (NO_SYNC_USED, ACCUMULATING_WITHOUT_NO_SYNC, NO_ACCUMULATION):
        if verdict in verdicts:
            return verdict
    return None


def _float_values(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """column[rows] (a mask) as float64, taken without pandas' selection."""
    return column.to_numpy()[rows].astype("float64")


def _all_reduce_starts(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Start times of the all-reduces among the host events `rows`: the op their name gives,
    else the one their collective argument gives."""
    positions = np.flatnonzero(rows)
    # A missing name names no op, whether as None or as NaN.
    names = _texts_at(events["name"], positions)
    collectives = (values_at(events["collective"], positions).tolist()
                   if "collective" in events.columns else [None] * len(positions))
    op_of = functools.lru_cache(maxsize=None)(canonical_op)  # a trace repeats a few names
    is_reduce = np.array([(op_of(name) or canonical_op(collective)) == "all_reduce"
                          for name, collective in zip(names, collectives)], dtype=bool)
    return _float_values(events["ts_ns"], rows)[is_reduce]


def _accumulation_of(forward_ts: np.ndarray, reduce_ts: np.ndarray, steps) -> str | None:
    starts = np.sort(forward_ts)
    ends = np.append(starts[1:], np.inf)
    step_of = np.zeros(len(starts))
    if isinstance(steps, pd.DataFrame) and not steps.empty and "start_ns" in steps.columns:
        step_starts, step_ends = _spans_by_start(steps)
        step_of = np.searchsorted(step_starts, starts, side="right") - 1
        inside = step_of >= 0
        ends[inside] = np.minimum(ends[inside], step_ends[step_of[inside]])
    reduced = (np.searchsorted(reduce_ts, ends, side="left")
               - np.searchsorted(reduce_ts, starts, side="left")) > 0
    if not reduced.any():
        return None  # no DDP gradient traffic in the window: nothing to judge
    if not reduced.all():
        # The last forward of a window may be cut by the trace's end: only a skipped sync
        # followed by a later forward counts.
        if (~reduced[:-1]).any():
            return NO_SYNC_USED
    several_per_step = len(np.unique(step_of)) < len(step_of)
    return ACCUMULATING_WITHOUT_NO_SYNC if several_per_step else NO_ACCUMULATION


def _spans_by_start(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the steps in steps.sort_values("start_ns")'s order, as float64."""
    starts = steps["start_ns"].to_numpy("float64", na_value=np.nan)
    order = starts.argsort(kind="quicksort")  # sort_values' default; NaN last, as there
    return starts[order], steps["end_ns"].to_numpy("float64", na_value=np.nan)[order]


# ---- process group names -------------------------------------------------------------------------
_NO_NAME = {"", "undefined", "none", "null"}


def group_names(trace) -> dict:
    """{pg id: description} for the rank's process groups, from every place that names them:
    the manifest's process-group records, the trace's distributedInfo pg_config, and the
    "Process Group Description" of record_param_comms calls and kernels.
    """
    names: dict = {}

    def add(pg, desc):
        desc = group_desc(pg, desc)
        if desc is not None:
            names.setdefault(str(pg), desc)

    records = getattr(trace, "records", None)
    for record in getattr(records, "manifest", None) or []:
        pg = getattr(record, "pg", None) or getattr(record, "pg_name", None)
        add(pg, getattr(record, "desc", None) or getattr(record, "pg_desc", None))
    for config in getattr(trace, "process_groups", None) or []:
        if isinstance(config, dict):
            add(config.get("pg_name"), config.get("pg_desc"))
    events = getattr(trace, "events", None)
    if isinstance(events, pd.DataFrame) and {"pg_name", "pg_desc"} <= set(events.columns):
        pgs, descs = events["pg_name"].to_numpy(), events["pg_desc"].to_numpy()
        named = np.flatnonzero(pd.notna(pgs))
        both = named[pd.notna(descs[named])]  # the descriptions looked at where named only
        for pg, desc in zip(pgs[both].tolist(), descs[both].tolist()):
            add(pg, desc)
    return names


def group_desc(pg, desc) -> str | None:
    """The group's own name, or None where torch gave it none ("undefined") or it is the id."""
    if pg is None or desc is None or not isinstance(desc, str):
        return None
    if desc.strip().lower() in _NO_NAME or desc == str(pg):
        return None
    return desc


def group_label(pg, desc) -> str:
    """"mesh_dp (1)" when the group has a name, else its id."""
    if desc is None or (not isinstance(desc, str) and pd.isna(desc)) or str(desc) == str(pg):
        return str(pg)
    return f"{desc} ({pg})"

