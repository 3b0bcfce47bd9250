"""Reading what the tracer wrote in a run folder, independently of the analysis package."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """(records, lines that did not parse)."""
    records, bad = [], 0
    if not path.is_file():
        return records, bad
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            bad += 1
    return records, bad


def trace_summary(path: Path) -> dict:
    """What a gzipped Kineto trace holds, read independently of the analysis package."""
    with gzip.open(path, "rt", errors="replace") as handle:
        doc = json.load(handle)
    events = doc.get("traceEvents") or []
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    cats = Counter(str(e.get("cat", "")).lower() for e in complete)
    kernels = [e for e in complete if str(e.get("cat", "")).lower() == "kernel"]
    nccl = sum(1 for e in kernels if "nccl" in str(e.get("name", "")).lower())
    steps = sum(1 for e in complete if str(e.get("name", "")).startswith("ProfilerStep#"))
    info = doc.get("distributedInfo") or {}
    devices = [d.get("name") for d in doc.get("deviceProperties") or [] if isinstance(d, dict)]
    return {"bytes": path.stat().st_size, "events": len(events), "kernels": len(kernels),
            "nccl_kernels": nccl, "memcpy": cats.get("gpu_memcpy", 0),
            "memset": cats.get("gpu_memset", 0), "cuda_runtime": cats.get("cuda_runtime", 0),
            "profiler_steps": steps, "backend": info.get("backend"), "devices": devices}


def read_run(run_dir: Path) -> dict:
    run = {"dir": run_dir, "exists": run_dir.is_dir()}
    if not run["exists"]:
        return run
    run["traces"] = sorted(p for p in run_dir.iterdir() if p.name.endswith(".pt.trace.json.gz"))
    run["manifest"], run["manifest_bad"] = read_jsonl(run_dir / "rank0.manifest.jsonl")
    run["steps"], run["steps_bad"] = read_jsonl(run_dir / "rank0.steps.jsonl")
    run["samples"], run["samples_bad"] = read_jsonl(run_dir / "rank0.samples.jsonl")
    run["comms"], run["comms_bad"] = read_jsonl(run_dir / "rank0.comms.jsonl")
    run["summaries"] = []
    run["summary_errors"] = []
    for trace in run["traces"]:
        try:
            run["summaries"].append(trace_summary(trace))
        except Exception as exc:
            run["summary_errors"].append(f"{trace.name}: {type(exc).__name__}: {exc}")
    kinds = {}
    for record in run["manifest"]:
        kinds.setdefault(record.get("kind"), []).append(record)
    run["run_start"] = (kinds.get("run_start") or [{}])[0]
    run["run_end"] = (kinds.get("run_end") or [None])[-1]
    run["clock_sync"] = kinds.get("clock_sync") or []
    run["errors"] = kinds.get("error") or []
    return run
