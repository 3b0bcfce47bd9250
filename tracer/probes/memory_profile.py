"""What fills memory at its peak: torch's memory profiler over profiler windows 1, 2, 4, 8, ...
(--profile-memory), one MemoryProfileRecord each in rank{R}.memory.jsonl.

torch.profiler._memory_profiler sorts every tensor the profiler saw into parameters, gradients,
optimizer state, activations, temporaries and inputs, from the window's ops, their tensors'
identities and the Python tracer's view of nn.Module and optimizer calls. None of that is in the
exported Kineto trace (its `[memory]` events carry addresses and sizes, never which tensor), so
it is computed here, in the process, from the profile object at the window's end. It needs the
profiler's shapes, memory and Python stacks: --profile-memory turns on the Python stacks in the
windows (tracer.probes.profiler).

One change to torch's categories: where the Python tracer saw the modules' parameters, torch's
fall-back guess of further parameters from the data flow is left out. That guess takes tensors
that are read in the forward pass and updated from gradients for parameters, and over a window
of more than one step it takes Adam's `exp_avg_sq.sqrt()` temporaries for parameters as well
(33% more parameter bytes on a 3-layer MLP; docs/memory.md).
"""

from __future__ import annotations

import re
import time

from tracer import schema
from tracer.parts.record_files import JsonlWriter

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def open_memory_profile(setup):
    """Built by the memory entry's factory (tracer.probes.memory) when --profile-memory is on
    and the profiler is: the writer of rank{R}.memory.jsonl, listening to the profiler's
    windows."""
    path = setup.run_dir + "/" + schema.MEMORY_PROFILE_FILE.format(rank=setup.rank)
    try:
        part = MemoryProfileWriter(path, setup.rank, setup.use_cuda, setup.built,
                                   budget=setup.budget)
    except OSError as exc:
        setup.report(MemoryProfileWriter.name,
                     f"cannot create {path} ({exc.strerror or exc}); memory categories are off")
        return None
    return setup.add(part)


class MemoryProfileWriter(JsonlWriter):
    """Writes a MemoryProfileRecord at the end of profiler windows 1, 2, 4, 8, ... (the k-th
    window where k is a power of two), on the training thread, where torch.profiler hands its
    windows over. torch's memory profiler takes 0.04-0.15 s over 3 steps of a small MLP and
    about a second over 3 steps of workloads/ddp.py on a loaded 2-core machine
    (docs/benchmarks.md, --profile-memory): with windows back to back (--repeat 0) it would stall
    every one of them; this way its cost grows with the log of the windows, and the first and
    the latest windows analysed still show what grows."""

    name = "memory_profile"
    off_what = "memory categories are off"

    def __init__(self, path: str, rank: int, use_cuda: bool, built, budget=None):
        super().__init__(path, self.name, budget=budget)
        self.rank = rank
        self.use_cuda = use_cuda
        self._built = built
        self.windows = 0  # windows seen, analysed or not

    def start(self) -> None:
        profiler = self._built("profiler")
        if profiler is not None:
            profiler.window_listeners.append(self.on_window)

    def on_window(self, profile) -> None:
        """The profiler's window just ended and its trace is written (torch.profiler.profile)."""
        self.windows += 1
        if self.failed or self.windows & (self.windows - 1):  # not a power of two
            return
        try:
            record = window_record(profile, self.rank, self._device())
        except Exception as exc:
            self.fail(f"torch's memory profiler failed ({type(exc).__name__}: {exc}); "
                      f"{self.off_what}")
            return
        if record is not None:
            self.write(record, record.last_step)

    def _device(self) -> str:
        if self.use_cuda:
            import torch

            if torch.cuda.is_initialized():
                return f"cuda:{torch.cuda.current_device()}"
        return "cpu"


def memory_profile(profile):
    """torch's MemoryProfile of a finished window, with the one change the module's doc says."""
    from torch.profiler import _memory_profiler as torch_memory

    class ParametersSeen(torch_memory.MemoryProfile):
        def _set_parameters_using_data_flow(self) -> None:
            seen = any(category == torch_memory.Category.PARAMETER
                       for category in self._category_snapshot().values())
            if not seen:  # no Python tracer, or no module seen: torch's guess is all there is
                super()._set_parameters_using_data_flow()

    return ParametersSeen(profile.profiler.kineto_results)


# torch's categories by name; AUTOGRAD_DETAIL and tensors it could not place are "other".
_CATEGORY_NAMES = {"PARAMETER": "parameter", "GRADIENT": "gradient",
                   "OPTIMIZER_STATE": "optimizer_state", "ACTIVATION": "activation",
                   "TEMPORARY": "temporary", "INPUT": "input"}


def category_name(category) -> str:
    """One of schema.MEMORY_CATEGORIES for a torch Category (or None)."""
    return _CATEGORY_NAMES.get(getattr(category, "name", ""), schema.MEMORY_OTHER)


def peak_of_timeline(timeline, category_of, device) -> tuple[int, int, dict[str, int]]:
    """(peak bytes, its time in the profiler's ns, bytes per category then) over torch's
    memory timeline of `device`: (t, action, (key, version), bytes >= 0) in time order, as
    MemoryProfile.timeline gives it (torch's MemoryProfileTimeline adds it up the same way);
    `category_of(key, version)` names a tensor's category."""
    from torch.profiler._memory_profiler import Action

    sizes = dict.fromkeys(schema.MEMORY_CATEGORIES, 0)
    total, peak, peak_t, at_peak = 0, -1, 0, dict(sizes)
    for t, action, (key, version), nbytes in timeline:
        if key.device != device:
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            sizes[category_of(key, version)] += nbytes
            total += nbytes
        elif action == Action.INCREMENT_VERSION:
            sizes[category_of(key, version)] -= nbytes
            sizes[category_of(key, version + 1)] += nbytes
        elif action == Action.DESTROY:
            sizes[category_of(key, version)] -= nbytes
            total -= nbytes
        if total > peak:
            peak, peak_t, at_peak = total, t, dict(sizes)
    return max(peak, 0), peak_t, at_peak


def window_record(profile, rank: int, device: str) -> schema.MemoryProfileRecord | None:
    """The MemoryProfileRecord of one finished window; None when it saw no step."""
    import torch
    from torch.profiler._memory_profiler import TensorKey

    profiled = memory_profile(profile)
    steps = [(int(m[1]), event.start_time_ns, event.end_time_ns)
             for event in profiled._op_tree.sorted_nodes
             if (m := _PROFILER_STEP.match(event.name))]
    if not steps:
        return None
    categories = profiled._categories

    def category_of(key, version) -> str:
        return category_name(categories.get(key, version) if isinstance(key, TensorKey)
                             else None)

    peak, peak_t, at_peak = peak_of_timeline(profiled.timeline, category_of,
                                             torch.device(device))
    peak_step = next((step for step, start, end in steps if start <= peak_t <= end), None)
    return schema.MemoryProfileRecord(
        rank=rank, t_ns=time.time_ns(), device=device, first_step=min(s[0] for s in steps),
        last_step=max(s[0] for s in steps), peak_step=peak_step, peak_bytes=peak,
        categories=at_peak)
