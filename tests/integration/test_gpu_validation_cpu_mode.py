"""scripts/gpu_validation: its CPU mode end to end, and its GPU checks on GPU-like records.

One `--cpu --quick` run (module fixture, well under a minute on 2 cores) must list every check,
pass every check a CPU can do, mark every GPU check skipped with its reason, and leave a small,
flat OUTDIR. The GPU checks themselves cannot run here, so they are fed records shaped like a GPU
run's (and a real V100 trace from tests/data) to show that they pass on good GPU data and fail,
with a reason, on bad.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import tarfile
import time
from pathlib import Path

import pytest

from helpers.launch import DATA, REPO, launch
from scripts.gpu_validation import preflight as preflight_module
from scripts.gpu_validation.analysis_checks import check_hta_columns, check_hta_match, run_analysis
from scripts.gpu_validation.cli import guarded, main
from scripts.gpu_validation.config import (
    COMM_WORKLOADS,
    OUTDIR_MAX_FILES,
    TAR_LIMIT_BYTES,
    TRACE_LIMIT_BYTES,
    WORKLOADS,
    settings,
)
from scripts.gpu_validation.outdir import layout_problems
from scripts.gpu_validation.preflight import preflight
from scripts.gpu_validation.results import Results, planned_checks
from scripts.gpu_validation.run_checks import (
    check_memory,
    check_run_files,
    check_trace,
    check_utilisation,
)
from scripts.gpu_validation.run_folder import trace_summary
from scripts.gpu_validation.runner import Budget, BudgetExhausted, Completed, Runner, base_env

PACKAGE = REPO / "scripts" / "gpu_validation"
GPU_TRACE = (DATA / "kineto" / "resnet50_num_workers_0"
             / "worker0.1623143089861.pt.trace.json.gz")


def hta_reference(trace_dir: str) -> dict:
    """HTA 0.5.0's temporal breakdown of a trace folder, from the reference CSV in tests/data."""
    with (DATA / "hta-0.5.0-reference.csv").open() as handle:
        row, = [r for r in csv.DictReader(handle) if r["trace_dir"] == trace_dir]
    return {k: float(row[k]) for k in ("idle_us", "compute_us", "non_compute_us",
                                       "kernel_time_us")}


RESNET_HTA = hta_reference("resnet50_num_workers_0")


# ---- the CPU-mode run ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-validation-out")
    # Not alone(): in CPU mode the tracer's overhead is reported, never a pass bar, and the
    # run's time is held to a bar with room for the other test session's worker beside it.
    started = time.monotonic()
    proc = launch(PACKAGE, out, "--cpu", "--quick", timeout=240)
    elapsed = time.monotonic() - started
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    return {"out": out, "proc": proc, "elapsed": elapsed, "results": results}


def checks_of(run) -> dict:
    assert run["results"] is not None, f"no results.json; output:\n{run['proc'].stdout[-3000:]}" \
                                       f"\n{run['proc'].stderr[-3000:]}"
    return {c["name"]: c for c in run["results"]["checks"]}


def failures(run) -> str:
    return "\n".join(f"{c['name']}: {c['detail']}" for c in run["results"]["checks"]
                     if c["status"] == "failed")


def test_cpu_mode_passes_and_says_so(cpu_run):
    checks_of(cpu_run)
    proc = cpu_run["proc"]
    assert proc.returncode == 0, f"failed checks:\n{failures(cpu_run)}\n{proc.stdout[-2000:]}"
    assert cpu_run["results"]["verdict"] == "passed"
    assert cpu_run["results"]["mode"] == "cpu"
    assert "VERDICT: PASSED" in proc.stdout
    assert re.search(r"== done in [\d.]+ s", proc.stdout), "the elapsed time is printed"


def test_results_list_every_planned_check_in_order(cpu_run):
    planned = [name for name, _, _ in planned_checks()]
    assert [c["name"] for c in cpu_run["results"]["checks"]] == planned
    assert len(planned) == len(set(planned))
    for check in cpu_run["results"]["checks"]:
        assert set(check) >= {"name", "status", "passed", "figure", "detail"}
        assert check["status"] in ("passed", "failed", "skipped")
        expected = {"passed": True, "failed": False, "skipped": None}[check["status"]]
        assert check["passed"] is expected


