"""Choosing and creating the run folder that all ranks of one run write into.

Rank 0 names the folder and creates it with an exclusive mkdir (adding -1, -2... when the name
is taken, so a run never overwrites an earlier one), then publishes the name in torchrun's agent
store; the other ranks wait for it there. The script is never involved, so this works before it
has started its process group, or if it never does. An elastic restart
(TORCHELASTIC_RESTART_COUNT > 0) gets a new folder `<first attempt's folder>-attempt<N>`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from tracer import schema

STORE_PREFIX = "ranktrace/rundir"
MAX_SUFFIX = 1000
_ERROR_MARK = "!"  # a published value starting with this is rank 0's error, not a name


class RunDirError(RuntimeError):
    """The run folder cannot be used; the message says which path and why."""


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the launch, from torchrun's environment (defaults: one rank)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    attempt: int = 0
    run_id: str = ""
    master_addr: str | None = None
    master_port: int | None = None
    agent_store: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchInfo:
        env = os.environ if environ is None else environ
        port = env.get("MASTER_PORT")
        return cls(rank=int(env.get("RANK", "0")), local_rank=int(env.get("LOCAL_RANK", "0")),
                   world_size=int(env.get("WORLD_SIZE", "1")),
                   attempt=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                   run_id=env.get("TORCHELASTIC_RUN_ID", ""),
                   master_addr=env.get("MASTER_ADDR"), master_port=int(port) if port else None,
                   agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def default_run_name(script: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    stem = os.path.splitext(os.path.basename(os.path.normpath(script)))[0] or "run"
    return f"{stamp}-{stem}"


def ensure_out_dir(out: str) -> None:
    """Create `out` and its parents if missing; fail with the path and the reason if that fails
    or `out` is not a folder (whether it is writable, the mkdir that follows finds out)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise RunDirError(f"--out {out!r} is not a folder")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create --out {out!r}: {exc.strerror or exc}") from None


def create_unique(out: str, name: str) -> str:
    """mkdir `out/name`, or `out/name-1`, `-2`...: never reuses an existing folder."""
    ensure_out_dir(out)
    for suffix in range(MAX_SUFFIX):
        candidate = name if suffix == 0 else f"{name}-{suffix}"
        path = os.path.join(out, candidate)
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise RunDirError(f"cannot create run folder {path!r}: {exc.strerror or exc}") from None
    raise RunDirError(f"{MAX_SUFFIX} folders named {name!r}[-N] already exist in {out!r}")


def _store_keys(launch: LaunchInfo) -> tuple[str, str]:
    base = f"{STORE_PREFIX}/{launch.run_id}"
    return f"{base}/first", f"{base}/attempt{launch.attempt}"


def _connect(launch: LaunchInfo, timeout: float):
    import torch.distributed as dist

    return dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                         timeout=timedelta(seconds=timeout), wait_for_workers=False)


def _read(store, key: str, timeout: float) -> str | None:
    try:
        store.wait([key], timedelta(seconds=timeout))
    except Exception:  # the store raises DistStoreError (a RuntimeError) on timeout
        return None
    return store.get(key).decode()


def resolve_run_dir(out: str, run_name: str, script: str, launch: LaunchInfo,
                    timeout: float, store=None) -> str:
    """The run folder's path, created; the same on every rank of this launch attempt."""
    if launch.world_size <= 1:
        return _create_for_attempt(out, run_name or default_run_name(script), launch.attempt)
    if store is None:
        if not launch.agent_store or launch.master_addr is None or launch.master_port is None:
            raise RunDirError(
                "cannot agree on a run folder across ranks: no torchrun agent store "
                "(TORCHELASTIC_USE_AGENT_STORE is not True); launch with torchrun")
        try:
            store = _connect(launch, timeout)
        except Exception as exc:
            raise RunDirError(f"cannot reach torchrun's store at {launch.master_addr}:"
                              f"{launch.master_port}: {exc}") from None
    first_key, attempt_key = _store_keys(launch)
    if launch.rank == 0:
        try:
            if launch.attempt == 0:
                path = create_unique(out, run_name or default_run_name(script))
                store.set(first_key, os.path.basename(path))
            else:
                # The agent's store outlives worker restarts, so the first attempt's name is there.
                first = _read(store, first_key, 0.1) or run_name or default_run_name(script)
                path = _create_for_attempt(out, first, launch.attempt)
        except RunDirError as exc:
            store.set(attempt_key, _ERROR_MARK + str(exc))
            raise
        store.set(attempt_key, os.path.basename(path))
        return path
    value = _read(store, attempt_key, timeout)
    if value is None:
        raise RunDirError(f"rank {launch.rank} waited {timeout:g} s for rank 0 to name the run "
                          f"folder and gave up (is rank 0 running under the tracer too?)")
    if value.startswith(_ERROR_MARK):
        raise RunDirError(f"rank 0 could not create the run folder: {value[1:]}")
    path = os.path.join(out, value)
    try:
        # Without a shared file system each node needs its own copy of the folder.
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run folder {path!r}: {exc.strerror or exc}") from None
    return path


def _create_for_attempt(out: str, name: str, attempt: int) -> str:
    return create_unique(out, name if attempt == 0 else f"{name}-attempt{attempt}")


def remove_rank_files(run_dir: str, paths: list[str]) -> bool:
    """Remove one rank's files (finished or `.tmp`), then the run folder if no other rank's files
    are left in it (the last rank out removes it). False, keeping the rest, if one cannot go."""
    for path in paths:
        for name in (path, path + schema.TEMP_SUFFIX):
            try:
                os.remove(name)
            except FileNotFoundError:
                pass
            except OSError:
                return False
    try:
        os.rmdir(run_dir)
    except OSError:
        pass  # other ranks' files are still there
    return True
