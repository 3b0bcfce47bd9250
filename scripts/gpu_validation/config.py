"""What the validation runs, in each mode, and the bars it holds the results to."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES_DEST = REPO / "tests" / "data" / "gpu"

WORKLOADS = ("ddp", "dp", "model_parallel", "pipeline")  # ddp first: it has the most to check
COMM_WORKLOADS = ("ddp", "model_parallel")  # world size 1 still issues collectives here
TRACE_LIMIT_BYTES = 2_000_000  # each gzipped Kineto trace
TAR_LIMIT_BYTES = 16_000_000  # fixtures.tar
# OUTDIR stays small and flat, so that it can be copied off the GPU machine as it is.
OUTDIR_MAX_FILES = 8
OUTDIR_MAX_DEPTH = 3  # OUTDIR/a/b/file
PORTABLE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
SUM_TOLERANCE_NS = 1_000  # the breakdown's parts add up to the step within 1 us
HTA_TOLERANCE = 0.01  # of the rank's kernel time
# The run keeps within --budget; writing the results after the last subprocess may add this.
BUDGET_OVERRUN_S = 30.0
DEFAULT_BUDGET_S = 330.0  # every subprocess timeout is cut to what is left of it
RESERVE_S = 12.0  # kept back for writing the tar files and results
MIN_STEP_S = 15.0  # a subprocess is not started with less time than this left


def settings(gpu: bool, quick: bool) -> dict:
    """Sizes, steps and profiler windows of one mode.

    Traces stay small (1 warm-up + 2 active steps, 4 layers); the GPU runs are long and wide
    enough for NVML's utilisation (averaged over up to 1 s) to rise."""
    if gpu:
        return {
            "model": ["--hidden", "4096", "--layers", "4", "--batch-size", "256"],
            "steps": 100 if quick else 200,
            # 6 DDP buckets per step instead of 22: the comms file stays a small fixture
            "ddp": ["--bucket-cap-mb", "100"],
            "tracer": ["--skip-first", "5", "--wait", "0", "--warmup", "1", "--active", "2",
                       "--windows", "1", "--sample-hz", "20"],
            "trace_timeout": 150.0, "analysis_timeout": 90.0, "hta_timeout": 150.0,
            "overhead_model": ["--hidden", "2048", "--layers", "4", "--batch-size", "128"],
            "overhead_steps": 60 if quick else 120, "overhead_sample_hz": "20",
            "overhead_pairs": 2 if quick else 3, "overhead_discard": 10,
            "overhead_timeout": 120.0,
            "parallel": 1,  # one workload at a time: NVML figures and memory peaks are per run
        }
    return {
        "model": ["--hidden", "64", "--layers", "4", "--batch-size", "32"],
        "steps": 7 if quick else 12,
        "ddp": [],
        "tracer": ["--skip-first", "2", "--wait", "0", "--warmup", "1", "--active", "2",
                   "--windows", "1", "--sample-hz", "10"],
        "trace_timeout": 90.0, "analysis_timeout": 60.0, "hta_timeout": 90.0,
        "overhead_model": ["--hidden", "64", "--layers", "4", "--batch-size", "32"],
        "overhead_steps": 24 if quick else 60, "overhead_sample_hz": "10",
        "overhead_pairs": 1 if quick else 2, "overhead_discard": 4,
        "overhead_timeout": 90.0,
        "parallel": 2,  # the traced runs mostly wait (launcher, rendezvous, start-up)
    }
