"""Wrappers of torch.distributed._functional_collectives' Python functions (DTensor, TP) and of
its wait_tensor. The torch.ops._c10d_functional ops are never replaced: compiled graphs and
Inductor's lowerings hold them, and a replaced op namespace changes what Inductor generates."""

from __future__ import annotations

import functools

import torch

from tracer.comms.patching import argument, in_compiled_code, parameter_positions, recording_wrapper
from tracer.comms.timing import tensor_bytes

# function -> (CommRecord.op, whether the payload is gathered from every rank of the group, so
# S = n * input). The deprecated aliases (all_gather_tensor, reduce_scatter_tensor,
# *_tensor_coalesced) call these through the module, so they are recorded without being
# wrapped, and their FutureWarning still points at the caller.
FUNCTIONAL_SPECS = {
    "all_reduce": ("all_reduce", False),
    "all_reduce_coalesced": ("all_reduce", False),
    "broadcast": ("broadcast", False),
    "all_gather_single": ("all_gather", True),
    "all_gather_single_coalesced": ("all_gather", True),
    "reduce_scatter_single": ("reduce_scatter", False),
    "reduce_scatter_single_coalesced": ("reduce_scatter", False),
    "all_to_all_single": ("all_to_all", False),
}


class FunctionalHooks:
    def __init__(self, recorder):
        self.recorder = recorder
        self.timing = recorder.timing
        self.compiled_collectives = 0  # traced into torch.compile graphs, never recorded
        self._pg_name_sizes: dict[str, int] = {}
        self._are_we_tracing = lambda: False
        self._resolve_group_name = lambda group, tag: group

    def install(self, patches) -> None:
        import torch.distributed._functional_collectives as funcol
        self._are_we_tracing = funcol._are_we_tracing
        self._resolve_group_name = funcol._resolve_group_name
        pairs = []
        for name, spec in FUNCTIONAL_SPECS.items():
            original = getattr(funcol, name, None)
            if original is None:
                continue
            positions = parameter_positions(original)
            if "group" not in positions:
                continue  # a torch whose signature differs: leave that function alone
            pairs.append((original, self._wrapper(name, original, positions, spec)))
        pairs.append((funcol.wait_tensor, self._wait_tensor_wrapper(funcol.wait_tensor)))
        for original, wrapper in pairs:
            functools.update_wrapper(wrapper, original)
        # DTensor looks them up on the module (funcol.all_reduce); some modules import them by name.
        patches.replace_everywhere(pairs)

    def _group(self, group_name):
        if not isinstance(group_name, str):
            group_name = group_name.group_name
        size = self._pg_name_sizes.get(group_name)
        if size is None:
            import torch.distributed as dist
            size = dist.distributed_c10d._get_group_size_by_name(group_name)
            self._pg_name_sizes[group_name] = size
        return group_name, size

    def _wrapper(self, name, original, positions, spec):
        op, gathered = spec
        hooks, recorder, timing = self, self.recorder, self.timing

        def describe(args, kwargs):
            if torch.compiler.is_compiling() or hooks._are_we_tracing():
                # AOTAutograd/make_fx runs this Python for real while it builds a compiled graph
                # (DTensor's redistribution under torch.compile): counted, never recorded.
                hooks.compiled_collectives += 1
                return None
            inputs = args[0] if args else kwargs.get("self", kwargs.get("inputs"))
            tensors = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
            if not tensors or tensors[0].device.type == "meta":
                return None  # fake or meta tensors (sharding propagation) move no data
            group = argument(args, kwargs, positions, "group")
            tag = argument(args, kwargs, positions, "tag", "")
            pg_name, pg_size = hooks._group(hooks._resolve_group_name(group, tag))
            nbytes = sum(tensor_bytes(t) for t in tensors) * (pg_size if gathered else 1)
            return timing.begin(op, "functional", pg_name, pg_size, tensors[0], nbytes, True, None)

        def complete(pending, result):
            timing.issued(pending)
            results = result if isinstance(result, (list, tuple)) else (result,)
            waiting = [getattr(r, "elem", None) for r in results
                       if not getattr(r, "completed", True)]  # AsyncCollectiveTensor, not waited
            if waiting and all(w is not None for w in waiting):
                timing.await_functional(pending, waiting)
            else:
                timing.complete_now(pending)  # the function waited before returning

        return recording_wrapper(recorder, f"_functional_collectives.{name}", original, describe,
                                 complete)

    def _wait_tensor_wrapper(self, original):
        recorder, timing = self.recorder, self.timing

        def wait_tensor(tensor):
            if in_compiled_code():
                return original(tensor)
            result = original(tensor)
            if timing.functional_pending:
                try:
                    timing.functional_waited(tensor)
                except Exception as exc:
                    recorder.fail("recording _functional_collectives.wait_tensor", exc)
            return result

        return wait_tensor
