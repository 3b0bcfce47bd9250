"""The runs the integration tests read, each recorded once per session and shared by every test
that asserts on it (the `shared_runs` fixture, tests/conftest.py): a table of named runs, each
with its command, as torchtitan's integration_tests/features.py keeps one.

A run is only shared where every user's assertions hold on the same command; a test whose run is
its own (a fault, a signal, a sweep) starts it itself. Users must not write into a shared run's
folder: a test that writes beside the traces (an analysis cache) works on a copy
(run_copies.copy_run).
"""

from __future__ import annotations

import os
import subprocess
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.alone import alone, alone_is_active
from helpers.launch import DDP, launch_reference, torchrun_env

PIPELINE = "workloads/pipeline.py"
MODEL_PARALLEL = "workloads/model_parallel.py"
LINEAR_DDP = "tests/scripts/linear_ddp.py"
MEMORY_DDP = "tests/scripts/memory_ddp.py"

# ---- the cross-rank runs: small models, so that an injected host delay dominates each step -----
# One DDP gradient bucket, about 1 ms of compute per step.
SMALL = ("--hidden", "64", "--batch-size", "8")
# Steps 0-1 skipped (start-up, DDP's bucket rebuild), 2 warm-up, then ACTIVE steps traced.
ACTIVE = 20
WINDOW = ("--skip-first", "2", "--wait", "0", "--warmup", "1", "--active", str(ACTIVE))
STEPS = ACTIVE + 4
DDP_DELAY_MS = 25
# The tracer's default profiler window: 3 steps traced after 7.
DEFAULT_WINDOW = ("--skip-first", "5", "--wait", "1", "--warmup", "1", "--active", "3")
EVEN_RUNS = 5  # DDP runs without delay, each a separate sample of the scheduling noise
# The default-options runs: as many steps as a user's first try (the straggler rule needs 11).
DEFAULT_STEPS = 30
# tests/scripts/straggle_ddp.py's delay: long against the scheduling noise of a shared 2-core CPU.
STRAGGLE_DDP_DELAY_MS = 60

# The runs of the late ranks' causes: the default window (steps 7-9) and a few steps after it.
CAUSE_STEPS = 14
SLOW_DATA_MS = 30

# ---- the tracer end to end ----------------------------------------------------------------------
DDP_STEPS = 20

# ---- the diffs of runs -------------------------------------------------------------------------
DIFF_STEPS = "12"
# The ops come from the traces here (--no-comms, shapes recorded for their sizes): with
# --bucket-cap-mb set, the tracer's comm records hold no DDP all-reduce.
DIFF_FROM_TRACE = ("--no-comms", "--record-shapes")

# ---- the workloads untraced, tiny: each a reference for the workload tests and the untraced
# side of the traced-training identity ----------------------------------------------------------
TINY_HIDDEN, TINY_LAYERS, TINY_BATCH, TINY_STEPS, TINY_SEED, TINY_LR = 16, 2, 8, 2, 0, 0.1
TINY_MODEL = tuple(map(str, ("--hidden", TINY_HIDDEN, "--layers", TINY_LAYERS, "--batch-size",
                             TINY_BATCH, "--steps", TINY_STEPS, "--seed", TINY_SEED,
                             "--lr", TINY_LR)))
TINY_WORKLOADS = {  # name -> (script, extra flags, ranks (None: one process), files --save writes)
    "dp": ("workloads/dp.py", (), None, ("out.pt",)),
    "ddp": (DDP, ("--pg-timeout-s", "60"), 2, ("out.pt",)),
    "model_parallel": (MODEL_PARALLEL, ("--pg-timeout-s", "60"), 2,
                       ("out.rank0.pt", "out.rank1.pt")),
    "pipeline": (PIPELINE, ("--pg-timeout-s", "60", "--microbatches", "2"), 2,
                 ("out.rank0.pt", "out.rank1.pt")),
}


@dataclass(frozen=True)
class Run:
    """`script` with `args` on `nproc` ranks under torchrun (None: one process); traced with the
    tracer options `tracer` (None: untraced), to which --out and --run-name are added; `save`:
    the workload's --save to out.pt in the run's folder; `env`: (name, value) pairs on top of
    torchrun_env; `timed`: its users assert on its timings, so it is recorded alone (alone.py),
    under xdist with the other timed runs of its `batch` in one go (one wait for the other
    worker, not one per run); `cpus`: the CPUs it is pinned to (taskset -c), "" for none."""

    script: str
    args: tuple = ()
    nproc: int | None = 2
    tracer: tuple | None = None
    save: bool = False
    env: tuple = ()
    timeout: float = 600
    timed: bool = False
    batch: str = ""
    cpus: str = ""
    users: str = field(default="", compare=False)


