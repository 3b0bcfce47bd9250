"""torch.cuda.memory._snapshot() as a MemorySnapshotRecord: the segments, blocks and Python
frames of the allocator's state, in a file the analysis reads without unpickling
(docs/trace-format.md, Memory snapshots).

torch's snapshot is a dict: `segments`, each with its `blocks` and each block with the `frames`
of its allocation (when history was recorded), `device_traces` (the allocation history) and the
allocator's settings. The record keeps the segments and blocks whole, and of the frames the
Python ones (a file ending in .py), at most schema.SNAPSHOT_MAX_FRAMES per block: C++ frames and
the history stay in the pickle beside it, for pytorch.org/memory_viz.
"""

from __future__ import annotations

from tracer import schema


def _python_frames(frames) -> tuple[list[schema.StackFrame], int]:
    """(the Python frames kept, the number left out)."""
    kept = []
    for frame in frames or ():
        filename = str(frame.get("filename", ""))
        if filename.endswith(".py") and len(kept) < schema.SNAPSHOT_MAX_FRAMES:
            kept.append(schema.StackFrame(file=filename, line=int(frame.get("line", 0)),
                                          function=str(frame.get("name", ""))))
    return kept, len(frames or ()) - len(kept)


def _segment(segment: dict) -> tuple[schema.SnapshotSegment, int]:
    blocks, dropped = [], 0
    for block in segment.get("blocks", ()):
        frames, left_out = _python_frames(block.get("frames"))
        dropped += left_out
        blocks.append(schema.SnapshotBlock(
            address=int(block["address"]), size=int(block["size"]),
            requested_size=int(block.get("requested_size", block["size"])),
            state=str(block["state"]), frames=frames))
    return schema.SnapshotSegment(
        device=int(segment["device"]), address=int(segment["address"]),
        total_size=int(segment["total_size"]), allocated_size=int(segment["allocated_size"]),
        active_size=int(segment.get("active_size", segment["allocated_size"])),
        requested_size=int(segment.get("requested_size", segment["allocated_size"])),
        stream=int(segment.get("stream", 0)), segment_type=str(segment.get("segment_type", "")),
        blocks=blocks, is_expandable=bool(segment.get("is_expandable", False))), dropped


def snapshot_record(snapshot: dict, rank: int, step: int, t_ns: int, reason: str,
                    oom: schema.OutOfMemory | None = None,
                    device_total_bytes: int | None = None) -> schema.MemorySnapshotRecord:
    """The record of one torch snapshot (the dict torch.cuda.memory._snapshot() returns)."""
    segments, dropped = [], 0
    for segment in snapshot.get("segments", ()):
        converted, left_out = _segment(segment)
        segments.append(converted)
        dropped += left_out
    return schema.MemorySnapshotRecord(
        rank=rank, step=step, t_ns=t_ns, reason=reason, segments=segments,
        device_total_bytes=device_total_bytes, oom=oom, frames_dropped=dropped)
