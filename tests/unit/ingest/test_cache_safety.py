"""The Parquet cache beside a trace (analysis.ingest.cache) costs no more than the trace: an
entry's key and size are read from its footer before its data, and the cache folder is never
written through a symbolic link."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.ingest import cache
from analysis.ingest.runs import CACHE_DIR, cache_file
from helpers.synthetic import TraceBuilder, trace_name

MB = 1 << 20


def _trace(folder):
    folder.mkdir(parents=True, exist_ok=True)
    builder = TraceBuilder(rank=0, world_size=1)
    for n in (1, 2):
        builder.step(n, n * 100, n * 100 + 90).compute(n * 100 + 10, n * 100 + 50)
    return builder.write(folder / trace_name(0))


def _hostile_entry(trace, rows: int):
    """A cache entry with the trace's own key whose one column decompresses to 8 bytes a row
    (a few kB on disk for millions of rows)."""
    meta = {"key": cache._cache_key(trace), "rank": 0, "world_size": 1, "backend": None,
            "float_timestamps": False, "problems": [], "process_groups": [],
            "steps": {"step": [], "start_ns": [], "end_ns": []}}
    table = pa.table({"ts_ns": pa.array([7] * rows, type=pa.int64())})
    table = table.replace_schema_metadata({b"ranktrace": json.dumps(meta).encode()})
    entry = cache_file(trace)
    entry.parent.mkdir(exist_ok=True)
    pq.write_table(table, entry, compression="zstd")
    return entry


def test_an_entry_larger_than_the_trace_limit_is_ignored_unread(tmp_path, monkeypatch):
    trace = _trace(tmp_path / "run")
    entry = _hostile_entry(trace, rows=8 * MB)  # 64 MB once read, twice the 16 MB limit and more
    assert entry.stat().st_size < MB
    monkeypatch.setenv("RANKTRACE_MAX_TRACE_MB", "16")
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("data was read"))
    assert cache.read_cache(trace) is None


def test_a_footer_that_claims_more_than_the_limit_is_not_read(tmp_path, monkeypatch):
    trace = _trace(tmp_path / "run")
    entry = _hostile_entry(trace, rows=10)
    data = bytearray(entry.read_bytes())
    data[-8:-4] = (cache.MAX_FOOTER_BYTES + 1).to_bytes(4, "little")
    entry.write_bytes(bytes(data))
    monkeypatch.setattr(pq, "ParquetFile", lambda *a, **k: pytest.fail("the footer was read"))
    assert cache.read_cache(trace) is None


def test_the_trace_is_parsed_when_its_entry_is_ignored(tmp_path, monkeypatch):
    trace = _trace(tmp_path / "run")
    _hostile_entry(trace, rows=8 * MB)
    monkeypatch.setenv("RANKTRACE_MAX_TRACE_MB", "16")
    parsed = cache.read_trace(trace)
    assert parsed.steps["step"].tolist() == [1, 2]
    assert len(parsed.events) > 0


def test_a_linked_cache_folder_is_neither_written_nor_read(tmp_path):
    trace = _trace(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (trace.parent / CACHE_DIR).symlink_to(elsewhere, target_is_directory=True)
    parsed = cache.read_trace(trace)
    assert parsed.steps["step"].tolist() == [1, 2]
    assert list(elsewhere.iterdir()) == []
    assert cache.read_cache(trace) is None


def test_a_planted_link_at_the_temporary_name_is_not_written_through(tmp_path):
    trace = _trace(tmp_path / "run")
    folder = trace.parent / CACHE_DIR
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    import os
    planted = folder / f"{trace.name}.parquet.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    cache.read_trace(trace)
    assert victim.read_text() == "untouched"
    assert not cache_file(trace).exists()


def test_an_entry_within_the_limits_is_used(tmp_path):
    trace = _trace(tmp_path / "run")
    cold = cache.read_trace(trace)
    warm = cache.read_cache(trace)
    assert warm is not None
    assert warm.events["ts_ns"].tolist() == cold.events["ts_ns"].tolist()
