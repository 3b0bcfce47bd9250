"""The one launcher of the tests: a script under torchrun, under ``python -m tracer.record``, or
as one plain process, always on CPU with gloo on the loopback interface, in one environment
(torchrun_env). Every test that starts training, the tracer or an analysis command in a
subprocess goes through here."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Real traces recorded by other projects, and HTA's numbers on them (tests/data/README.md).
DATA = REPO / "tests" / "data"
# Scripts as typed on a command line, relative to the repository root (argv[0] comes through so).
DDP = "workloads/ddp.py"
TINY = "tests/scripts/tiny_train.py"

# What a launcher (torchrun, an outer job) or a developer's shell may have set that would change
# the run under test: torchrun's own variables, the tracer's options, torch.compile's logs and
# caches (a run sets its own where it needs them).
_LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                       "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR",
                       "MASTER_PORT")
_DROPPED_PREFIXES = ("RANKTRACE_", "TORCHELASTIC_", "TORCH_LOGS", "TORCHINDUCTOR_")

# Runs a script the way ranktrace's tracer does: runpy with sys.argv and sys.path[0] set as
# python would, counting optimizer steps through the global post hook the tracer relies on.
_RUNPY = """
import os, runpy, sys
from torch.optim.optimizer import register_optimizer_step_post_hook
steps = []
register_optimizer_step_post_hook(lambda *_: steps.append(1))
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
print(f"optimizer steps {len(steps)}")
"""


def torchrun_env(**extra: str) -> dict:
    """The environment of every process a test starts: none of the variables above inherited,
    no GPU, one intra-op thread, gloo's sockets on loopback, unbuffered output, the repository
    importable; `extra` on top."""
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARIABLES and not k.startswith(_DROPPED_PREFIXES)}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else [])))
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def command(script, args=(), *, nproc: int | None = None, tracer=None, torchrun=(),
            standalone: bool = True, count_steps: bool = False) -> list[str]:
    """The command line of `script` (a path as typed, relative to the repository) with `args`:
    under torchrun when `nproc` is set (`torchrun`: its own options, after --standalone unless
    `standalone` is false), traced when `tracer` (the tracer's options) is not None;
    `count_steps`: one process through runpy, counting optimizer steps as the tracer does."""
    if count_steps:
        assert nproc is None and tracer is None, "count_steps runs one untraced process"
        head = [sys.executable, "-c", _RUNPY]
    elif nproc is None:
        head = [sys.executable]
    else:
        head = [sys.executable, "-m", "torch.distributed.run",
                *(["--standalone"] if standalone else []), f"--nproc-per-node={nproc}",
                *map(str, torchrun)]
    if tracer is not None:
        head += ["-m", "tracer.record", *map(str, tracer)]
    return head + [str(script)] + [str(a) for a in args]


def launch(script, *args, nproc: int | None = None, tracer=None, torchrun=(),
           standalone: bool = True, count_steps: bool = False, env: dict | None = None,
           timeout: float = 300, prefix=(), **kwargs) -> subprocess.CompletedProcess:
    """Runs `command(...)` (after `prefix`, e.g. ``taskset -c 0,1``) from the repository root to
    its end; output captured as text. Past `timeout` every process it started is killed (its
    own session: torchrun's ranks too, which would outlive torchrun) and TimeoutExpired
    raised."""
    process = popen(script, *args, nproc=nproc, tracer=tracer, torchrun=torchrun,
                    standalone=standalone, count_steps=count_steps, prefix=prefix, env=env,
                    start_new_session=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


# What a rank prints when gloo's worker threads outlive the interpreter at exit and the process
# aborts (a known PyTorch teardown race: pytorch/pytorch#179291, #190489), even after
# destroy_process_group; seen on the loaded 2-core CI machine in untraced reference runs (a
# model-parallel and an accelerate one) twice in a day of full suites.
GLOO_EXIT_ABORT = "terminate called without an active exception"
# The same race can leave a rank hung at exit instead (an untraced transformers.Trainer run on
# the CI machine: training done and its result written, one rank alive 600 s later). The
# untraced reference runs take seconds: one still running after this long is that hang.
REFERENCE_HANG_S = 180.0


def launch_reference(script, *args, tracer=None, timeout: float = 300,
                     **kwargs) -> subprocess.CompletedProcess:
    """`launch` of a run other tests compare against; untraced (`tracer` None), started once
    more where a rank aborted at exit with GLOO_EXIT_ABORT or the run outlived
    REFERENCE_HANG_S (killed, every rank): the untraced run is the reference, not what the
    tests test (a traced run that aborts or hangs is never started again: that is the
    tracer's to answer for)."""
    if tracer is not None:
        return launch(script, *args, tracer=tracer, timeout=timeout, **kwargs)
    try:
        done = launch(script, *args, timeout=min(timeout, REFERENCE_HANG_S), **kwargs)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or (done.returncode != 0 and GLOO_EXIT_ABORT in done.stderr):
        done = launch(script, *args, timeout=timeout, **kwargs)
    return done


def popen(script, *args, nproc: int | None = None, tracer=None, torchrun=(),
          standalone: bool = True, count_steps: bool = False, prefix=(),
          env: dict | None = None, **kwargs) -> subprocess.Popen:
    """Starts `command(...)` (after `prefix`, e.g. ``timeout``) with stdout and stderr piped as
    text, and returns at once."""
    argv = [*map(str, prefix), *command(script, args, nproc=nproc, tracer=tracer,
                                        torchrun=torchrun, standalone=standalone,
                                        count_steps=count_steps)]
    return subprocess.Popen(argv, cwd=REPO, env=env or torchrun_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def start(script, *args, **options) -> Started:
    """`popen(...)`, its output read as it comes (see Started)."""
    return Started(popen(script, *args, **options))


def run_module(module: str, *args, env: dict | None = None, cwd=REPO, timeout: float = 300,
               **kwargs) -> subprocess.CompletedProcess:
    """``python -m module args`` (analysis.breakdown, analysis.diff, tracer.sweep, dask ...)."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                          env=env or torchrun_env(), capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def start_module(module: str, *args, env: dict | None = None, cwd=REPO, **kwargs):
    """``python -m module args`` started in the background (a Popen)."""
    return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                            env=env or torchrun_env(), **kwargs)


class Started:
    """A started process whose output is read as it comes, so that a test can wait for a line
    of stdout without blocking past its deadline; `popen` is the process itself."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.stdout_lines: list[str] = []
        self._stderr: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=lambda: self._stderr.extend(popen.stderr),
                                          daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self):
        for line in self.popen.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for_line(self, text: str, timeout: float = 120) -> str:
        """The first line of stdout holding `text`; fails if the process ends first or the time
        runs out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} within {timeout} s") from None
            if line is None:
                self._lines.put(None)
                self.popen.wait()
                self._readers[1].join(10)
                raise AssertionError(f"exited ({self.popen.returncode}) before {text!r}: "
                                     f"{''.join(self._stderr)[-3000:]}")
            self.stdout_lines.append(line)
            if text in line:
                return line

    def communicate(self, timeout: float = 120) -> tuple[str, str]:
        """Waits for the end; (all of stdout, all of stderr)."""
        self.popen.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout)
        while (line := self._lines.get()) is not None:
            self.stdout_lines.append(line)
        self._lines.put(None)
        return "".join(self.stdout_lines), "".join(self._stderr)
