"""Records every collective and point-to-point op a training script issues, one CommRecord each.

Nothing in the workload changes: `CommsRecorder.install()` replaces the functions torch code
looks up at call time, and `uninstall()` puts the very same objects back.

How each way of issuing an op is caught
---------------------------------------
* ``torch.distributed`` calls (all_reduce, all_gather, all_gather_into_tensor, reduce_scatter,
  reduce_scatter_tensor, broadcast, reduce, all_to_all, all_to_all_single, gather, scatter,
  send, recv, isend, irecv, barrier, monitored_barrier and the deprecated/underscored aliases):
  the attribute is replaced in ``torch.distributed``, ``torch.distributed.distributed_c10d`` and
  in every loaded ``torch.distributed.*`` module that imported it by name (DTensor's
  ``_collective_utils`` imports ``broadcast`` and ``scatter`` that way). Where one wrapped
  function calls another (``all_gather_into_tensor`` -> ``all_gather_single``, ``recv`` ->
  ``irecv``), a per-thread depth counter lets only the outermost call record.
* Object collectives (``all_gather_object``, ``broadcast_object_list``, ``send_object_list``,
  ...) are not wrapped: the tensor ops they issue inside are, so each real transfer is one
  record with its real size (the pickled payload and the size exchange before it).
* ``batch_isend_irecv`` records one "send"/"recv" per ``P2POp`` (peer = global rank) and times
  each by its own work, or by the one coalesced work NCCL returns for the batch. Its inner
  isend/irecv calls do not record again. ``P2POp.op`` is compared with ``is`` against the
  module's isend/irecv inside torch, so those two wrappers also compare equal (``==``, hash)
  to the originals, and a P2POp built with an original before install is given the wrapper
  for the call.
* ``_coalescing_manager``: ops issued inside it are timed together by the work the manager
  produces on exit (their own return value is a placeholder).
* DDP gradient buckets: the C++ reducer talks to the process group directly, so when a DDP
  model is built while installed (and uses neither mixed precision nor the Python reducer), a hook that
  reproduces DDP's default reduction exactly is registered (see "DDP default reduction" below)
  and issues the bucket all_reduce through the wrapped ``all_reduce`` with source "ddp". A
  user's own hook (``register_comm_hook``, DDP mixed precision, fused optimizers) is
  wrapped so that the ops it issues are labelled "ddp"; as our hook holds the reducer's single
  slot, it hands the slot over and runs the user's hook instead of its own reduction. The
  built-in C++ hooks ALLREDUCE and FP16_COMPRESS become their Python twins from
  ``default_hooks`` (same arithmetic) so their all_reduce can be seen. DDP's parameter and
  buffer broadcasts (``dist._broadcast_coalesced``) record as "broadcast" with source "ddp".
* Functional collectives (DTensor, ``torch.distributed._functional_collectives``): the module's
  Python functions (all_reduce, all_gather_single, reduce_scatter_single, all_to_all_single,
  broadcast and their *_coalesced forms) are replaced in every loaded ``torch.distributed.*``
  module that holds them; DTensor looks them up on the module at call time. Completion is
  observed in the module's ``wait_tensor`` (also replaced), which AsyncCollectiveTensor calls on
  first use; the pending op is found by the output's storage address, so waiting on a view of
  the output also counts. The ``torch.ops._c10d_functional`` ops themselves are never replaced:
  compiled graphs and Inductor's lowerings hold them, and a replaced op namespace made Inductor
  generate different code (another buffer waited on, wrong losses). The ``*_autograd`` variants
  (``torch.ops._c10d_functional_autograd``) and DTensor's ``shard_dim_alltoall`` op are not seen.
* Pipelining (``torch.distributed.pipelining``) builds ``dist.P2POp(dist.isend, ...)`` and calls
  ``dist.batch_isend_irecv`` or, for one-direction batches, ``P2POp.op`` directly: both paths
  are covered above, with source "p2p".

torch.compile
-------------
Every wrapper first asks ``torch.compiler.is_dynamo_compiling()`` and, when Dynamo traces it, is
the original and nothing else, so Dynamo's graphs, guards and graph breaks are those of the
untraced script. Collectives inside compiled graphs are not recorded: the functional wrappers
count how many AOTAutograd traced into graphs (they run for real while a graph is built) and
``uninstall`` says so in one line. DDP's hook is registered when the DDP module is built, never
in its forward, which Dynamo traces; its buckets are reduced by the C++ reducer outside compiled
code, so they are recorded compiled or not.

Not seen: ops inside torch.compile graphs; ops that torch issues from C++ only (DDP's one-off
bucket-order broadcast after its first iteration and its start-up parameter-shape check);
nn.DataParallel's intra-process device copies, which are not torch.distributed ops.

Timing
------
On CPU (gloo) the host clock brackets the op's completion: a synchronous op is timed around
the call; an async op from its issue until its work's future completes
(``get_future().add_done_callback``); p2p works on gloo have no future, so ``Work.wait`` is
wrapped to stamp their completion when the workload waits (and ``drain`` polls
``is_completed()`` for works nobody waits on).

On GPU (a CUDA tensor and ``use_cuda``) durations come from CUDA events, never host clocks:
* the start event is recorded on the issuing thread's current stream just before the op is
  issued; NCCL's stream waits on that stream before it runs the op, so the op cannot start
  before the event (queueing behind earlier NCCL work on the same stream counts as its time);
* the end event is recorded in a callback on the work's future. c10d futures on CUDA run
  callbacks with the current stream set to a pool stream that has been made to wait for the
  op's completion event, so the end event completes exactly when the op does, independent of
  when (or whether) the workload waits and of compute queued on its own stream meanwhile;
* a synchronous op has already made the current stream wait on the op when it returns, so its
  end event is recorded right after the call on the current stream;
* where a work has no future, the end event is recorded on the current stream after
  ``Work.wait``; functional collectives expose no work, so theirs is recorded after
  ``wait_tensor`` on the current stream: both are upper bounds if the stream still had compute
  queued when the workload waited.
Events are resolved lazily: ``drain()`` uses ``Event.query()`` and never blocks;
``drain(wait=True)`` polls until all resolvable ops are done or the timeout passes. For
event-timed records ``start_ns`` is the host clock at issue and ``end_ns`` is
``start_ns + duration`` (the device may run the op later than the host issued it).

DDP default reduction (why the replacement hook gives bit-identical gradients)
-------------------------------------------------------------------------------
Without a hook, ``Reducer::mark_variable_ready_dense`` scales each gradient while filling the
bucket, and the bucket is then all-reduced with SUM: a gradient that is not already a view of
the bucket is written as ``mul_out(view, grad, 1.0 / div_factor)``; one that already is (only
with ``gradient_as_bucket_view=True``) is divided in place, ``view.div_(div_factor)``; with
``batched_grad_copy=True`` the copies are deferred and the whole bucket gets one
``div_(div_factor)``; sparse gradients get ``div_(div_factor)``. With a hook registered the
reducer only copies (``view.copy_(grad)``, exact) and leaves the scaling to the hook. The
replacement hook applies the very same op to the same elements: ``buffer.mul_(1.0 / n)`` (the
same double scalar, the same kernel, element by element) when no gradient was a view,
``div_(n)`` for batched buckets and sparse ones, and, with ``gradient_as_bucket_view``, for each
parameter the op its path would have used. Which path a parameter took is decided by whether
its gradient was a view of the bucket when the reducer marked it ready; a
post-accumulate-grad hook (which autograd runs before the reducer's own hook on the same
AccumulateGrad node) stores the gradient's data pointer, and the hook compares it with the
bucket's address range. ``n`` is the process group size, DDP's ``div_factor`` (DDP's Join with
``divide_by_initial_world_size=False`` changes that factor on uneven inputs; that mode is not
reproduced). The bucket is then all-reduced with ``async_op=True`` and the future's first value
returned, as ``default_hooks.allreduce_hook`` does (which torch documents as identical to no
hook). ``no_sync()`` steps issue nothing and never reach the hook. A C++ reducer cannot drop a
hook, so a DDP model that got this hook keeps it after ``uninstall()``, recording nothing and
still reducing exactly as DDP does.

Every patched function falls back to the original untouched if the recorder's own code
raises: the recorder writes one line to stderr, sets ``error`` and records nothing more.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import sys
import threading
import time
import weakref
from typing import Callable

import torch

from tracer import schema
from tracer.jsonl import say as _say

_DTYPE_NAMES: dict = {}
_MAX_PENDING_FUNCTIONAL = 10_000  # outputs that are never waited on must not pile up forever


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _tensor_bytes(tensor) -> int:
    if tensor.is_sparse:
        return tensor._values().nbytes + tensor._indices().nbytes
    return tensor.nbytes


def _storage_key(tensor) -> int:
    # Views of a collective's output share its storage; the key is where that storage starts.
    return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


def _first_value(fut):
    return fut.value()[0]


class _ThreadState(threading.local):
    depth = 0  # >0 while inside a wrapped call: inner wrapped calls must not record again
    source = None  # "ddp" while a DDP comm hook runs on this thread
    coalescing = ()  # stack of (process group, [pending]) for open _coalescing_manager blocks


_thread = _ThreadState()


class _Pending:
    """One issued op whose completion is not yet known."""

    __slots__ = ("step", "op", "source", "pg", "pg_size", "dtype", "nbytes", "start_ns", "t0",
                 "async_op", "peer", "device", "start_event", "end_event", "duration_ns", "keep")

    def __init__(self, step, op, source, pg, pg_size, dtype, nbytes, async_op, peer, device):
        self.step, self.op, self.source, self.pg, self.pg_size = step, op, source, pg, pg_size
        self.dtype, self.nbytes, self.async_op, self.peer, self.device = dtype, nbytes, async_op, peer, device
        self.start_event = self.end_event = self.duration_ns = self.keep = None
        self.start_ns = time.time_ns()
        self.t0 = time.perf_counter_ns()


class _P2POpEqualWrapper:
    """isend/irecv wrapper that torch's ``op in [isend, irecv]`` checks accept as the original."""

    def __init__(self, wrapper, original):
        self._wrapper = wrapper
        self._original = original
        functools.update_wrapper(self, original)

    def __call__(self, *args, **kwargs):
        return self._wrapper(*args, **kwargs)

    def __eq__(self, other):
        return other is self or other is self._original

    def __hash__(self):
        return hash(self._original)

    def __repr__(self):
        return f"<ranktrace wrapper of {self._original!r}>"


