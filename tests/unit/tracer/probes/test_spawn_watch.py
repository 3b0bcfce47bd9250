"""The spawn watch (tracer.probes.spawn_watch): the processes torch.multiprocessing.spawn and
start_processes start are handed to the launcher, which gives the function they run or says why
they are not traced (one line, counted); a multiprocessing.Process is shown to the launcher before
it starts, with whether it runs the script's own code; elastic_launch's commands are said
untraced; the script's calls go through as they were made, and closing puts torch's very
functions back."""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.pool
import multiprocessing.process
import os
import sys
import types

import pytest
import torch.multiprocessing as mp
from torch.utils.data._utils.worker import _worker_loop

from tracer.probes import spawn_watch
from tracer.probes.spawn_watch import TRACER_ROOT, SpawnWatch, is_scripts_own

SPAWN_MODULE = sys.modules["torch.multiprocessing.spawn"]
BASE_START = multiprocessing.process.BaseProcess.start


class Launcher:
    """A launcher that notes what it is asked; `why` (None: it traces them) and `wrapped` are
    its answers."""

    def __init__(self, why=None):
        self.why = why
        self.asked = []
        self.starting_seen = []
        self.undone = []

    def ranks(self, fn, args, nprocs, start_method):
        self.asked.append((fn, args, nprocs, start_method))
        if self.why is not None:
            return fn, self.why
        return functools.partial(fn, "wrapped"), None

    def starting(self, process, scripts_own):
        self.starting_seen.append((process._target, scripts_own))
        return (lambda: self.undone.append(process)) if scripts_own else None


@pytest.fixture
def torch_start(monkeypatch):
    """A torch whose start_processes starts nothing but notes its arguments (`calls`)."""
    calls = []

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        calls.append((fn, args, nprocs, join, daemon, start_method))
        return "the context"

    monkeypatch.setattr(SPAWN_MODULE, "start_processes", start_processes)
    monkeypatch.setattr(mp, "start_processes", start_processes)
    return start_processes, calls


@pytest.fixture
def watching(torch_start, request):
    """start(launcher): a started watch over `torch_start`, noting what it says (`told`), and
    closed when the test ends."""
    def start(launcher):
        told = []
        watch = SpawnWatch(launcher, lambda what, why: told.append((what, why)))
        watch.start()
        request.addfinalizer(watch.close)
        return watch, told

    return start


def work(rank):
    pass


def test_the_processes_run_the_launchers_function_with_the_scripts_arguments(watching,
                                                                             torch_start):
    _, calls = torch_start
    launcher = Launcher()
    watch, told = watching(launcher)
    assert mp.spawn(work, args=(1,), nprocs=3, join=False) == "the context"
    assert mp.start_processes(work, (), 2, True, True, "fork") == "the context"
    assert launcher.asked == [(work, (1,), 3, "spawn"), (work, (), 2, "fork")]
    assert [call[1:] for call in calls] == [((1,), 3, False, False, "spawn"),
                                           ((), 2, True, True, "fork")]
    assert all(call[0].func is work and call[0].args == ("wrapped",) for call in calls)
    assert told == [] and watch.run_end_fields() == {"untraced_processes": 0}


def test_processes_the_launcher_refuses_are_said_once_and_counted_and_start_unchanged(
        watching, torch_start):
    _, calls = torch_start
    watch, told = watching(Launcher(why="this process is rank 1 of 2 under torchrun"))
    mp.spawn(work, nprocs=2, join=False)
    assert calls == [(work, (), 2, False, False, "spawn")]
    assert told == [("torch.multiprocessing started 2 process(es) (start method spawn)",
                     "this process is rank 1 of 2 under torchrun")]
    assert watch.run_end_fields() == {"untraced_processes": 2}


def test_without_a_launcher_the_processes_are_not_traced_and_the_line_says_why(watching,
                                                                              torch_start):
    _, calls = torch_start
    watch, told = watching(None)
    mp.spawn(work, nprocs=1, join=False)
    assert calls == [(work, (), 1, False, False, "spawn")]
    assert told == [("torch.multiprocessing started 1 process(es) (start method spawn)",
                     spawn_watch.UNTRACED_WHY)]


def test_a_failing_launcher_never_stops_the_processes_from_starting(watching, torch_start,
                                                                     capsys):
    _, calls = torch_start

    class Broken(Launcher):
        def ranks(self, fn, args, nprocs, start_method):
            raise RuntimeError("broken")

    watch, _ = watching(Broken())
    mp.spawn(work, nprocs=2, join=False)
    assert calls == [(work, (), 2, False, False, "spawn")]
    assert watch.failed
    assert "spawn_watch: RuntimeError: broken; processes it starts are not traced" in (
        capsys.readouterr().err)


