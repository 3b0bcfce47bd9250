"""`python -m analysis.breakdown` on damaged and hostile copies of real run folders, one kind of
damage each (tests/helpers/hostile_inputs.py; the table in docs/reliability.md, "Damaged and
hostile input"): no traceback, the problem named in one warning line (file, rank, field, value),
the rest analysed (rank 0 in the JSON document's `ranks`, from its trace), in bounded time and
memory.

Each case runs the command's main() in a child forked from this process once the analysis is
imported (one runner for every case), under an address-space limit (RLIMIT_AS) of this process's
size plus MEMORY_HEADROOM, with RANKTRACE_MAX_TRACE_MB=64; it may take at most twice the CPU time
the undamaged folder takes, plus START_SLACK_S, and DEADLINE_S of wall time. CPU time, its own and
its finished workers', is what the input decides: the cases run beside the rest of the suite,
whose load moves wall time twofold and CPU time little.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import select
import signal
import statistics
import time
import traceback
from pathlib import Path

import pytest

from analysis import breakdown
from helpers.hostile_inputs import CASES, Hostile, copy_source

MEMORY_HEADROOM = 1536 << 20
MAX_TRACE_MB = "64"
# What a case may take beyond twice the undamaged folder's CPU time: the first touch of the
# forked memory and the process pool's start, neither of which grows with the input.
START_SLACK_S = 1.0
# A child that has not answered by then is killed: the case fails as unbounded.
DEADLINE_S = 60.0


def _address_space() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _cpu_seconds() -> float:
    """This process's CPU time and that of its children that have ended (its workers)."""
    spent = os.times()
    return spent.user + spent.system + spent.children_user + spent.children_system


def _analyse_in_child(folder: Path, answer: int) -> None:
    """The child's life: the command under the memory limit, its outcome on `answer`."""
    try:
        limit = _address_space() + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        out, err = io.StringIO(), io.StringIO()
        started = _cpu_seconds()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = breakdown.main([str(folder), "--format", "json"])
        except BaseException:  # noqa: BLE001  (what the test fails on)
            err.write("Traceback\n" + traceback.format_exc())
            code = None
        outcome = {"code": code, "seconds": _cpu_seconds() - started,
                   "out": out.getvalue(), "err": err.getvalue()}
        with os.fdopen(answer, "wb") as pipe:
            pipe.write(json.dumps(outcome).encode())
    finally:
        os._exit(0)


def run_command(folder: Path) -> dict:
    """{code, seconds, out, err} of the command on `folder`, run in a forked child; a child
    that dies or outlives DEADLINE_S fails the case."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _analyse_in_child(folder, write_end)
    os.close(write_end)
    data, deadline = b"", time.monotonic() + DEADLINE_S
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while (left := deadline - time.monotonic()) > 0:
            if select.select([pipe], [], [], left)[0]:
                chunk = pipe.read(1 << 20)
                if not chunk:
                    break
                data += chunk
        else:
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert data, f"the analysis died (wait status {status}) or ran past {DEADLINE_S} s"
    return json.loads(data)


class Runner:
    """Copies, damages and analyses; the undamaged time of each source folder measured once."""

    def __init__(self, root: Path):
        self.root = root
        self.clean: dict[str, float] = {}

    def folder(self, name: str, source: str) -> Path:
        return copy_source(source, self.root / name.replace(" ", "_").replace("/", "_"))

    def clean_seconds(self, source: str) -> float:
        if source not in self.clean:
            times = []
            for attempt in range(3):
                outcome = run_command(self.folder(f"clean-{source}-{attempt}", source))
                assert outcome["code"] == 0, outcome["err"]
                times.append(outcome["seconds"])
            self.clean[source] = statistics.median(times)
        return self.clean[source]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RANKTRACE_MAX_TRACE_MB", MAX_TRACE_MB)
        yield Runner(tmp_path_factory.mktemp("hostile"))


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ranktrace: warning: ")]


@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_a_damaged_run_folder_names_its_problem_and_analyses_the_rest(runner, case: Hostile):
    clean = runner.clean_seconds(case.source)
    folder = runner.folder(case.kind, case.source)
    case.damage(folder)
    outcome = run_command(folder)
    err = outcome["err"]
    assert "Traceback" not in err, err
    assert outcome["code"] == 0, err
    for stream in (outcome["out"], err):  # every control character escaped (core/terminal.py)
        assert "\x1b" not in stream and "\x07" not in stream
    if case.named:
        assert any(all(word in line for word in case.named) for line in _warnings(err)), \
            f"no warning names {case.named}:\n{err}"
    document = json.loads(outcome["out"])
    traced = {r["rank"] for r in document["ranks"] if r["has_trace"]}
    assert 0 in traced, document["ranks"]
    if case.rank1_trace is not None:
        assert (1 in traced) == case.rank1_trace, (traced, err)
    if case.check is not None:
        case.check(document)
    assert outcome["seconds"] <= 2 * clean + START_SLACK_S, (outcome["seconds"], clean)
