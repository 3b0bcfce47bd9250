"""Which collectives DDP and FSDP issue themselves (CommRecord.issuer): the units the tracer saw
built, and the rule that names an op's issuer from them (docs/tracer.md, Collective hooks: who
issued an op).

tracer.comms.ddp and tracer.comms.fsdp observe the constructors (DDP.__init__,
FullyShardedDataParallel.__init__, FSDP2's FSDPParamGroup.__init__), which compiled code never
runs: `building` marks the thread while one runs, `add_*` note what the unit built. The rule reads
only these notes and the op, so it is the same for an op a hook saw (`of_hooked`) and one read
from torch's Flight Recorder (`of_native`).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from tracer import schema
from tracer.comms.patching import thread

DDP, FSDP1, FSDP2 = schema.ISSUER_DDP, schema.ISSUER_FSDP1, schema.ISSUER_FSDP2
# The dtypes of gradient buckets, and of the bucket order DDP's rebuild broadcasts
# (Reducer::sync_bucket_indices: bucket indices and count, then bucket sizes, as int32).
GRADIENT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "complex64",
                             "complex128", "complex32"})
BUCKET_ORDER_DTYPE = "int32"
FIRST_BUCKET_BYTES = 1024 * 1024  # DDP's first bucket cap (dist._DEFAULT_FIRST_BUCKET_BYTES)
MAX_SPANS = 4096  # constructions remembered until the Flight Recorder has read past them


@dataclass(frozen=True)
class DdpUnit:
    """What the gradient buckets of one DDP module can be."""

    pg: str  # its process group's name
    built_ns: int  # when its construction ended: its reducer issues nothing before
    params: int  # the parameters DDP reduces (requires_grad and not ignored)
    elements: int  # their elements: every bucket of one backward together
    # The elements of each (dtype, device) group of parameters: the one bucket each group is
    # until DDP rebuilds its buckets after the first backward.
    whole: frozenset
    # The most elements a rebuilt bucket holds: the largest bucket cap over the smallest element
    # size, plus the largest parameter (a bucket closes once it reaches its cap).
    bound: int

    def holds_bucket(self, elements: int) -> bool:
        """A gradient bucket can have this many elements (in any dtype: a comm hook that
        compresses keeps the count)."""
        return 0 < elements <= self.elements and (elements <= self.bound or elements in self.whole)

    def holds_bucket_order(self, elements: int) -> bool:
        """The rebuild's broadcasts: one index per parameter and the bucket count, then one size
        per bucket."""
        return 0 < elements <= self.params + 1


def ddp_unit(ddp, pg: str, built_ns: int) -> DdpUnit | None:
    """The DdpUnit of a DistributedDataParallel module just built; None without parameters to
    reduce."""
    params = [p for p in getattr(ddp, "_module_parameters", None) or ddp.module.parameters()
              if p.requires_grad]
    if not params:
        return None
    groups: dict = {}
    for p in params:
        groups[(p.dtype, p.device)] = groups.get((p.dtype, p.device), 0) + p.numel()
    caps = [int(getattr(ddp, "bucket_bytes_cap", 0) or 0), FIRST_BUCKET_BYTES,
            *(int(c) for c in getattr(ddp, "bucket_bytes_cap_list", None) or ())]
    bound = max(caps) // min(p.element_size() for p in params) + max(p.numel() for p in params)
    return DdpUnit(pg=pg, built_ns=built_ns, params=len(params), elements=sum(groups.values()),
                   whole=frozenset(groups.values()), bound=bound)


def fsdp1_sizes(fsdp, group_name) -> list[tuple[str, str, int]]:
    """(pg, op, elements) of the collectives of one FullyShardedDataParallel unit's flat
    parameter: the all-gather of the padded unsharded parameter and the reduce-scatter of its
    gradient; NO_SHARD all-reduces the whole gradient, HYBRID_SHARD all-reduces the sharded
    gradient across nodes. `group_name(pg)` names a process group."""
    handle = getattr(fsdp, "_handle", None)
    flat = getattr(handle, "flat_param", None)
    if flat is None:
        return []
    pg = group_name(handle.process_group)
    if not handle.uses_sharded_strategy:
        return [(pg, "all_reduce", flat.numel())]
    # Built, the flat parameter is this rank's padded shard.
    unsharded = flat.numel() * handle.world_size
    sizes = [(pg, "all_gather", unsharded), (pg, "reduce_scatter", unsharded)]
    inter_node = getattr(fsdp, "_inter_node_pg", None)
    if inter_node is not None:
        sizes.append((group_name(inter_node), "all_reduce", flat.numel()))
    return sizes


def fsdp2_sizes(param_group, group_name) -> list[tuple[str, str, int]]:
    """(pg, op, elements) of the collectives of one fully_shard parameter group: the all-gather
    of its parameters' padded shards and the reduce-scatter of their gradients (all of the
    group's parameters), and with HSDP the all-reduce of the reduced shards across replicas."""
    mesh = param_group.mesh_info
    shards = getattr(mesh, "shard_process_group", None)
    params = getattr(param_group, "fsdp_params", None) or []
    if shards is None or not params:
        return []
    shard = sum(p.padded_sharded_param_size.numel() for p in params)
    pg, unsharded = group_name(shards), shard * shards.size()
    sizes = [(pg, "all_gather", unsharded), (pg, "reduce_scatter", unsharded)]
    replicas = getattr(mesh, "replicate_process_group", None)
    if replicas is not None:
        sizes.append((group_name(replicas), "all_reduce", shard))
    return sizes