def test_closing_puts_torchs_and_multiprocessings_very_functions_back(watching, torch_start):
    original, _ = torch_start
    watch, _ = watching(Launcher())
    assert mp.start_processes is not original and SPAWN_MODULE.start_processes is mp.start_processes
    assert mp.start_processes.__wrapped__ is original
    assert multiprocessing.process.BaseProcess.start is not BASE_START
    watch.close()
    assert mp.start_processes is original and SPAWN_MODULE.start_processes is original
    assert multiprocessing.process.BaseProcess.start is BASE_START


def test_in_a_forked_child_the_wrappers_call_straight_through(watching, torch_start):
    _, calls = torch_start
    launcher = Launcher()
    watch, _ = watching(launcher)
    watch.pid = os.getpid() + 1  # as the wrappers see it in a forked child
    mp.spawn(work, nprocs=2, join=False)
    assert launcher.asked == [] and calls == [(work, (), 2, False, False, "spawn")]


def test_a_process_is_shown_to_the_launcher_before_it_starts_and_undone_after(monkeypatch):
    launcher = Launcher()
    started = []
    monkeypatch.setattr(spawn_watch, "TRACER_ROOT", "/nowhere/tracer-root")

    def fake_start(process):  # stands in for the real start under the wrapper
        started.append((process._target, "/nowhere/tracer-root" in sys.path))

    process = multiprocessing.get_context("spawn").Process(target=work, args=(0,))
    own = SpawnWatch(launcher)._process_start_wrapper(fake_start)
    own(process)
    assert launcher.starting_seen == [(work, True)]
    assert started == [(work, True)]  # the tracer's folder on sys.path while it started
    assert launcher.undone == [process] and "/nowhere/tracer-root" not in sys.path


def test_only_the_scripts_own_code_is_its_own():
    context = multiprocessing.get_context("spawn")

    class Worker(context.Process):
        def run(self):
            pass

    assert is_scripts_own(context.Process(target=work))
    assert is_scripts_own(context.Process(target=functools.partial(work, 1)))
    assert is_scripts_own(Worker())
    assert not is_scripts_own(context.Process())  # no target, run() not overridden
    assert not is_scripts_own(context.Process(target=_worker_loop))  # a DataLoader worker
    assert not is_scripts_own(context.Process(target=multiprocessing.pool.worker))
    assert not is_scripts_own(context.Process(target=print))  # no Python code at all


def test_elastic_launch_of_a_command_is_said_untraced_with_what_to_do(watching):
    watch, told = watching(Launcher())
    calls = []
    module = types.ModuleType("fake_launcher_api")
    module.launch_agent = lambda config, entrypoint, args: calls.append(entrypoint) or {0: None}
    watch._wrap_launch_agent(module)
    config = types.SimpleNamespace(nproc_per_node=2)
    assert module.launch_agent(config, sys.executable, ["train.py", "--steps", "3"]) == {0: None}
    assert module.launch_agent(config, work, []) == {0: None}  # a function: through start_processes
    assert calls == [sys.executable, work]
    (what, why), = told
    assert what == (f"elastic_launch started 2 worker(s) as the command "
                    f"'{sys.executable} train.py --steps 3'")
    assert "`python -m tracer.record SCRIPT ...`" in why
    assert watch.run_end_fields() == {"untraced_processes": 2}
    watch.close()
    assert module.launch_agent is not None and module.launch_agent.__name__ == "<lambda>"


def test_the_launcher_api_is_wrapped_as_it_is_imported_and_the_import_is_unchanged(
        tmp_path, monkeypatch):
    (tmp_path / "late_module_for_the_hook.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = spawn_watch._AfterImport("late_module_for_the_hook", seen.append)
    sys.meta_path.insert(0, hook)
    try:
        import late_module_for_the_hook as module
    finally:
        sys.modules.pop("late_module_for_the_hook", None)
    assert seen == [module] and module.VALUE == 42
    assert hook not in sys.meta_path  # it left once the module came
    assert "exec_module" not in vars(module.__spec__.loader)  # the loader's own method again


def test_the_tracers_folder_is_on_sys_path_only_while_a_child_starts(monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if os.path.abspath(p or os.curdir) != TRACER_ROOT])
    before = list(sys.path)
    with spawn_watch.tracer_importable():
        assert sys.path == [*before, TRACER_ROOT]
    assert sys.path == before
    monkeypatch.setattr(sys, "path", [TRACER_ROOT, *before])
    with spawn_watch.tracer_importable():
        assert sys.path == [TRACER_ROOT, *before]
