"""Out-of-memory forensics across ranks: which rank ran out first and at which step, and what
held the memory then (docs/memory.md, "Out of memory").

From the CUDA allocator snapshots the tracer writes at a rank's first out-of-memory error
(tracer.schema.MemorySnapshotRecord, reason "oom"): the first rank is the one whose snapshot was
taken first on rank 0's clock (each rank's clock_sync offset subtracted; the ranks' own clocks
where an offset is missing, which the lines then say). What held the memory: the live blocks
(state active_allocated) grouped by where they were allocated, the innermost frame of the script
itself (not of torch or another installed package) or, without one, the innermost frame; and the
categories of the rank's last profiler window with --profile-memory.
"""

from __future__ import annotations

from collections import defaultdict

from analysis.core.contracts import OomDiagnosis
from tracer import schema

TOP_SITES = 5
NO_STACK = "<no stack: allocation history was off (trace with --memory-snapshot)>"
# Paths of code that allocates on behalf of the script: the allocation site is the innermost
# frame outside them.
_LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/torch/", "/lib/python")
GIB = 1 << 30


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def allocation_site(frames: list[schema.StackFrame]) -> str:
    """"file:line in name" of the innermost frame of the script's own code (else the innermost
    frame); NO_STACK without frames."""
    if not frames:
        return NO_STACK
    own = next((f for f in frames if not any(p in f.file for p in _LIBRARY_PARTS)),
               frames[0])
    return f"{own.file}:{own.line} in {own.function}"


def top_sites(record: schema.MemorySnapshotRecord, top: int = TOP_SITES) -> list[dict]:
    """The live blocks grouped by allocation site, the most bytes first: {"site", "bytes",
    "blocks"}."""
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for segment in record.segments:
        for block in segment.blocks:
            if block.state == "active_allocated":
                held = sites[allocation_site(block.frames)]
                held[0] += block.size
                held[1] += 1
    ordered = sorted(sites.items(), key=lambda item: (-item[1][0], item[0]))
    return [{"site": site, "bytes": size, "blocks": count} for site, (size, count) in
            ordered[:top]]


def held_memory(record: schema.MemorySnapshotRecord) -> dict:
    """The allocator's state in the snapshot: allocated (live blocks), reserved (segments),
    cached free (inactive blocks) and the largest free block, in bytes."""
    allocated = reserved = free = largest = 0
    for segment in record.segments:
        reserved += segment.total_size
        for block in segment.blocks:
            if block.state == "active_allocated":
                allocated += block.size
            elif block.state == "inactive":
                free += block.size
                largest = max(largest, block.size)
    return {"allocated_bytes": allocated, "reserved_bytes": reserved,
            "cached_free_bytes": free, "largest_free_block_bytes": largest}


def _categories_before(profiles: list, step: int) -> schema.MemoryProfileRecord | None:
    """The last memory profile of a window that ended by `step`."""
    before = [p for p in profiles or () if p.last_step <= step]
    return max(before, key=lambda p: p.last_step) if before else None


def _rank_entry(record: schema.MemorySnapshotRecord, offset_ns: int | None,
                profiles: list) -> dict:
    entry = {"rank": record.rank, "step": record.step,
             "t_ns": record.t_ns - (offset_ns or 0), "on_rank0_clock": offset_ns is not None,
             "requested_bytes": record.oom.requested_bytes if record.oom else None,
             "device_free_bytes": record.oom.device_free_bytes if record.oom else None,
             "device_total_bytes": record.device_total_bytes,
             **held_memory(record), "top_sites": top_sites(record)}
    profile = _categories_before(profiles, record.step)
    entry["categories"] = dict(profile.categories) if profile is not None else None
    entry["categories_steps"] = ([profile.first_step, profile.last_step]
                                 if profile is not None else None)
    return entry


def _rank_line(entry: dict) -> str:
    asked = (f"asked {_gib(entry['requested_bytes'])} with " if entry["requested_bytes"]
             is not None else "")
    total = (f" of {_gib(entry['device_total_bytes'])}" if entry["device_total_bytes"]
             else "")
    sites = "; ".join(f"{s['site']} {_gib(s['bytes'])} ({s['blocks']} blocks)"
                      for s in entry["top_sites"]) or "no live block"
    line = (f"Rank {entry['rank']} at step {entry['step']}: {asked}"
            f"{_gib(entry['allocated_bytes'])} allocated, {_gib(entry['reserved_bytes'])} "
            f"reserved{total} ({_gib(entry['cached_free_bytes'])} cached free, largest free "
            f"block {_gib(entry['largest_free_block_bytes'])}); held by {sites}.")
    if entry["categories"] is not None:
        first, last = entry["categories_steps"]
        kinds = ", ".join(f"{name.replace('_', ' ')} {_gib(size)}" for name, size in
                          sorted(entry["categories"].items(), key=lambda item: -item[1])
                          if size > 0)
        line += f" At the peak of its profiler window (steps {first}-{last}): {kinds}."
    return line


def oom_diagnosis(snapshots: list[schema.MemorySnapshotRecord],
                  profiles: dict[int, list] | None = None,
                  offsets_ns: dict[int, int] | None = None) -> OomDiagnosis | None:
    """The diagnosis (its `ranks`: one entry per rank that ran out, the first first); None
    without an out-of-memory snapshot. `profiles`: rank -> its memory profiles;
    `offsets_ns`: rank -> its clock_sync offset."""
    ooms = [s for s in snapshots if s.reason == schema.SNAPSHOT_REASONS[0]]
    if not ooms:
        return None
    first_of_rank = {}
    for record in sorted(ooms, key=lambda r: (r.rank, r.step)):
        first_of_rank.setdefault(record.rank, record)
    offsets_ns = offsets_ns or {}
    entries = [_rank_entry(record, offsets_ns.get(rank), (profiles or {}).get(rank, []))
               for rank, record in first_of_rank.items()]
    entries.sort(key=lambda e: (e["t_ns"], e["step"], e["rank"]))
    first = entries[0]
    later = ", ".join(f"rank {e['rank']} (step {e['step']}, "
                      f"+{(e['t_ns'] - first['t_ns']) / 1e9:.1f} s)" for e in entries[1:])
    clock = ("" if all(e["on_rank0_clock"] for e in entries) or len(entries) == 1 else
             " (some ranks' clock offsets are unknown: their times are their own clocks')")
    head = (f"Out of memory: rank {first['rank']} ran out first, at step {first['step']}"
            + (f"; then {later}" if later else "") + f"{clock}.")
    return OomDiagnosis(first_rank=first["rank"], first_step=first["step"], ranks=entries,
                        lines=[head, *(_rank_line(e) for e in entries)])
