"""Wrappers of the torch.distributed (c10d) functions: collectives, p2p, batch_isend_irecv,
_coalescing_manager, DDP's _broadcast_coalesced, and Work.wait for works without a future."""

from __future__ import annotations

import contextlib
import functools
import weakref

from tracer.comms.patching import (
    argument,
    close_span,
    in_compiled_code,
    open_span,
    parameter_positions,
    recording_wrapper,
    report_op_error,
    thread,
)
from tracer.comms.timing import tensor_bytes
from tracer.schema import ISSUER_DDP

# name -> (CommRecord.op, parameter holding the payload, how it counts, source, peer params, async)
# "one": a tensor; "list": a list of tensors; "lists": a list of lists; "per_rank": one tensor
# that every rank of the group contributes (gather) or receives (scatter), so S = n * tensor.
C10D_SPECS = {
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


class P2POpEqualWrapper:
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


def _payload(payload, kind, pg_size):
    """(first tensor, bytes) of a payload counted as C10D_SPECS says."""
    if kind == "one":
        return payload, tensor_bytes(payload)
    if kind == "per_rank":
        return payload, tensor_bytes(payload) * pg_size
    flat = payload if kind == "list" else [t for group_list in payload for t in group_list]
    return (flat[0] if flat else None), sum(tensor_bytes(t) for t in flat)


class C10dHooks:
    def __init__(self, recorder):
        self.recorder = recorder
        self.timing = recorder.timing
        self.originals: dict[str, object] = {}
        self.wrappers: dict[str, object] = {}
        self._pg_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def install(self, patches) -> None:
        import torch.distributed as dist
        c10d = dist.distributed_c10d
        for name, spec in C10D_SPECS.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            positions = parameter_positions(original)
            needed = [p for p in (spec[1], *(spec[4] or ())) if p]
            if any(p not in positions for p in needed):
                continue  # a torch whose signature differs: leave that function alone
            wrapper = functools.update_wrapper(
                self._c10d_wrapper(name, original, positions, spec), original)
            if name in ("isend", "irecv"):
                wrapper = P2POpEqualWrapper(wrapper, original)
            self.originals[name] = original
            self.wrappers[name] = wrapper
        batch = c10d.batch_isend_irecv
        self.originals["batch_isend_irecv"] = batch
        self.wrappers["batch_isend_irecv"] = functools.update_wrapper(
            self._batch_wrapper(batch), batch)
        if hasattr(c10d, "_coalescing_manager"):
            self.originals["_coalescing_manager"] = c10d._coalescing_manager
            self.wrappers["_coalescing_manager"] = self._coalescing_wrapper(
                c10d._coalescing_manager)
        patches.replace_everywhere((self.originals[n], w) for n, w in self.wrappers.items())
        broadcast_coalesced = getattr(dist, "_broadcast_coalesced", None)
        if broadcast_coalesced is not None:
            patches.patch(dist, "_broadcast_coalesced",
                          self._broadcast_coalesced_wrapper(broadcast_coalesced))
        self._install_work_wait(patches)

    def group_info(self, group):
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
        peer = argument(args, kwargs, positions, peer_names[0])
        if peer is not None:
            return int(peer)
        group_peer = argument(args, kwargs, positions, peer_names[1])
        if group_peer is None:
            return None
        if pg is dist.distributed_c10d._get_default_group():
            return int(group_peer)
        return dist.get_global_rank(pg, group_peer)

    def _coalescing_list(self, pg):
        for group, collected in thread.coalescing:
            if group is pg:
                return collected
        return None

    def _c10d_wrapper(self, name, original, positions, spec):
        import torch
        op, payload_name, payload_kind, source, peer_names, fixed_async = spec
        hooks, timing, owners = self, self.timing, self.recorder.owners

        def describe(args, kwargs):
            if torch.compiler.is_compiling():
                return None
            group_info = hooks.group_info(argument(args, kwargs, positions, "group"))
            if group_info is None:
                return None
            pg, pg_name, pg_size = group_info
            if payload_kind == "one":  # the common case, without a call to _payload
                tensor = argument(args, kwargs, positions, payload_name)
                nbytes = tensor_bytes(tensor)
            elif payload_name is not None:
                tensor, nbytes = _payload(argument(args, kwargs, positions, payload_name),
                                          payload_kind, pg_size)
            else:
                tensor, nbytes = None, 0
            async_op = fixed_async if fixed_async is not None else bool(
                argument(args, kwargs, positions, "async_op", False))
            peer = (hooks._global_peer(pg, positions, args, kwargs, peer_names) if peer_names
                    else None)
            issued_as = thread.source or source
            pending = timing.begin(op, issued_as, pg_name, pg_size, tensor, nbytes, async_op, peer,
                                   owners.of_hooked(op, issued_as, pg_name, tensor, nbytes))
            return pending, hooks._coalescing_list(pg)

        def complete(described, result):
            pending, coalescing = described
            if coalescing is not None:
                coalescing.append(pending)  # timed by the work the manager produces on exit
                timing.issued(pending)
            elif not pending.async_op:
                if op == "recv" and pending.peer is None and isinstance(result, int):
                    pending.peer = result if result >= 0 else None  # recv from any source
                timing.issued(pending)
                timing.complete_now(pending)
            elif result is not None:  # None: this rank was not in the group, nothing was issued
                timing.issued(pending)
                timing.complete_with_work(result, [pending])
            else:
                timing.outstanding.pop(id(pending), None)

        return recording_wrapper(self.recorder, name, original, describe, complete)

    def _batch_wrapper(self, original):
        hooks, timing = self, self.timing

        def describe(args, kwargs):
            ops = hooks._normalize_p2p_ops(args[0] if args else kwargs["p2p_op_list"])
            pendings = []
            for p2p_op in ops:
                group_info = hooks.group_info(p2p_op.group)
                if group_info is None:
                    continue
                _, pg_name, pg_size = group_info
                op = "send" if p2p_op.op == hooks.originals["isend"] else "recv"
                pendings.append(timing.begin(op, thread.source or "p2p", pg_name, pg_size,
                                             p2p_op.tensor, tensor_bytes(p2p_op.tensor),
                                             True, p2p_op.peer))
            return ops, pendings

        def complete(described, works):
            pendings = described[1]
            for pending in pendings:
                timing.issued(pending)
            if works and len(works) == len(pendings):
                for work, pending in zip(works, pendings):
                    timing.complete_with_work(work, [pending])
            elif works:
                timing.complete_with_work(works[-1], pendings)
            else:
                for pending in pendings:
                    timing.complete_now(pending)

        return recording_wrapper(self.recorder, "batch_isend_irecv", original, describe, complete,
                                 call_with=lambda described: original(described[0]))

    def _normalize_p2p_ops(self, p2p_op_list):
        """P2POps built with the original isend/irecv get the wrapper torch's `is` checks expect."""
        if not isinstance(p2p_op_list, list):
            return p2p_op_list
        swap = {id(self.originals["isend"]): self.wrappers["isend"],
                id(self.originals["irecv"]): self.wrappers["irecv"]}
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

    def _coalescing_wrapper(self, original):
        recorder, timing = self.recorder, self.timing

        @contextlib.contextmanager
        def _coalescing_manager(group=None, device=None, async_ops=False):
            if in_compiled_code() or not recorder.active or thread.depth:
                with original(group, device, async_ops) as cm:
                    yield cm
                return
            import torch.distributed as dist
            pg = group or dist.distributed_c10d._get_default_group()
            collected: list = []
            entry = (pg, collected)
            thread.coalescing = (*thread.coalescing, entry)
            span = open_span(recorder)  # the coalesced op is issued at the block's exit
            try:
                with original(group, device, async_ops) as cm:
                    yield cm
            finally:
                close_span(span)
                thread.coalescing = tuple(e for e in thread.coalescing if e is not entry)
            try:
                works = [w for w in (cm.works if async_ops else ()) if w is not None]
                if works:
                    timing.complete_with_work(works[-1], collected)
                else:
                    for pending in collected:
                        timing.complete_now(pending)
            except Exception as exc:
                recorder.fail("recording _coalescing_manager", exc)

        return functools.update_wrapper(_coalescing_manager, original)

    def _broadcast_coalesced_wrapper(self, original):
        hooks, timing = self, self.timing

        def describe(args, kwargs):
            process_group = args[0] if args else kwargs.get("process_group")
            tensors = args[1] if len(args) > 1 else kwargs.get("tensors")
            group_info = hooks.group_info(process_group) if tensors else None
            if group_info is None:
                return None
            # DDP's parameter and buffer broadcasts; FSDP1's sync_module_states while it builds
            return timing.begin("broadcast", "ddp", group_info[1], group_info[2], tensors[0],
                                sum(tensor_bytes(t) for t in tensors), False, None,
                                thread.issuer or ISSUER_DDP)

        def complete(pending, _result):
            timing.issued(pending)
            timing.complete_now(pending)

        return recording_wrapper(self.recorder, "_broadcast_coalesced", original, describe,
                                 complete)

    def _install_work_wait(self, patches) -> None:
        """gloo's p2p works have no future: their ops complete when the workload waits."""
        import torch.distributed as dist
        original_wait = dist.Work.wait
        recorder, timing = self.recorder, self.timing

        def wait(work, *args, **kwargs):
            if in_compiled_code():
                return original_wait(work, *args, **kwargs)
            try:
                result = original_wait(work, *args, **kwargs)
            except Exception as exc:
                if recorder.active:
                    report_op_error(recorder, exc)
                raise
            if timing.wait_pending:  # works without a future (gloo p2p) wait here
                try:
                    timing.on_work_done(work)
                except Exception as exc:
                    recorder.fail("recording Work.wait", exc)
            return result

        patches.patch(dist.Work, "wait", functools.update_wrapper(wait, original_wait))
