"""A hand-built run of two GPU ranks whose cross-rank answers are known exactly: rank 1 is late
to every all-reduce (tests/unit/crossrank/test_crossrank_in_the_run.py,
tests/unit/run/test_critical_path_in_the_run.py; docs/cross-rank.md, docs/critical-path.md)."""

from pathlib import Path

from helpers.synthetic import TraceBuilder, trace_name
from helpers.tracer_files import write_jsonl
from tracer import schema

US = 1000  # ns per us
RECORDS_CLOCK_NS = 1_700_000_000_000_000_000  # time.time_ns() of the records; Kineto's is small
STEPS = (1, 2, 3)
STEP_US = 1000
LATE_US = 590  # rank 1 reaches each all-reduce 590 us into the step, rank 0 at 100 us
AHEAD_NS = 5_000_000  # rank 1's time.time_ns() runs 5 ms ahead of rank 0's (its clock_sync)


def _records(run: Path, rank: int, issue_us: int, comms: bool, setup: bool) -> None:
    start = schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name=run.name, rank=rank,
                            local_rank=rank, world_size=2, host="h", pid=1, start_ns=0, argv=[],
                            script="s.py", script_args=[], torch_version="x", config={})
    ahead = AHEAD_NS if rank else 0
    sync = schema.ClockSync(rank=rank, offset_ns=ahead, uncertainty_ns=0, round_trips=1)
    end = schema.RunEnd(rank=rank, end_ns=1, status="ok", exit_code=0, steps=len(STEPS),
                        windows=1, samples=0, comm_ops=len(STEPS), bytes_written=0, errors=0)
    write_jsonl(run / schema.MANIFEST_FILE.format(rank=rank), [start, sync, end])
    steps, ops = [], []
    if setup:  # DDP's first broadcast, 2 ms before the first step: set-up
        base = RECORDS_CLOCK_NS + ahead - 2 * STEP_US * US
        ops.append(schema.CommRecord(
            step=0, op="broadcast", source="ddp", pg="0", pg_size=2, dtype="float32",
            bytes=1 << 22, start_ns=base, end_ns=base + 400 * US, duration_us=400.0,
            timing="host", algbw_gbps=0.0, busbw_gbps=0.0))
    for n in STEPS:
        base = RECORDS_CLOCK_NS + ahead + (n - 1) * STEP_US * US
        steps.append(schema.StepRecord(step=n, start_ns=base, end_ns=base + STEP_US * US))
        ops.append(schema.CommRecord(
            step=n, op="all_reduce", source="ddp", pg="0", pg_size=2, dtype="float32",
            bytes=1 << 20, start_ns=base + issue_us * US, end_ns=base + 700 * US,
            duration_us=700.0 - issue_us, timing="host", algbw_gbps=0.0, busbw_gbps=0.0))
    write_jsonl(run / schema.STEPS_FILE.format(rank=rank), steps)
    if comms:
        write_jsonl(run / schema.COMMS_FILE.format(rank=rank), ops)


def late_rank_run(folder: Path, comms: bool = True, setup: bool = False) -> Path:
    """Two GPU ranks on one host (one Kineto clock; rank 1's records clock 5 ms ahead), 1 ms
    steps: rank 1 computes until 590 us into each step, rank 0 until 100 us, each issuing its
    all-reduce then; the all-reduce kernel runs 600-700 us (110 us of transfer after rank 1
    arrived), the step ends at 1000 us. So rank 0 waits 490 us per step, and the critical path
    is rank 1's 590 us of work, the transfer and 300 us of rank 0's work after it.

    `comms` False: no comms records (Kineto only); `setup`: DDP's first broadcast as a comm
    record 2 ms before step 1."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        busy_until = LATE_US if rank else 100
        for n in STEPS:
            t = (n - 1) * STEP_US
            b.step(n, t, t + STEP_US).compute(t + 10, t + busy_until, launch_at=t + 5)
            b.nccl(t + 600, t + 700, launch_at=t + busy_until)
        b.write(folder / trace_name(rank))
        _records(folder, rank, issue_us=busy_until, comms=comms, setup=setup)
    return folder
