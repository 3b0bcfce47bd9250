"""The process that starts the ranks itself: `mp.spawn(demo_basic, nprocs=world_size)` under
`python -m tracer.record` (docs/tracer.md, Ranks the script starts itself).

When the script first starts ranks (tracer.probes.spawn_watch hands them here), this process
stops being rank 0: its session, which has recorded nothing yet, retires (its files go), and it
becomes the launcher of the run. The run folder its session made is the first launch's; every
later launch gets one of its own, `<first>-launch<N>`, or `<first>-attempt<N>` for
torchelastic's restart N. In each it writes `launcher.manifest.jsonl` (schema.LAUNCHER_FILE):
one `launch` record per launch, then `launch_end`, how its script ended. The ranks trace
themselves (tracer.session.launched). On SIGTERM it passes the signal on to its ranks and waits
for them to record how they stopped, as torchrun's agent does, then dies by it. If the launcher
later joins a process group itself, it is traced as the rank the group makes it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass

from tracer import schema
from tracer.parts.record_files import JsonlWriter
from tracer.probes.spawn_watch import TRACER_ROOT, SpawnWatch
from tracer.session.launched import (
    LaunchedRank,
    LaunchSpec,
    SpawnedRank,
    arm_process,
    is_elastic_worker,
)
from tracer.session.manifest import host_name
from tracer.session.run_folder import create_unique
from tracer.session.script_end import ScriptOutcome, say_lines

TORCH_MP, ELASTIC, PROCESS = schema.LAUNCHERS
RANKS_WAIT_S = 3.0  # after passing SIGTERM on: within the launcher's own SIGTERM deadline
LAUNCHER_LABEL = "launcher"  # what its lines on stderr name it


@dataclass
class _Launch:
    """One launch's run folder, and what was started into it."""

    run_dir: str
    launcher: str
    start_method: str
    writer: JsonlWriter
    processes: int = 0


