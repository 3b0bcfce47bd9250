"""Reading the tracer's records of one rank (tracer.schema): manifest, step, comm and sample lines.

Files are read as written, `.tmp` included (a rank killed before it could rename them); a bad line
(a last line cut short by a crash among them) is skipped, with a problem naming the file, the rank
and the line, and each value out of range is set aside (analysis.ingest.record_checks). Nothing
read is evaluated or unpickled.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from analysis.core.limits import (
    MAX_TRACE_ENV,
    MAX_WORLD_SIZE,
    WHOLE_DECODE_SHARE,
    int_within,
    max_trace_bytes,
)
from analysis.core.model import RunRecords, StepsEnded
from analysis.ingest.record_checks import checked_frame, checked_manifest, manifest_world_size
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


def read_jsonl(path: Path, record_type, rank: int, max_bytes: int | None = None
               ) -> tuple[list, list[str]]:
    """Decode a records file; a bad line (a last one cut short by a crash among them) is
    skipped with a problem. A file larger than a trace decoded whole may be (a share of
    `max_bytes`, default RANKTRACE_MAX_TRACE_MB's: it is decoded whole) is not read."""

    limit = (max_trace_bytes() if max_bytes is None else max_bytes) // WHOLE_DECODE_SHARE
    try:
        size = path.stat().st_size
        if size > limit:
            return [], [f"{path}: rank {rank}: too large to read: {size / (1 << 20):.1f} MB, "
                        f"over the limit of {limit / (1 << 20):g} MB for a record file "
                        f"(1/{WHOLE_DECODE_SHARE} of {MAX_TRACE_ENV}); its records are not "
                        f"read"]
        data = path.read_bytes()
    except OSError as exc:
        return [], [f"{path}: rank {rank}: cannot read ({exc.strerror or exc})"]
    decoder = schema.decoder(record_type)
    try:
        return decoder.decode_lines(data), []
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    records, problems = [], []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            if number == len(lines):  # no newline after it: cut off by a crash
                problems.append(f"{path}: rank {rank}: its last line (line {number}) is cut "
                                f"short, as a rank that stops while writing leaves it; skipped")
                continue
            why = ("JSON nested too deeply to decode" if isinstance(exc, RecursionError)
                   else str(exc))
            problems.append(f"{path}: rank {rank}: line {number} skipped ({why})")
    return records, problems


def records_frame(records: list, record_type, rank: int, path: Path | None,
                   world_size: int | None) -> tuple[pd.DataFrame, list[str]]:
    """The records as a frame, each value out of range set aside (analysis.ingest.
    record_checks), and the problems naming them."""
    # Imported here: the command lists a run's record files before it imports pandas
    # (analysis.ingest.parse_ahead).
    import pandas as pd

    columns = [f.name for f in msgspec.structs.fields(record_type)]
    rows = [msgspec.structs.asdict(r) for r in records]
    frame = pd.DataFrame(rows, columns=columns)
    problems = []
    if path is not None:
        frame, problems = checked_frame(frame, record_type, path, rank, world_size)
    frame["rank"] = rank
    return frame, problems


class _ManifestVersion(msgspec.Struct):
    kind: Any = None
    schema_version: Any = None


def read_records(run_dir: Path, rank: int, max_bytes: int | None = None
                 ) -> tuple[RunRecords | None, list[str]]:
    """The tracer's records of one rank, or None where the folder has none for it; `max_bytes`
    as in read_jsonl."""
    problems: list[str] = []
    manifest_path = records_path(run_dir, schema.MANIFEST_FILE, rank)
    manifest: list = []
    if manifest_path is not None:
        versions, _ = read_jsonl(manifest_path, _ManifestVersion, rank, max_bytes)
        newer = [v.schema_version for v in versions if v.kind == "run_start"
                 and isinstance(v.schema_version, int) and v.schema_version > schema.SCHEMA_VERSION]
        if newer:
            return None, [f"{manifest_path}: rank {rank}: written with trace schema version "
                          f"{newer[0]}, newer than this analysis reads "
                          f"({schema.SCHEMA_VERSION}); its records are ignored (upgrade "
                          f"ranktrace to read them)"]
        manifest, found = read_jsonl(manifest_path, schema.ManifestRecord, rank, max_bytes)
        manifest, checked = checked_manifest(manifest, manifest_path, rank)
        problems += found + checked + _manifest_problems(manifest, manifest_path, rank)
    frames = {}
    for key, pattern, record_type in (("comms", schema.COMMS_FILE, schema.CommRecord),
                                      ("samples", schema.SAMPLES_FILE, schema.DeviceSample),
                                      ("steps", schema.STEPS_FILE, schema.StepRecord)):
        path = records_path(run_dir, pattern, rank)
        records: list = []
        if path is not None:
            records, found = read_jsonl(path, record_type, rank, max_bytes)
            problems += found
        frames[key] = (records, record_type, path)
    # Frames are built only for a rank with records: an empty frame costs more than the reading.
    if manifest_path is None and not any(records for records, _, _ in frames.values()):
        return None, problems
    world_size = manifest_world_size(manifest)
    built = {}
    for key, (records, record_type, path) in frames.items():
        built[key], found = records_frame(records, record_type, rank, path, world_size)
        problems += found
    problems += _steps_lost(manifest, built["steps"], frames["steps"][2], rank)
    return RunRecords(manifest=manifest, **built), problems


def _steps_lost(manifest: list, steps: pd.DataFrame, path: Path | None, rank: int
                ) -> list[str]:
    """The problem of step records that stop before the steps the run_end counts (lost, or
    set aside), unless --max-record-mb stopped them (run_end.record_cap_step)."""
    ends = [r for r in manifest if isinstance(r, schema.RunEnd)]
    if not ends or ends[-1].steps is None or ends[-1].record_cap_step is not None:
        return []
    counted, held = ends[-1].steps, len(steps)
    if held >= counted or path is None:
        return []
    return [f"{path}: rank {rank}: {held} step records, but the run_end counts {counted} steps "
            f"ended; the steps without a record are analysed from the trace alone"]


def _manifest_problems(manifest: list, path: Path, rank: int) -> list[str]:
    """What the tracer itself reported: parts that switched off, what it clipped, ignored or
    cut short, and how the rank ended."""
    problems = [f"{path}: rank {rank}: tracer part '{r.part}' failed: {r.message}"
                for r in manifest if isinstance(r, schema.TracerError)]
    problems += [f"{path}: rank {rank}: tracer part '{r.part}': {r.message}"
                 for r in manifest if isinstance(r, schema.TracerProblem)]
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
                  if r.kind == "run_start" and int_within(r.world_size, 1, MAX_WORLD_SIZE)}
    return sizes