# ---- c10d call specs ----------------------------------------------------------------------------
# name -> (CommRecord.op, parameter holding the payload, how it counts, source, peer params, async)
# "one": a tensor; "list": a list of tensors; "lists": a list of lists; "per_rank": one tensor
# that every rank of the group contributes (gather) or receives (scatter), so S = n * tensor.
_C10D_SPECS = {
    "all_reduce": ("all_reduce", "tensor", "one", "c10d", None, None),
    "all_reduce_coalesced": ("all_reduce", "tensors", "list", "c10d", None, None),
    "broadcast": ("broadcast", "tensor", "one", "c10d", None, None),
    "reduce": ("reduce", "tensor", "one", "c10d", None, None),
    "all_gather": ("all_gather", "tensor_list", "list", "c10d", None, None),
    "all_gather_single": ("all_gather", "output_tensor", "one", "c10d", None, None),
    "all_gather_into_tensor": ("all_gather", "output_tensor", "one", "c10d", None, None),
    "_all_gather_base": ("all_gather", "output_tensor", "one", "c10d", None, None),
    "all_gather_coalesced": ("all_gather", "output_tensor_lists", "lists", "c10d", None, None),
    "reduce_scatter": ("reduce_scatter", "input_list", "list", "c10d", None, None),
    "reduce_scatter_single": ("reduce_scatter", "input", "one", "c10d", None, None),
    "_reduce_scatter_base": ("reduce_scatter", "input", "one", "c10d", None, None),
    "all_to_all": ("all_to_all", "input_tensor_list", "list", "c10d", None, None),
    "all_to_all_single": ("all_to_all", "input", "one", "c10d", None, None),
    "gather": ("gather", "tensor", "per_rank", "c10d", None, None),
    "scatter": ("scatter", "tensor", "per_rank", "c10d", None, None),
    "send": ("send", "tensor", "one", "p2p", ("dst", "group_dst"), False),
    "recv": ("recv", "tensor", "one", "p2p", ("src", "group_src"), False),
    "isend": ("send", "tensor", "one", "p2p", ("dst", "group_dst"), True),
    "irecv": ("recv", "tensor", "one", "p2p", ("src", "group_src"), True),
    "barrier": ("barrier", None, None, "c10d", None, None),
    "monitored_barrier": ("barrier", None, None, "c10d", None, False),
}