class Launcher:
    """This process as the launcher of the ranks its script starts (the module's doc)."""

    def __init__(self, session):
        """`session`: tracer.session.rank_session.Session, this process's own."""
        self.session = session
        self.launches: list[_Launch] = []
        self.children: list = []  # the rank processes started, to pass SIGTERM on to
        self.own: LaunchedRank | None = None  # this process, once it joins a group itself
        self.watch: SpawnWatch | None = None
        self.summary: str | None = None
        self._end_lock = threading.Lock()
        self._ended = threading.Event()
        self._ending = False

    @property
    def active(self) -> bool:
        return bool(self.launches)

    # ---- what the spawn watch asks ---------------------------------------------------------
    def ranks(self, fn, args, nprocs: int, start_method: str):
        """(the function to start the processes with, None), or (`fn`, why they cannot be
        traced)."""
        why = self._why_untraced(start_method)
        if why is not None:
            return fn, why
        launcher = ELASTIC if is_elastic_worker(fn) else TORCH_MP
        attempt = _elastic_attempt(args) if launcher == ELASTIC else 0
        launch = self._new_launch(launcher, start_method, attempt)
        self._note(launch, nprocs, attempt)
        return SpawnedRank(fn, self._spec(launch, nprocs)), None

    def starting(self, process, scripts_own: bool):
        """Any process this one is about to start: kept if it is one of the ranks; armed if it
        runs the script's own code (`scripts_own`) and can be traced, then the undo of that is
        returned (None otherwise; such a process may be no rank at all, so nothing is said)."""
        target_args = getattr(process, "_args", ())
        if target_args and isinstance(target_args[0], SpawnedRank):
            self.children.append(process)
            return None
        if not scripts_own:
            return None
        start_method = _start_method(process)
        if self._why_untraced(start_method) is not None:
            return None
        launch = self.launches[-1] if self.launches else None
        if launch is None or launch.launcher != PROCESS:
            launch = self._new_launch(PROCESS, start_method, 0)
        self._note(launch, 1, 0)
        self.children.append(process)
        return arm_process(process, self._spec(launch, 1), start_method)

    def _why_untraced(self, start_method: str) -> str | None:
        session = self.session
        launch = session.launch
        if launch.world_size > 1:
            return (f"this process is rank {launch.rank} of {launch.world_size} under torchrun, "
                    f"and ranks it started would be numbered as torchrun's: launch every rank "
                    f"with torchrun -m tracer.record instead")
        if self.own is not None and self.own.session is not None:
            return (f"this process is traced as rank {self.own.session.rank} itself since it "
                    f"joined a process group: start the ranks before it does")
        if not self.active and session.recorded_so_far():
            return (f"this process traced training of its own first ({session.clock.steps} "
                    f"step(s)): start the ranks before training, or launch every rank with "
                    f"torchrun -m tracer.record")
        if start_method == "forkserver" and _forkserver_misses_tracer():
            return ("the forkserver was started before the tracer could put itself on its "
                    "sys.path: install ranktrace, or put its folder on PYTHONPATH")
        return None

    # ---- launches ----------------------------------------------------------------------------
    def _new_launch(self, launcher: str, start_method: str, attempt: int) -> _Launch:
        first = not self.launches
        session = self.session
        if first:
            # As the session names it (so the ranks' lines show it alike), unless the script
            # has changed directory since: then the path that still leads there.
            run_dir = session.run_dir
            if os.path.abspath(run_dir) != session.run_path:
                run_dir = session.run_path
        else:
            head = self.launches[0].run_dir
            suffix = f"attempt{attempt}" if attempt else f"launch{len(self.launches) + 1}"
            if os.path.abspath(head) != session.run_path:  # the script changed directory
                head = session.run_path
            run_dir = create_unique(os.path.dirname(head), f"{os.path.basename(head)}-{suffix}")
        # Before the session retires: the folder is never empty from now on.
        launch = _Launch(run_dir, launcher, start_method, self._writer(run_dir))
        self.launches.append(launch)
        if first:
            self._retire_session()
        return launch

    def _writer(self, run_dir: str) -> JsonlWriter:
        return JsonlWriter(os.path.join(run_dir, schema.LAUNCHER_FILE), part="launcher")

    def _retire_session(self) -> None:
        """This process is no rank from now on; it traces itself again as the rank its own
        init_process_group makes it, if it calls one."""
        session = self.session
        run_dir = self.launches[0].run_dir
        session.retire()
        self.watch = SpawnWatch(self)
        self.watch.start()
        self.own = LaunchedRank(self._spec_for(run_dir, None, 1), watch_sigterm=False)
        self.own.arm()

    def _note(self, launch: _Launch, processes: int, attempt: int) -> None:
        launch.processes += processes
        session = self.session
        launch.writer.write(schema.Launch(
            schema_version=schema.SCHEMA_VERSION, run_name=os.path.basename(launch.run_dir),
            host=host_name(), pid=os.getpid(), t_ns=time.time_ns(), argv=self._argv(),
            script=session.script, script_args=list(session.script_args),
            config=asdict(session.config), launcher=launch.launcher,
            processes=processes, start_method=launch.start_method, attempt=attempt))
        launch.writer.flush()

    def _spec(self, launch: _Launch, nprocs: int) -> LaunchSpec:
        return self._spec_for(launch.run_dir, launch.launcher, nprocs)

    def _spec_for(self, run_dir: str, launcher: str | None, nprocs: int) -> LaunchSpec:
        session = self.session
        return LaunchSpec(run_dir=run_dir, config=session.config, script=session.script,
                          script_args=tuple(session.script_args), argv=tuple(self._argv()),
                          launcher=launcher, nprocs=nprocs)

    def _argv(self) -> list[str]:
        return list(self.session.argv or getattr(sys, "orig_argv", sys.argv))

    # ---- the end -----------------------------------------------------------------------------
    def finish(self, outcome: ScriptOutcome, status: str | None = None) -> None:
        """The script ended (`status` overrides its own, "interrupted" after SIGTERM): every
        launch's `launch_end`, this process's own rank closed, the summary lines."""
        if not self._first_to_end():
            return
        try:
            self._finish(outcome, status or outcome.status)
        finally:
            self._ended.set()

    def _first_to_end(self) -> bool:
        """True for the first caller (the script's end on the main thread, or SIGTERM's on
        either thread); any later one waits for the first to be done and gets False."""
        with self._end_lock:
            later, self._ending = self._ending, True
        if later:
            self._ended.wait(RANKS_WAIT_S + 1.0)
        return not later

    def _finish(self, outcome: ScriptOutcome, status: str) -> None:
        lines = []
        if self.own is not None:
            own = self.own.finish(outcome)
            if own:
                lines.append(own)
        if self.watch is not None:
            self.watch.close()
        alive = self._alive()
        for launch in self.launches:
            launch.writer.write(schema.LaunchEnd(end_ns=time.time_ns(), status=status,
                                                 exit_code=outcome.exit_code,
                                                 exception=outcome.exception_text))
            launch.writer.close()
            kept = alive or _holds_ranks(launch.run_dir)
            if not kept:
                _remove_launch(launch.run_dir)
            where = (launch.run_dir if kept else
                     "nothing recorded by them (no steps, comm ops or traces), run files removed")
            lines.append(f"ranktrace: {LAUNCHER_LABEL} {status} started {launch.processes} "
                         f"process(es) ({launch.launcher}, start method {launch.start_method}) "
                         f"-> {where}")
        self.summary = "\n".join(lines)

    def end_by_sigterm(self, wait_s: float) -> None:
        """SIGTERM: pass it on to the ranks still running, wait for them to record how they
        stopped (at most RANKS_WAIT_S, within `wait_s`), then end as interrupted and print
        the summary. This process's own rank dumps its stacks first. Once, whichever thread
        comes first (the main thread's handler, or the watcher when the main thread is stuck)."""
        if not self._first_to_end():
            return
        try:
            self._pass_sigterm_on(wait_s)
            if self.summary:  # before the other thread, let go, can end the process
                say_lines(self.summary)
        finally:
            self._ended.set()

    def _pass_sigterm_on(self, wait_s: float) -> None:
        own = self.own.session if self.own is not None else None
        if own is not None:
            own.dump_sigterm_stacks()
            own.close("interrupted", -signal.SIGTERM,
                      on_main=threading.current_thread() is threading.main_thread())
        alive = self._alive()
        for process in alive:
            try:
                os.kill(process.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        _wait_for(alive, min(RANKS_WAIT_S, max(0.0, wait_s - 1.5)))
        self._finish(ScriptOutcome(exit_code=-signal.SIGTERM), "interrupted")

    def _alive(self) -> list:
        """The rank processes that have not exited, told by their sentinels: nothing is reaped
        here, the script's own join does that."""
        import multiprocessing.connection

        alive = []
        for process in self.children:
            try:
                sentinel = process.sentinel
            except ValueError:  # closed
                continue
            if not multiprocessing.connection.wait([sentinel], 0):
                alive.append(process)
        return alive


def _wait_for(processes: list, timeout_s: float) -> None:
    import multiprocessing.connection

    sentinels = {process.sentinel for process in processes}
    deadline = time.monotonic() + timeout_s
    while sentinels:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for ready in multiprocessing.connection.wait(list(sentinels), left):
            sentinels.discard(ready)


def _start_method(process) -> str:
    import multiprocessing

    method = getattr(process, "_start_method", None)
    return method or multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_all_start_methods()[0]


def _elastic_attempt(args) -> int:
    """TORCHELASTIC_RESTART_COUNT of the workers torchelastic starts (its _wrap's `envs`)."""
    envs = args[2] if len(args) > 2 and isinstance(args[2], dict) else {}
    first = next(iter(envs.values()), {})
    try:
        return int(first.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except (TypeError, ValueError):
        return 0


def _forkserver_misses_tracer() -> bool:
    """A forkserver already running, started while the tracer's folder was not on sys.path."""
    if any(os.path.abspath(entry or os.curdir) == TRACER_ROOT for entry in sys.path):
        return False
    import multiprocessing.forkserver

    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    return getattr(server, "_forkserver_pid", None) is not None


def _holds_ranks(run_dir: str) -> bool:
    """Whether anything but the launcher's own file is in `run_dir` (a rank's records)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return True  # cannot tell: keep it
    own = {schema.LAUNCHER_FILE, schema.LAUNCHER_FILE + schema.TEMP_SUFFIX}
    return any(name not in own for name in names)


def _remove_launch(run_dir: str) -> None:
    for name in (schema.LAUNCHER_FILE, schema.LAUNCHER_FILE + schema.TEMP_SUFFIX):
        try:
            os.remove(os.path.join(run_dir, name))
        except OSError:
            pass
    try:
        os.rmdir(run_dir)
    except OSError:
        pass

