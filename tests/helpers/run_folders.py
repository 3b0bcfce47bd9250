"""Run folders written for the ingest tests: a GPU trace per rank, the tracer's records, a
killed rank."""

from pathlib import Path

from helpers.synthetic import TraceBuilder, trace_name
from tracer import schema


def gpu_trace(rank=0, world_size=2, steps=(1, 2, 3)) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=world_size)
    for n in steps:
        start = (n - 1) * 100
        b.step(n, start, start + 100).compute(start + 10, start + 40).nccl(start + 30, start + 60)
    b.op("record_param_comms", 5, 6, args={
        "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0"})
    b.annotation("gloo:all_reduce", 7, 9, tid=2, args={"Input Dims": [[1024]],
                                                         "Input type": ["float"]})
    return b


def write_run(folder: Path, builders) -> Path:
    for b in builders:
        b.write(folder / trace_name(b.rank))
    return folder


def problems_with(result, *words) -> list[str]:
    return [p for p in result.problems if all(w in p for w in words)]


def write_records(run: Path, rank: int, schema_version=schema.SCHEMA_VERSION, crashed=False):
    start = schema.RunStart(schema_version=schema_version, run_name=run.name, rank=rank,
                            local_rank=rank, world_size=2, host="h", pid=1, start_ns=0, argv=[],
                            script="s.py", script_args=[], torch_version="x", config={})
    lines = [start, schema.TracerError(rank=rank, t_ns=1, part="sampler", message="no NVML")]
    if not crashed:
        lines.append(schema.RunEnd(rank=rank, end_ns=2, status="ok", exit_code=0, steps=3,
                                   windows=1, samples=0, comm_ops=1, bytes_written=0, errors=1))
    manifest = b"".join(schema.ENCODER.encode(r) + b"\n" for r in lines)
    (run / schema.MANIFEST_FILE.format(rank=rank)).write_bytes(manifest)
    comm = schema.CommRecord(step=1, op="all_reduce", source="ddp", pg="0", pg_size=2,
                             dtype="float32", bytes=4096, start_ns=10, end_ns=20,
                             duration_us=0.01, timing="host", algbw_gbps=1.0, busbw_gbps=1.0)
    comms = schema.ENCODER.encode(comm) + b"\n" + schema.ENCODER.encode(comm)[:-5]
    suffix = schema.TEMP_SUFFIX if crashed else ""
    (run / (schema.COMMS_FILE.format(rank=rank) + suffix)).write_bytes(comms)
    step = schema.StepRecord(step=1, start_ns=0, end_ns=5, rss_bytes=123)
    (run / schema.STEPS_FILE.format(rank=rank)).write_bytes(schema.ENCODER.encode(step) + b"\n")


def write_killed_rank(run: Path, rank: int, steps: int = 5, world_size: int = 2) -> None:
    """What a SIGKILLed rank leaves: .tmp record files cut mid-line, a manifest without run_end,
    no Kineto trace."""
    start = schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name=run.name, rank=rank,
                            local_rank=rank, world_size=world_size, host="h", pid=1, start_ns=0,
                            argv=[], script="s.py", script_args=[], torch_version="x", config={})
    suffix = schema.TEMP_SUFFIX
    (run / (schema.MANIFEST_FILE.format(rank=rank) + suffix)).write_bytes(
        schema.ENCODER.encode(start) + b"\n")
    records = [schema.ENCODER.encode(schema.StepRecord(step=n, start_ns=n * 100,
                                                       end_ns=n * 100 + 90, rss_bytes=1000 + n))
               for n in range(steps + 1)]
    (run / (schema.STEPS_FILE.format(rank=rank) + suffix)).write_bytes(
        b"".join(r + b"\n" for r in records[:-1]) + records[-1][:-7])
    comm = schema.CommRecord(step=0, op="all_reduce", source="ddp", pg="0", pg_size=world_size,
                             dtype="float32", bytes=4096, start_ns=10, end_ns=20,
                             duration_us=10.0, timing="host", algbw_gbps=0.4096,
                             busbw_gbps=0.4096)
    (run / (schema.COMMS_FILE.format(rank=rank) + suffix)).write_bytes(
        schema.ENCODER.encode(comm) + b"\n")
