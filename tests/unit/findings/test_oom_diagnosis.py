"""Out-of-memory forensics across ranks (analysis.findings.oom_diagnosis) on snapshots built in
the documented format (tracer.schema.MemorySnapshotRecord): the first rank on rank 0's clock,
the live blocks by the script's own allocation site, the allocator's state, the categories of
the last profiler window."""

from __future__ import annotations

from analysis.findings.oom_diagnosis import NO_STACK, allocation_site, oom_diagnosis
from tracer import schema

GIB = 1 << 30
MIB = 1 << 20
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"


def _frames(*sites):
    return [schema.StackFrame(file=f, line=n, function=name) for f, n, name in sites]


ATTENTION = _frames((TORCH, 125, "forward"), ("/home/u/model.py", 88, "attention"),
                    ("/home/u/train.py", 40, "main"))
CACHE = _frames(("/home/u/train.py", 52, "main"))


def _snapshot(rank, step, t_ns, blocks, reason="oom", requested=2 * GIB):
    segment = schema.SnapshotSegment(
        device=0, address=0, total_size=sum(b.size for b in blocks),
        allocated_size=sum(b.size for b in blocks if b.state == "active_allocated"),
        active_size=0, requested_size=0, stream=0, segment_type="large", blocks=blocks)
    oom = schema.OutOfMemory(device=0, requested_bytes=requested,
                             device_allocated_bytes=segment.allocated_size,
                             device_free_bytes=GIB // 2) if reason == "oom" else None
    return schema.MemorySnapshotRecord(rank=rank, step=step, t_ns=t_ns, reason=reason,
                                       segments=[segment], device_total_bytes=80 * GIB,
                                       oom=oom)


def _block(size, frames=(), state="active_allocated"):
    return schema.SnapshotBlock(address=0, size=size, requested_size=size, state=state,
                                frames=list(frames))


def test_the_first_rank_to_run_out_is_found_on_rank_0s_clock():
    blocks = [_block(40 * GIB, ATTENTION), _block(30 * GIB, ATTENTION), _block(6 * GIB, CACHE),
              _block(GIB // 4, state="inactive")]
    # rank 3's clock runs 5 s ahead of rank 0's: its snapshot, 2 s later by its own clock,
    # was taken 3 s before rank 1's
    snapshots = [_snapshot(1, 41, 100 * 10**9, blocks), _snapshot(3, 41, 102 * 10**9, blocks),
                 _snapshot(2, 40, 50 * 10**9, blocks, reason="end")]
    result = oom_diagnosis(snapshots, offsets_ns={1: 0, 3: 5 * 10**9})
    assert (result.first_rank, result.first_step) == (3, 41)
    assert [e["rank"] for e in result.ranks] == [3, 1]  # rank 2 only has an end snapshot
    assert result.lines[0] == ("Out of memory: rank 3 ran out first, at step 41; then rank 1 "
                                  "(step 41, +3.0 s).")
    first = result.ranks[0]
    assert (first["allocated_bytes"], first["reserved_bytes"], first["cached_free_bytes"],
            first["largest_free_block_bytes"]) == (76 * GIB, 76 * GIB + GIB // 4, GIB // 4,
                                                   GIB // 4)
    assert first["top_sites"] == [
        {"site": "/home/u/model.py:88 in attention", "bytes": 70 * GIB, "blocks": 2},
        {"site": "/home/u/train.py:52 in main", "bytes": 6 * GIB, "blocks": 1}]
    assert result.lines[1] == (
        "Rank 3 at step 41: asked 2.00 GiB with 76.00 GiB allocated, 76.25 GiB reserved of "
        "80.00 GiB (0.25 GiB cached free, largest free block 0.25 GiB); held by "
        "/home/u/model.py:88 in attention 70.00 GiB (2 blocks); /home/u/train.py:52 in main "
        "6.00 GiB (1 blocks).")


def test_categories_come_from_the_last_window_before_the_out_of_memory():
    profile = schema.MemoryProfileRecord(
        rank=0, t_ns=1, device="cuda:0", first_step=7, last_step=9, peak_bytes=3 * GIB,
        categories={**dict.fromkeys(schema.MEMORY_CATEGORIES, 0), "activation": 2 * GIB,
                    "parameter": GIB})
    late = schema.MemoryProfileRecord(**{**{f: getattr(profile, f) for f in
                                            profile.__struct_fields__},
                                         "first_step": 50, "last_step": 52})
    result = oom_diagnosis([_snapshot(0, 20, 1, [_block(GIB)])], profiles={0: [late, profile]})
    assert result.ranks[0]["categories_steps"] == [7, 9]
    assert result.lines[1].endswith(
        "At the peak of its profiler window (steps 7-9): activation 2.00 GiB, parameter "
        "1.00 GiB.")


def test_unknown_clock_offsets_are_said_and_blocks_without_stacks_grouped():
    blocks = [_block(GIB), _block(GIB)]
    result = oom_diagnosis([_snapshot(0, 5, 10, blocks), _snapshot(1, 6, 20, blocks)],
                           offsets_ns={0: 0})
    assert "some ranks' clock offsets are unknown" in result.lines[0]
    assert result.ranks[0]["top_sites"] == [{"site": NO_STACK, "bytes": 2 * GIB,
                                                "blocks": 2}]


def test_no_out_of_memory_snapshot_is_no_diagnosis():
    assert oom_diagnosis([]) is None
    assert oom_diagnosis([_snapshot(0, 9, 1, [_block(GIB)], reason="end")]) is None


def test_the_allocation_site_is_the_scripts_innermost_frame():
    assert allocation_site(ATTENTION) == "/home/u/model.py:88 in attention"
    only_torch = _frames((TORCH, 125, "forward"))
    assert allocation_site(only_torch) == f"{TORCH}:125 in forward"
    assert allocation_site([]) == NO_STACK
