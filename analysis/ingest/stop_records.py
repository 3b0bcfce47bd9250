"""What the stop diagnosis of a run folder reads (analysis.findings.stop_diagnosis;
docs/reliability.md, "Stop diagnosis"): every rank's issue records and the main thread's frames
of its stack dumps, with its comm records, how its run ended and the exception it raised, as one
StopInputs (analysis.core.contracts). A value out of range is set aside as in the other record
files (analysis.ingest.record_checks); a frame's source line is read as text where the file is
still as it was, never run.
"""

from __future__ import annotations

import linecache
import os
import re
from pathlib import Path

import msgspec
import pandas as pd

from analysis.core.contracts import StopInputs
from analysis.core.model import UNKNOWN_RANK, LoadResult
from analysis.ingest.record_checks import checked_dumps
from analysis.ingest.records import read_jsonl, records_frame, records_path
from tracer import schema

FRAME_COLUMNS = ["rank", "reason", "t_ns", "depth", "file", "line", "function", "code"]
TOP_FRAMES = 3  # innermost frames of each rank's main thread shown


def stop_inputs(loaded: LoadResult) -> StopInputs:
    """Everything the stop diagnosis of a loaded run folder reads: each rank's status (its
    manifest's), issue records, stack-dump frames, comm records and run_end's exception."""
    statuses = {t.rank: t.status for t in loaded.ranks if t.rank != UNKNOWN_RANK}
    issued, frames, problems = read_stop_inputs(Path(loaded.run_dir), sorted(statuses),
                                                loaded.world_size)
    completed = pd.concat([t.records.comms for t in loaded.ranks if t.records is not None]
                          or [pd.DataFrame()], ignore_index=True)
    exceptions = {t.rank: end.exception for t in loaded.ranks if t.records is not None
                  for end in t.records.manifest if isinstance(end, schema.RunEnd)}
    return StopInputs(statuses=statuses, world_size=loaded.world_size or len(statuses),
                      issued=issued, completed=completed, frames=frames,
                      exceptions=exceptions, problems=problems)


def read_stop_inputs(run_dir: Path, ranks: list[int], world_size: int | None = None
                     ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(issue records, stack dumps' main-thread frames, problems) of `ranks` in `run_dir`; each
    value out of range set aside as in the other record files (analysis.ingest.record_checks):
    an issue record or a dump whose required value it is, an issue's peer alone. `world_size`
    (the run's, where known) bounds peer and pg_size."""
    columns = [f.name for f in msgspec.structs.fields(schema.IssueRecord)] + ["rank"]
    issued, frames, problems = [pd.DataFrame(columns=columns)], [], []
    for rank in ranks:
        path = records_path(run_dir, schema.ISSUED_FILE, rank)
        if path is not None:
            found, bad = read_jsonl(path, schema.IssueRecord, rank)
            frame, checked = records_frame(found, schema.IssueRecord, rank, path, world_size)
            problems += bad + checked
            issued.append(frame)
        path = run_dir / schema.STACKS_FILE.format(rank=rank)
        if path.is_file():
            dumps, bad = read_jsonl(path, schema.StackDump, rank)
            dumps, checked = checked_dumps(dumps, path, rank)
            problems += bad + checked
            frames += dump_frames(dumps, rank)
    issued_frame = pd.concat([f for f in issued if not f.empty] or issued[:1],
                             ignore_index=True).reindex(columns=columns)
    return issued_frame, pd.DataFrame(frames, columns=FRAME_COLUMNS), problems


def dump_frames(dumps: list, rank: int) -> list[dict]:
    """The main thread's innermost frames (depth 0 innermost) of `rank`'s first dump at a stop
    (a collective's error, SIGTERM: the first is where it got stuck, later ones are on the way
    out), else of its last SIGUSR1 dump."""
    if not dumps:
        return []
    stops = [d for d in dumps if d.reason != "sigusr1"]
    dump = stops[0] if stops else dumps[-1]
    main = next((t for t in dump.threads if t.main), None)
    if main is None:
        return []
    inner = list(reversed(main.frames))
    shown = list(range(min(TOP_FRAMES, len(inner))))
    if not any(is_script_frame(inner[d].file) for d in shown):
        # Stuck inside a library (torch's backward): where the script called it, too.
        shown += [next((d for d in range(len(shown), len(inner))
                        if is_script_frame(inner[d].file)), None)]
    return [{"rank": rank, "reason": dump.reason, "t_ns": dump.t_ns, "depth": d,
             "file": inner[d].file, "line": inner[d].line, "function": inner[d].function,
             "code": source_line(inner[d].file, inner[d].line, dump.t_ns)}
            for d in shown if d is not None]


def is_script_frame(path: str) -> bool:
    """Not an installed package's, nor the interpreter's (frozen modules, the standard
    library)."""
    parts = Path(path).parts
    in_stdlib = any(re.fullmatch(r"python\d+\.\d+", name) and parts[i - 1].startswith("lib")
                    for i, name in enumerate(parts[1:-1], 1))
    return not (path.startswith("<") or "site-packages" in parts or "dist-packages" in parts
                or in_stdlib)


def source_line(path: str, line: int, at_ns: int) -> str:
    """The line of a frame where its file is readable here and unchanged since the dump (read
    as text, never run); "" otherwise."""
    try:
        if os.stat(path).st_mtime_ns > at_ns:
            return ""
    except OSError:
        return ""
    return linecache.getline(path, line).strip()
