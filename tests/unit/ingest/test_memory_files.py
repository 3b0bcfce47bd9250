"""Reading the memory profiles and the CUDA snapshot records (analysis.ingest.memory_files) from
files written through tracer.schema, and from damaged and hostile ones: each problem names the
file, the rank and what is wrong, in bounded time and memory, and the rest is read."""

from __future__ import annotations

import pytest

from analysis.ingest.memory_files import read_memory_profiles, read_snapshots
from tracer import schema

MIB = 1 << 20


def _profile(rank=0, **changes):
    categories = {**dict.fromkeys(schema.MEMORY_CATEGORIES, 0), "parameter": 4 * MIB,
                  "activation": MIB}
    fields = {"rank": rank, "t_ns": 10**18, "device": "cpu", "first_step": 7, "last_step": 9,
              "peak_bytes": 5 * MIB, "categories": categories, "peak_step": 8, **changes}
    return schema.MemoryProfileRecord(**fields)


def _write_profiles(folder, rank, lines):
    path = folder / schema.MEMORY_PROFILE_FILE.format(rank=rank)
    path.write_bytes(b"".join(line if isinstance(line, bytes) else
                              schema.ENCODER.encode(line) + b"\n" for line in lines))
    return path


def test_memory_profiles_are_read_and_bad_ones_set_aside_by_name(tmp_path):
    good = _profile()
    path = _write_profiles(tmp_path, 0, [
        good, _profile(peak_bytes=-1), _profile(rank=3),
        _profile(categories={**good.categories, "weights": 1}),
        _profile(device="tpu:0"), b'{"rank": 0, "t_ns": "soon"}\n', good])
    records, problems = read_memory_profiles(tmp_path, 0)
    assert records == [good, good]
    assert problems == [
        f"{path}: rank 0: line 6 skipped (Expected `int`, got `str` - at `$.t_ns`)",
        f"{path}: rank 0: memory profile 2 set aside ('peak_bytes' out of range (-1))",
        f"{path}: rank 0: memory profile 3 set aside (rank 3 in the file of rank 0)",
        f"{path}: rank 0: memory profile 4 set aside (unknown categories 'weights')",
        f"{path}: rank 0: memory profile 5 set aside (unknown device 'tpu:0')"]
    assert read_memory_profiles(tmp_path, 1) == ([], [])  # no file: nothing, no problem


def test_profiles_whose_categories_do_not_add_up_are_set_aside(tmp_path):
    _write_profiles(tmp_path, 2, [_profile(rank=2, peak_bytes=6 * MIB)])
    records, problems = read_memory_profiles(tmp_path, 2)
    assert records == [] and "categories that do not sum to 'peak_bytes'" in problems[0]


def _snapshot(rank=1, step=41, **changes):
    block = schema.SnapshotBlock(address=1, size=2 * MIB, requested_size=2 * MIB - 3,
                                 state="active_allocated",
                                 frames=[schema.StackFrame("/home/u/train.py", 40, "main")])
    segment = schema.SnapshotSegment(device=0, address=1, total_size=2 * MIB,
                                     allocated_size=2 * MIB, active_size=2 * MIB,
                                     requested_size=2 * MIB - 3, stream=0,
                                     segment_type="large", blocks=[block])
    fields = {"rank": rank, "step": step, "t_ns": 10**18, "reason": "oom",
              "segments": [segment], "device_total_bytes": 80 << 30, **changes}
    return schema.MemorySnapshotRecord(**fields)


def _write_snapshot(folder, rank, step, content):
    path = folder / schema.MEMORY_SNAPSHOT_RECORD_FILE.format(rank=rank, step=step)
    path.write_bytes(content if isinstance(content, bytes)
                     else schema.ENCODER.encode(content) + b"\n")
    return path


def test_snapshot_records_are_read_without_the_pickles(tmp_path):
    good = _snapshot()
    _write_snapshot(tmp_path, 1, 41, good)
    # The pickle beside it is never opened: one that would run code if unpickled stays shut
    (tmp_path / "rank1.step41.memory_snapshot.pickle").write_bytes(
        b"cos\nsystem\n(S'touch pwned'\ntR.")
    records, problems = read_snapshots(tmp_path)
    assert records == [good] and problems == []
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("content, why", [
    (b'{"rank": 1, "step": 41', "memory snapshot not read (Input data was truncated)"),
    (b"[" * 100_000 + b"]" * 100_000, "memory snapshot not read ("),
    (_snapshot(rank=2), "it says rank 2, step 41: not the rank and step of its file name"),
    (_snapshot(reason="later"), "unknown reason 'later'"),
    (_snapshot(device_total_bytes=1 << 60), "'device_total_bytes' out of range"),
    (_snapshot(t_ns=-5), "'t_ns' out of range (-5)"),
], ids=["cut short", "nested 100000 deep", "another rank's", "unknown reason", "huge device",
        "negative time"])
def test_damaged_or_hostile_snapshots_are_set_aside_with_a_named_problem(tmp_path, content,
                                                                          why):
    path = _write_snapshot(tmp_path, 1, 41, content)
    _write_snapshot(tmp_path, 0, 40, _snapshot(rank=0, step=40))
    records, problems = read_snapshots(tmp_path)
    assert [(r.rank, r.step) for r in records] == [(0, 40)]  # the other snapshot is read
    assert len(problems) == 1 and problems[0].startswith(f"{path}: rank 1: ")
    assert why in problems[0]


def test_a_block_with_an_unknown_state_or_a_size_out_of_range_sets_the_snapshot_aside(tmp_path):
    record = _snapshot()
    record.segments[0].blocks[0].state = "borrowed"
    _write_snapshot(tmp_path, 1, 41, record)
    assert "a block's unknown state 'borrowed'" in read_snapshots(tmp_path)[1][0]
    record.segments[0].blocks[0].state = "inactive"
    record.segments[0].total_size = 1 << 62
    _write_snapshot(tmp_path, 1, 41, record)
    assert "a segment's 'total_size' out of range" in read_snapshots(tmp_path)[1][0]


def test_a_snapshot_over_the_size_limit_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKTRACE_MAX_TRACE_MB", "1")  # a record file may hold a quarter
    path = _write_snapshot(tmp_path, 1, 41, b" " * (300 << 10) + schema.ENCODER.encode(
        _snapshot()))
    records, problems = read_snapshots(tmp_path)
    assert records == [] and problems == [
        f"{path}: rank 1: memory snapshot too large to read: 0.3 MB, over the limit of 0.25 MB "
        f"for a record file; not read"]