RUNS: dict[str, Run] = {
    # The tracer's default window on DDP's default model, every bucket in the comm records and
    # operator shapes in the traces (TensorBoard's plugin sizes comm ops from them).
    "ddp-bucket-hook": Run(DDP, ("--steps", str(DDP_STEPS)),
                           tracer=("--ddp-bucket-hook", "--record-shapes"), save=True,
                           users="test_tracer_end_to_end (test_ddp_*), test_tensorboard_view"),
    # Rank 1 late by a busy loop before every forward pass; DDP's buckets only in the window (the
    # Flight Recorder off): the cross-rank pass reads them from the Kineto traces.
    "ddp-late-window": Run(DDP, ("--steps", str(STEPS), *SMALL, "--layers", "1", "--straggle",
                                 f"1:{DDP_DELAY_MS}"), tracer=(*WINDOW, "--no-flight-recorder"),
                           timed=True, batch="crossrank",
                           users="test_crossrank_names_stragglers (profiler_window), "
                                 "test_breakdown_command (a real traced run), "
                                 "test_timeline_of_traced_runs (ddp)"),
    # The same delay in ddp.py's own model with the tracer's default options, as a user would
    # run it: every bucket of every step is in the comm records (the Flight Recorder). Its
    # steps of about 10 ms, unlike SMALL's 2 ms, are long against the host's own noise: a rank
    # that the machine slows by 12% for half a run is otherwise a real 0.5 ms straggler.
    "ddp-late-default": Run(DDP, ("--steps", str(DEFAULT_STEPS), "--straggle",
                                  f"1:{DDP_DELAY_MS}"), tracer=(),
                            timed=True, batch="crossrank",
                            users="test_crossrank_names_stragglers (records, default options), "
                                  "test_diff_of_traced_runs (late)"),
    **{f"ddp-even-{n}": Run(DDP, ("--steps", str(DEFAULT_STEPS)),
                            tracer=(), timed=True, batch="crossrank",
                            users="test_crossrank_names_stragglers (no delay; -0: DDP's buckets "
                                  "named), test_diff_of_traced_runs (-0 and -1: base, again)")
       for n in range(EVEN_RUNS)},
    # The pipeline's own model, outside a long profiler window: with four ranks on two cores and
    # a tiny model, the stages' run time is the scheduler's, not the schedule's.
    "pipeline-4-late": Run(PIPELINE, ("--steps", str(STEPS), "--straggle", "2:15"), nproc=4,
                           tracer=DEFAULT_WINDOW, timed=True, batch="crossrank",
                           users="test_crossrank_names_stragglers (pipeline), "
                                 "test_timeline_of_traced_runs (pipeline)"),
    # Why a rank is late (test_late_rank_causes), each with the tracer's default options: rank 1
    # trains on 4 times rank 0's batch (an uneven shard); rank 1's DataLoader sleeps 30 ms in
    # each batch; a 4-stage pipeline of equal blocks on 4 ranks pinned to 2 CPUs, so that the
    # ranks compete for cores on any machine.
    "ddp-uneven-batch": Run(DDP, ("--steps", str(CAUSE_STEPS), "--uneven-batch", "1:4"),
                            tracer=(), timed=True, batch="crossrank",
                            users="test_late_rank_causes (larger inputs)"),
    "ddp-slow-data": Run(DDP, ("--steps", str(CAUSE_STEPS), *SMALL, "--slow-data",
                               f"1:{SLOW_DATA_MS}"), tracer=(), timed=True, batch="crossrank",
                         users="test_late_rank_causes (data loading)"),
    "pipeline-4-on-2-cpus": Run(PIPELINE, ("--steps", str(CAUSE_STEPS), "--hidden", "64"),
                                nproc=4, tracer=(), cpus="0,1", timed=True, batch="crossrank",
                                users="test_late_rank_causes (competition for cores)"),
    # Two ranks: a burst of contention on the other rank can hide the delay for several steps in
    # a row, so 40 steps (their comm records; the window as by default).
    "tp-late": Run(MODEL_PARALLEL, (*SMALL, "--layers", "1", "--straggle", "0:20", "--steps",
                                    "40"), tracer=DEFAULT_WINDOW, timed=True, batch="crossrank",
                   users="test_crossrank_names_stragglers (tensor parallel)"),
    # A 60 ms busy loop on rank 1 of a plain DDP loop; 16 steps traced after 2 skipped and 1
    # warm-up step: two ranks need 10 clean steps or more before either can be named.
    # Its buckets timed by the comm hook (--ddp-bucket-hook): a clock is estimated from ops with
    # a completion time, which gloo's Flight Recorder entries do not give.
    "ddp-straggle-60": Run("tests/scripts/straggle_ddp.py",
                           ("--steps", "20", "--straggle", f"1:{STRAGGLE_DDP_DELAY_MS}"),
                           tracer=("--skip-first", "2", "--wait", "0", "--warmup", "1",
                                   "--active", "16", "--ddp-bucket-hook"), timed=True,
                           batch="crossrank", users="test_crossrank_on_a_traced_straggler"),
    "diff-cap25": Run(DDP, ("--steps", DIFF_STEPS, "--bucket-cap-mb", "25"),
                      tracer=DIFF_FROM_TRACE, users="test_diff_of_traced_runs"),
    "diff-cap1": Run(DDP, ("--steps", DIFF_STEPS, "--bucket-cap-mb", "1"),
                     tracer=DIFF_FROM_TRACE, users="test_diff_of_traced_runs"),
    "diff-pp2": Run(PIPELINE, ("--steps", DIFF_STEPS, "--microbatches", "2"), tracer=(),
                    users="test_diff_of_traced_runs"),
    "diff-pp8": Run(PIPELINE, ("--steps", DIFF_STEPS, "--microbatches", "8"), tracer=(),
                    users="test_diff_of_traced_runs"),
    # Bias-free linear layers under DDP, traced with the default options: its FLOPs per step
    # against FlopCounterMode's count, its losses against an untraced process's.
    "linear-ddp": Run(LINEAR_DDP, ("--steps", "12"), tracer=(), save=True,
                      users="test_flops_of_a_traced_run"),
    # Issue 40's case: rank 0 holds 256 MiB aside all along, rank 1 keeps 2 MiB every step from
    # step 20 on (200 steps, the default options).
    "memory-leak": Run(MEMORY_DDP, ("--steps", "200", "--buffer", "0:256", "--leak", "1:2:20"),
                       tracer=(), users="test_memory_across_ranks (records, growth, verdict)"),
    # Rank 0's buffer alone, with torch's memory profiler in the default window.
    "memory-buffer": Run(MEMORY_DDP, ("--steps", "40", "--buffer", "0:256"),
                         tracer=("--profile-memory",),
                         users="test_memory_across_ranks (imbalance, categories)"),
    **{f"{name}-tiny": Run(script, (*TINY_MODEL, *flags), nproc=nproc, save=True,
                           users="test_workloads_train_like_references, "
                                 "test_traced_training_bit_identical (untraced, eager)")
       for name, (script, flags, nproc, _) in TINY_WORKLOADS.items()},
}


