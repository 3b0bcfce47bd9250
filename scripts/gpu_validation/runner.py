"""Subprocesses under one time budget: every command's timeout is cut to what is left."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from .config import MIN_STEP_S, REPO, RESERVE_S


class Budget:
    def __init__(self, total: float):
        self.total = float(total)
        self.start = time.monotonic()
        self.started_at = datetime.datetime.now().isoformat(timespec="seconds")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.total - self.elapsed()


class BudgetExhausted(Exception):
    pass


class Interrupted(Exception):
    pass


class Runner:
    """Runs commands in the repository with a timeout cut to the budget; keeps their output."""

    def __init__(self, budget: Budget, env: dict):
        self.budget = budget
        self.env = env
        self.logs: dict[str, str] = {}  # name -> text, for logs.tar.gz
        self.live: set = set()  # Popen objects still running (several with run_many)
        self.stopping = False

    def kill_all(self) -> None:
        self.stopping = True  # no new command starts after this
        for proc in list(self.live):
            _kill_group(proc)

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None):
        left = self.budget.remaining() - RESERVE_S
        if left < MIN_STEP_S:
            raise BudgetExhausted(f"time budget exhausted before {name} "
                                  f"({self.budget.elapsed():.0f} s of {self.budget.total:g} s)")
        limit = min(timeout, left)
        if self.stopping:
            raise Interrupted(f"{name} not started: stopping")
        started = time.monotonic()
        print(f"  $ {' '.join(_short(c) for c in cmd)}  (timeout {limit:.0f} s)", flush=True)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)
        self.live.add(proc)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        finally:
            self.live.discard(proc)
        elapsed = time.monotonic() - started
        rc = proc.returncode
        self.logs[name] = (f"$ {' '.join(cmd)}\nrc={rc} timed_out={timed_out} "
                           f"elapsed={elapsed:.1f}s\n--- stdout ---\n{out}\n"
                           f"--- stderr ---\n{err}\n")
        state = f"timed out after {limit:.0f} s" if timed_out else f"rc={rc}"
        print(f"    {name}: {state} in {elapsed:.1f} s (total {self.budget.elapsed():.0f} s)",
              flush=True)
        return Completed(rc=None if timed_out else rc, stdout=out, stderr=err,
                         timed_out=timed_out, elapsed=elapsed, limit=limit)

    def run_many(self, jobs: list[tuple[str, list[str], float]], parallel: int) -> dict:
        """name -> Completed (or the BudgetExhausted it raised), `parallel` commands at a time."""
        if parallel <= 1:
            out = {}
            for name, cmd, timeout in jobs:
                out[name] = self.run(name, cmd, timeout)
            return out
        pool = ThreadPoolExecutor(max_workers=parallel)
        futures: dict = {}
        try:
            futures = {name: pool.submit(self.run, name, cmd, timeout)
                       for name, cmd, timeout in jobs}
            for future in futures.values():
                future.exception()  # waits; a signal here (SIGTERM, Ctrl-C) kills the commands
        except BaseException:
            for future in futures.values():
                future.cancel()
            self.kill_all()
            raise
        finally:
            pool.shutdown(wait=True)
        out = {}
        for name, future in futures.items():
            error = future.exception()
            if error is not None and not isinstance(error, BudgetExhausted):
                raise error
            out[name] = error if error is not None else future.result()
        return out


class Completed:
    def __init__(self, rc, stdout, stderr, timed_out, elapsed, limit):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.timed_out, self.elapsed, self.limit = timed_out, elapsed, limit

    def failure(self) -> str:
        """Why the command failed, with the tail of its output."""
        tail = output_tail(self.stderr or self.stdout)
        if self.timed_out:
            return f"timed out after {self.limit:.0f} s; output tail: {tail}"
        return f"exit code {self.rc}; output tail: {tail}"


def output_tail(text: str, lines: int = 6, chars: int = 600) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()][-lines:]
    return " / ".join(kept)[-chars:] or "(no output)"


def _short(word: str) -> str:
    if "\n" in word:
        return "<code>"
    return word.replace(str(REPO) + os.sep, "")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the process group this script started for `proc`."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def base_env(gpu: bool, extra_paths: list[str]) -> dict:
    """The environment for every subprocess: no launcher or tracer variables from outside."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("RANKTRACE_", "TORCHELASTIC_"))}
    paths = [str(REPO), *extra_paths]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    if gpu:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # "DP on one GPU", even on a bigger machine
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
        if any(name == "lo" for _, name in socket.if_nameindex()):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env
