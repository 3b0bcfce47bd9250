"""Decoding a trace in chunks gives the whole-file result; cuts the chunked reader cannot make
fall back to a whole-file decode (analysis.ingest.kineto)."""

import json

import pandas as pd
import pytest

from analysis.ingest import kineto, parsed_trace
from analysis.ingest.load import load_path
from helpers.chunks import many_events_trace
from helpers.run_folders import gpu_trace, problems_with, write_run
from helpers.synthetic import TraceBuilder, trace_name

# ---- chunked decoding --------------------------------------------------------------------------


def same_trace(a, b):
    pd.testing.assert_frame_equal(a.events, b.events)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert (a.rank, a.world_size, a.float_timestamps) == (b.rank, b.world_size, b.float_timestamps)


@pytest.mark.parametrize("layout", ["indented", "info_after_events", "one_line"])
def test_chunked_decoding_gives_the_whole_file_result(tmp_path, small_chunks, layout):
    doc = many_events_trace()
    if layout == "info_after_events":
        doc["distributedInfo"] = doc.pop("distributedInfo")  # now in the tail
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=None if layout == "one_line" else 1))
    chunked = parsed_trace.parse_trace(path)
    assert len(small_chunks) > 5  # it really was cut into chunks
    same_trace(chunked, parsed_trace.parse_trace(path, chunked=False))
    assert chunked.rank == 3 and chunked.steps["step"].tolist() == list(range(1, 41))


def test_a_cut_inside_a_string_or_nested_args_falls_back_to_the_whole_file(tmp_path, small_chunks,
                                                                          monkeypatch):
    whole = []
    monkeypatch.setattr(kineto, "_decode_whole",
                        lambda path, columns, *limits, real=kineto._decode_whole:
                        whole.append(path) or real(path, columns, *limits))
    doc = many_events_trace()
    # names and arguments that contain what a cut between events looks for
    # each longer than a chunk, so that some cut must land inside them
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[5]["name"] += ' weird }, { name "},{" ' * 300
    kernels[20]["args"]["nested"] = [{"a": 1}, {"b": 2}] * 300
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    parsed = parsed_trace.parse_trace(path)
    assert whole == [path]  # the chunked read gave up and the file was decoded whole
    same_trace(parsed, parsed_trace.parse_trace(path, chunked=False))
    long_name = ' weird }, { name "},{" ' * 300
    assert any(n.endswith(long_name) for n in parsed.events["name"].astype(str))
    assert parsed.steps["step"].tolist() == list(range(1, 41))


def test_an_event_longer_than_a_chunk_is_read_whole(tmp_path, small_chunks):
    doc = many_events_trace()
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = "k" * 20000  # no place to cut for ten chunks
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    parsed = parsed_trace.parse_trace(path)
    assert len(small_chunks) > 5
    same_trace(parsed, parsed_trace.parse_trace(path, chunked=False))
    assert "k" * 20000 in set(parsed.events["name"].astype(str))


def test_random_bytes_named_gz_are_not_gzip_naming_file_and_rank(tmp_path):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    (run / trace_name(1)).write_bytes(bytes(range(7, 250)) * 40)
    result = load_path(run, use_cache=False)
    assert [t.rank for t in result.ranks] == [0]
    found = problems_with(result, str(run / trace_name(1)), "rank 1", "not gzip")
    assert found and not problems_with(result, "invalid JSON")


def test_chunks_decoded_in_place_keep_each_chunks_arguments_and_first_seen_order(tmp_path,
                                                                                small_chunks):
    b = TraceBuilder(rank=0, world_size=2)
    for n in range(1, 41):
        t = n * 100
        b.step(n, t, t + 100)
        # a collective whose Raw arguments point into the chunk they were decoded from
        b.op("record_param_comms", t + 1, t + 9, args={
            "Collective name": "allreduce", "Input Dims": [[n, 4 * n]], "Input type": ["float"],
            "In msg nelems": 4 * n * n})
        # a name first seen in this step's chunk, and one seen in every chunk
        b.op(f"aten::step_{n}_op", t + 10, t + 20).op("aten::mm", t + 20, t + 30)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(b.document()))
    chunked = parsed_trace.parse_trace(path)
    assert len(small_chunks) > 5
    same_trace(chunked, parsed_trace.parse_trace(path, chunked=False))
    comm = chunked.events[chunked.events["name"] == "record_param_comms"]
    assert comm["input_dims"].tolist() == [f"[[{n}, {4 * n}]]" for n in range(1, 41)]
    assert comm["in_nelems"].tolist() == [4.0 * n * n for n in range(1, 41)]
    ops = [c for c in chunked.events["name"].cat.categories if c.startswith("aten::step_")]
    assert ops == [f"aten::step_{n}_op" for n in range(1, 41)]


def test_a_repeated_step_keeps_its_longest_span_and_steps_come_sorted(tmp_path):
    b = TraceBuilder(rank=0, world_size=1)
    b.step(3, 300, 400).step(1, 100, 150).step(1, 90, 200).step(2, 200, 260)
    b.step(1, 95, 180).step(2, 210, 260)  # step 2 twice with the same end: the first one stays
    b.op("ProfilerStep#1", 100, 900, cat="gpu_user_annotation")  # the GPU-side copy: not a step
    path = tmp_path / "t.json"
    path.write_text(json.dumps(b.document()))
    steps = parsed_trace.parse_trace(path).steps
    assert steps.to_dict("list") == {"step": [1, 2, 3], "start_ns": [90_000, 200_000, 300_000],
                                     "end_ns": [200_000, 260_000, 400_000]}
    assert list(steps.index) == [0, 1, 2] and (steps.dtypes == "int64").all()
