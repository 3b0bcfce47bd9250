"""Notices the processes a script starts itself, and hands those that are ranks to the launcher.

Three ways in, each caught at the one function every path goes through:

* `torch.multiprocessing.spawn` and `start_processes` (PyTorch's DDP tutorial), and
  `elastic_launch` with a function (torchelastic's agent starts its workers through
  `start_processes` too): `start_processes`, wrapped in `torch.multiprocessing.spawn` and in
  `torch.multiprocessing`, which imported it by name (`spawn` calls it through its module's
  globals, torchelastic through `torch.multiprocessing`). The launcher
  (tracer.session.launcher) gives the function each process runs, wrapped so that each starts
  its own session; or says why they cannot be traced, which is said here in one line.
* `multiprocessing.Process.start` (`BaseProcess.start`, which every start method's Process
  inherits): a process whose code is the script's own (not the standard library's, torch's or
  an installed package's: not a DataLoader worker, a Pool's or an executor's) is handed to the
  launcher, which traces it as a rank if it calls init_process_group. Every process about to
  start is shown to the launcher, which keeps the ranks it starts (to pass SIGTERM on).
* `elastic_launch` with a command (`torch.distributed.launcher.api.launch_agent`, wrapped as
  that module is imported): its workers are new programs, which nothing here reaches; said in
  one line, with what to do.

Only the process that started the watch acts; in a forked child the wrappers call through.
Compiled code never starts processes, so these wrappers are out of its reach. While a wrapped
start runs, the tracer's own folder is on sys.path (appended, if it is not there), so that a
child that unpickles the wrapped function finds it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import os
import sys
import sysconfig
import types
from collections.abc import Callable

import tracer
from tracer.parts.log import say
from tracer.parts.part import Part

_MODULES = ("torch.multiprocessing.spawn", "torch.multiprocessing")
LAUNCHER_API = "torch.distributed.launcher.api"
TRACER_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tracer.__file__)))
_TRACER_DIR = os.path.dirname(os.path.abspath(tracer.__file__)) + os.sep
# Code under these folders is not the script's own: its processes are not ranks to trace.
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in (
    "stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_paths().get(key))}))
UNTRACED_WHY = ("this process is a rank that the script's own launch started: processes it "
                "starts in turn are not traced (start every rank from the first process)")


def open_spawn_watch(setup):
    """The registry's factory of the spawn watch (a tracer.session.part_registry.PartSetup)."""
    return setup.build(SpawnWatch, setup.launcher)


def say_untraced(what: str, why: str) -> None:
    say(f"{what}; they are not traced: {why}")


