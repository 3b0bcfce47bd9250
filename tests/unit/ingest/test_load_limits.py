"""The limit on one trace file's JSON (RANKTRACE_MAX_TRACE_MB, analysis.ingest.kineto): a file over
it
is refused with its size, the limit and what to do; the other ranks are still analysed."""

import gzip
import json

import pytest

from analysis import breakdown as cli
from analysis.ingest import kineto, parsed_trace
from analysis.ingest.load import load_path
from helpers.chunks import many_events_trace
from helpers.run_folders import gpu_trace, problems_with, write_run
from helpers.synthetic import trace_name

MB = 1 << 20


def _limit_mb(nbytes: float) -> str:
    return f"{nbytes / MB:.6f}"


def _big_and_small_run(tmp_path):
    """rank 0: a small trace; rank 1: one of about 12 times its JSON (both gzipped)."""
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    big = many_events_trace()
    big["distributedInfo"] = {"rank": 1, "world_size": 2}
    (run / trace_name(1)).write_bytes(gzip.compress(json.dumps(big).encode()))
    small_json = len(gzip.decompress((run / trace_name(0)).read_bytes()))
    big_json = len(json.dumps(big).encode())
    assert big_json > 10 * small_json
    return run, small_json, big_json


def test_a_gzipped_trace_over_the_limit_is_refused_and_the_other_ranks_analysed(tmp_path,
                                                                                monkeypatch):
    run, small_json, big_json = _big_and_small_run(tmp_path)
    limit = 2 * small_json
    monkeypatch.setenv("RANKTRACE_MAX_TRACE_MB", _limit_mb(limit))
    result = load_path(run, use_cache=False)
    assert [r.rank for r in result.ranks] == [0]
    assert len(result.ranks[0].steps) == 3
    shown = f"{int(float(_limit_mb(limit)) * MB) / MB:g}"
    found = problems_with(result, str(run / trace_name(1)), "rank 1", "too large",
                          f"more than {shown} MB", "gzipped", f"limit of {shown} MB",
                          "RANKTRACE_MAX_TRACE_MB", "shorter profiler window")
    assert len(found) == 1, result.problems
    monkeypatch.setenv("RANKTRACE_MAX_TRACE_MB", _limit_mb(2 * big_json))
    assert [r.rank for r in load_path(run, use_cache=False).ranks] == [0, 1]


def test_a_plain_trace_over_the_limit_is_refused_with_its_size(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(many_events_trace()))
    size = path.stat().st_size
    with pytest.raises(kineto.TraceReadError) as refused:
        parsed_trace.parse_trace(path, max_bytes=size - 1)
    assert size < MB and f"{size / MB:.3g} MB of JSON" in str(refused.value)
    assert str(path) in str(refused.value)
    assert len(parsed_trace.parse_trace(path, max_bytes=size).steps) == 40


@pytest.mark.usefixtures("small_chunks")
def test_a_trace_that_must_be_decoded_whole_has_a_quarter_of_the_limit(tmp_path):
    doc = many_events_trace()
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] += ' }, { "},{" ' * 400  # longer than a chunk: some cut lands inside it
    path = tmp_path / "t.json.gz"
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data))
    with pytest.raises(kineto.TraceReadError) as refused:
        parsed_trace.parse_trace(path, max_bytes=2 * len(data))
    assert "decoded whole" in str(refused.value) and "1/4 of" in str(refused.value)
    assert len(parsed_trace.parse_trace(path, max_bytes=4 * len(data)).steps) == 40


@pytest.mark.parametrize("value", ["lots", "0", "-5", "inf"])
def test_a_bad_limit_is_a_usage_error_naming_the_variable(tmp_path, monkeypatch, capsys, value):
    run = write_run(tmp_path / "run", [gpu_trace(rank=0)])
    monkeypatch.setenv("RANKTRACE_MAX_TRACE_MB", value)
    with pytest.raises(SystemExit) as exited:
        cli.main([str(run), "--no-cache"])
    assert exited.value.code == 2
    assert f"RANKTRACE_MAX_TRACE_MB='{value}': not a positive number of MB" in \
        capsys.readouterr().err


def _event(ts: int) -> bytes:
    return json.dumps({"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": ts, "dur": 2,
                       "pid": 1, "tid": 1}).encode()


def test_white_space_padding_between_events_is_read_in_linear_time(tmp_path):
    # 64 MB of spaces on both sides of each comma: the reader once rescanned the growing buffer
    # for a cut on every read (100 MB took 16.6 s); read linearly it takes well under a second.
    import time

    pad = b" " * (32 * MB)
    events = [_event(ts) for ts in (10, 20, 30)]
    padded = tmp_path / "padded.json"
    padded.write_bytes(b'{"traceEvents":[' + (pad + b"," + pad).join(events) + b"]}")
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"traceEvents":[' + b",".join(events) + b"]}")
    started = time.perf_counter()
    read = parsed_trace.parse_trace(padded)
    seconds = time.perf_counter() - started
    assert read.events["ts_ns"].tolist() == parsed_trace.parse_trace(plain).events["ts_ns"].tolist()
    assert read.events["ts_ns"].tolist() == [10_000, 20_000, 30_000]
    assert seconds < 5, f"64 MB of padding took {seconds:.1f} s"


def test_a_gzip_bomb_in_one_string_is_refused_once_a_quarter_of_the_limit_is_read(tmp_path):
    # 128 MB of one string (a few hundred kB gzipped) under a 32 MB limit: no place to cut it, so
    # it is refused as soon as a file decoded whole could not hold it, not after the whole file.
    import time

    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb") as handle:
        handle.write(b'{"traceEvents":[{"ph":"X","name":"')
        for _ in range(32):
            handle.write(b"a" * (4 * MB))
        handle.write(b'","ts":1,"dur":1}]}')
    started = time.perf_counter()
    with pytest.raises(kineto.TraceReadError) as refused:
        kineto.decode_trace(bomb, max_bytes=32 * MB)
    seconds = time.perf_counter() - started
    assert "too large to analyse: more than 8.2 MB of JSON with no place between two events" \
        in refused.value.reason
    assert "over the limit of 32 MB, of which one event may hold 1/4" in refused.value.reason
    assert seconds < 5, f"refused after {seconds:.1f} s"
