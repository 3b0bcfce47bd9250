"""Reading the tracer's records of one rank (tracer.schema): manifest, step, comm and sample lines.

Files are read as written, `.tmp` included (a rank killed before it could rename them), and a last
line cut short by a crash is dropped quietly; every other bad line is a problem naming the file,
the rank and the line. Nothing read is evaluated or unpickled.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from analysis.core.model import RunRecords
from tracer import schema

if TYPE_CHECKING:
    import pandas as pd


# Every record file of a rank, the manifest first (tracer.schema names them).
RECORD_FILES = (schema.MANIFEST_FILE, schema.STEPS_FILE, schema.COMMS_FILE, schema.SAMPLES_FILE)


def records_path(run_dir: Path, pattern: str, rank: int) -> Path | None:
    final = run_dir / pattern.format(rank=rank)
    if final.is_file():
        return final
    partial = final.with_name(final.name + schema.TEMP_SUFFIX)
    return partial if partial.is_file() else None


def read_jsonl(path: Path, record_type, rank: int) -> tuple[list, list[str]]:
    """Decode a records file; a truncated last line (a crash mid-write) is dropped quietly."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [], [f"{path}: rank {rank}: cannot read ({exc.strerror or exc})"]
    decoder = schema.decoder(record_type)
    try:
        return decoder.decode_lines(data), []
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    records, problems = [], []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if number == len(lines):  # no newline after it: cut off by a crash
                continue
            problems.append(f"{path}: rank {rank}: line {number} skipped ({exc})")
    return records, problems


def _records_frame(records: list, record_type, rank: int) -> pd.DataFrame:
    # Imported here: the command lists a run's record files before it imports pandas
    # (analysis.ingest.parse_ahead).
    import pandas as pd

    columns = [f.name for f in msgspec.structs.fields(record_type)]
    rows = [msgspec.structs.asdict(r) for r in records]
    frame = pd.DataFrame(rows, columns=columns)
    frame["rank"] = rank
    return frame


class _ManifestVersion(msgspec.Struct):
    kind: Any = None
    schema_version: Any = None


def read_records(run_dir: Path, rank: int) -> tuple[RunRecords | None, list[str]]:
    """The tracer's records of one rank, or None where the folder has none for it."""
    problems: list[str] = []
    manifest_path = records_path(run_dir, schema.MANIFEST_FILE, rank)
    manifest: list = []
    if manifest_path is not None:
        versions, _ = read_jsonl(manifest_path, _ManifestVersion, rank)
        newer = [v.schema_version for v in versions if v.kind == "run_start"
                 and isinstance(v.schema_version, int) and v.schema_version > schema.SCHEMA_VERSION]
        if newer:
            return None, [f"{manifest_path}: rank {rank}: written with trace schema version "
                          f"{newer[0]}, newer than this analysis reads "
                          f"({schema.SCHEMA_VERSION}); its records are ignored (upgrade "
                          f"ranktrace to read them)"]
        manifest, found = read_jsonl(manifest_path, schema.ManifestRecord, rank)
        problems += found + _manifest_problems(manifest, manifest_path, rank)
    frames = {}
    for key, pattern, record_type in (("comms", schema.COMMS_FILE, schema.CommRecord),
                                      ("samples", schema.SAMPLES_FILE, schema.DeviceSample),
                                      ("steps", schema.STEPS_FILE, schema.StepRecord)):
        path = records_path(run_dir, pattern, rank)
        records: list = []
        if path is not None:
            records, found = read_jsonl(path, record_type, rank)
            problems += found
        frames[key] = (records, record_type)
    # Frames are built only for a rank with records: an empty frame costs more than the reading.
    if manifest_path is None and not any(records for records, _ in frames.values()):
        return None, problems
    frames = {key: _records_frame(records, record_type, rank)
              for key, (records, record_type) in frames.items()}
    return RunRecords(manifest=manifest, **frames), problems


def _manifest_problems(manifest: list, path: Path, rank: int) -> list[str]:
    """What the tracer itself reported: parts that switched off, and how the rank ended."""
    problems = [f"{path}: rank {rank}: tracer part '{r.part}' failed: {r.message}"
                for r in manifest if isinstance(r, schema.TracerError)]
    ends = [r for r in manifest if isinstance(r, schema.RunEnd)]
    if any(isinstance(r, schema.RunStart) for r in manifest) and not ends:
        problems.append(f"{path}: rank {rank}: no run_end record; the rank ended without "
                        f"closing its files ({schema.STATUS_NO_END}), its records may be cut short")
    for end in ends:
        if end.status != "ok":
            reason = f": {end.exception}" if end.exception else ""
            problems.append(f"{path}: rank {rank}: the run ended '{end.status}' "
                            f"(exit code {end.exit_code}){reason}")
    return problems


def _file_name_re(patterns) -> re.Pattern:
    """A regular expression for the names `patterns` give; the rank is the one group matched."""
    rank = re.escape("{rank}")
    names = "|".join(re.escape(p).replace(rank, r"(\d+)", 1) for p in patterns)
    return re.compile(f"^(?:{names})(?:{re.escape(schema.TEMP_SUFFIX)})?$")


RECORD_FILE_RE = _file_name_re(RECORD_FILES)


def record_ranks(run_dir: Path) -> set[int]:
    """The ranks that have a record file in `run_dir`."""
    ranks = set()
    for entry in run_dir.iterdir():
        match = RECORD_FILE_RE.match(entry.name)
        if match:
            ranks.add(int(next(g for g in match.groups() if g is not None)))
    return ranks


def manifest_world_sizes(run_dir: Path) -> set[int]:
    """The world sizes the run_start records of the manifests in `run_dir` give."""
    sizes = set()
    for rank in record_ranks(run_dir):
        path = records_path(run_dir, schema.MANIFEST_FILE, rank)
        if path is None:
            continue
        records, _ = read_jsonl(path, _ManifestWorldSize, rank)
        sizes |= {r.world_size for r in records
                  if r.kind == "run_start" and isinstance(r.world_size, int)}
    return sizes


class _ManifestWorldSize(msgspec.Struct):
    kind: Any = None
    world_size: Any = None


def run_status(manifest: list) -> str | None:
    """How a rank's run ended: its last run_end's status, "crashed" with a run_start and no
    run_end, None without a manifest."""
    ends = [r for r in manifest if isinstance(r, schema.RunEnd)]
    if ends:
        return ends[-1].status
    if any(isinstance(r, schema.RunStart) for r in manifest):
        return schema.STATUS_NO_END
    return None