def test_every_cpu_possible_check_passed(cpu_run):
    checks = checks_of(cpu_run)
    both = [name for name, scope, _ in planned_checks() if scope == "both"]
    not_passed = {n: checks[n]["detail"] for n in both if checks[n]["status"] != "passed"}
    assert not not_passed, not_passed
    # the ones the issue names: traces exist, the breakdown adds up, records are present
    for wl in WORKLOADS:
        assert checks[f"{wl}.trace"]["status"] == "passed"
        assert "max |sum - step| 0 ns" in checks[f"{wl}.breakdown"]["figure"] or \
            checks[f"{wl}.breakdown"]["status"] == "passed"
        assert "psutil" in checks[f"{wl}.samples"]["figure"]
    for wl in COMM_WORKLOADS:
        assert "'host'" in checks[f"{wl}.comm_records"]["detail"]


def test_gpu_checks_are_skipped_with_the_reason(cpu_run):
    checks = checks_of(cpu_run)
    for name, scope, _ in planned_checks():
        if scope == "gpu":
            assert checks[name]["status"] == "skipped", name
            assert checks[name]["detail"].startswith("skipped: no GPU"), checks[name]
    assert checks["pipeline.p2p"]["status"] == "skipped"
    assert "two NCCL ranks" in checks["pipeline.p2p"]["detail"]


def test_outdir_is_small_and_flat(cpu_run):
    out = cpu_run["out"]
    files = [p for p in out.rglob("*") if p.is_file()]
    names = sorted(str(p.relative_to(out)) for p in files)
    assert names == ["fixtures.tar", "logs.tar.gz", "results.json", "results.md"]
    assert len(files) + 1 <= OUTDIR_MAX_FILES  # + a console log tee'd into OUTDIR
    for path in out.rglob("*"):
        rel = path.relative_to(out)
        assert len(rel.parts) <= 3, rel
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts), rel
        assert not path.is_symlink()
    assert (out / "fixtures.tar").stat().st_size <= TAR_LIMIT_BYTES
    assert checks_of(cpu_run)["outdir.layout"]["status"] == "passed"


