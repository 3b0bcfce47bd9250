"""The ranks a script starts itself, each traced by a session of its own (docs/tracer.md, Ranks the
script starts itself); the launching process's side is tracer.session.launcher.

A process started by `torch.multiprocessing.spawn` / `start_processes` (and so by
`elastic_launch` with a function) runs `SpawnedRank(fn, spec)` in place of `fn`: it opens a
session before `fn` runs, as rank `i` of `nprocs` (its spawn index; torchelastic's worker
variables say exactly, for its workers), and when the script's init_process_group gives the
process another rank or world size, the session starts again under those, if it had recorded
nothing yet. `fn`'s exception passes through unchanged, without this wrapper's frame or any other
of the tracer's in its traceback, so torch's `_wrap` writes the same text for the parent's
ProcessRaisedException as untraced; its return value too (torchelastic returns it to the agent).

A `multiprocessing.Process` of the script's own code is armed instead (its target is left as it
is): on unpickling in a spawn or forkserver child, or in a forked child right after the fork, it
wraps init_process_group, and becomes a rank when that returns. Its session ends with the process
(multiprocessing's exit finalizers), which sees the exception that is ending it.

Every session writes into the run folder the launcher made, with the launcher's options.
"""

from __future__ import annotations

import multiprocessing.util
import os
import sys
import threading
from dataclasses import dataclass, replace

from tracer import schema
from tracer.options.config import TracerConfig
from tracer.parts.log import say
from tracer.probes.clock_sync import restore, wrap_init_process_group
from tracer.session.rank_session import Session
from tracer.session.run_folder import LaunchInfo
from tracer.session.script_end import (
    ScriptOutcome,
    exit_code_of,
    hide_tracer_frames,
    say_lines,
)

ELASTIC_WRAP = ("torch.distributed.elastic.multiprocessing.api", "_wrap")
# Runs before multiprocessing's own exit finalizers (the queues' feeder threads, priority 10).
FINALIZER_PRIORITY = 100


@dataclass(frozen=True)
class LaunchSpec:
    """What a launched process needs to trace itself, picklable for spawn and forkserver."""

    run_dir: str  # the run folder the launcher made
    config: TracerConfig  # the launcher's options
    script: str
    script_args: tuple[str, ...]
    argv: tuple[str, ...]  # the launcher's command line, as typed
    launcher: str | None  # one of schema.LAUNCHERS; None: the launching process itself
    nprocs: int  # processes started by the same call (1 for a multiprocessing.Process)


def is_elastic_worker(fn) -> bool:
    """Whether `fn` is torchelastic's worker entry, whose args carry each worker's variables."""
    return (getattr(fn, "__module__", None), getattr(fn, "__name__", None)) == ELASTIC_WRAP


def rank_taken(run_dir: str, rank: int) -> bool:
    """Whether rank `rank` has files in `run_dir` already (another process records as it)."""
    path = os.path.join(run_dir, schema.MANIFEST_FILE.format(rank=rank))
    return os.path.exists(path) or os.path.exists(path + schema.TEMP_SUFFIX)


class LaunchedRank:
    """This process's rank session: opened as the launch says, or when init_process_group
    returns; kept to the group's rank and world size."""

    def __init__(self, spec: LaunchSpec, watch_sigterm: bool = True):
        """`watch_sigterm`: the session handles SIGTERM (not in the launcher, whose own
        handling passes it on to its ranks and then closes this session)."""
        self.spec = spec
        self.watch_sigterm = watch_sigterm
        self.pid = os.getpid()
        self.session: Session | None = None
        self._patches: list = []
        self._finalizer = None

    def open(self, launch: LaunchInfo) -> None:
        """Trace this process as `launch` says, from now on; one line if it cannot be."""
        spec = self.spec
        if rank_taken(spec.run_dir, launch.rank):
            say(f"rank {launch.rank} is traced already in {spec.run_dir} (by another process "
                f"of this launch); this process is not traced", rank=launch.rank)
            return
        session = Session(spec.config, spec.script, list(spec.script_args), launch,
                          run_dir=spec.run_dir, argv=list(spec.argv),
                          launched_by=spec.launcher, on_group_joined=self._group_joined)
        try:
            if self.watch_sigterm and threading.current_thread() is threading.main_thread():
                session.watch_sigterm()
            session.open()
        except Exception as exc:  # a bug of ours must not cost the user their training run
            say(f"tracer setup failed ({type(exc).__name__}: {exc}); this process runs "
                f"untraced", rank=launch.rank)
            session.abandon()
            return
        self.session = session

    def _group_joined(self, rank: int, world_size: int) -> None:
        """The script's init_process_group made this process rank `rank` of `world_size`."""
        session = self.session
        if session is None or (rank, world_size) == (session.rank, session.launch.world_size):
            return
        was = f"rank {session.rank} of {session.launch.world_size}"
        if session.recorded_so_far() or rank_taken(self.spec.run_dir, rank):
            say(f"init_process_group made this process rank {rank} of {world_size}; its "
                f"records stay those of {was} (it had recorded as such already)")
            return
        session.abandon()
        self.session = None
        self.open(replace(session.launch, rank=rank, world_size=world_size))

    # ---- traced from init_process_group on ---------------------------------------------------
    def arm(self) -> None:
        """Trace this process from the moment its script's init_process_group returns (when
        torch.distributed is loaded: a process whose script never imported torch trains no
        rank)."""
        if "torch.distributed" in sys.modules:
            self._patches = wrap_init_process_group(self._joined)

    def _joined(self) -> None:
        if os.getpid() != self.pid or self.session is not None:
            return  # a fork of the armed process, or a second group: the session follows it
        restore(self._patches)
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        self.open(LaunchInfo(rank=rank, local_rank=local_rank, world_size=world_size))
        if self.session is not None:
            self._finalizer = multiprocessing.util.Finalize(
                None, self.finish_at_exit, exitpriority=FINALIZER_PRIORITY)

    def finish_at_exit(self) -> None:
        """multiprocessing's exit finalizer: the process's run() has returned or is raising."""
        exc = sys.exc_info()[1]
        if exc is None:
            self.finish_and_say(ScriptOutcome(exit_code=0))
            return
        if isinstance(exc, SystemExit):
            self.finish_and_say(ScriptOutcome(exit_code=exit_code_of(exc), system_exit=exc))
            return
        self.finish_and_say(ScriptOutcome(exit_code=1, exception=exc))
        hide_tracer_frames(exc)  # multiprocessing prints it next

    def finish(self, outcome: ScriptOutcome) -> str | None:
        """Close the session; its summary lines, unless this was no rank after all (it
        recorded nothing and ended well: a helper process, whose output stays its own)."""
        self.disarm()
        session, self.session = self.session, None
        if session is None:
            return None
        session.finish(outcome)
        return session.summary if session.kept or outcome.status != "ok" else None

    def finish_and_say(self, outcome: ScriptOutcome) -> None:
        summary = self.finish(outcome)
        if summary:
            say_lines(summary)

    def disarm(self) -> None:
        restore(self._patches)
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.cancel()


