"""The limit on one trace file's JSON (RANKTRACE_MAX_TRACE_MB, analysis.ingest.kineto): a file over
it
is refused with its size, the limit and what to do; the other ranks are still analysed."""

import gzip
import json

import pytest
from test_load import gpu_trace, problems_with, write_run
from test_load_chunks import many_events_trace
from test_load_chunks import small_chunks as small_chunks  # a fixture the tests below use

from analysis import breakdown as cli
from analysis.ingest import kineto, parsed_trace
from analysis.ingest.load import load_path
from synthetic import trace_name

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
