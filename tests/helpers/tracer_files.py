"""Readers of what the tracer writes (run folders, JSONL records, Kineto traces, the summary
lines on stderr), for the tests of the tracer and of what it records."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tracer import schema

# Kineto's own log lines ("USDT:2026-01-01 12:00:00 ... profiler_start"): torch.profiler prints
# them whoever drives it.
_KINETO_LOG = re.compile(r"^(USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d ")
SUMMARY_RE = re.compile(
    r"^ranktrace: rank(?P<rank>\d+) (?P<status>\w+) steps=(?P<steps>\d+) windows=(?P<windows>\d+) "
    r"samples=(?P<samples>\d+)(?: samples_missed=(?P<samples_missed>[\d.]+)%)? "
    r"comm_ops=(?P<comm_ops>\d+) bytes_written=(?P<bytes>[\d.]+ [kMG]?B) "
    r"errors=(?P<errors>\d+) -> (?P<run_dir>.+)$", re.M)


def script_stderr(stderr: str) -> str:
    """stderr without the tracer's lines and Kineto's log lines: what the script printed."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith("ranktrace:") and not _KINETO_LOG.match(line))


def summaries(stderr: str) -> dict[int, dict]:
    return {int(m["rank"]): m.groupdict() for m in SUMMARY_RE.finditer(stderr)}


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in Path(out).iterdir() if p.is_dir())


def only_run_dir(out: Path) -> Path:
    dirs = run_dirs(out)
    assert len(dirs) == 1, dirs
    return dirs[0]


def jsonl_path(run_dir: Path, pattern: str, rank: int) -> Path:
    """The finished file, or its .tmp if the rank never finished it."""
    path = Path(run_dir) / pattern.format(rank=rank)
    if path.exists():
        return path
    return path.with_name(path.name + schema.TEMP_SUFFIX)


def write_jsonl(path: Path, records: list) -> None:
    """`records` (tracer.schema structs) as a record file, one JSON line each, as the tracer
    writes them."""
    path.write_bytes(b"".join(schema.ENCODER.encode(r) + b"\n" for r in records))


def read_jsonl(path: Path, record_type=None) -> list:
    """Every complete line; a last line cut off mid-write (killed process) is left out."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    records = []
    for i, line in enumerate(lines):
        if not line:
            continue
        if i == len(lines) - 1:  # no newline after it: it may be partial
            try:
                json.loads(line)
            except ValueError:
                break
        records.append(
            schema.decoder(record_type).decode(line) if record_type else json.loads(line)
        )
    return records


def manifest(run_dir: Path, rank: int) -> list:
    return read_jsonl(jsonl_path(run_dir, schema.MANIFEST_FILE, rank), schema.ManifestRecord)


def of_kind(records, kind) -> list:
    return [r for r in records if isinstance(r, kind)]


def run_end(run_dir: Path, rank: int) -> schema.RunEnd:
    ends = of_kind(manifest(run_dir, rank), schema.RunEnd)
    assert len(ends) == 1, ends
    return ends[0]


def steps(run_dir: Path, rank: int) -> list[schema.StepRecord]:
    return read_jsonl(jsonl_path(run_dir, schema.STEPS_FILE, rank), schema.StepRecord)


def traces(run_dir: Path, rank: int) -> list[Path]:
    found = []
    for p in sorted(Path(run_dir).iterdir()):
        m = schema.KINETO_TRACE_RE.match(p.name)
        if m and m["worker"] == schema.worker_name(rank):
            found.append(p)
    return found


def load_trace(path: Path) -> dict:
    import gzip

    with gzip.open(path, "rt") as f:
        return json.load(f)


def temp_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in Path(run_dir).iterdir() if p.name.endswith(schema.TEMP_SUFFIX))


def losses(path: Path) -> list[str]:
    """repr() of each loss, as tiny_train.py writes them: compared as text, so bit for bit."""
    return Path(path).read_text().splitlines()


def stack_dump(reason, function, line, t_ns):
    """Rank 1's stack dump at `t_ns`: its main thread in `function` at /x/train.py:`line`,
    called from the module; another thread beside it."""
    frames_ = [schema.StackFrame(file="/x/train.py", line=10, function="<module>"),
               schema.StackFrame(file="/x/train.py", line=line, function=function)]
    return schema.StackDump(rank=1, t_ns=t_ns, reason=reason, pending=[], threads=[
        schema.ThreadStack(name="other", thread_id=2, main=False, frames=frames_[:1]),
        schema.ThreadStack(name="MainThread", thread_id=1, main=True, frames=frames_)])
