"""`python -m analysis.breakdown --scheduler ADDRESS`: the trace files parsed by the workers of a
real Dask scheduler (two worker processes on 127.0.0.1), with the same JSON as a local run."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from distributed import Client

from helpers.launch import DATA, REPO, run_module, start_module

RUN = DATA / "ddp_cpu"
START_TIMEOUT_S = 120


def _dask(*args: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return start_module("dask", *args, stdout=out, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The address of a scheduler with two single-threaded worker processes registered."""
    folder = tmp_path_factory.mktemp("dask")
    address_file = folder / "scheduler.json"
    processes = [_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                       "--scheduler-file", str(address_file), log=folder / "scheduler.log")]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not address_file.is_file() or not address_file.read_text().strip():
            assert processes[0].poll() is None, (folder / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the Dask scheduler did not start"
            time.sleep(0.2)
        address = json.loads(address_file.read_text())["address"]
        for number in range(2):
            processes.append(_dask("worker", address, "--nthreads", "1", "--no-nanny",
                                   "--no-dashboard", "--host", "127.0.0.1",
                                   log=folder / f"worker{number}.log"))
        with Client(address, timeout=START_TIMEOUT_S) as client:
            client.wait_for_workers(2, timeout=START_TIMEOUT_S)
        yield address
    finally:
        for process in reversed(processes):
            _stop(process)


def _breakdown(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return run_module("analysis.breakdown", *args, cwd=cwd)


def _jobs_run_by_workers(address: str) -> set[str]:
    with Client(address, timeout=START_TIMEOUT_S) as client:
        logs = client.run(lambda dask_worker: [str(entry[0]) for entry in dask_worker.state.log])
    return {key for log in logs.values() for key in log if key.startswith("_read_trace_job-")}


def test_scheduler_run_gives_the_local_json(scheduler, tmp_path):
    local = _breakdown(RUN.relative_to(REPO), "--format", "json", "--no-cache")
    before = _jobs_run_by_workers(scheduler)
    remote = _breakdown(RUN.relative_to(REPO), "--format", "json", "--no-cache",
                        "--scheduler", scheduler)
    assert remote.returncode == local.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    assert len(json.loads(remote.stdout)["ranks"]) == 2
    # One job per trace file ran on the workers, none in the command's own process.
    assert len(_jobs_run_by_workers(scheduler) - before) == 2


def test_workers_write_the_cache_beside_the_traces(scheduler, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    first = _breakdown("run", "--format", "json", "--scheduler", scheduler, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    cached = sorted(p.name for p in (run / ".ranktrace-cache").iterdir())
    assert cached == sorted(f"{p.name}.parquet" for p in RUN.glob("*.pt.trace.json.gz"))
    again = _breakdown("run", "--format", "json", "--scheduler", scheduler, cwd=tmp_path)
    local = _breakdown("run", "--format", "json", "--no-cache", cwd=tmp_path)
    assert json.loads(first.stdout) == json.loads(again.stdout) == json.loads(local.stdout)
    # Paths read as given on the command line, not as the workers were sent them.
    assert json.loads(first.stdout)["run"]["files"][0].startswith("run/")
