"""torch's Flight Recorder entries as ranktrace records: decoding, op names, sizes, and which
entries a hooked call issued (docs/tracer.md, Collective hooks: the Flight Recorder). Pure."""

from __future__ import annotations

import bisect
import re

import msgspec

from tracer import schema


class FrEntry(msgspec.Struct):
    """One entry of `_dump_fr_trace_json`'s `entries`, the fields ranktrace reads."""

    record_id: int
    time_created_ns: int
    profiling_name: str = ""
    process_group: list[str] = []  # [name, description]
    collective_seq_id: int = 0
    p2p_seq_id: int = 0
    is_p2p: bool = False
    input_sizes: list[list[int]] = []
    input_dtypes: list[str] = []
    output_sizes: list[list[int]] = []
    output_dtypes: list[str] = []
    state: str = ""
    retired: bool = False
    thread_id: str = ""
    # NCCL: when torch saw the op complete (host clock, 0 before); gloo: always 0
    time_discovered_completed_ns: int = 0
    # NCCL with TORCH_NCCL_ENABLE_TIMING=1: CUDA events' time, set when the watchdog retires it
    duration_ms: float | None = None


class FrDump(msgspec.Struct):
    entries: list[FrEntry] = []
    pg_config: dict[str, dict[str, str]] = {}


# FR's op names (after "backend:") -> COMM_OPS: ProcessGroupGloo's and ProcessGroupNCCL's.
_OP_NAMES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "allreduce_coalesced": "all_reduce", "all_reduce_barrier": "barrier",
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "allgather_coalesced": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "send": "send", "recv": "recv", "recv_any_source": "recv",
    "recvanysource": "recv",
}
_PEER_RE = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")

# c10 ScalarType names as FR writes them -> (torch dtype name, bytes per element)
DTYPES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "Int": ("int32", 4),
    "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1), "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "ComplexHalf": ("complex32", 4), "UInt16": ("uint16", 2), "UInt32": ("uint32", 4),
    "UInt64": ("uint64", 8), "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1), "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1),
}


def op_name(profiling_name: str) -> tuple[str, int | None, int | None] | None:
    """(COMM_OPS name, group rank from, group rank to) of an FR profiling name ("gloo:all_reduce",
    "nccl:send 0->1"); the two ranks are None unless the name carries them. None: no op ranktrace
    names."""
    _, _, rest = profiling_name.partition(":")
    word, _, tail = (rest or profiling_name).strip().partition(" ")
    op = _OP_NAMES.get(word.lower())
    if op is None:
        return None
    found = _PEER_RE.search(tail)
    if found is None:
        return op, None, None
    a, arrow, b = int(found.group(1)), found.group(2), int(found.group(3))
    return (op, a, b) if arrow == "->" else (op, b, a)


def _elements(sizes: list[list[int]]) -> int:
    total = 0
    for shape in sizes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def payload(op: str, entry: FrEntry, pg_size: int) -> tuple[str, int, int]:
    """(dtype name, elements, nccl-tests size S in bytes) as CommRecord.bytes defines it."""
    dtypes = entry.input_dtypes or entry.output_dtypes
    if op == "barrier" or not dtypes:
        return "none", 0, 0
    name, item = DTYPES.get(dtypes[0], (dtypes[0].lower(), 0))
    n = max(int(pg_size), 1)
    inputs, outputs = _elements(entry.input_sizes), _elements(entry.output_sizes)
    if op == "all_gather":
        elements = outputs or n * inputs  # the gathered output: n parts
    elif op == "gather":
        elements = n * inputs  # every member's part
    elif op == "scatter":
        elements = n * outputs  # every member's part
    else:  # all_reduce, broadcast, reduce, send, recv, all_to_all, reduce_scatter: the input
        elements = inputs
    return name, elements, elements * item


# An NCCL entry that torch saw complete is retired by its watchdog (which sets duration_ms with
# TORCH_NCCL_ENABLE_TIMING=1) within about 0.1 s; one still not retired this long after is
# written without waiting for it any longer.
RETIRE_WAIT_NS = 2_000_000_000


def is_done(entry: FrEntry, now_ns: int | None = None) -> bool:
    """The op completed and its record can be written: retired (gloo: its work finished; NCCL:
    the watchdog saw it complete, and timed it where timing is on); or, NCCL, seen complete but
    not retired RETIRE_WAIT_NS before `now_ns` (None: the last drain, which waits no more)."""
    if entry.retired:
        return True
    if entry.state != "completed":
        return False
    return now_ns is None or now_ns - entry.time_discovered_completed_ns >= RETIRE_WAIT_NS


