"""Where the per-rank work runs: in this process, in local worker processes, or on a Dask
distributed cluster (`--scheduler ADDRESS`, docs/analysis.md "Large runs and Dask").

`run_jobs(job, items, ...)` gives `[job(item) for item in items]`, in order, whichever runs them.
A job must be a module-level function whose arguments and result pickle; it reports its own
failures in its result, so that one bad file never stops the others.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence

# progress(items done, items in all): told after each item.
Progress = Callable[[int, int], None]
# Seconds to wait for the scheduler to answer before giving up with SchedulerUnavailable.
CONNECT_TIMEOUT_S = 30


class SchedulerUnavailable(RuntimeError):
    """The Dask scheduler named by --scheduler cannot be used (not installed, not reachable)."""


def run_jobs(job: Callable, items: Sequence, jobs: int | None = None,
             scheduler: str | None = None, progress: Progress | None = None) -> list:
    """job(item) for every item, in the order of `items`: on the Dask cluster at `scheduler`
    when given, else in up to `jobs` local processes (default: one per core), in-process for a
    single item or a single job."""
    if scheduler:
        return _on_dask(job, items, scheduler, progress)
    jobs = jobs or min(len(items), os.cpu_count() or 1)
    results = []
    if len(items) > 1 and jobs > 1:
        # Imported here: the command imports this module before it forks its decoder
        # (analysis.ingest.parse_ahead), which should start as early as it can.
        from concurrent.futures import ProcessPoolExecutor

        # gc.enable: a worker collects whether or not its caller had paused its collector.
        with ProcessPoolExecutor(max_workers=jobs, initializer=gc.enable) as pool:
            for done, result in enumerate(pool.map(job, items), start=1):
                results.append(result)
                if progress is not None:
                    progress(done, len(items))
        return results
    for done, item in enumerate(items, start=1):
        results.append(job(item))
        if progress is not None:
            progress(done, len(items))
    return results


def _on_dask(job: Callable, items: Sequence, address: str, progress: Progress | None) -> list:
    try:
        # Imported here: only --scheduler needs Dask, an optional extra (ranktrace[dask]).
        from distributed import Client, as_completed
    except ImportError:
        raise SchedulerUnavailable(
            f"--scheduler {address}: Dask is not installed; pip install 'ranktrace[dask]'"
        ) from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise SchedulerUnavailable(
            f"--scheduler {address}: cannot connect to the Dask scheduler ({exc})") from None
    try:
        # pure=False: a file read twice (after it changed) must be read again, not recalled.
        futures = client.map(job, list(items), pure=False)
        position = {future.key: index for index, future in enumerate(futures)}
        results: list = [None] * len(futures)
        for done, future in enumerate(as_completed(futures, loop=client.loop), start=1):
            results[position[future.key]] = future.result()
            if progress is not None:
                progress(done, len(futures))
        return results
    finally:
        client.close()