# Other work keeping more than this many processes per core runnable (the 1-minute load average
# as a run ended) slows one run of a command up to 3.5-fold against the next
# (docs/benchmarks.md#run-to-run-noise-of-one-command), and a rank's fast steps for a second or
# more at a time: step times and slowdowns of such a run say more of the machine than of it.
OVERLOAD_PER_CORE = 2.0


def overloaded(load: float) -> bool:
    """Whether a run that ended at this load average ran on an overloaded machine."""
    return load > OVERLOAD_PER_CORE * (os.cpu_count() or 1)


@dataclass
class Recorded:
    """A finished run: its folder, the process's result, the run folder the tracer wrote
    (traced runs), the file --save wrote, and the 1-minute load average as it ended."""

    name: str
    folder: Path
    result: subprocess.CompletedProcess
    load_at_end: float

    @property
    def run_dir(self) -> Path:
        return self.folder / "traces" / self.name

    @property
    def saved(self) -> Path:
        return self.folder / "out.pt"


def record(name: str, folder: Path) -> Recorded:
    spec = RUNS[name]
    folder.mkdir(parents=True)
    tracer = None if spec.tracer is None else (
        "--out", folder / "traces", "--run-name", name, *spec.tracer)
    args = (*spec.args, *(("--save", folder / "out.pt") if spec.save else ()))
    with alone() if spec.timed else nullcontext():
        result = launch_reference(spec.script, *args, nproc=spec.nproc, tracer=tracer,
                                  env=torchrun_env(**dict(spec.env)), timeout=spec.timeout,
                                  prefix=("taskset", "-c", spec.cpus) if spec.cpus else ())
        load = os.getloadavg()[0]
    assert result.returncode == 0, (f"shared run {name}: exit {result.returncode}\n"
                                    f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return Recorded(name, folder, result, load)


class SharedRuns:
    """`shared_runs[name]`: the run recorded on first use and kept for the session; a run that
    failed fails every test that asks for it, with its own message, and is not started again."""

    def __init__(self, root: Path):
        self.root = root
        self._done: dict[str, Recorded | str] = {}

    def __getitem__(self, name: str) -> Recorded:
        if name not in self._done:
            batch = RUNS[name].batch
            if batch and alone_is_active():
                # All of the batch's runs in one stretch alone: under xdist each wait for the
                # other worker's test to end costs that worker's whole test.
                with alone():
                    for other, spec in RUNS.items():
                        if spec.batch == batch and other not in self._done:
                            self._record(other)
            else:
                self._record(name)
        done = self._done[name]
        if isinstance(done, str):
            pytest.fail(done, pytrace=False)
        return done

    def _record(self, name: str) -> None:
        try:
            self._done[name] = record(name, self.root / name)
        except (AssertionError, subprocess.TimeoutExpired) as failure:
            self._done[name] = str(failure)

