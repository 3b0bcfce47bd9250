"""A rank whose comm records lack ops its profiled window shows (a DDP run traced without the
bucket hook and without Flight Recorder records): the window's steps are read from the trace,
every op of them, the other steps from the records, so the window's bucket all-reduces are not
lost and no op counts twice (docs/cross-rank.md, "Ops")."""

from pathlib import Path

from analysis.run.analysed_run import analyse_run
from analysis.run.loading import load_run_path
from helpers.synthetic import TraceBuilder, trace_name
from helpers.tracer_files import write_jsonl
from tracer import schema

US = 1000
RECORDS_CLOCK_NS = 1_700_000_000_000_000_000
STEPS = (1, 2, 3, 4)
WINDOW = (2, 3)
STEP_US = 1000



def _run(folder: Path, ddp_buckets: str) -> Path:
    """Two GPU ranks: each step the script broadcasts 4 bytes of its own (recorded, 50-60 us),
    and DDP all-reduces one bucket (the kernel at 600-700 us, in the window's trace only)."""
    folder.mkdir(parents=True)
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        for n in WINDOW:
            t = (n - 1) * STEP_US
            b.step(n, t, t + STEP_US).compute(t + 10, t + 40, launch_at=t + 5)
            b.nccl(t + 600, t + 700, launch_at=t + 590)
        b.write(folder / trace_name(rank))
        start = schema.RunStart(
            schema_version=schema.SCHEMA_VERSION, run_name=folder.name, rank=rank,
            local_rank=rank, world_size=2, host="h", pid=1, start_ns=0, argv=[], script="s.py",
            script_args=[], torch_version="x", config={}, ddp_buckets=ddp_buckets)
        end = schema.RunEnd(rank=rank, end_ns=1, status="ok", exit_code=0, steps=len(STEPS),
                            windows=1, samples=0, comm_ops=len(STEPS), bytes_written=0,
                            errors=0)
        sync = schema.ClockSync(rank=rank, offset_ns=0, uncertainty_ns=1_000, round_trips=8,
                                backend="nccl", world_size=2)
        write_jsonl(folder / schema.MANIFEST_FILE.format(rank=rank), [start, sync, end])
        steps, ops = [], []
        for n in STEPS:
            base = RECORDS_CLOCK_NS + (n - 1) * STEP_US * US
            steps.append(schema.StepRecord(step=n, start_ns=base, end_ns=base + STEP_US * US,
                                           in_profiler_window=n in WINDOW))
            ops.append(schema.CommRecord(
                step=n, op="broadcast", source="c10d", pg="0", pg_size=2, dtype="float32",
                bytes=4, start_ns=base + 50 * US, end_ns=base + 60 * US, duration_us=10.0,
                timing="host", algbw_gbps=0.0, busbw_gbps=0.0))
        write_jsonl(folder / schema.STEPS_FILE.format(rank=rank), steps)
        write_jsonl(folder / schema.COMMS_FILE.format(rank=rank), ops)
    return folder


def _cross(folder: Path) -> dict:
    loaded = load_run_path(folder, None, use_cache=False)
    report = analyse_run(loaded, name=folder.name, path=str(folder))
    assert report.problems == []
    return report.cross_rank


def test_the_windows_steps_come_from_the_trace_and_the_others_from_the_records(tmp_path):
    cross = _cross(_run(tmp_path / "run", schema.DDP_BUCKETS_FROM_PROFILER))
    ops = cross.ops
    by_step = ops.groupby("step")["op"].agg(lambda o: sorted(set(o))).to_dict()
    assert by_step == {1: ["broadcast"], 2: ["all_reduce"], 3: ["all_reduce"],
                       4: ["broadcast"]}
    # Each matched op once per rank: two members per instance, nothing doubled.
    assert ops.groupby("instance").size().tolist() == [2] * 4
    assert cross.mismatches.empty
    assert sorted(cross.waits["step"].unique()) == list(STEPS)


def test_records_with_the_buckets_are_read_alone(tmp_path):
    # With the DDP hook the records hold every bucket: the window adds nothing.
    cross = _cross(_run(tmp_path / "run", schema.DDP_BUCKETS_FROM_HOOK))
    assert set(cross.ops["op"]) == {"broadcast"}
    assert sorted(cross.ops["step"].unique()) == list(STEPS)
