"""Builders of run folders from recorded ones: a plain copy to write beside, and a copy with one
rank's clock moved."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path


def copy_run(run: Path, target: Path) -> Path:
    """A copy of a shared run for a test that writes beside the traces (an analysis cache)."""
    shutil.copytree(run, target)
    return target


def shifted_copy(run: Path, target: Path, rank: int, shift_ns: int) -> Path:
    """The run with `rank`'s clock moved by `shift_ns` in every record file and Kineto trace,
    and its clock_sync record removed, as if the rank's host clock were off by that much."""
    shutil.copytree(run, target)
    for path in target.glob(f"rank{rank}.*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "clock_sync":
                continue
            for key in ("start_ns", "end_ns", "t_ns", "issue_ns"):
                if isinstance(record.get(key), int):
                    record[key] += shift_ns
            lines.append(json.dumps(record))
        path.write_text("".join(f"{line}\n" for line in lines))
    for path in target.glob(f"rank{rank}.*.pt.trace.json.gz"):
        document = json.loads(gzip.decompress(path.read_bytes()))
        for event in document["traceEvents"]:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += shift_ns // 1000
        path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return target