# torch.distributed._functional_collectives function -> (CommRecord.op, whether the payload is
# gathered from every rank of the group, so S = n * input). The deprecated aliases
# (all_gather_tensor, reduce_scatter_tensor, *_tensor_coalesced) call these through the module, so
# they are recorded without being wrapped, and their FutureWarning still points at the caller.
_FUNCTIONAL_SPECS = {
    "all_reduce": ("all_reduce", False),
    "all_reduce_coalesced": ("all_reduce", False),
    "broadcast": ("broadcast", False),
    "all_gather_single": ("all_gather", True),
    "all_gather_single_coalesced": ("all_gather", True),
    "reduce_scatter_single": ("reduce_scatter", False),
    "reduce_scatter_single_coalesced": ("reduce_scatter", False),
    "all_to_all_single": ("all_to_all", False),
}


def _in_compiled_code() -> bool:
    """True while Dynamo traces the caller: a wrapper must then be the original and nothing else."""
    return torch.compiler.is_dynamo_compiling()


def _positions(function) -> dict[str, int]:
    names = list(inspect.signature(function).parameters)
    return {name: i for i, name in enumerate(names)}


def _arg(args, kwargs, positions, name, default=None):
    index = positions.get(name)
    if index is not None and index < len(args):
        return args[index]
    return kwargs.get(name, default)