def test_fixtures_tar_holds_every_run_folder(cpu_run):
    with tarfile.open(cpu_run["out"] / "fixtures.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
        provenance = json.loads(tar.extractfile("gpu/provenance.jsonl").read())
    assert provenance["mode"] == "cpu"
    for wl in WORKLOADS:
        traces = [m for n, m in members.items()
                  if n.startswith(f"gpu/{wl}/rank0.") and n.endswith(".pt.trace.json.gz")]
        assert len(traces) == 1, sorted(members)
        assert traces[0].size < TRACE_LIMIT_BYTES
        for kind in ("manifest", "comms", "samples", "steps"):
            assert f"gpu/{wl}/rank0.{kind}.jsonl" in members
    assert all(n.startswith("gpu/") for n in members)


def test_results_md_shows_every_check(cpu_run):
    text = (cpu_run["out"] / "results.md").read_text()
    assert "**Verdict: PASSED**" in text
    for name, _, _ in planned_checks():
        assert f"| {name} |" in text


def test_cpu_run_is_quick(cpu_run):
    # The bar is under a minute on 2 cores; contention on a busy CI machine is allowed for.
    assert cpu_run["elapsed"] < 120, f"{cpu_run['elapsed']:.0f} s"
    assert checks_of(cpu_run)["time_budget"]["status"] == "passed"


def test_install_fixtures_refuses_a_cpu_tar_and_installs_with_allow_cpu(cpu_run, tmp_path, capsys):
    tar = cpu_run["out"] / "fixtures.tar"
    dest = tmp_path / "gpu"
    assert main(["--install-fixtures", str(tar), "--dest", str(dest)]) == 1
    assert "not on a GPU" in capsys.readouterr().err
    assert not dest.exists()
    (dest / "stale").mkdir(parents=True)
    assert main(["--install-fixtures", str(tar), "--dest", str(dest), "--allow-cpu"]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted([*WORKLOADS, "provenance.jsonl"])
    assert list((dest / "ddp").glob("rank0.*.pt.trace.json.gz"))


def test_install_fixtures_refuses_paths_outside_gpu(tmp_path, capsys):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        source = tmp_path / "x"
        source.write_text("x")
        tar.add(source, arcname="gpu/../../escape")
    assert main(["--install-fixtures", str(bad), "--dest", str(tmp_path / "d")]) == 2
    assert "unexpected members" in capsys.readouterr().err


def test_list_checks_prints_the_plan(capsys):
    assert main(["--list-checks"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in listed] == [n for n, _, _ in planned_checks()]


def test_layout_problems_are_found(tmp_path):
    for i in range(7):
        (tmp_path / f"f{i}").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep").write_text("x")
    (tmp_path / "bad name").write_text("x")
    problems, count = layout_problems(tmp_path)
    text = " ".join(problems)
    assert "deeper" in text and "'bad name'" in text and "more than 8" in text
    assert count == 11


# ---- the GPU checks on GPU-shaped records --------------------------------------------------------
def new_results(tmp_path, mode="gpu"):
    return Results(tmp_path, mode, True, Budget(300), ["test"])


def gpu_run(**changes) -> dict:
    """A run dict as read_run() returns it for a healthy 1-rank NCCL DDP run on a GPU."""
    t0 = 1_800_000_000_000_000_000
    samples = [{"t_ns": t0 + i * 50_000_000, "source": "nvml", "device": 0,
                "sm_util_pct": 0.0 if i < 2 else 45.0, "power_w": 120.0 + i,
                "mem_used_bytes": 600_000_000 + i * 10**8, "mem_total_bytes": 150 * 10**9}
               for i in range(20)]
    steps = [{"step": i, "start_ns": t0 + i * 10**7, "end_ns": t0 + (i + 1) * 10**7,
              "in_profiler_window": 5 <= i <= 7, "cuda_peak_allocated_bytes": 6 * 10**9,
              "cuda_peak_reserved_bytes": 7 * 10**9, "cuda_total_bytes": 150 * 10**9}
             for i in range(10)]
    comms = [{"step": 0, "op": "broadcast", "source": "ddp", "pg": "0", "pg_size": 1,
              "dtype": "float32", "bytes": 10**6, "start_ns": t0, "end_ns": t0 + 9000,
              "duration_us": 9.0, "timing": "cuda_event", "algbw_gbps": 111.1,
              "busbw_gbps": 111.1}]
    comms += [dict(comms[0], step=i, op="all_reduce", duration_us=4.5) for i in range(10)]
    run = {"dir": Path("/nonexistent"), "exists": True, "traces": [], "samples": samples,
           "steps": steps, "comms": comms, "manifest": [],
           "run_start": {"kind": "run_start", "sampler_source": "nvml"},
           "run_end": {"kind": "run_end", "status": "ok", "backend": "nccl"},
           "clock_sync": [{"kind": "clock_sync", "backend": "nccl"}], "errors": [],
           "summaries": [{"bytes": 10**5, "events": 5000, "kernels": 420, "nccl_kernels": 0,
                          "memcpy": 3, "memset": 1, "cuda_runtime": 900, "profiler_steps": 3,
                          "backend": "nccl", "devices": ["NVIDIA H200"]}],
           "summary_errors": [], "manifest_bad": 0, "steps_bad": 0, "samples_bad": 0,
           "comms_bad": 0}
    run.update(changes)
    return run


def statuses(results) -> dict:
    return {n: c["status"] for n, c in results.checks.items() if c["status"] != "pending"}


def test_gpu_file_checks_pass_on_a_healthy_gpu_run(tmp_path):
    results = new_results(tmp_path)
    run = gpu_run()
    check_run_files(results, "ddp", run, gpu=True)
    check_memory(results, "ddp", run, {"steps": [{"peak_allocated_bytes": 6e9}]})
    check_utilisation(results, {"ddp": run})
    got = statuses(results)
    for name in ("ddp.samples", "ddp.kernels", "ddp.nvml_values", "ddp.comm_records",
                 "ddp.comm_cuda_event", "ddp.cuda_memory", "nvml.utilisation_rises"):
        assert got[name] == "passed", (name, results.checks[name]["detail"])
    assert results.checks["ddp.kernels"]["figure"] == "420 kernels"


@pytest.mark.parametrize("change, failing, reason", [
    ({"summaries": [dict(gpu_run()["summaries"][0], kernels=0)]}, "ddp.kernels", "no "),
    ("host_timing", "ddp.comm_cuda_event", "not timed by CUDA events"),
    ("zero_duration", "ddp.comm_cuda_event", "duration <= 0"),
    ("gloo", "ddp.comm_cuda_event", "expected nccl"),
    ("psutil", "ddp.samples", "expected only 'nvml'"),
    ("no_power", "ddp.nvml_values", "with power"),
    ("no_peaks", "ddp.cuda_memory", "lack CUDA peaks"),
    ("flat_util", "nvml.utilisation_rises", "0% -> max 0%"),
    ({"comms": []}, "ddp.comm_records", "no collective records"),
])
def test_gpu_file_checks_fail_with_a_reason(tmp_path, change, failing, reason):
    base = gpu_run()
    if change == "host_timing":
        change = {"comms": [dict(c, timing="host") for c in base["comms"]]}
    elif change == "zero_duration":
        change = {"comms": [dict(c, duration_us=0.0) for c in base["comms"]]}
    elif change == "gloo":
        change = {"clock_sync": [{"backend": "gloo"}], "run_end": {"status": "ok",
                                                                   "backend": "gloo"}}
    elif change == "psutil":
        change = {"samples": [{"t_ns": 1, "source": "psutil", "cpu_process_pct": 50.0}],
                  "run_start": {"sampler_source": "psutil", "sampler_reason": "pynvml missing"}}
    elif change == "no_power":
        change = {"samples": [dict(s, power_w=None) for s in base["samples"]]}
    elif change == "no_peaks":
        change = {"steps": [{k: v for k, v in s.items() if not k.startswith("cuda_")}
                            for s in base["steps"]]}
    elif change == "flat_util":
        change = {"samples": [dict(s, sm_util_pct=0.0) for s in base["samples"]]}
    run = gpu_run(**change)
    results = new_results(tmp_path)
    check_run_files(results, "ddp", run, gpu=True)
    check_memory(results, "ddp", run, None)
    check_utilisation(results, {"ddp": run})
    check = results.checks[failing]
    assert check["status"] == "failed", check
    assert reason in check["detail"], check["detail"]


def test_trace_check_needs_run_end_ok_and_no_failed_tracer_part(tmp_path):
    done = Completed(rc=0, stdout="", stderr="", timed_out=False, elapsed=1.0, limit=10)
    cfg = {"steps": 10}
    run = gpu_run(traces=[Path("rank0.1.pt.trace.json.gz")])
    results = new_results(tmp_path)
    assert check_trace(results, "ddp", done, run, cfg)
    run = gpu_run(traces=[Path("x")], errors=[{"part": "comms", "message": "boom"}],
                  run_end={"status": "failed", "exception": "RuntimeError: x"})
    results = new_results(tmp_path)
    assert not check_trace(results, "ddp", done, run, cfg)
    detail = results.checks["ddp.trace"]["detail"]
    assert "tracer part comms failed: boom" in detail and "'failed'" in detail
    timed_out = Completed(rc=None, stdout="", stderr="stuck\n", timed_out=True, elapsed=9.0,
                             limit=9.0)
    results = new_results(tmp_path)
    assert not check_trace(results, "ddp", timed_out, run, cfg)
    assert "timed out" in results.checks["ddp.trace"]["detail"]


# ---- the analysis and HTA checks on a real GPU trace ---------------------------------------------
def gpu_run_folder(tmp_path: Path) -> Path:
    """The V100 trace from tests/data as rank 0 of a run folder, with GPU-shaped records."""
    from tracer import schema

    folder = tmp_path / "ddp"
    folder.mkdir()
    (folder / "rank0.1623143089861000000.pt.trace.json.gz").write_bytes(
        GPU_TRACE.read_bytes())
    run = gpu_run()
    lines = {
        "steps": [schema.StepRecord(**s) for s in run["steps"] + [
            dict(run["steps"][0], step=i) for i in range(10, 12)]],
        "samples": [schema.DeviceSample(**s) for s in run["samples"]],
        "comms": [schema.CommRecord(**c) for c in run["comms"]],
    }
    for kind, records in lines.items():
        (folder / f"rank0.{kind}.jsonl").write_bytes(
            b"".join(schema.ENCODER.encode(r) + b"\n" for r in records))
    return folder


def test_analysis_and_hta_column_checks_pass_on_a_real_gpu_trace(tmp_path):
    folder = gpu_run_folder(tmp_path)
    results = new_results(tmp_path)
    runner = Runner(Budget(300), base_env(False, []))
    cfg = settings(False, True)
    doc = run_analysis(results, runner, "ddp", folder, cfg, gpu=True)
    assert results.checks["ddp.breakdown"]["status"] == "passed", \
        results.checks["ddp.breakdown"]["detail"]
    assert "kind ['gpu']" in results.checks["ddp.breakdown"]["detail"]
    run = gpu_run()
    check_memory(results, "ddp", run, doc)
    assert results.checks["ddp.cuda_memory"]["status"] == "passed", \
        results.checks["ddp.cuda_memory"]["detail"]
    ours = check_hta_columns(results, "ddp", doc)
    assert results.checks["ddp.hta_columns"]["status"] == "passed"
    for key, value in RESNET_HTA.items():
        assert abs(ours[key] - value) <= 0.01 * RESNET_HTA["kernel_time_us"]


def fake_hta(tmp_path: Path, row: dict) -> dict:
    """An `hta` package whose temporal breakdown is `row`; returns the env that imports it."""
    package = tmp_path / "fake-hta" / "hta"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "trace_analysis.py").write_text(
        "import json, os\n"
        "class _Frame:\n"
        "    def to_json(self, orient):\n"
        "        return json.dumps([json.loads(os.environ['FAKE_HTA_ROW'])])\n"
        "class TraceAnalysis:\n"
        "    def __init__(self, trace_dir):\n"
        "        assert [p for p in os.listdir(trace_dir) if p.endswith('.json.gz')]\n"
        "    def get_temporal_breakdown(self, visualize=True):\n"
        "        return _Frame()\n")
    env = base_env(False, [str(package.parent)])
    env["FAKE_HTA_ROW"] = json.dumps(row)
    return env


@pytest.mark.parametrize("scale, status", [(1.0, "passed"), (1.05, "failed")])
def test_hta_match_compares_within_one_percent_of_kernel_time(tmp_path, scale, status):
    ours = dict(RESNET_HTA)
    row = {"rank": 0, "idle_time(us)": RESNET_HTA["idle_us"] * scale,
           "compute_time(us)": RESNET_HTA["compute_us"],
           "non_compute_time(us)": RESNET_HTA["non_compute_us"],
           "kernel_time(us)": RESNET_HTA["kernel_time_us"], "idle_time_pctg": 39.4}
    trace = tmp_path / "rank0.1.pt.trace.json.gz"
    trace.write_bytes(b"")
    results = new_results(tmp_path)
    runner = Runner(Budget(300), fake_hta(tmp_path, row))
    theirs = check_hta_match(results, runner, "ddp", {"traces": [trace]}, ours, tmp_path,
                                settings(False, True))
    check = results.checks["ddp.hta_match"]
    assert check["status"] == status, check
    assert theirs["kernel_time_us"] == RESNET_HTA["kernel_time_us"]
    assert "idle_us: ours 327463.0 vs HTA" in check["detail"]


def test_hta_match_is_skipped_when_hta_is_missing(tmp_path, monkeypatch):
    original = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "hta" else original(name, *a))
    results = new_results(tmp_path)
    runner = Runner(Budget(300), base_env(False, []))
    check_hta_match(results, runner, "ddp", gpu_run(), dict(RESNET_HTA), tmp_path, {})
    check = results.checks["ddp.hta_match"]
    assert check["status"] == "skipped" and "not importable" in check["detail"]


def test_trace_summary_counts_kernels_of_a_real_gpu_trace():
    summary = trace_summary(GPU_TRACE)
    assert summary["kernels"] > 1000 and summary["profiler_steps"] >= 2


def test_preflight_names_missing_modules_and_how_to_bring_wheels(tmp_path, monkeypatch):
    missing = ("no_such_module_rt", "no-such-dist", "required")
    monkeypatch.setattr(preflight_module, "MODULES", [*preflight_module.MODULES, missing])
    results = new_results(tmp_path, mode="cpu")
    runner = Runner(Budget(300), base_env(False, []))
    # a module the tracer itself does not need: the check fails, the run goes on
    assert preflight(results, runner, gpu=False, wheels=None, work=tmp_path)
    check = results.checks["preflight.modules"]
    assert check["status"] == "failed"
    assert "no_such_module_rt (pip: no-such-dist)" in check["detail"]
    assert "pip download" in check["detail"] and "--wheels" in check["detail"]


def test_docs_describe_every_check_and_the_status():
    text = (REPO / "docs" / "gpu-validation.md").read_text()
    for name, _, _ in planned_checks():
        prefix, _, suffix = name.partition(".")
        generic = f"`<workload>.{suffix}`" if prefix in WORKLOADS else None
        assert f"`{name}`" in text or (generic and generic in text), name
    assert "**Not yet run on a GPU. The GPU paths are not validated.**" in text


def test_a_crashing_check_fails_its_own_checks_and_the_run_goes_on(tmp_path, capsys):
    results = new_results(tmp_path, mode="cpu")
    with guarded(results, "ddp."):
        raise KeyError("power_w")
    detail = results.checks["ddp.trace"]["detail"]
    assert results.checks["ddp.trace"]["status"] == "failed"
    assert "crashed: KeyError" in detail and "power_w" in detail
    assert results.checks["ddp.kernels"]["status"] == "skipped"  # already settled: unchanged
    assert results.checks["dp.trace"]["status"] == "pending"
    assert "Traceback" in capsys.readouterr().err
    with pytest.raises(BudgetExhausted):
        with guarded(results, "dp."):
            raise BudgetExhausted("out of time")
