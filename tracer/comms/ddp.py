"""DDP: notes each DDP module built (its ops are DDP's: tracer.comms.owners), labels the ops of a
user's comm hook "ddp", and, only with --ddp-bucket-hook, times each gradient bucket with a comm
hook that reduces exactly as DDP does without one.

Without that option no hook is registered: DDP's C++ reducer all-reduces its buckets as it
would untraced, so a failing bucket all-reduce raises gloo's or NCCL's own error, and the
buckets are read from torch's Flight Recorder (tracer.comms.flight; docs/tracer.md, Collective
hooks).
"""

from __future__ import annotations

import functools
import time
import weakref

from tracer.comms.owners import ddp_unit
from tracer.comms.patching import thread
from tracer.schema import DDP_BUCKETS_FROM_HOOK, DDP_BUCKETS_FROM_PROFILER, ISSUER_DDP


class DdpHooks:
    def __init__(self, recorder, bucket_hook: bool, owners=None):
        """`owners`: where the DDP modules built are noted (tracer.comms.owners.Owners)."""
        self.recorder = recorder
        self.bucket_hook = bucket_hook
        self.owners = owners
        self.default_reductions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def buckets_recorded_by(self) -> str:
        return DDP_BUCKETS_FROM_HOOK if self.bucket_hook else DDP_BUCKETS_FROM_PROFILER

    def install(self, patches) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        hooks, recorder = self, self.recorder
        original_register = dist._register_comm_hook

        @functools.wraps(original_register)
        def _register_comm_hook(reducer, state, hook):
            labelled = hook
            try:
                labelled = LabelledDdpHook(hook)
                default = hooks.default_reductions.get(reducer)
                if default is not None and default.user_hook is None:
                    # Our hook took the reducer's only slot at construction: it hands over.
                    default.user_state, default.user_hook = state, labelled
                    return None
            except Exception as exc:
                recorder.fail("registering a DDP comm hook", exc)
            return original_register(reducer, state, labelled)

        patches.patch(dist, "_register_comm_hook", _register_comm_hook)
        self._install_init(patches, DDP, original_register)
        if self.bucket_hook:
            self._install_builtin_hooks(patches, DDP)

    def _install_init(self, patches, DDP, original_register) -> None:
        """DDP's construction: its ops are DDP's, and the module built is noted (its process
        group and what its buckets can be), with the timing hook where --ddp-bucket-hook asks.
        Construction never runs inside a compiled region: DDP.forward is left alone, so
        torch.compile(DDP(model)) traces exactly what it would untraced."""
        hooks, recorder, owners = self, self.recorder, self.owners
        original_init = DDP.__init__

        @functools.wraps(original_init)
        def __init__(ddp, *args, **kwargs):
            if not recorder.active:
                return original_init(ddp, *args, **kwargs)
            span = owners.building(ISSUER_DDP) if owners is not None else None
            try:
                original_init(ddp, *args, **kwargs)
            finally:
                if owners is not None:
                    owners.built(span)
            try:
                if owners is not None:
                    owners.add_ddp(ddp_unit(ddp, str(ddp.process_group.group_name),
                                            time.time_ns()))
            except Exception as exc:
                recorder.fail("noting a DDP module", exc)
            if hooks.bucket_hook and recorder.active:
                try:
                    hooks._attach_default_hook(ddp, original_register)
                except Exception as exc:
                    recorder.fail("registering the DDP timing hook", exc)

        patches.patch(DDP, "__init__", __init__)

    def _install_builtin_hooks(self, patches, DDP) -> None:
        import torch.distributed as dist
        hooks, recorder = self, self.recorder
        original_builtin = DDP._register_builtin_comm_hook

        @functools.wraps(original_builtin)
        def _register_builtin_comm_hook(ddp, comm_hook_type):
            twin = None
            if recorder.active or getattr(ddp, "reducer", None) in hooks.default_reductions:
                try:
                    twin = python_twin(comm_hook_type)
                except Exception as exc:
                    recorder.fail("replacing a built-in DDP comm hook", exc)
            if twin is None:
                return original_builtin(ddp, comm_hook_type)
            # As the original does, with the hook's Python twin (same arithmetic) in its place.
            ddp.logger._set_comm_hook_name(str(comm_hook_type))
            dist._register_comm_hook(ddp.reducer, ddp.process_group, twin)

        patches.patch(DDP, "_register_builtin_comm_hook", _register_builtin_comm_hook)

    def _attach_default_hook(self, ddp, original_register) -> None:
        if (getattr(ddp, "mixed_precision", None) is not None
                or getattr(ddp, "_use_python_reducer", False)
                or getattr(ddp, "reducer", None) is None):
            return  # someone else reduces the buckets: their ops are recorded where they issue them
        state = DdpDefaultReduction(ddp)
        original_register(ddp.reducer, state, ddp_default_hook)
        self.default_reductions[ddp.reducer] = state


def python_twin(comm_hook_type):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
            dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
            }.get(comm_hook_type)


class LabelledDdpHook:
    """A user's DDP comm hook; the ops it issues on this thread are labelled source "ddp"."""

    def __init__(self, hook):
        self.hook = hook
        functools.update_wrapper(self, hook)

    def __call__(self, state, bucket):
        previous = thread.source
        thread.source = "ddp"
        try:
            return self.hook(state, bucket)
        finally:
            thread.source = previous


class DdpDefaultReduction:
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


def _first_value(fut):
    return fut.value()[0]


def ddp_default_hook(state: DdpDefaultReduction, bucket):
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
    previous = thread.source
    thread.source = "ddp"
    try:
        work = dist.distributed_c10d.all_reduce(buffer, group=state.process_group, async_op=True)
    finally:
        thread.source = previous
    # A Python hook must return a future of a Python value; PyTorch's Future.then rewrites an
    # error of the all-reduce as "Got the following error when running the callback", which is
    # the cost of this option.
    return work.get_future().then(_first_value)
