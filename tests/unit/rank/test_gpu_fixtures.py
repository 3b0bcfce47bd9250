"""The analysis on traces recorded on a real GPU: tests/data/gpu/<workload>/ run folders.

`python scripts/gpu_validation OUTDIR` on a GPU machine writes OUTDIR/fixtures.tar;
`python scripts/gpu_validation --install-fixtures OUTDIR/fixtures.tar` unpacks it here
(docs/gpu-validation.md). Each folder is one traced run (rank 0, world size 1 on NCCL) with its
Kineto trace and the tracer's records; gpu/provenance.jsonl says where and how it was made, and
holds HTA's own numbers when HTA was importable on that machine.

Until a run on a GPU has produced them, the whole module is skipped with the reason.
GPU_FIXTURES_DIR points the module at another folder of such run folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from helpers.launch import DATA, REPO

FIXTURES = Path(os.environ.get("GPU_FIXTURES_DIR") or DATA / "gpu")
SKIP_REASON = ("no GPU fixtures yet: run scripts/gpu_validation on a GPU, see "
               "docs/gpu-validation.md")
SUM_TOLERANCE_NS = 1_000  # the parts add up to the step within 1 us
HTA_TOLERANCE = 0.01  # of the rank's kernel time
COMM_WORKLOADS = {"ddp", "model_parallel"}  # these issue collectives even in a 1-rank world


def fixture_folders() -> list[Path]:
    if not FIXTURES.is_dir():
        return []
    return [p for p in sorted(FIXTURES.iterdir())
            if p.is_dir() and any(p.glob("*.pt.trace.json*"))]


FOLDERS = fixture_folders()
if not FOLDERS:
    pytest.skip(SKIP_REASON, allow_module_level=True)

# after the skip: nothing to import for nothing
from analysis.rank import step_breakdown as breakdown  # noqa: E402
from analysis.rank.hta import hta_temporal_breakdown  # noqa: E402
from analysis.rank.layers import PARTS  # noqa: E402
from analysis.run.loading import load_run_path  # noqa: E402


def provenance() -> dict:
    path = FIXTURES / "provenance.jsonl"
    if not path.is_file():
        return {}
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return json.loads(lines[0]) if lines else {}


PROVENANCE = provenance()


@cache
def loaded(folder: Path):
    # no cache: nothing may be written into tests/data
    return load_run_path(folder, use_cache=False, jobs=1)


def expects_comms(folder: Path) -> bool:
    workloads = PROVENANCE.get("workloads") or {}
    if folder.name in workloads:
        return bool(workloads[folder.name].get("expect_comms"))
    return folder.name in COMM_WORKLOADS


folder_params = pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])


def test_fixtures_come_from_a_gpu():
    assert PROVENANCE.get("mode", "gpu") == "gpu", (
        f"{FIXTURES} holds traces made with --cpu: {PROVENANCE.get('created')}")


@folder_params
def test_breakdown_adds_up_on_gpu_traces(folder):
    result = loaded(folder)
    assert result.ranks, result.problems
    for trace in result.ranks:
        per_step = breakdown.breakdown_per_step(trace)
        assert len(per_step) >= 1, f"{folder.name}: no step analysed ({result.problems})"
        assert (per_step["step_ns"] > 0).all()
        diff = (per_step[PARTS].sum(axis=1) - per_step["step_ns"]).abs()
        assert (diff <= SUM_TOLERANCE_NS).all(), per_step
        assert set(per_step["kind"]) == {"gpu"}, per_step["kind"]


@folder_params
def test_traces_hold_cuda_kernels(folder):
    for trace in loaded(folder).ranks:
        cats = trace.events["cat"].astype(str)
        kernels = int((cats == "kernel").sum())
        assert kernels > 0, f"{folder.name} rank {trace.rank}: no kernel events"
        assert bool(trace.events["is_gpu"].any())


@folder_params
def test_comm_records_are_timed_by_cuda_events(folder):
    for trace in loaded(folder).ranks:
        assert trace.records is not None, f"{folder.name}: no tracer records beside the trace"
        comms = trace.records.comms
        if expects_comms(folder):
            assert len(comms) > 0, f"{folder.name}: no collective records"
        if len(comms):
            assert set(comms["timing"]) == {"cuda_event"}, comms["timing"].value_counts()
            assert (comms["duration_us"] > 0).all(), comms[comms["duration_us"] <= 0]
        if folder.name == "ddp":
            assert {"broadcast", "all_reduce"} <= set(comms["op"])


@folder_params
def test_cuda_memory_peaks_and_nvml_samples_are_recorded(folder):
    for trace in loaded(folder).ranks:
        steps, samples = trace.records.steps, trace.records.samples
        assert len(steps) > 0
        assert (steps["cuda_peak_allocated_bytes"] > 0).all()
        assert (steps["cuda_total_bytes"] > 0).all()
        nvml = samples[samples["source"] == "nvml"]
        assert len(nvml) > 0, f"{folder.name}: no NVML samples"
        assert (nvml["power_w"].dropna() > 0).all() and nvml["power_w"].notna().any()
        assert (nvml["mem_used_bytes"].dropna() > 0).all()


@folder_params
def test_hta_compatible_columns(folder):
    result = loaded(folder)
    hta = hta_temporal_breakdown(result.ranks)
    assert len(hta) == len(result.ranks)
    for _, row in hta.iterrows():
        assert row["kernel_time_us"] > 0, row["note"]
        parts = row["idle_us"] + row["compute_us"] + row["non_compute_us"]
        assert abs(parts - row["kernel_time_us"]) <= 1.0
    reference = (PROVENANCE.get("hta") or {}).get(folder.name)
    if not reference:
        return  # HTA was not importable on the GPU machine: nothing of HTA's to compare with
    ours = hta.iloc[0]
    for column, theirs in reference.items():
        deviation = abs(ours[column] - theirs) / reference["kernel_time_us"]
        assert deviation <= HTA_TOLERANCE, (column, ours[column], theirs)


@folder_params
def test_the_command_line_report_adds_up(folder):
    proc = subprocess.run([sys.executable, "-m", "analysis.breakdown", str(folder),
                           "--format", "json", "--no-cache"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    parts = ("compute_only_ns", "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns")
    assert doc["steps"]
    for row in doc["steps"]:
        assert abs(sum(row[p] for p in parts) - row["step_ns"]) <= SUM_TOLERANCE_NS, row
        assert row["kind"] == "gpu"
        assert row["peak_allocated_bytes"] is not None
    assert all(r["hta_compatible"]["kernel_time_us"] for r in doc["ranks"])