class SpawnWatch(Part):
    name = "spawn_watch"

    def __init__(self, launcher, on_untraced: Callable[[str, str], None] = say_untraced):
        """`launcher`: tracer.session.launcher.Launcher, or None (nothing is traced: a rank that
        was itself started so); `on_untraced(what, why)` says that processes are not
        traced."""
        self.launcher = launcher
        self.on_untraced = on_untraced
        self.processes = 0  # processes not traced that are known to be ranks
        self.pid = os.getpid()
        self._patches: list[tuple[object, str, object]] = []
        self._import_hook: _AfterImport | None = None

    def start(self) -> None:
        # `import torch.multiprocessing.spawn as m` would give the function of that name.
        spawn_module = importlib.import_module("torch.multiprocessing.spawn")
        original = spawn_module.start_processes
        wrapped = self._start_processes_wrapper(original)
        for name in _MODULES:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "start_processes", None) is original:
                self._patch(module, "start_processes", wrapped)
        import multiprocessing.process

        base = multiprocessing.process.BaseProcess
        self._patch(base, "start", self._process_start_wrapper(base.start))
        if LAUNCHER_API in sys.modules:
            self._wrap_launch_agent(sys.modules[LAUNCHER_API])
        else:
            self._import_hook = _AfterImport(LAUNCHER_API, self._wrap_launch_agent)
            sys.meta_path.insert(0, self._import_hook)

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        self.close()

    def run_end_fields(self) -> dict:
        return {"untraced_processes": self.processes}

    def close(self) -> None:
        if self._import_hook is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self._import_hook)
            self._import_hook = None
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()

    def _patch(self, owner, name: str, wrapper) -> None:
        self._patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    # ---- the wrappers ----------------------------------------------------------------------
    def _start_processes_wrapper(self, original):
        watch = self

        @functools.wraps(original)
        def start_processes(fn, args=(), nprocs=1, join=True, daemon=False,
                            start_method="spawn"):
            if os.getpid() != watch.pid:
                return original(fn, args, nprocs, join, daemon, start_method)
            traced = watch._ranks(fn, args, nprocs, start_method)
            with tracer_importable() if traced is not fn else contextlib.nullcontext():
                return original(traced, args, nprocs, join, daemon, start_method)

        return start_processes

    def _process_start_wrapper(self, original):
        watch = self

        @functools.wraps(original)
        def start(process):
            if os.getpid() != watch.pid or watch.launcher is None:
                return original(process)
            undo = watch._starting(process)
            try:
                with tracer_importable() if undo is not None else contextlib.nullcontext():
                    return original(process)
            finally:
                if undo is not None:
                    undo()

        return start

    def _wrap_launch_agent(self, module) -> None:
        original = getattr(module, "launch_agent", None)
        if original is None:
            return
        watch = self

        @functools.wraps(original)
        def launch_agent(config, entrypoint, args, *rest, **kwargs):
            if os.getpid() == watch.pid and isinstance(entrypoint, str):
                watch._command(config, entrypoint, args)
            return original(config, entrypoint, args, *rest, **kwargs)

        self._patch(module, "launch_agent", launch_agent)

    # ---- what each wrapper asks the launcher; never stops the script's call ------------------
    def _ranks(self, fn, args, nprocs, start_method):
        """The function the processes are to run: `fn` wrapped by the launcher, or `fn`."""
        what = f"torch.multiprocessing started {nprocs} process(es) (start method {start_method})"
        try:
            count = int(nprocs)
            if self.launcher is None:
                traced, why = fn, UNTRACED_WHY
            else:
                traced, why = self.launcher.ranks(fn, args, count, str(start_method))
            if why is not None:
                self.processes += count
                self.on_untraced(what, why)
            return traced
        except Exception as exc:  # a note about the script must never stop its processes
            self.fail(f"{type(exc).__name__}: {exc}; processes it starts are not traced")
            return fn

    def _starting(self, process):
        """The launcher's undo of what it did to `process`, about to start (before its start,
        which drops its target and arguments), or None."""
        try:
            return self.launcher.starting(process, is_scripts_own(process))
        except Exception as exc:
            self.fail(f"{type(exc).__name__}: {exc}; processes it starts are not traced")
            return None

    def _command(self, config, entrypoint: str, args) -> None:
        try:
            count = int(getattr(config, "nproc_per_node", 1))
            self.processes += count
            command = " ".join([entrypoint, *map(str, args)])
            self.on_untraced(
                f"elastic_launch started {count} worker(s) as the command {command!r}",
                "a command is a new program: make it `python -m tracer.record SCRIPT ...` (or "
                "give elastic_launch a function), and each worker records as under torchrun")
        except Exception:
            pass


def is_scripts_own(process) -> bool:
    """Whether the code `process` runs is the script's own, not the standard library's, torch's,
    the tracer's or an installed package's (a DataLoader worker, a Pool's, an executor's)."""
    target = getattr(process, "_target", None)
    if target is None:
        run = type(process).run
        import multiprocessing.process

        if run is multiprocessing.process.BaseProcess.run:
            return False
        target = run
    while isinstance(target, functools.partial):
        target = target.func
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if not isinstance(code, types.CodeType):
        return False
    path = os.path.abspath(code.co_filename)
    return not path.startswith(_LIBRARY_DIRS) and not path.startswith(_TRACER_DIR)


@contextlib.contextmanager
def tracer_importable():
    """The tracer's folder on sys.path (at its end, if it is not there already) while a child
    is started, which reads sys.path as it is then (spawn, forkserver)."""
    if any(os.path.abspath(entry or os.curdir) == TRACER_ROOT for entry in sys.path):
        yield
        return
    sys.path.append(TRACER_ROOT)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(TRACER_ROOT)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` once the module `name` has been imported, then leaves sys.meta_path:
    the finder and loader that would load it still do, unchanged."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]):
        self.name = name
        self.then = then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        def exec_and_then(module):
            exec_module(module)
            with contextlib.suppress(AttributeError):
                del loader.exec_module  # the loader's own method again
            try:
                then(module)
            except Exception:
                pass  # the note about commands is a nicety; the import stands

        loader.exec_module = exec_and_then
        return spec