class Owners:
    """The DDP and FSDP units built while tracing, and who issued an op."""

    def __init__(self, clock_ns=time.time_ns):
        self.ddp: dict[str, tuple[DdpUnit, ...]] = {}  # pg -> the DDP units on it
        self.fsdp: dict[tuple[str, str, int], str] = {}  # (pg, op, elements) -> FSDP1 or FSDP2
        # [thread ident, start_ns, end_ns or None (still building), issuer]: each outermost
        # construction, until the Flight Recorder has read every entry created before its end.
        self.spans: collections.deque = collections.deque(maxlen=MAX_SPANS)
        self._clock_ns = clock_ns
        self._lock = threading.Lock()  # the constructing thread adds, the step-end worker prunes

    # ---- what was built -------------------------------------------------------------------------
    def building(self, issuer: str):
        """Mark this thread as building a unit of `issuer` (a DDP module, an FSDP unit) until
        `built(span)`; a construction inside another keeps the outer one's issuer."""
        if thread.issuer is not None:
            return None
        thread.issuer = issuer
        span = [threading.get_ident(), self._clock_ns(), None, issuer]
        with self._lock:
            self.spans.append(span)
        return span

    def built(self, span) -> None:
        if span is not None:
            span[2] = self._clock_ns()
            thread.issuer = None

    def add_ddp(self, unit: DdpUnit | None) -> None:
        if unit is not None:
            self.ddp[unit.pg] = (*self.ddp.get(unit.pg, ()), unit)

    def add_fsdp(self, issuer: str, sizes) -> None:
        for key in sizes:
            self.fsdp[key] = issuer

    def prune(self, before_ns: int) -> None:
        """Forget constructions that ended before `before_ns`: the Flight Recorder has read
        every entry created before it."""
        with self._lock:
            while self.spans and self.spans[0][2] is not None and self.spans[0][2] < before_ns:
                self.spans.popleft()

    # ---- the rule -------------------------------------------------------------------------------
    def of_hooked(self, op: str, source: str, pg: str, tensor, nbytes: int) -> str | None:
        """The issuer of an op a hook saw as it was issued on this thread: the framework
        building a unit here; DDP for its comm hooks' ops and its broadcasts (source "ddp");
        FSDP where the op's group, kind and size are an FSDP unit's."""
        issuer = thread.issuer
        if issuer is not None:
            return issuer
        if source == DDP:
            return DDP
        if self.fsdp and tensor is not None:
            size = tensor.element_size()
            return self.fsdp.get((pg, op, nbytes // size)) if size else None
        return None

    def of_native(self, op: str, pg: str, dtype: str, elements: int, thread_id: str,
                  created_ns: int) -> str | None:
        """The issuer of an op no Python hook issued (a Flight Recorder entry: `thread_id` as FR
        writes it, the decimal thread ident): the framework that was building a unit on that
        thread then; DDP for an all-reduce of a gradient bucket's size, or a broadcast of its
        bucket order, on a DDP module's group after it was built (its C++ reducer issues them
        in backward); FSDP where group, kind and size are an FSDP unit's."""
        issuer = self._building_at(thread_id, created_ns)
        if issuer is not None:
            return issuer
        for unit in self.ddp.get(pg, ()):
            if created_ns < unit.built_ns:
                continue
            if op == "all_reduce" and dtype in GRADIENT_DTYPES and unit.holds_bucket(elements):
                return DDP
            if (op == "broadcast" and dtype == BUCKET_ORDER_DTYPE
                    and unit.holds_bucket_order(elements)):
                return DDP
        return self.fsdp.get((pg, op, elements))

    def _building_at(self, thread_id: str, created_ns: int) -> str | None:
        with self._lock:
            spans = list(self.spans)
        for ident, start, end, issuer in spans:
            if str(ident) == thread_id and start <= created_ns and (end is None
                                                                   or created_ns <= end):
                return issuer
        return None