class NativeOp(msgspec.Struct):
    """An FR entry that no hook recorded, with what its records need."""

    step: int
    op: str
    pg: str
    pg_size: int
    position: int
    dtype: str
    nbytes: int
    issue_ns: int
    peer: int | None = None
    elements: int = 0  # the payload's elements, counted as nbytes is
    issuer: str | None = None  # CommRecord.issuer (tracer.comms.owners)

    def issue_record(self) -> schema.IssueRecord:
        return schema.IssueRecord(
            step=self.step, op=self.op, source=schema.NATIVE_SOURCE, pg=self.pg,
            pg_size=self.pg_size, position=self.position, dtype=self.dtype, bytes=self.nbytes,
            issue_ns=self.issue_ns, peer=self.peer, issuer=self.issuer)

    def comm_record(self, entry: FrEntry) -> schema.CommRecord:
        """Its CommRecord once `entry` (its latest state) is done: CUDA-event duration where FR
        has one (NCCL with TORCH_NCCL_ENABLE_TIMING=1), else only the issue time."""
        duration_ns = int(entry.duration_ms * 1e6) if entry.duration_ms else 0
        if duration_ns > 0:
            timing = "cuda_event"
            algbw, busbw = schema.bandwidth_gbps(self.op, self.nbytes, self.pg_size,
                                                 duration_ns / 1e9)
        else:
            timing, duration_ns, algbw, busbw = schema.TIMING_ISSUE, 0, 0.0, 0.0
        return schema.CommRecord(
            step=self.step, op=self.op, source=schema.NATIVE_SOURCE, pg=self.pg,
            pg_size=self.pg_size, dtype=self.dtype, bytes=self.nbytes, start_ns=self.issue_ns,
            end_ns=self.issue_ns + duration_ns, duration_us=duration_ns / 1e3, timing=timing,
            algbw_gbps=algbw, busbw_gbps=busbw, peer=self.peer, position=self.position,
            issuer=self.issuer)


def native_op(entry: FrEntry, pg_size: int, step: int, global_rank=None) -> NativeOp | None:
    """The NativeOp of `entry`, or None for an op ranktrace has no name for. `global_rank(g)`
    turns a group rank into a global one (a peer); None: the default group's, unchanged."""
    named = op_name(entry.profiling_name)
    if named is None:
        return None
    op, src, dst = named
    pg = entry.process_group[0] if entry.process_group else ""
    dtype, elements, nbytes = payload(op, entry, pg_size)
    p2p = op in ("send", "recv")
    seq = entry.p2p_seq_id if p2p else entry.collective_seq_id
    peer = None
    if p2p and src is not None:
        local = dst if op == "send" else src
        peer = global_rank(local) if global_rank is not None else local
    return NativeOp(step=step, op=op, pg=pg, pg_size=pg_size, position=max(int(seq) - 1, 0),
                    dtype=dtype, nbytes=nbytes, issue_ns=entry.time_created_ns, peer=peer,
                    elements=elements)


# ---- which entries the hooks issued -------------------------------------------------------------
NESTED_SPANS = 8  # spans looked back at for one that holds the later ones


def span_index(spans) -> dict[str, tuple[list[int], list]]:
    """Hooked calls' spans [thread ident, start_ns, end_ns or None (still inside)] by thread,
    as FR writes the thread (its decimal ident): (starts, spans), sorted by start."""
    by_thread: dict[str, list] = {}
    for span in spans:
        by_thread.setdefault(str(span[0]), []).append(span)
    index = {}
    for thread, own in by_thread.items():
        own.sort(key=lambda s: s[1])
        index[thread] = ([s[1] for s in own], own)
    return index


def within_span(index, entry: FrEntry) -> bool:
    """Whether `entry` was created on a thread while it was inside a hooked call, which is then
    the call that issued it: a thread is inside one call at a time, so this is exact."""
    found = index.get(entry.thread_id)
    if found is None:
        return False
    starts, spans = found
    created = entry.time_created_ns
    last = bisect.bisect_right(starts, created) - 1
    # The latest span that began before it, or one it is nested in (a _coalescing_manager
    # block holds the hooked calls inside it, and issues its op at its end).
    for i in range(last, max(last - NESTED_SPANS, -1), -1):
        end = spans[i][2]
        if end is None or created <= end:
            return True
    return False
