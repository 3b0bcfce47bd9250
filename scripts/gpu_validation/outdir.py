"""What goes into OUTDIR besides the results: fixtures.tar, logs.tar.gz, and its layout check."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from pathlib import Path

from .config import (
    COMM_WORKLOADS,
    OUTDIR_MAX_DEPTH,
    OUTDIR_MAX_FILES,
    PORTABLE_NAME_RE,
    TAR_LIMIT_BYTES,
    WORKLOADS,
)
from .results import Results

FIXTURE_FILE_RE = re.compile(r"(\.pt\.trace\.json\.gz|^rank\d+\.(manifest|comms|samples|steps)"
                             r"\.jsonl)$")


def provenance_of(results: Results, command: list[str], runs: dict, **extra) -> dict:
    """gpu/provenance.jsonl: where and how the run folders in fixtures.tar were made."""
    return {"mode": results.mode, "created": results.budget.started_at,
            "device_name": results.environment.get("device_name"),
            "environment": results.environment, "command": command,
            "workloads": {wl: {"expect_comms": wl in COMM_WORKLOADS} for wl in runs}, **extra}


def write_fixtures(results: Results, outdir: Path, runs: dict, provenance: dict) -> None:
    tar_path = outdir / "fixtures.tar"
    temp = outdir / "fixtures.tar.tmp"
    members = []
    try:
        with tarfile.open(temp, "w") as tar:
            for wl, run in runs.items():
                if not run.get("exists"):
                    continue
                for path in sorted(run["dir"].iterdir()):
                    if path.is_file() and FIXTURE_FILE_RE.search(path.name):
                        tar.add(path, arcname=f"gpu/{wl}/{path.name}")
                        members.append(f"{wl}/{path.name}")
            data = (json.dumps(provenance, default=str) + "\n").encode()
            info = tarfile.TarInfo("gpu/provenance.jsonl")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
        os.replace(temp, tar_path)
    except OSError as exc:
        results.record("fixtures.tar", False, None, f"cannot write {tar_path}: {exc}")
        return
    size = tar_path.stat().st_size
    workloads = sorted({m.split("/")[0] for m in members})
    missing = [wl for wl in WORKLOADS if wl not in workloads]
    problems = []
    if size > TAR_LIMIT_BYTES:
        problems.append(f"{size} bytes, over {TAR_LIMIT_BYTES}")
    if missing:
        problems.append(f"no run folder for {missing}")
    results.record("fixtures.tar", not problems, f"{size} bytes",
                   "; ".join(problems) if problems else
                   f"{len(members)} files from {workloads} + gpu/provenance.jsonl; install with "
                   f"`python scripts/gpu_validation --install-fixtures {tar_path.name}`")


def write_logs(outdir: Path, logs: dict) -> None:
    temp = outdir / "logs.tar.gz.tmp"
    with tarfile.open(temp, "w:gz") as tar:
        for name, text in logs.items():
            data = text.encode(errors="replace")
            suffix = "" if name.endswith(".json") else ".txt"
            info = tarfile.TarInfo(f"logs/{_safe(name)}{suffix}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(temp, outdir / "logs.tar.gz")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


FINAL_FILES = ("results.json", "results.md")


def layout_problems(outdir: Path, expect_log: bool = True) -> tuple[list[str], int]:
    """What keeps OUTDIR from being small and flat, counting the results files still to be written
    (and a tee'd `log`, whatever its name, when none is there yet)."""
    problems, files = [], set()
    for path in outdir.rglob("*"):
        rel = path.relative_to(outdir)
        for part in rel.parts:
            if not PORTABLE_NAME_RE.match(part):
                problems.append(f"name {part!r} has characters other than letters, digits, . _ -")
        if path.is_symlink():
            problems.append(f"{rel} is a link")
        elif path.is_file():
            files.add(str(rel))
            if len(rel.parts) > OUTDIR_MAX_DEPTH:
                problems.append(f"{rel} is deeper than OUTDIR/a/b/file")
        elif not path.is_dir():
            problems.append(f"{rel} is not a plain file")
    files |= set(FINAL_FILES)
    count = len(files) + (1 if expect_log and not any(
        f not in FINAL_FILES and not f.endswith((".tar", ".tar.gz")) for f in files) else 0)
    if count > OUTDIR_MAX_FILES:
        problems.append(f"{count} files (a log included), more than {OUTDIR_MAX_FILES}: "
                        f"{sorted(files)}")
    return problems, count


def check_layout(results: Results, outdir: Path) -> None:
    problems, count = layout_problems(outdir)
    results.record("outdir.layout", not problems, f"{count} files",
                   "; ".join(sorted(set(problems))) if problems else
                   f"{count} files counting results.json, results.md and a tee'd log; all at "
                   f"depth 1; names fit")
