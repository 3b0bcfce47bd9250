"""A small 2-stage pipeline run folder, built by hand: each rank's Kineto trace (a profiler window
of steps 2-3, as the tracer's default schedule records) and its records (manifest, steps 0-4, the
p2p ops of every step). Stage 0 computes two microbatches and sends each to stage 1, which waits
in its recv for the first and then computes both."""

from pathlib import Path

from helpers.synthetic import TraceBuilder, trace_name
from helpers.tracer_files import write_jsonl
from tracer import schema

US = 1000  # ns per us
RECORDS_CLOCK_NS = 1_700_000_000_000_000_000  # time.time_ns() of the records; Kineto's is small
STEPS = range(5)  # the tracer's steps 0-4
WINDOW = (2, 3)  # the steps the profiler window holds
STEP_US = 1000
MICROBATCHES = 2
# Per microbatch: stage 0 computes it in [start, send) and sends it at `send`; stage 1 gets it
# at send + 10 us and computes it in [send + 20, send + 290).
SENDS_US = (300, 600)



def _p2p(rank: int, step: int, microbatch: int, base_ns: int) -> schema.CommRecord:
    send_us = SENDS_US[microbatch]
    # The recv is posted at the step's start (or as the last microbatch's compute ends).
    start_us = send_us if rank == 0 else (5 if microbatch == 0 else SENDS_US[0] + 290)
    end_us = send_us + 10
    return schema.CommRecord(
        step=step, op="send" if rank == 0 else "recv", source="p2p", pg="0", pg_size=2,
        dtype="float32", bytes=1 << 20, start_ns=base_ns + start_us * US,
        end_ns=base_ns + end_us * US, duration_us=float(end_us - start_us), timing="host",
        algbw_gbps=0.0, busbw_gbps=0.0, peer=1 - rank,
        position=step * MICROBATCHES + microbatch)


def _records(run: Path, rank: int) -> None:
    start = schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name=run.name, rank=rank,
                            local_rank=rank, world_size=2, host="h", pid=100 + rank,
                            start_ns=RECORDS_CLOCK_NS, argv=[], script="pipeline.py",
                            script_args=[], torch_version="x", config={})
    end = schema.RunEnd(rank=rank, end_ns=RECORDS_CLOCK_NS + len(STEPS) * STEP_US * US,
                        status="ok", exit_code=0, steps=len(STEPS), windows=1, samples=0,
                        comm_ops=len(STEPS) * MICROBATCHES, bytes_written=0, errors=0)
    # One host: the clocks agree (p2p ops alone would not place them).
    sync = schema.ClockSync(rank=rank, offset_ns=0, uncertainty_ns=1_000, round_trips=8,
                            backend="gloo", world_size=2)
    write_jsonl(run / schema.MANIFEST_FILE.format(rank=rank), [start, sync, end])
    steps, ops = [], []
    for n in STEPS:
        base = RECORDS_CLOCK_NS + n * STEP_US * US
        steps.append(schema.StepRecord(step=n, start_ns=base, end_ns=base + STEP_US * US,
                                       in_profiler_window=n in WINDOW))
        ops += [_p2p(rank, n, m, base) for m in range(MICROBATCHES)]
    write_jsonl(run / schema.STEPS_FILE.format(rank=rank), steps)
    write_jsonl(run / schema.COMMS_FILE.format(rank=rank), ops)


def _trace(rank: int) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=2, backend="gloo")
    for n in WINDOW:
        t = n * STEP_US
        b.step(n, t, t + STEP_US)
        for send in SENDS_US:
            if rank == 0:
                b.compute(t + send - 280, t + send, launch_at=t + send - 285)
            else:
                b.compute(t + send + 20, t + send + 290, launch_at=t + send + 15)
    return b


def pipeline_run(folder: Path) -> Path:
    """The run folder, written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        _trace(rank).write(folder / trace_name(rank))
        _records(folder, rank)
    return folder