class CommsRecorder:
    def __init__(self, writer, current_step: Callable[[], int], use_cuda: bool, *,
                 event_factory: Callable[[], object] | None = None, wait_timeout_s: float = 10.0):
        """`event_factory` replaces torch.cuda.Event(enable_timing=True) and then times every
        tensor op by events, whatever its device (for tests of the bookkeeping on CPU)."""
        self.writer = writer
        self.current_step = current_step
        self.use_cuda = bool(use_cuda)
        self.wait_timeout_s = wait_timeout_s
        self.ops = 0
        self.bytes = 0
        self.error: str | None = None
        self.dropped = 0  # issued ops whose completion was never seen (not written)
        self._event_factory = event_factory
        self._events_for_all = event_factory is not None
        self._free_events: list = []
        self._active = False
        self._installed = False
        self._patches: list[tuple[object, str, object]] = []  # (owner, attribute, original)
        self._wrapper_to_original: dict[int, tuple[object, object]] = {}
        self._originals: dict[str, object] = {}
        self._count_lock = threading.Lock()
        self._done: collections.deque = collections.deque()  # timing known, waiting for drain
        self._in_flight: dict[int, _Pending] = {}  # host-timed, waiting for a future callback
        self._event_pending: collections.deque = collections.deque()  # event-timed, not yet resolved
        self._wait_pending: dict[int, tuple[object, list]] = {}  # work without future -> its ops
        self._wait_lock = threading.Lock()
        self._functional_pending: collections.OrderedDict = collections.OrderedDict()
        self._pg_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._pg_name_sizes: dict[str, int] = {}
        self._default_reductions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # reducer -> state
        self._c10d_wrappers: dict[str, object] = {}
        self._are_we_tracing: Callable[[], bool] = lambda: False
        self._resolve_group_name: Callable = lambda group, tag: group
        self.compiled_collectives = 0  # functional collectives traced into torch.compile graphs

    # ---- lifecycle ------------------------------------------------------------------------------
    def install(self) -> None:
        if self._installed:
            return
        try:
            import torch.distributed as dist
            if not dist.is_available():
                raise RuntimeError("torch.distributed is not available in this build")
            self._install_c10d()
            self._install_work_wait()
            self._install_functional()
            self._install_ddp()
        except Exception as exc:  # a torch without one of these pieces: leave nothing half-patched
            self._restore()
            self._fail("install", exc)
            return
        self._installed = True
        self._active = self.error is None

    def uninstall(self) -> None:
        self._active = False
        self._restore()
        self._installed = False
        if self.compiled_collectives:
            _say(f"comms: {self.compiled_collectives} collectives were compiled into torch.compile "
                 f"graphs; the ops compiled code issues are not in the comms records (comm_ops "
                 f"counts eager ops only; the profiler's Kineto traces show them)")
            self.compiled_collectives = 0

    def _restore(self) -> None:
        for owner, name, original in reversed(self._patches):
            try:
                setattr(owner, name, original)
            except Exception as exc:
                self._fail(f"restoring {name}", exc)
        self._patches.clear()
        # Modules imported while installed may have bound a wrapper by name: give them the original.
        for module in self._distributed_modules():
            for name, value in list(vars(module).items()):
                found = self._wrapper_to_original.get(id(value))
                if found is not None and found[0] is value:
                    setattr(module, name, found[1])

    def _patch(self, owner, name: str, replacement) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._patches.append((owner, name, original))

    @staticmethod
    def _distributed_modules():
        return [m for n, m in list(sys.modules.items())
                if m is not None and (n == "torch.distributed" or n.startswith("torch.distributed."))]

    def _fail(self, what: str, exc: BaseException) -> None:
        self._active = False
        if self.error is None:
            self.error = f"comms: {what} failed ({type(exc).__name__}: {exc}); comms recording is off"
            _say(self.error)

    # ---- c10d -----------------------------------------------------------------------------------
    def _install_c10d(self) -> None:
        import torch.distributed as dist
        c10d = dist.distributed_c10d
        for name, spec in _C10D_SPECS.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            positions = _positions(original)
            needed = [p for p in (spec[1], *(spec[4] or ())) if p]
            if any(p not in positions for p in needed):
                continue  # a torch whose signature differs: leave that function alone
            wrapper = self._make_c10d_wrapper(name, original, positions, spec)
            if name in ("isend", "irecv"):
                wrapper = _P2POpEqualWrapper(wrapper, original)
            self._originals[name] = original
            self._c10d_wrappers[name] = wrapper
        self._originals["batch_isend_irecv"] = c10d.batch_isend_irecv
        self._c10d_wrappers["batch_isend_irecv"] = functools.wraps(c10d.batch_isend_irecv)(
            self._make_batch_wrapper(c10d.batch_isend_irecv))
        if hasattr(c10d, "_coalescing_manager"):
            self._originals["_coalescing_manager"] = c10d._coalescing_manager
            self._c10d_wrappers["_coalescing_manager"] = self._make_coalescing_wrapper(
                c10d._coalescing_manager)
        wrapper_of = {}  # id(original) -> (original, wrapper)
        for name, wrapper in self._c10d_wrappers.items():
            original = self._originals[name]
            self._wrapper_to_original[id(wrapper)] = (wrapper, original)
            wrapper_of[id(original)] = (original, wrapper)
        for module in self._distributed_modules():
            for attr, value in list(vars(module).items()):
                found = wrapper_of.get(id(value))
                if found is not None and found[0] is value:
                    self._patch(module, attr, found[1])
        original_broadcast_coalesced = getattr(dist, "_broadcast_coalesced", None)
        if original_broadcast_coalesced is not None:
            self._patch(dist, "_broadcast_coalesced",
                        self._make_broadcast_coalesced_wrapper(original_broadcast_coalesced))

    def _group_info(self, group):
        """(pg, name, size) or None when this rank is not in the group."""
        import torch.distributed as dist
        c10d = dist.distributed_c10d
        pg = group if group is not None else c10d._get_default_group()
        if pg is c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        info = self._pg_cache.get(pg)
        if info is None:
            info = self._pg_cache[pg] = (str(pg.group_name), pg.size())
        return pg, info[0], info[1]

    @staticmethod
    def _global_peer(pg, positions, args, kwargs, peer_names):
        import torch.distributed as dist
        peer = _arg(args, kwargs, positions, peer_names[0])
        if peer is not None:
            return int(peer)
        group_peer = _arg(args, kwargs, positions, peer_names[1])
        if group_peer is None:
            return None
        if pg is dist.distributed_c10d._get_default_group():
            return int(group_peer)
        return dist.get_global_rank(pg, group_peer)

    def _make_c10d_wrapper(self, name, original, positions, spec):
        op, payload_name, payload_kind, source, peer_names, fixed_async = spec
        recorder = self

        def describe(args, kwargs):
            """Everything a record needs that is known before the call, or None to pass through."""
            group_info = recorder._group_info(_arg(args, kwargs, positions, "group"))
            if group_info is None:
                return None
            pg, pg_name, pg_size = group_info
            if payload_name is None:
                tensor, nbytes = None, 0
            else:
                payload = _arg(args, kwargs, positions, payload_name)
                if payload_kind == "one":
                    tensor, nbytes = payload, _tensor_bytes(payload)
                elif payload_kind == "per_rank":
                    tensor, nbytes = payload, _tensor_bytes(payload) * pg_size
                elif payload_kind == "list":
                    tensor = payload[0] if payload else None
                    nbytes = sum(_tensor_bytes(t) for t in payload)
                else:
                    flat = [t for group_list in payload for t in group_list]
                    tensor = flat[0] if flat else None
                    nbytes = sum(_tensor_bytes(t) for t in flat)
            async_op = fixed_async if fixed_async is not None else bool(
                _arg(args, kwargs, positions, "async_op", False))
            peer = recorder._global_peer(pg, positions, args, kwargs, peer_names) if peer_names else None
            return pg, pg_name, pg_size, tensor, nbytes, async_op, peer

        def wrapper(*args, **kwargs):
            if _in_compiled_code() or not recorder._active or _thread.depth or torch.compiler.is_compiling():
                return original(*args, **kwargs)
            failure = pending = None
            try:
                described = describe(args, kwargs)
                if described is not None:
                    pg, pg_name, pg_size, tensor, nbytes, async_op, peer = described
                    pending = recorder._begin(op, _thread.source or source, pg_name, pg_size, tensor,
                                              nbytes, async_op, peer)
                    coalescing = recorder._coalescing_list(pg)
            except Exception as exc:
                failure = exc
            if failure is not None:
                # Bad arguments make the original raise its own error (outside our except block, so
                # the user's traceback does not show ours); if it does not raise, the fault is ours.
                result = original(*args, **kwargs)
                recorder._fail(f"recording {name}", failure)
                return result
            if pending is None:
                return original(*args, **kwargs)
            _thread.depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                _thread.depth -= 1
            try:
                if coalescing is not None:
                    coalescing.append(pending)
                    recorder._issued(pending)
                elif not async_op:
                    if op == "recv" and pending.peer is None and isinstance(result, int) and result >= 0:
                        pending.peer = result
                    recorder._issued(pending)
                    recorder._complete_now(pending)
                elif result is not None:
                    recorder._issued(pending)
                    recorder._complete_with_work(result, [pending])
            except Exception as exc:
                recorder._fail(f"recording {name}", exc)
            return result

        functools.update_wrapper(wrapper, original)
        return wrapper

    def _coalescing_list(self, pg):
        for group, collected in _thread.coalescing:
            if group is pg:
                return collected
        return None

    def _make_batch_wrapper(self, original):
        recorder = self

        def batch_isend_irecv(p2p_op_list):
            if _in_compiled_code() or not recorder._active or _thread.depth or torch.compiler.is_compiling():
                return original(p2p_op_list)
            try:
                ops = recorder._normalize_p2p_ops(p2p_op_list)
                pendings = []
                for p2p_op in ops:
                    group_info = recorder._group_info(p2p_op.group)
                    if group_info is None:
                        continue
                    _, pg_name, pg_size = group_info
                    op = "send" if p2p_op.op == recorder._originals["isend"] else "recv"
                    pendings.append(recorder._begin(op, _thread.source or "p2p", pg_name, pg_size,
                                                    p2p_op.tensor, _tensor_bytes(p2p_op.tensor),
                                                    True, p2p_op.peer))
            except Exception as exc:
                failure = exc
            else:
                failure = None
            if failure is not None:
                result = original(p2p_op_list)
                recorder._fail("recording batch_isend_irecv", failure)
                return result
            _thread.depth += 1
            try:
                works = original(ops)
            finally:
                _thread.depth -= 1
            try:
                for pending in pendings:
                    recorder._issued(pending)
                if works and len(works) == len(pendings):
                    for work, pending in zip(works, pendings):
                        recorder._complete_with_work(work, [pending])
                elif works:
                    recorder._complete_with_work(works[-1], pendings)
                else:
                    for pending in pendings:
                        recorder._complete_now(pending)
            except Exception as exc:
                recorder._fail("recording batch_isend_irecv", exc)
            return works

        return batch_isend_irecv

    def _normalize_p2p_ops(self, p2p_op_list):
        """P2POps built with the original isend/irecv get the wrapper torch's `is` checks expect."""
        if not isinstance(p2p_op_list, list):
            return p2p_op_list
        swap = {id(self._originals["isend"]): self._c10d_wrappers["isend"],
                id(self._originals["irecv"]): self._c10d_wrappers["irecv"]}
        if not any(id(getattr(p, "op", None)) in swap for p in p2p_op_list):
            return p2p_op_list
        normalized = []
        for p2p_op in p2p_op_list:
            replacement = swap.get(id(getattr(p2p_op, "op", None)))
            if replacement is not None:
                copy = object.__new__(type(p2p_op))
                copy.__dict__.update(p2p_op.__dict__)
                copy.op = replacement
                p2p_op = copy
            normalized.append(p2p_op)
        return normalized

    def _make_coalescing_wrapper(self, original):
        recorder = self

        @contextlib.contextmanager
        def _coalescing_manager(group=None, device=None, async_ops=False):
            if _in_compiled_code() or not recorder._active or _thread.depth:
                with original(group, device, async_ops) as cm:
                    yield cm
                return
            import torch.distributed as dist
            pg = group or dist.distributed_c10d._get_default_group()
            collected: list = []
            entry = (pg, collected)
            _thread.coalescing = (*_thread.coalescing, entry)
            try:
                with original(group, device, async_ops) as cm:
                    yield cm
            finally:
                _thread.coalescing = tuple(e for e in _thread.coalescing if e is not entry)
            try:
                works = [w for w in (cm.works if async_ops else ()) if w is not None]
                if works:
                    recorder._complete_with_work(works[-1], collected)
                else:
                    for pending in collected:
                        recorder._complete_now(pending)
            except Exception as exc:
                recorder._fail("recording _coalescing_manager", exc)

        functools.update_wrapper(_coalescing_manager, original)
        return _coalescing_manager

    def _make_broadcast_coalesced_wrapper(self, original):
        recorder = self

        def _broadcast_coalesced(process_group, tensors, *args, **kwargs):
            if _in_compiled_code() or not recorder._active or _thread.depth or not tensors:
                return original(process_group, tensors, *args, **kwargs)
            failure = pending = None
            try:
                group_info = recorder._group_info(process_group)
                if group_info is not None:
                    pending = recorder._begin("broadcast", "ddp", group_info[1], group_info[2],
                                              tensors[0], sum(_tensor_bytes(t) for t in tensors),
                                              False, None)
            except Exception as exc:
                failure = exc
            if failure is not None:
                result = original(process_group, tensors, *args, **kwargs)
                recorder._fail("recording _broadcast_coalesced", failure)
                return result
            result = original(process_group, tensors, *args, **kwargs)
            if pending is not None:
                try:
                    recorder._issued(pending)
                    recorder._complete_now(pending)
                except Exception as exc:
                    recorder._fail("recording _broadcast_coalesced", exc)
            return result

        return _broadcast_coalesced

    # ---- works without a future (gloo p2p) ------------------------------------------------------
    def _install_work_wait(self) -> None:
        import torch.distributed as dist
        work_class = dist.Work
        original_wait = work_class.wait
        recorder = self

        def wait(work, *args, **kwargs):
            if _in_compiled_code():
                return original_wait(work, *args, **kwargs)
            result = original_wait(work, *args, **kwargs)
            if recorder._wait_pending:
                try:
                    recorder._on_work_done(work)
                except Exception as exc:
                    recorder._fail("recording Work.wait", exc)
            return result

        functools.update_wrapper(wait, original_wait)
        self._patch(work_class, "wait", wait)

    def _on_work_done(self, work) -> None:
        # Entries hold their work, so no other work can share its id while the entry exists.
        with self._wait_lock:
            entry = self._wait_pending.pop(id(work), None)
        if entry is None:
            return
        for pending in entry[1]:
            self._complete_now(pending)

    # ---- functional collectives -----------------------------------------------------------------
    def _install_functional(self) -> None:
        """Wraps the Python functions of torch.distributed._functional_collectives, never the
        torch.ops._c10d_functional ops: compiled graphs and Inductor's lowerings hold those ops,
        and a replaced op namespace changes what Inductor generates."""
        import torch.distributed._functional_collectives as funcol
        self._are_we_tracing = funcol._are_we_tracing
        self._resolve_group_name = funcol._resolve_group_name
        wrappers = {}
        for name, spec in _FUNCTIONAL_SPECS.items():
            original = getattr(funcol, name, None)
            if original is None:
                continue
            positions = _positions(original)
            if "group" not in positions:
                continue  # a torch whose signature differs: leave that function alone
            wrappers[name] = (original, self._make_functional_call(name, original, positions, spec))
        wrappers["wait_tensor"] = (funcol.wait_tensor, self._make_wait_tensor(funcol.wait_tensor))
        wrapper_of = {}
        for original, wrapper in wrappers.values():
            functools.update_wrapper(wrapper, original)
            self._wrapper_to_original[id(wrapper)] = (wrapper, original)
            wrapper_of[id(original)] = (original, wrapper)
        # DTensor looks them up on the module (funcol.all_reduce); some modules import them by name.
        for module in self._distributed_modules():
            for attr, value in list(vars(module).items()):
                found = wrapper_of.get(id(value))
                if found is not None and found[0] is value:
                    self._patch(module, attr, found[1])

    def _functional_group(self, group_name):
        if not isinstance(group_name, str):
            group_name = group_name.group_name
        size = self._pg_name_sizes.get(group_name)
        if size is None:
            import torch.distributed as dist
            size = self._pg_name_sizes[group_name] = dist.distributed_c10d._get_group_size_by_name(group_name)
        return group_name, size

    def _make_functional_call(self, name, original, positions, spec):
        op, gathered = spec
        recorder = self

        def call(*args, **kwargs):
            if _in_compiled_code():
                return original(*args, **kwargs)
            if torch.compiler.is_compiling() or recorder._are_we_tracing():
                # AOTAutograd/make_fx runs this Python for real while it builds a compiled graph
                # (DTensor's redistribution under torch.compile): counted, never recorded.
                if recorder._active:
                    recorder.compiled_collectives += 1
                return original(*args, **kwargs)
            if not recorder._active or _thread.depth:
                return original(*args, **kwargs)
            failure = pending = None
            try:
                inputs = args[0] if args else kwargs.get("self", kwargs.get("inputs"))
                tensors = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
                # Fake or meta tensors (sharding propagation) move no data.
                if tensors and tensors[0].device.type != "meta":
                    group = _arg(args, kwargs, positions, "group")
                    tag = _arg(args, kwargs, positions, "tag", "")
                    pg_name, pg_size = recorder._functional_group(recorder._resolve_group_name(group, tag))
                    nbytes = sum(_tensor_bytes(t) for t in tensors) * (pg_size if gathered else 1)
                    pending = recorder._begin(op, "functional", pg_name, pg_size, tensors[0], nbytes,
                                              True, None)
            except Exception as exc:
                failure = exc
            if failure is not None:
                result = original(*args, **kwargs)
                recorder._fail(f"recording _functional_collectives.{name}", failure)
                return result
            if pending is None:
                return original(*args, **kwargs)
            _thread.depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                _thread.depth -= 1
            try:
                recorder._issued(pending)
                results = result if isinstance(result, (list, tuple)) else (result,)
                waiting = [getattr(r, "elem", None) for r in results
                           if not getattr(r, "completed", True)]  # AsyncCollectiveTensor, not waited yet
                if waiting and all(w is not None for w in waiting):
                    recorder._await_functional(pending, waiting)
                else:
                    recorder._complete_now(pending)  # the function waited before returning
            except Exception as exc:
                recorder._fail(f"recording _functional_collectives.{name}", exc)
            return result

        return call

    def _await_functional(self, pending, outputs) -> None:
        pending.keep = outputs  # holds the storages so their addresses stay unique until waited
        pending_map = self._functional_pending
        for output in outputs:
            key = _storage_key(output)
            earlier = pending_map.pop(key, None)
            if earlier is not None and earlier is not pending:
                # An in-place op on a tensor whose earlier op was never waited: that one is lost.
                self._forget_functional(earlier)
            pending_map[key] = pending
        while len(pending_map) > _MAX_PENDING_FUNCTIONAL:
            _, stale = pending_map.popitem(last=False)
            self._forget_functional(stale)

    def _forget_functional(self, pending) -> None:
        """Drop a functional op that will never be waited on: once, with all its outputs' keys
        (a coalesced op has several, and each may be found again later)."""
        if pending.keep is None:
            return  # completed or dropped already
        pending_map = self._functional_pending
        for output in pending.keep:
            key = _storage_key(output)
            if pending_map.get(key) is pending:
                del pending_map[key]
        pending.keep = None
        self._drop(pending)

    def _make_wait_tensor(self, original):
        recorder = self

        def wait_tensor(tensor):
            if _in_compiled_code():
                return original(tensor)
            result = original(tensor)
            if recorder._functional_pending:
                try:
                    pending = recorder._functional_pending.pop(_storage_key(tensor), None)
                    if pending is not None and pending.keep is not None:
                        for other in pending.keep:  # the other outputs of a coalesced op
                            recorder._functional_pending.pop(_storage_key(other), None)
                        pending.keep = None
                        recorder._complete_now(pending)
                except Exception as exc:
                    recorder._fail("recording _functional_collectives.wait_tensor", exc)
            return result

        return wait_tensor

    # ---- DDP ------------------------------------------------------------------------------------
    def _install_ddp(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        recorder = self
        original_init = DDP.__init__
        original_builtin = DDP._register_builtin_comm_hook
        original_register = dist._register_comm_hook

        # The hook is registered at construction, which never runs inside a compiled region:
        # DDP.forward is left alone, so torch.compile(DDP(model)) traces exactly what it would
        # untraced (no graph break, no warning at a comm hook registration).
        @functools.wraps(original_init)
        def __init__(ddp, *args, **kwargs):
            original_init(ddp, *args, **kwargs)
            if recorder._active:
                try:
                    recorder._attach_default_hook(ddp, original_register)
                except Exception as exc:
                    recorder._fail("registering the DDP timing hook", exc)

        @functools.wraps(original_builtin)
        def _register_builtin_comm_hook(ddp, comm_hook_type):
            twin = None
            if recorder._active or getattr(ddp, "reducer", None) in recorder._default_reductions:
                try:
                    twin = recorder._python_twin(comm_hook_type)
                except Exception as exc:
                    recorder._fail("replacing a built-in DDP comm hook", exc)
            if twin is None:
                return original_builtin(ddp, comm_hook_type)
            # As the original does, with the hook's Python twin (same arithmetic) in its place.
            ddp.logger._set_comm_hook_name(str(comm_hook_type))
            dist._register_comm_hook(ddp.reducer, ddp.process_group, twin)

        @functools.wraps(original_register)
        def _register_comm_hook(reducer, state, hook):
            labelled = hook
            try:
                labelled = _LabelledDdpHook(hook)
                default = recorder._default_reductions.get(reducer)
                if default is not None and default.user_hook is None:
                    # Our hook took the reducer's only slot at construction: it hands over.
                    default.user_state, default.user_hook = state, labelled
                    return None
            except Exception as exc:
                recorder._fail("registering a DDP comm hook", exc)
            return original_register(reducer, state, labelled)

        self._patch(DDP, "__init__", __init__)
        self._patch(DDP, "_register_builtin_comm_hook", _register_builtin_comm_hook)
        self._patch(dist, "_register_comm_hook", _register_comm_hook)

    @staticmethod
    def _python_twin(comm_hook_type):
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        return {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
                }.get(comm_hook_type)

    def _attach_default_hook(self, ddp, original_register) -> None:
        if (getattr(ddp, "mixed_precision", None) is not None or getattr(ddp, "_use_python_reducer", False)
                or getattr(ddp, "reducer", None) is None):
            return  # someone else reduces the buckets: their ops are recorded where they issue them
        state = _DdpDefaultReduction(ddp)
        original_register(ddp.reducer, state, _ddp_default_hook)
        self._default_reductions[ddp.reducer] = state

    # ---- record bookkeeping ---------------------------------------------------------------------
    def _begin(self, op, source, pg_name, pg_size, tensor, nbytes, async_op, peer) -> _Pending:
        pending = _Pending(int(self.current_step()), op, source, pg_name, pg_size,
                           _dtype_name(tensor.dtype) if tensor is not None else "none",
                           int(nbytes), bool(async_op), peer,
                           tensor.device if tensor is not None else None)
        if tensor is not None and (self._events_for_all or (self.use_cuda and tensor.is_cuda)):
            pending.start_event = self._new_event()
            self._record(pending.start_event, pending.device)
        return pending

    def _issued(self, pending) -> None:
        with self._count_lock:
            self.ops += 1
            self.bytes += pending.nbytes

    def _drop(self, pending) -> None:
        with self._count_lock:
            self.ops -= 1
            self.bytes -= pending.nbytes
            self.dropped += 1
        self._recycle(pending)

    def _new_event(self):
        try:
            return self._free_events.pop()  # callbacks on other threads share the pool
        except IndexError:
            pass
        if self._event_factory is not None:
            return self._event_factory()
        return torch.cuda.Event(enable_timing=True)

    @staticmethod
    def _record(event, device) -> None:
        if device is not None and device.type == "cuda":
            event.record(torch.cuda.current_stream(device))
        else:
            event.record()

    def _recycle(self, pending) -> None:
        for event in (pending.start_event, pending.end_event):
            if event is not None and len(self._free_events) < 256:
                self._free_events.append(event)
        pending.start_event = pending.end_event = None

    def _complete_now(self, pending) -> None:
        """The op is complete (host) or the current stream is ordered after it (events)."""
        if pending.start_event is None:
            pending.duration_ns = time.perf_counter_ns() - pending.t0
            self._done.append(pending)
        else:
            pending.end_event = self._new_event()
            self._record(pending.end_event, pending.device)
            self._event_pending.append(pending)

    def _complete_with_work(self, work, pendings) -> None:
        try:
            future = work.get_future()
        except Exception:
            future = None  # gloo p2p works have none: completion is seen at Work.wait
        if future is None:
            with self._wait_lock:
                self._wait_pending[id(work)] = (work, pendings)
            return
        for pending in pendings:
            if pending.start_event is None:
                self._in_flight[id(pending)] = pending
            else:
                self._event_pending.append(pending)  # end_event stays None until the callback
        recorder = self

        def on_done(_future):
            # Runs on a c10d thread (gloo) or inline with pool streams ordered after the op (CUDA).
            try:
                for pending in pendings:
                    if pending.start_event is None:
                        pending.duration_ns = time.perf_counter_ns() - pending.t0
                        recorder._in_flight.pop(id(pending), None)
                        recorder._done.append(pending)
                    else:
                        event = recorder._new_event()
                        recorder._record(event, pending.device)
                        pending.end_event = event
            except Exception as exc:
                recorder._fail("timing a work's completion", exc)

        future.add_done_callback(on_done)

    # ---- drain ----------------------------------------------------------------------------------
    def drain(self, wait: bool = False) -> None:
        try:
            self._drain_once()
            if not wait:
                return
            deadline = time.monotonic() + self.wait_timeout_s
            while self._resolvable() and time.monotonic() < deadline:
                time.sleep(0.002)
                self._drain_once()
            self._give_up_pending()
        except Exception as exc:
            self._fail("drain", exc)

    def _resolvable(self) -> bool:
        return bool(self._in_flight or self._wait_pending
                    or any(p.end_event is not None for p in self._event_pending))

    def _drain_once(self) -> None:
        if self._wait_pending:
            with self._wait_lock:
                entries = list(self._wait_pending.values())
            for work, _ in entries:
                if work.is_completed():
                    self._on_work_done(work)
        for _ in range(len(self._event_pending)):
            pending = self._event_pending.popleft()
            if pending.end_event is not None and pending.end_event.query():
                pending.duration_ns = int(pending.start_event.elapsed_time(pending.end_event) * 1e6)
                self._done.append(pending)
            else:
                self._event_pending.append(pending)
        while self._done:
            self._write(self._done.popleft())

    def _give_up_pending(self) -> None:
        left = list(self._in_flight.values()) + list(self._event_pending)
        with self._wait_lock:
            for _, pendings in self._wait_pending.values():
                left.extend(pendings)
            self._wait_pending.clear()
        functional = list({id(p): p for p in self._functional_pending.values()}.values())
        self._functional_pending.clear()
        self._in_flight.clear()
        self._event_pending.clear()
        for pending in left + functional:
            pending.keep = None
            self._drop(pending)
        if left or functional:
            _say(f"comms: {len(left) + len(functional)} ops never completed or were never waited on "
                 f"within {self.wait_timeout_s:g}s; they are not in the comms file")

    def _write(self, pending) -> None:
        duration_ns = max(int(pending.duration_ns), 0)
        algbw, busbw = schema.bandwidth_gbps(pending.op, pending.nbytes, pending.pg_size, duration_ns / 1e9)
        record = schema.CommRecord(
            step=pending.step, op=pending.op, source=pending.source, pg=pending.pg,
            pg_size=pending.pg_size, dtype=pending.dtype, bytes=pending.nbytes,
            start_ns=pending.start_ns, end_ns=pending.start_ns + duration_ns,
            duration_us=duration_ns / 1e3,
            timing="host" if pending.start_event is None else "cuda_event",
            algbw_gbps=algbw, busbw_gbps=busbw, peer=pending.peer, async_op=pending.async_op)
        self._recycle(pending)
        self.writer.write(record)


# ---- DDP hooks ----------------------------------------------------------------------------------
class _LabelledDdpHook:
    """A user's DDP comm hook; the ops it issues on this thread are labelled source "ddp"."""

    def __init__(self, hook):
        self.hook = hook
        functools.update_wrapper(self, hook)

    def __call__(self, state, bucket):
        previous = _thread.source
        _thread.source = "ddp"
        try:
            return self.hook(state, bucket)
        finally:
            _thread.source = previous


class _DdpDefaultReduction:
    """State of the hook that does what DDP's reducer does when no hook is registered."""

    def __init__(self, ddp):
        self.process_group = ddp.process_group
        if getattr(ddp, "batched_grad_copy", False):
            self.mode = "divide"
        elif ddp.gradient_as_bucket_view:
            self.mode = "per_parameter"
        else:
            self.mode = "multiply"
        self.user_state = None
        self.user_hook = None  # a hook registered after ours took the slot: it runs instead
        self.grad_addresses: dict[int, int] = {}
        self.probe_handles = []
        if self.mode == "per_parameter":
            addresses = self.grad_addresses

            def probe(param):
                # Runs after accumulation, before the reducer marks the parameter ready.
                grad = param.grad
                if grad is not None and not grad.is_sparse:
                    addresses[id(param)] = grad.data_ptr()

            for param in ddp.module.parameters():
                if param.requires_grad:
                    self.probe_handles.append(param.register_post_accumulate_grad_hook(probe))


def _ddp_default_hook(state: _DdpDefaultReduction, bucket):
    import torch.distributed as dist
    if state.user_hook is not None:
        return state.user_hook(state.user_state, bucket)
    buffer = bucket.buffer()
    world = state.process_group.size()
    if buffer.is_sparse or state.mode == "divide":
        buffer.div_(world)
    elif state.mode == "multiply":
        buffer.mul_(1.0 / world)
    else:
        low = buffer.data_ptr()
        high = low + buffer.nbytes
        addresses = state.grad_addresses
        aliased = [low <= addresses.get(id(p), -1) < high for p in bucket.parameters()]
        if all(aliased):
            buffer.div_(world)
        elif not any(aliased):
            buffer.mul_(1.0 / world)
        else:
            for view, was_view in zip(bucket.gradients(), aliased):
                if was_view:
                    view.div_(world)
                else:
                    view.mul_(1.0 / world)
    previous = _thread.source
    _thread.source = "ddp"
    try:
        work = dist.distributed_c10d.all_reduce(buffer, group=state.process_group, async_op=True)
    finally:
        _thread.source = previous
    return work.get_future().then(_first_value)