class _ManifestWorldSize(msgspec.Struct):
    kind: Any = None
    world_size: Any = None


def steps_ended(records: RunRecords | None) -> StepsEnded | None:
    """Which steps the rank's records say ended (analysis.core.steps.StepsEnded), None without
    step records or run_end to say it. The step records end at the last step that ended, unless
    they stop early: a run_end that counts more steps says so (records lost, or stopped by
    --max-record-mb), and a manifest with a run_start and no run_end means the rank died with
    its last records unwritten, so that they bound nothing."""
    if records is None:
        return None
    numbers = [n for n in records.steps["step"].tolist() if n == n] if "step" in \
        records.steps.columns else []
    recorded = int(max(numbers)) if numbers else None
    ends = [r for r in records.manifest if isinstance(r, schema.RunEnd)]
    counted = ends[-1].steps if ends else None
    if counted is not None and counted > 0 and (recorded is None or counted - 1 > recorded):
        said = f"step records end at step {recorded}" if recorded is not None else \
            "step records hold no step"
        return StepsEnded(counted - 1, f"run_end counts {counted} steps ended ({said})")
    if recorded is None:
        return None
    said = f"step records end at step {recorded}"
    died = not ends and any(isinstance(r, schema.RunStart) for r in records.manifest)
    return StepsEnded(recorded, said, cut_short=died)


def run_status(manifest: list) -> str | None:
    """How a rank's run ended: its last run_end's status, "crashed" with a run_start and no
    run_end, None without a manifest."""
    ends = [r for r in manifest if isinstance(r, schema.RunEnd)]
    if ends:
        return ends[-1].status
    if any(isinstance(r, schema.RunStart) for r in manifest):
        return schema.STATUS_NO_END
    return None
