"""Notices the processes a script starts with torch.multiprocessing.spawn or start_processes.

Those processes (each usually one rank of a job the script launches itself) run a function of
the script in a fresh interpreter, or a fork, where the tracer does not run: they are not
traced. Tracing them would need a tracer session per child, a rank numbering of their own and an
agreement on the run folder outside torchrun; instead the tracer says so, once, when it happens,
and counts them in `run_end.untraced_processes`. Launching the ranks with
`torchrun -m tracer.record` traces every one of them.

`torch.multiprocessing.spawn` calls `start_processes` through its module's globals, so wrapping
`start_processes` in `torch.multiprocessing.spawn` and in `torch.multiprocessing` (which imported
it by name) sees both entry points. Compiled code never starts processes, so this wrapper is out
of its reach.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Callable

from tracer.parts.log import say
from tracer.parts.part import Part

_MODULES = ("torch.multiprocessing.spawn", "torch.multiprocessing")


def open_spawn_watch(setup):
    """The registry's factory of the spawn watch (a tracer.session.part_registry.PartSetup)."""
    return setup.build(SpawnWatch, _say_untraced)


def _say_untraced(nprocs: int, start_method: str) -> None:
    say(f"torch.multiprocessing started {nprocs} process(es) (start method {start_method}); "
        f"they are not traced, only this process is: launch the ranks with torchrun -m "
        f"tracer.record to trace each one")


class SpawnWatch(Part):
    name = "spawn_watch"

    def __init__(self, on_start: Callable[[int, str], None]):
        """`on_start(nprocs, start_method)` is called before the processes start."""
        self.on_start = on_start
        self.processes = 0
        self._patches: list[tuple[types.ModuleType, object]] = []

    def start(self) -> None:
        # `import torch.multiprocessing.spawn as m` would give the function of that name.
        spawn_module = importlib.import_module("torch.multiprocessing.spawn")
        original = spawn_module.start_processes
        watch = self

        @functools.wraps(original)
        def start_processes(fn, args=(), nprocs=1, join=True, daemon=False,
                            start_method="spawn"):
            watch._started(nprocs, start_method)
            return original(fn, args, nprocs, join, daemon, start_method)

        for name in _MODULES:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "start_processes", None) is original:
                module.start_processes = start_processes
                self._patches.append((module, original))

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        self.close()

    def run_end_fields(self) -> dict:
        return {"untraced_processes": self.processes}

    def close(self) -> None:
        for module, original in reversed(self._patches):
            module.start_processes = original
        self._patches.clear()

    def _started(self, nprocs, start_method) -> None:
        try:
            count = int(nprocs)
            self.processes += count
            self.on_start(count, str(start_method))
        except Exception:
            pass  # a note about the script must never stop it from starting its processes
