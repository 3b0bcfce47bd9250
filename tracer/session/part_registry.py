"""The tracer's parts, in the one list the session goes by: their names, the option that switches
each off, how each is built, and when each starts and stops.

The session builds the parts in REGISTRY's order and calls their hooks (tracer.parts.part.Part)
in that order; it starts them in `start_order` and stops them in `close_order`, then closes every
file in REGISTRY's order. A part is one entry here, its own module (the part, and the factory that
builds it from a PartSetup), its option in tracer.options.config and its fields in tracer.schema.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from tracer.options.config import TracerConfig
from tracer.parts.buffered_file import RecordBudget
from tracer.parts.part import Part
from tracer.session.run_folder import LaunchInfo


@dataclass(frozen=True)
class PartEntry:
    name: str  # labels the line and manifest error of a part that cannot be built
    # "module:function", imported only when the part is on, so that a missing dependency
    # (tensorboard, a torch without distributed) switches off only this part; or the function.
    # It gets a PartSetup and returns the part that `Session.in_use(name)` finds, or None.
    build: str | Callable[[PartSetup], Part | None]
    off_option: str | None = None  # the TracerConfig field that switches it off
    # Parts start in start_order before run_start is written, except those that start last,
    # after it and after the step-end worker, so that setting up the rest is not in the first
    # profiler window. None: after those that have one, in REGISTRY's order (a part with
    # nothing to start is not called).
    start_order: int | None = None
    starts_last: bool = False
    # Parts that observe the script stop (`on_script_end`) in close_order before the last
    # records are written; None as for start_order (a file has nothing to stop: it closes
    # after the last records).
    close_order: int | None = None

    def is_on(self, config: TracerConfig) -> bool:
        return self.off_option is None or not getattr(config, self.off_option)


REGISTRY: list[PartEntry] = [
    PartEntry("steps", "tracer.steps.steps_file:open_steps_file"),
    PartEntry("comms", "tracer.comms:open_comms", off_option="no_comms", start_order=2,
              close_order=4),
    # After comms, which it needs; its last drain comes before comms closes the issued file.
    PartEntry("flight", "tracer.comms.flight:open_flight", off_option="no_flight_recorder",
              close_order=3),
    PartEntry("sampler", "tracer.probes.device_sampler:open_sampler", off_option="no_sampler",
              start_order=4, close_order=5),
    PartEntry("scalars", "tracer.parts.tensorboard_scalars:open_scalars",
              off_option="no_scalars"),
    PartEntry("memory", "tracer.probes.memory:open_step_memory"),
    PartEntry("memory_snapshot", "tracer.probes.memory:open_snapshots", start_order=5),
    PartEntry("profiler", "tracer.probes.profiler:open_profiler", off_option="no_profiler",
              start_order=6, starts_last=True, close_order=1),
    PartEntry("spawn_watch", "tracer.probes.spawn_watch:open_spawn_watch", start_order=3,
              close_order=2),
    # Last, after run_start: a session that opens once the script's process group exists (a
    # rank traced from its init_process_group on) measures the clock offset as it starts.
    PartEntry("clock", "tracer.probes.clock_sync:open_clock_sync", start_order=1,
              starts_last=True, close_order=6),
    PartEntry("peak", "tracer.probes.peak_tflops:open_peak"),
]


def register(entry: PartEntry) -> PartEntry:
    """Add a part after the others (a part that lives outside the tracer, a test's)."""
    if any(e.name == entry.name for e in REGISTRY):
        raise ValueError(f"a tracer part named {entry.name!r} is registered already")
    REGISTRY.append(entry)
    return entry


def factory(entry: PartEntry) -> tuple[Callable | None, str | None]:
    """(the entry's factory, None) or (None, why it cannot be imported)."""
    if callable(entry.build):
        return entry.build, None
    module, _, name = entry.build.partition(":")
    try:
        return getattr(importlib.import_module(module), name), None
    except Exception as exc:
        return None, f"{module} unavailable ({type(exc).__name__}: {exc}); this part is off"


@dataclass
class PartSetup:
    """What an entry's factory builds its part from: the run, and the session's ways to add a
    part and to report one that cannot be built (the factory goes on without it)."""

    entry: PartEntry
    config: TracerConfig
    launch: LaunchInfo
    run_dir: str
    use_cuda: bool
    budget: RecordBudget | None  # --max-record-mb, shared by the record files
    current_step: Callable[[], int]
    track_step_ends: Callable[[], object]  # tracer.steps.step_clock.StepClock.track_ends
    write_manifest: Callable[[object], None]
    add: Callable[[Part], Part | None]  # None: it failed while being built
    report: Callable[[str, str], None]  # (part name, message): one line and a manifest error
    built: Callable[[str], Part | None] = lambda name: None  # a part built before, in use
    # The ranks the script starts itself go to it (tracer.session.launcher.Launcher); None:
    # they are not traced (a rank of several, a rank that was itself started so).
    launcher: object | None = None
    # (rank, world_size) each time the script's init_process_group returns (the clock sync).
    group_joined: Callable[[int, int], None] = lambda rank, world_size: None

    @property
    def rank(self) -> int:
        return self.launch.rank

    def build(self, cls, *args, **kwargs):
        """The part `cls(*args, **kwargs)`, or None after reporting why it could not be built."""
        name = self.entry.name
        try:
            part = cls(*args, **kwargs)
        except Exception as exc:
            self.report(name, f"{type(exc).__name__}: {exc}; {name} is off")
            return None
        return self.add(part)

    def open_writer(self, pattern: str, writer_class, *args):
        """A record file `pattern` (a tracer.schema file name) of this rank in the run folder,
        or None after reporting that it cannot be created."""
        name = self.entry.name
        path = os.path.join(self.run_dir, pattern.format(rank=self.rank))
        try:
            return self.add(writer_class(path, name, *args, budget=self.budget))
        except OSError as exc:
            self.report(name, f"cannot create {path} ({exc.strerror or exc}); {name} is off")
            return None