class SpawnedRank:
    """The function that torch.multiprocessing starts each process with, traced (module doc)."""

    def __init__(self, fn, spec: LaunchSpec):
        self.fn = fn
        self.spec = spec

    def __call__(self, index, *args):
        rank = LaunchedRank(self.spec)
        rank.open(self._launch(index, args))
        try:
            result = self.fn(index, *args)
        except BaseException as exc:
            rank.finish_and_say(_spawned_outcome(exc))
            hide_tracer_frames(exc)
            raise  # a bare raise adds no frame: torch's _wrap sees the untraced traceback
        rank.finish_and_say(ScriptOutcome(exit_code=0))
        return result

    def _launch(self, index: int, args: tuple) -> LaunchInfo:
        if is_elastic_worker(self.fn):
            # torchelastic's _wrap(local_rank, fn, args, envs, ...) sets envs[local_rank] as the
            # worker's variables before the worker's function runs: torchrun's own.
            envs = args[2] if len(args) > 2 and isinstance(args[2], dict) else {}
            return LaunchInfo.from_env({**os.environ, **envs.get(index, {})})
        return LaunchInfo(rank=index, local_rank=index, world_size=self.spec.nprocs)


def _spawned_outcome(exc: BaseException) -> ScriptOutcome:
    """How the process ends when its function raises `exc`, as torch's _wrap ends it: exit 1
    after an exception, 0 after KeyboardInterrupt (the parent's SIGINT), SystemExit's code."""
    if isinstance(exc, SystemExit):
        return ScriptOutcome(exit_code=exit_code_of(exc), system_exit=exc)
    if isinstance(exc, KeyboardInterrupt):
        return ScriptOutcome(exit_code=0, exception=exc)
    return ScriptOutcome(exit_code=1, exception=exc)


# ---- multiprocessing.Process: armed in the child ---------------------------------------------
_pending_fork: LaunchSpec | None = None  # set while the launcher forks a process to arm
_fork_hook_registered = False


def arm_process(process, spec: LaunchSpec, start_method: str):
    """Arm the child `process` is about to start as (see the module's doc); returns the undo
    to call once it has started."""
    global _pending_fork, _fork_hook_registered
    if start_method == "fork":
        if not _fork_hook_registered:
            os.register_at_fork(after_in_child=_arm_forked_child)
            _fork_hook_registered = True
        _pending_fork = spec

        def undo():
            global _pending_fork
            _pending_fork = None
        return undo
    process._ranktrace_arm = _ArmOnUnpickle(spec)
    return lambda: process.__dict__.pop("_ranktrace_arm", None)


def _arm_forked_child() -> None:
    global _pending_fork
    spec, _pending_fork = _pending_fork, None
    if spec is not None:
        LaunchedRank(spec).arm()


class _ArmOnUnpickle:
    """Pickled with the Process object; unpickled in the child, it arms the child."""

    def __init__(self, spec: LaunchSpec):
        self.spec = spec

    def __reduce__(self):
        return _armed, (self.spec,)


def _armed(spec: LaunchSpec) -> None:
    LaunchedRank(spec).arm()
