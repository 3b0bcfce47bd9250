"""The trace contract's bandwidth definitions: nccl-tests' bus factors, by hand."""

import pytest

from tracer import schema


@pytest.mark.parametrize("op, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875), ("all_to_all", 2, 0.5),
    ("gather", 4, 0.75), ("scatter", 4, 0.75),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send", 2, 1.0), ("recv", 2, 1.0),
    ("barrier", 8, 0.0), ("all_reduce", 1, 0.0),
])
def test_bus_factor_is_nccl_tests(op, n, factor):
    assert schema.bus_factor(op, n) == pytest.approx(factor)


def test_bandwidth_is_bytes_over_seconds_in_gb_per_s():
    # 1 GB all-reduced over 4 ranks in 0.5 s: algbw 2 GB/s, busbw 2 * 2(4-1)/4 = 3 GB/s.
    assert schema.bandwidth_gbps("all_reduce", 10**9, 4, 0.5) == pytest.approx((2.0, 3.0))
    assert schema.bandwidth_gbps("all_reduce", 10**9, 4, 0.0) == (0.0, 0.0)
    assert schema.bandwidth_gbps("send", 0, 2, 1.0) == (0.0, 0.0)


def test_every_op_and_file_name_is_stable():
    assert schema.kineto_trace_file(3, 12) == "rank3.12.pt.trace.json.gz"
    match = schema.KINETO_TRACE_RE.match("rank3.12.pt.trace.json.gz")
    assert match and match["worker"] == "rank3" and match["span"] == "12"
    assert set(schema.COMM_OPS) >= {"all_reduce", "all_gather", "reduce_scatter", "send", "recv"}


def test_record_files_and_trace_suffixes_name_what_the_tracer_writes():
    names = [pattern.format(rank=2) for pattern in schema.RECORD_FILES]
    assert names == ["rank2.manifest.jsonl", "rank2.steps.jsonl", "rank2.comms.jsonl",
                     "rank2.samples.jsonl"]
    trace = schema.kineto_trace_file(2, 5)
    assert trace.endswith(schema.TRACE_SUFFIXES) and not any(
        n.endswith(schema.TRACE_SUFFIXES) for n in names)
    assert [s for s in schema.TRACE_SUFFIXES if schema.KINETO_TRACE_RE.match("rank2.5.pt.trace" + s)
            ] == list(schema.TRACE_SUFFIXES)


def test_a_step_record_carries_samples_only_when_given():
    plain = schema.StepRecord(step=0, start_ns=1, end_ns=2)
    assert b"samples" not in schema.ENCODER.encode(plain)
    given = schema.decoder(schema.StepRecord).decode(
        schema.ENCODER.encode(schema.StepRecord(step=0, start_ns=1, end_ns=2, samples=256)))
    assert given.samples == 256


def test_run_start_says_where_ddp_buckets_are_seen_and_older_files_still_read():
    fields = dict(schema_version=1, run_name="r", rank=0, local_rank=0, world_size=1, host="h",
                  pid=1, start_ns=0, argv=[], script="s.py", script_args=[], torch_version="2",
                  config={})
    written = schema.ENCODER.encode(schema.RunStart(**fields, ddp_buckets="comm hook"))
    read = schema.decoder(schema.ManifestRecord).decode(written)
    assert read.ddp_buckets == schema.DDP_BUCKETS_FROM_HOOK == "comm hook"
    older = schema.ENCODER.encode(schema.RunStart(**fields)).replace(b',"ddp_buckets":null', b"")
    assert b"ddp_buckets" not in older
    assert schema.decoder(schema.ManifestRecord).decode(older).ddp_buckets is None


def test_the_capture_and_problem_records_are_described_field_by_field():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "trace-format.md").read_text()
    for record_type in (schema.CaptureRecord, schema.TracerProblem, schema.CaptureRequest,
                        schema.CaptureAsk):
        for field in record_type.__struct_fields__:
            assert f"`{field}`" in doc, f"{record_type.__name__}.{field} is not in the doc"
    for field in schema.RankChange.__struct_fields__:
        assert f"`{field}`" in doc.split("| `ranks` | list |")[1].split("\n")[0]
    assert f"`{schema.WINDOW_CUT_METADATA}`" in doc
    # A manifest line of every kind decodes as one, the new ones too.
    problem = schema.TracerProblem(rank=1, t_ns=2, part="capture", message="m")
    line = schema.ENCODER.encode(problem)
    assert b'"kind":"problem"' in line
    assert schema.decoder(schema.ManifestRecord).decode(line) == problem
