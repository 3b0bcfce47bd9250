"""The arguments a FLOP count reads, kept by the trace decoder in the events frame's `op_args`
for the ops the perf model knows only (analysis.ingest.kineto, .op_args): read from a
parsed trace and from its Parquet cache alike, with no second read of the file."""

import json

import pandas as pd

from analysis.ingest import op_args
from analysis.ingest.cache import read_trace
from analysis.ingest.parsed_trace import parse_trace
from helpers.synthetic import TraceBuilder, trace_name

MM_ARGS = {"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"],
           "Concrete Inputs": ["", ""], "flops": 128}


def _trace(tmp_path):
    b = TraceBuilder(rank=0)
    b.step(1, 0, 100)
    b.op("aten::mm", 10, 20, args=MM_ARGS)
    b.op("aten::mm", 30, 40, args=MM_ARGS)  # the same arguments: one text
    b.op("aten::view", 12, 13, args={"Input Dims": [[4, 8], []]})  # not modelled
    b.op("aten::add_", 50, 60, tid=2, args={"Input Dims": [[4], [4], []]})
    b.op("aten::linear", 61, 62)  # modelled, no arguments at all
    b.annotation("aten::mm", 70, 71, args=MM_ARGS)  # not a cpu_op
    return b.write(tmp_path / "run" / trace_name(0))


def test_only_the_modelled_host_ops_keep_their_arguments(tmp_path):
    events = parse_trace(_trace(tmp_path)).events
    kept = events[events["op_args"].notna()]
    assert kept["name"].astype(str).tolist() == ["aten::mm", "aten::mm", "aten::add_",
                                                 "aten::linear"]
    first, second, add, linear = kept["op_args"].tolist()
    assert first is second  # one str per distinct text
    assert json.loads(first) == [MM_ARGS["Input Dims"], MM_ARGS["Input type"],
                                 MM_ARGS["Concrete Inputs"], 128]
    assert json.loads(add) == [[[4], [4], []], None, None, None]
    assert json.loads(linear) == [None, None, None, None]


def test_the_ops_read_from_the_events_and_from_the_cache_are_the_same(tmp_path):
    path = _trace(tmp_path)
    ops = op_args.ops_of_events(parse_trace(path).events)
    assert ops["name"].tolist() == ["aten::mm", "aten::mm", "aten::linear", "aten::add_"]
    assert ops["tid"].tolist() == ["1", "1", "1", "2"]
    assert ops["ts_ns"].tolist() == [10_000, 30_000, 61_000, 50_000]
    assert ops["flops"].tolist()[:2] == [128.0, 128.0]
    assert ops["input_dims"].iloc[3] == [[4], [4], []] and ops["input_type"].iloc[3] is None
    assert ops["input_dims"].iloc[2] is None
    read_trace(path)  # writes the cache
    cached = read_trace(path)
    pd.testing.assert_frame_equal(op_args.ops_of_events(cached.events), ops)
    pd.testing.assert_frame_equal(op_args.read_ops([path]), ops)
