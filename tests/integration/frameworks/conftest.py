"""The framework suite's runs: each framework's script (tests/scripts/frameworks/) untraced, traced
and traced with rank 1 late, every run recorded once per session on first use and shared by the
tests that read it. Every test here is marked `frameworks`, and all are skipped, with one reason,
when the `frameworks` extra (transformers, lightning, accelerate) is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.alone import alone
from helpers.launch import launch_reference, torchrun_env
from helpers.runs import DDP_DELAY_MS, STEPS, WINDOW

HERE = Path(__file__).resolve().parent
SCRIPTS = {"hf_trainer": "tests/scripts/frameworks/hf_trainer.py",
           "lightning": "tests/scripts/frameworks/lightning_ddp.py",
           "accelerate": "tests/scripts/frameworks/accelerate_ddp.py"}
EXTRA = ("transformers", "lightning", "accelerate")
MISSING = [name for name in EXTRA if importlib.util.find_spec(name) is None]
SKIP_REASON = (f"the frameworks extra is not installed ({', '.join(MISSING)} missing): "
               "pip install -e .[dev,frameworks]")
# The runs of each framework: (traced, rank 1 late by DDP_DELAY_MS at every step's start). The
# traced runs keep the cross-rank runs' profiler window: steps 0-1 skipped, 2 warm-up, 3-22 traced.
KINDS = {"untraced": (False, False), "traced": (True, False), "late": (True, True)}
LATE_RANK = 1
RECORDED: dict[str, float] = {}  # "framework kind" -> the run's wall time in seconds


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.frameworks)
            if MISSING:  # ahead of the tests' own skipif marks, so this is the reason shown
                item.add_marker(pytest.mark.skipif(True, reason=SKIP_REASON), append=False)


def pytest_terminal_summary(terminalreporter):
    """Each framework run's wall time, so that the suite's cost in CI stays in view."""
    if RECORDED:
        terminalreporter.write_sep("-", "framework runs (wall time)")
        for name, seconds in RECORDED.items():
            terminalreporter.write_line(f"{name}: {seconds:.1f} s")


@dataclass
class FrameworkRun:
    """A finished run: its folder, the script's result file (rank 0's losses and final
    parameters), the tracer's run folder (traced runs), the run's wall time and the 1-minute load
    average as it ended (a timing assertion's message shows it: on a machine busier than its
    cores, one rank descheduled more than the other is slower in every step)."""

    folder: Path
    result: dict
    seconds: float
    load_at_end: float

    @property
    def run_dir(self) -> Path:
        return self.folder / "traces" / "run"


class FrameworkRuns:
    """`framework_runs[framework, kind]`: recorded on first use and kept for the session; a run
    that failed fails every test that asks for it, with its own message."""

    late_rank = LATE_RANK

    def __init__(self, root: Path):
        self.root = root
        self._done: dict[tuple[str, str], FrameworkRun | str] = {}

    def __getitem__(self, key: tuple[str, str]) -> FrameworkRun:
        if key not in self._done:
            try:
                self._done[key] = self._record(*key)
            except (AssertionError, OSError, ValueError) as failure:
                self._done[key] = str(failure)
        done = self._done[key]
        if isinstance(done, str):
            pytest.fail(done, pytrace=False)
        return done

    def _record(self, framework: str, kind: str) -> FrameworkRun:
        traced, late = KINDS[kind]
        folder = self.root / f"{framework}-{kind}"
        folder.mkdir(parents=True)
        tracer = ("--out", folder / "traces", "--run-name", "run", *WINDOW) if traced else None
        args = ("--steps", STEPS, "--out", folder / "result.json",
                *(("--straggle", f"{LATE_RANK}:{DDP_DELAY_MS}") if late else ()))
        began = time.monotonic()
        # Timings are asserted on the traced runs: nothing else of the session runs meanwhile.
        with alone() if traced else nullcontext():
            done = launch_reference(SCRIPTS[framework], *args, nproc=2, tracer=tracer,
                                    env=torchrun_env(), timeout=600)
        seconds, load = time.monotonic() - began, os.getloadavg()[0]
        RECORDED[f"{framework} {kind}"] = seconds
        assert done.returncode == 0, (f"{framework} {kind}: exit {done.returncode}\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return FrameworkRun(folder, json.loads((folder / "result.json").read_text()), seconds,
                            load)


@pytest.fixture(scope="session")
def framework_runs(tmp_path_factory) -> FrameworkRuns:
    return FrameworkRuns(tmp_path_factory.mktemp("framework-runs"))
