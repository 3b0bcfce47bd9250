#!/usr/bin/env python3
"""Validate ranktrace's GPU paths on a real GPU, in one command, with one verdict.

    python scripts/gpu_validation.py OUTDIR [--quick] [--cpu] [--budget S] [--wheels DIR]
    python scripts/gpu_validation.py --install-fixtures OUTDIR/fixtures.tar
    python scripts/gpu_validation.py --list-checks

Made for a machine with one NVIDIA GPU (an H200), torch with CUDA and NCCL, nvidia-ml-py, and no
network. It traces each workload under the tracer (DP in one process; DDP, model parallel and the
pipeline under torchrun with world size 1 on NCCL), checks what the tracer wrote (CUDA kernels in
the traces, CUDA-event timing of NCCL collectives, real NVML samples, CUDA memory peaks), runs
`python -m analysis.breakdown RUN --format json` on every run and checks that the breakdown adds
up (and, where the `hta` package is importable, matches HTA's temporal breakdown), times the
tracer's overhead, and writes into OUTDIR:

    results.json   every check: name, status (passed/failed/skipped), passed, figure, detail
    results.md     the same, readable, failing checks first
    fixtures.tar   gpu/<workload>/ run folders (traces + records) and gpu/provenance.jsonl:
                   the test fixtures for tests/test_gpu_fixtures.py (--install-fixtures)
    logs.tar.gz    every subprocess's output, the analysis documents, the overhead timings

That is four files, one level deep, so that a device tool that fetches at most 8 files (names of
letters, digits, `.`, `_`, `-`) brings all of them back, with room for a tee'd `log`.

`--cpu` runs the same flow without a GPU (gloo, psutil) and marks every GPU-only check
"skipped: no GPU (--cpu)"; this is how CI and tests/test_gpu_validation.py exercise it.
The whole run keeps within --budget seconds (every subprocess has a timeout cut to what is left);
the exit status is 0 only when no check failed. See docs/gpu-validation.md.

This file imports only the standard library; everything else runs in subprocesses, so that a
machine without pandas or msgspec still gets a clear preflight verdict instead of a traceback.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.util
import io
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
FIXTURES_DEST = REPO / "tests" / "data" / "gpu"

WORKLOADS = ("ddp", "dp", "model_parallel", "pipeline")  # ddp first: it has the most to check
COMM_WORKLOADS = ("ddp", "model_parallel")  # world size 1 still issues collectives here
TRACE_LIMIT_BYTES = 2_000_000  # each gzipped Kineto trace
TAR_LIMIT_BYTES = 16_000_000  # fixtures.tar
FETCH_MAX_FILES = 8
FETCH_MAX_DEPTH = 3  # OUTDIR/a/b/file
FETCH_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
SUM_TOLERANCE_NS = 1_000  # the breakdown's parts add up to the step within 1 us
HTA_TOLERANCE = 0.01  # of the rank's kernel time
TIME_LIMIT_S = 360.0  # the whole run must stay under 6 minutes
DEFAULT_BUDGET_S = 330.0
RESERVE_S = 12.0  # kept back for writing the tar files and results
MIN_STEP_S = 15.0  # a subprocess is not started with less time than this left
STATUS_DATE = "2026-11-29"

# Python modules: (import name, pip name, needed for). "required" ones stop the run when missing.
MODULES = [
    ("torch", "torch", "required"),
    ("numpy", "numpy", "required"),
    ("pandas", "pandas", "required"),
    ("msgspec", "msgspec", "required"),
    ("pynvml", "nvidia-ml-py", "gpu"),  # NVML sampling; without it the sampler falls back to psutil
    ("psutil", "psutil", "cpu"),  # the CPU sampler and RSS; on a GPU only RSS figures need it
    ("tensorboard", "tensorboard", "optional"),  # the tracer's scalar summaries
    ("pyarrow", "pyarrow", "optional"),  # the analysis cache only; we run with --no-cache
]
PROJECT_PACKAGES = ("tracer", "analysis", "workloads")
TRACING_MODULES = ("torch", "msgspec")  # the tracer cannot run without them
TRACER_CRITICAL_PARTS = {"profiler", "comms", "sampler", "memory", "steps", "manifest", "clock"}


# ---- the settings of one mode ---------------------------------------------------------------------
def settings(gpu: bool, quick: bool) -> dict:
    """Sizes, steps and profiler windows. Traces stay small (1 warm-up + 2 active steps, 4 layers);
    the GPU runs are long and wide enough for NVML's utilisation (averaged over up to 1 s) to rise."""
    if gpu:
        return {
            "model": ["--hidden", "4096", "--layers", "4", "--batch-size", "256"],
            "steps": 100 if quick else 200,
            # 6 DDP buckets per step instead of 22: the comms file stays a small fixture
            "ddp": ["--bucket-cap-mb", "100"],
            "tracer": ["--skip-first", "5", "--wait", "0", "--warmup", "1", "--active", "2",
                       "--repeat", "1", "--sample-hz", "20"],
            "trace_timeout": 150.0, "analysis_timeout": 90.0, "hta_timeout": 150.0,
            "overhead_model": ["--hidden", "2048", "--layers", "4", "--batch-size", "128"],
            "overhead_steps": 60 if quick else 120, "overhead_sample_hz": "20",
            "overhead_pairs": 2 if quick else 3, "overhead_discard": 10,
            "overhead_timeout": 120.0,
            "parallel": 1,  # one workload at a time: NVML figures and memory peaks are per run
        }
    return {
        "model": ["--hidden", "64", "--layers", "4", "--batch-size", "32"],
        "steps": 7 if quick else 12,
        "ddp": [],
        "tracer": ["--skip-first", "2", "--wait", "0", "--warmup", "1", "--active", "2",
                   "--repeat", "1", "--sample-hz", "10"],
        "trace_timeout": 90.0, "analysis_timeout": 60.0, "hta_timeout": 90.0,
        "overhead_model": ["--hidden", "64", "--layers", "4", "--batch-size", "32"],
        "overhead_steps": 24 if quick else 60, "overhead_sample_hz": "10",
        "overhead_pairs": 1 if quick else 2, "overhead_discard": 4,
        "overhead_timeout": 90.0,
        "parallel": 2,  # the traced runs mostly wait (launcher, rendezvous, start-up)
    }


# ---- the checks -------------------------------------------------------------------------------------
# scope: "both" runs on CPU and GPU; "gpu" is skipped with --cpu; "p2p" needs two GPUs.
def planned_checks() -> list[tuple[str, str, str]]:
    """(name, scope, what it checks), in the order they run. The same list in both modes."""
    checks = [
        ("preflight.modules", "both", "the Python modules the tracer and the analysis need are "
                                      "importable (missing ones listed with their pip names)"),
        ("preflight.cuda", "gpu", "torch sees a CUDA device and runs a kernel on it"),
        ("preflight.nccl", "gpu", "torch.distributed has NCCL"),
        ("preflight.nvml", "gpu", "pynvml initialises and reads the device's power"),
    ]
    for wl in WORKLOADS:
        checks += [
            (f"{wl}.trace", "both", "the traced run exits 0 with run_end ok, a Kineto trace and "
                                    "steps/samples/manifest records, no tracer part failed"),
            (f"{wl}.trace_size", "both", f"every gzipped trace is under {TRACE_LIMIT_BYTES} bytes"),
            (f"{wl}.kernels", "gpu", "the trace holds CUDA kernels (cat 'kernel')"),
            (f"{wl}.samples", "both", "device samples were written, from NVML on a GPU and "
                                      "psutil on CPU"),
            (f"{wl}.nvml_values", "gpu", "NVML samples have non-zero power and memory used"),
            (f"{wl}.cuda_memory", "gpu", "every step record has CUDA peak allocated/reserved "
                                         "bytes and the device total; the analysis reports them"),
        ]
        if wl in COMM_WORKLOADS:
            checks += [
                (f"{wl}.comm_records", "both", "collective records were written and are "
                                               "well-formed"),
                (f"{wl}.comm_cuda_event", "gpu", "every collective record is timed by CUDA "
                                                 "events (timing 'cuda_event', duration > 0) on "
                                                 "NCCL"),
            ]
        checks += [
            (f"{wl}.breakdown", "both", "analysis.breakdown exits 0 and every step's parts add "
                                        "up to the step time within 1 us (kind gpu on a GPU)"),
            (f"{wl}.hta_columns", "gpu", "the HTA-compatible columns are present and idle + "
                                         "compute + non-compute = kernel time"),
            (f"{wl}.hta_match", "gpu", "HTA's own get_temporal_breakdown on the same trace "
                                       "agrees within 1% of kernel time (needs the hta package)"),
        ]
    checks += [
        ("pipeline.p2p", "p2p", "pipeline send/recv between two stages timed by CUDA events "
                                "(needs two GPUs: one GPU cannot host two NCCL ranks)"),
        ("nvml.utilisation_rises", "gpu", "NVML SM utilisation rises above its starting value "
                                          "while a workload trains"),
        ("overhead.outside_windows", "both", "tracer overhead per step between profiler windows "
                                             "(median traced / median untraced step time)"),
        ("overhead.inside_windows", "both", "tracer overhead per step inside profiler windows "
                                            "(median traced / median bare torch.profiler "
                                            "recording step, exports left out)"),
        ("fixtures.tar", "both", f"fixtures.tar holds every run folder, under "
                                 f"{TAR_LIMIT_BYTES} bytes"),
        ("outdir.layout", "both", f"OUTDIR fits the device tool's fetch limits: at most "
                                  f"{FETCH_MAX_FILES} files (a tee'd log included), no deeper "
                                  f"than OUTDIR/a/b/file, names of letters, digits, . _ -"),
        ("time_budget", "both", f"the whole run took under {TIME_LIMIT_S:.0f} s"),
    ]
    return checks


class Results:
    """Every planned check with its status; saved as results.json after each change."""

    def __init__(self, outdir: Path, mode: str, quick: bool, budget: "Budget", argv: list[str]):
        self.outdir, self.mode, self.quick, self.budget = outdir, mode, quick, budget
        self.argv = argv
        self.environment: dict = {}
        self.notes: list[str] = []
        self.checks: dict[str, dict] = {}
        for name, scope, description in planned_checks():
            self.checks[name] = {"name": name, "scope": scope, "description": description,
                                 "status": "pending", "passed": None, "figure": None,
                                 "detail": ""}
        p2p_reason = ("the pipeline's send/recv need two stages, one per GPU, and one GPU cannot "
                      "host two NCCL ranks; the pipeline runs as 1 stage (no p2p ops)")
        if mode == "cpu":
            for check in self.checks.values():
                if check["scope"] == "gpu":
                    self._set(check, "skipped", None, "skipped: no GPU (--cpu); this check "
                                                      "needs a CUDA device", echo=False)
            p2p_reason = "no GPU (--cpu); and " + p2p_reason
        self._set(self.checks["pipeline.p2p"], "skipped", None, f"skipped: {p2p_reason}",
                  echo=False)

    def _set(self, check: dict, status: str, figure, detail: str, echo: bool = True) -> None:
        check.update(status=status, passed={"passed": True, "failed": False}.get(status),
                     figure=figure, detail=detail)
        if echo:
            label = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[status]
            figure_text = f" [{figure}]" if figure not in (None, "") else ""
            print(f"[{label}] {check['name']}{figure_text}: {detail}", flush=True)

    def pending(self, name: str) -> bool:
        return self.checks[name]["status"] == "pending"

    def record(self, name: str, ok: bool, figure=None, detail: str = "") -> bool:
        if self.pending(name):
            self._set(self.checks[name], "passed" if ok else "failed", figure, detail)
            self.save()
        return ok

    def skip(self, name: str, detail: str) -> None:
        if self.pending(name):
            self._set(self.checks[name], "skipped", None, detail)
            self.save()

    def not_run(self, names, why: str) -> None:
        marked = [n for n in names if self.pending(n)]
        for name in marked:
            self._set(self.checks[name], "failed", None, f"not run: {why}", echo=False)
        if marked:
            print(f"[FAIL] {len(marked)} checks not run: {why}: {', '.join(marked)}", flush=True)
        self.save()

    def finish(self, why: str) -> None:
        self.not_run(list(self.checks), why)

    @property
    def failed(self) -> list[dict]:
        return [c for c in self.checks.values() if c["status"] == "failed"]

    def counts(self) -> Counter:
        return Counter(c["status"] for c in self.checks.values())

    def document(self) -> dict:
        counts = self.counts()
        verdict = ("failed" if counts["failed"] else
                   "incomplete" if counts["pending"] else "passed")
        return {
            "tool": "scripts/gpu_validation.py", "format": 1, "mode": self.mode,
            "quick": self.quick, "verdict": verdict, "command": self.argv,
            "started": self.budget.started_at, "elapsed_s": round(self.budget.elapsed(), 1),
            "budget_s": self.budget.total, "counts": dict(counts),
            "environment": self.environment, "notes": self.notes,
            "checks": list(self.checks.values()),
        }

    def save(self) -> None:
        write_atomic(self.outdir / "results.json",
                     json.dumps(self.document(), indent=2, default=str) + "\n")

    def markdown(self) -> str:
        doc = self.document()
        counts = doc["counts"]
        env = self.environment
        lines = [
            "# ranktrace GPU validation results", "",
            f"**Verdict: {doc['verdict'].upper()}** ({counts.get('passed', 0)} passed, "
            f"{counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped); mode "
            f"`{self.mode}`{' --quick' if self.quick else ''}; {doc['elapsed_s']} s "
            f"(budget {self.budget.total:g} s); started {doc['started']}.", "",
            f"- machine: {env.get('device_name') or 'no GPU'}; torch {env.get('torch')}, CUDA "
            f"{env.get('torch_cuda')}, NCCL {env.get('nccl_version')}, NVIDIA driver "
            f"{env.get('nvml_driver')}, Python {env.get('python')}",
            f"- command: `{' '.join(self.argv)}`",
        ]
        lines += [f"- note: {note}" for note in self.notes]
        if self.failed:
            lines += ["", "## Failed checks", ""]
            lines += [f"- **{c['name']}**: {c['detail']}" for c in self.failed]
        lines += ["", "## All checks", "", "| check | status | figure | detail |",
                  "|---|---|---|---|"]
        for c in doc["checks"]:
            figure = "" if c["figure"] is None else str(c["figure"])
            lines.append(f"| {c['name']} | {c['status']} | {_md(figure)} | {_md(c['detail'])} |")
        return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    os.replace(temp, path)


class Budget:
    def __init__(self, total: float):
        self.total = float(total)
        self.start = time.monotonic()
        self.started_at = datetime.datetime.now().isoformat(timespec="seconds")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.total - self.elapsed()


class BudgetExhausted(Exception):
    pass


class Interrupted(Exception):
    pass


# ---- subprocesses -------------------------------------------------------------------------------------
class Runner:
    """Runs commands in the repository with a timeout cut to the budget; keeps their output."""

    def __init__(self, budget: Budget, env: dict):
        self.budget = budget
        self.env = env
        self.logs: dict[str, str] = {}  # name -> text, for logs.tar.gz
        self.live: set = set()  # Popen objects still running (several with run_many)
        self.stopping = False

    def kill_all(self) -> None:
        self.stopping = True  # no new command starts after this
        for proc in list(self.live):
            _kill_group(proc)

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None):
        left = self.budget.remaining() - RESERVE_S
        if left < MIN_STEP_S:
            raise BudgetExhausted(f"time budget exhausted before {name} "
                                  f"({self.budget.elapsed():.0f} s of {self.budget.total:g} s)")
        limit = min(timeout, left)
        if self.stopping:
            raise Interrupted(f"{name} not started: stopping")
        started = time.monotonic()
        print(f"  $ {' '.join(_short(c) for c in cmd)}  (timeout {limit:.0f} s)", flush=True)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)
        self.live.add(proc)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        finally:
            self.live.discard(proc)
        elapsed = time.monotonic() - started
        rc = proc.returncode
        self.logs[name] = (f"$ {' '.join(cmd)}\nrc={rc} timed_out={timed_out} "
                           f"elapsed={elapsed:.1f}s\n--- stdout ---\n{out}\n--- stderr ---\n{err}\n")
        state = f"timed out after {limit:.0f} s" if timed_out else f"rc={rc}"
        print(f"    {name}: {state} in {elapsed:.1f} s (total {self.budget.elapsed():.0f} s)",
              flush=True)
        return Completed(rc=None if timed_out else rc, stdout=out, stderr=err,
                         timed_out=timed_out, elapsed=elapsed, limit=limit)


    def run_many(self, jobs: list[tuple[str, list[str], float]], parallel: int) -> dict:
        """name -> Completed (or the BudgetExhausted it raised), `parallel` commands at a time."""
        if parallel <= 1:
            out = {}
            for name, cmd, timeout in jobs:
                out[name] = self.run(name, cmd, timeout)
            return out
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=parallel)
        futures: dict = {}
        try:
            futures = {name: pool.submit(self.run, name, cmd, timeout)
                       for name, cmd, timeout in jobs}
            for future in futures.values():
                future.exception()  # waits; a signal here (SIGTERM, Ctrl-C) kills the commands
        except BaseException:
            for future in futures.values():
                future.cancel()
            self.kill_all()
            raise
        finally:
            pool.shutdown(wait=True)
        out = {}
        for name, future in futures.items():
            error = future.exception()
            if error is not None and not isinstance(error, BudgetExhausted):
                raise error
            out[name] = error if error is not None else future.result()
        return out


class Completed:
    def __init__(self, rc, stdout, stderr, timed_out, elapsed, limit):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.timed_out, self.elapsed, self.limit = timed_out, elapsed, limit

    def failure(self) -> str:
        """Why the command failed, with the tail of its output."""
        tail = _tail(self.stderr or self.stdout)
        if self.timed_out:
            return f"timed out after {self.limit:.0f} s; output tail: {tail}"
        return f"exit code {self.rc}; output tail: {tail}"


def _tail(text: str, lines: int = 6, chars: int = 600) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()][-lines:]
    return " / ".join(kept)[-chars:] or "(no output)"


def _short(word: str) -> str:
    if "\n" in word:
        return "<code>"
    return word.replace(str(REPO) + os.sep, "")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the process group this script started for `proc`."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def base_env(gpu: bool, extra_paths: list[str]) -> dict:
    """The environment for every subprocess: no launcher or tracer variables from outside."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("RANKTRACE_", "TORCHELASTIC_"))}
    paths = [str(REPO), *extra_paths]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    if gpu:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # "DP on one GPU", even on a bigger machine
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
        if any(name == "lo" for _, name in socket.if_nameindex()):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


# ---- preflight ----------------------------------------------------------------------------------------
PREFLIGHT_CODE = r"""
import json, platform, sys
want_gpu = sys.argv[1] == "gpu"
info = {"python": platform.python_version(), "platform": platform.platform(),
        "machine": platform.machine()}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if want_gpu and torch.cuda.is_available():
        info["device_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        info["device_name"] = props.name
        info["device_total_bytes"] = props.total_memory
        info["capability"] = f"{props.major}.{props.minor}"
        x = torch.arange(1024, device="cuda", dtype=torch.float32)
        info["cuda_kernel_ok"] = float(x.sum().item()) == 1023 * 1024 / 2
    import torch.distributed as dist
    info["distributed"] = dist.is_available()
    info["gloo_available"] = dist.is_available() and dist.is_gloo_available()
    info["nccl_available"] = dist.is_available() and dist.is_nccl_available()
    if want_gpu:
        try:
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:
            info["nccl_error"] = f"{type(exc).__name__}: {exc}"
except Exception as exc:
    info["torch_error"] = f"{type(exc).__name__}: {exc}"
if want_gpu:
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["nvml_driver"] = driver.decode() if isinstance(driver, bytes) else driver
        info["nvml_device_count"] = pynvml.nvmlDeviceGetCount()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        info["nvml_device"] = name.decode() if isinstance(name, bytes) else name
        info["nvml_power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        info["nvml_mem_used_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        pynvml.nvmlShutdown()
    except Exception as exc:
        info["nvml_error"] = f"{type(exc).__name__}: {exc}"
print("PREFLIGHT " + json.dumps(info))
"""


def missing_modules(search_paths: list[str], gpu: bool) -> tuple[list, list]:
    """(missing required (import, pip, why), missing optional) without importing anything."""
    saved = list(sys.path)
    sys.path[:0] = [str(REPO), *search_paths]
    importlib.invalidate_caches()
    try:
        required, optional = [], []
        for module, pip_name, need in MODULES:
            if importlib.util.find_spec(module) is not None:
                continue
            needed = need == "required" or (need == "gpu" and gpu) or (need == "cpu" and not gpu)
            (required if needed else optional).append((module, pip_name, need))
        for package in PROJECT_PACKAGES:
            if importlib.util.find_spec(package) is None:
                required.append((package, f"(this repository's {package}/)", "required"))
        return required, optional
    finally:
        sys.path[:] = saved


def install_wheels(wheels: Path, target: Path, runner: Runner) -> str:
    """pip install every wheel in `wheels` into `target`, offline and without dependency
    resolution: the folder is expected to hold exactly what this machine lacks."""
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        return f"--wheels {wheels}: no *.whl files there"
    target.mkdir(parents=True, exist_ok=True)
    done = runner.run("pip-install-wheels",
                      [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                       "--target", str(target), "--no-warn-script-location", "--quiet", *files],
                      timeout=180.0)
    if done.rc != 0:
        return f"pip install of {len(files)} wheels from {wheels} failed: {done.failure()}"
    return f"installed {len(files)} wheels from {wheels} into {target}"


def wheel_advice(missing: list, python: str, machine: str) -> str:
    pips = " ".join(pip for _, pip, _ in missing if not pip.startswith("("))
    version = "".join(python.split(".")[:2])
    return (f"carry wheels for this machine (Python {python}, {machine}): on a machine with "
            f"network run `pip download --only-binary=:all: --python-version {version} "
            f"--platform manylinux2014_{machine} -d wheels {pips}`, send the `wheels` folder with "
            f"the run (carry), and rerun with `--wheels wheels` (docs/gpu-validation.md)")


def preflight(results: Results, runner: Runner, gpu: bool, wheels: Path | None,
              work: Path) -> bool:
    """Modules, CUDA, NCCL and NVML. False: nothing more can run."""
    extra = []
    install_note = ""
    if wheels is not None:
        site = work / "site-packages"
        install_note = install_wheels(wheels.resolve(), site, runner)
        extra = [str(site)]
        runner.env["PYTHONPATH"] = os.pathsep.join([str(site), runner.env["PYTHONPATH"]])
    required, optional = missing_modules(extra, gpu)
    probe = runner.run("preflight", [sys.executable, "-c", PREFLIGHT_CODE,
                                     "gpu" if gpu else "cpu"], timeout=120.0)
    info = {}
    for line in probe.stdout.splitlines():
        if line.startswith("PREFLIGHT "):
            info = json.loads(line[len("PREFLIGHT "):])
    results.environment.update(info)
    results.environment["hta_importable"] = _importable_in_env("hta", runner.env)
    python = info.get("python", platform.python_version())
    machine = info.get("machine", platform.machine())
    optional_text = (f"; optional, missing: {', '.join(m for m, _, _ in optional)}"
                     if optional else "")
    if not gpu and not required and not info.get("gloo_available"):
        results.record("preflight.modules", False, "no gloo",
                       f"torch.distributed has no gloo backend, which the CPU flow needs "
                       f"({info.get('torch_error') or probe.failure()})")
    if required:
        names = ", ".join(f"{m} (pip: {p})" for m, p, _ in required)
        results.record("preflight.modules", False, f"{len(required)} missing",
                       f"missing: {names}{optional_text}. {install_note + '. ' if install_note else ''}"
                       + wheel_advice(required + optional, python, machine))
    else:
        results.record("preflight.modules", True, "all present",
                       f"torch {info.get('torch')}, Python {python}{optional_text}"
                       + (f"; {install_note}" if install_note else ""))
    if probe.rc != 0 or "torch_error" in info or not info:
        results.notes.append(f"preflight probe failed: {info.get('torch_error') or probe.failure()}")
    # Without these nothing can be traced; without the others (pandas: the analysis; pynvml: NVML
    # samples) the run goes on, so that one device call still yields traces and every other check.
    blocking = [m for m, _, _ in required if m in TRACING_MODULES or m in PROJECT_PACKAGES]
    if blocking:
        results.notes.append(f"cannot trace without {', '.join(blocking)}")
    if not gpu:
        return not blocking and bool(info.get("gloo_available"))

    cuda_ok = bool(info.get("cuda_available")) and bool(info.get("cuda_kernel_ok"))
    results.record("preflight.cuda", cuda_ok, info.get("device_name"),
                   (f"{info.get('device_count')} device(s), {info.get('device_name')}, capability "
                    f"{info.get('capability')}, {info.get('device_total_bytes', 0) / 2**30:.0f} GiB,"
                    f" torch {info.get('torch')} built for CUDA {info.get('torch_cuda')}")
                   if cuda_ok else
                   f"no usable CUDA device (torch {info.get('torch')}, built for CUDA "
                   f"{info.get('torch_cuda')}, cuda_available={info.get('cuda_available')}"
                   f"{', ' + info['torch_error'] if 'torch_error' in info else ''}); on a machine "
                   f"without a GPU run with --cpu")
    results.record("preflight.nccl", bool(info.get("nccl_available")), info.get("nccl_version"),
                   f"NCCL {info.get('nccl_version')}" if info.get("nccl_available") else
                   f"torch.distributed has no NCCL ({info.get('nccl_error', 'is_nccl_available() is False')})")
    nvml_ok = "nvml_error" not in info and info.get("nvml_power_w") is not None
    results.record("preflight.nvml", nvml_ok, info.get("nvml_driver"),
                   f"driver {info.get('nvml_driver')}, {info.get('nvml_device')}, "
                   f"{info.get('nvml_power_w')} W now" if nvml_ok else
                   f"NVML unusable: {info.get('nvml_error', 'no reading')}")
    if (info.get("nvml_device_count") or 0) > 1:
        results.notes.append(f"{info['nvml_device_count']} GPUs present; runs are restricted to "
                             f"CUDA_VISIBLE_DEVICES={runner.env.get('CUDA_VISIBLE_DEVICES')}")
    return not blocking and cuda_ok


# ---- reading a run folder ------------------------------------------------------------------------------
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


# ---- the workloads ----------------------------------------------------------------------------------------
def trace_command(wl: str, work: Path, cfg: dict) -> list[str]:
    tracer = ["-m", "tracer.record", "--out", str(work), "--run-name", wl, *cfg["tracer"]]
    script = [f"workloads/{wl}.py", "--steps", str(cfg["steps"]), *cfg["model"]]
    if wl == "pipeline":
        script += ["--microbatches", "4"]
    if wl == "ddp":
        script += cfg["ddp"]
    if wl == "dp":  # DataParallel: one process, no process group, no torchrun
        return [sys.executable, *tracer, *script]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "1", *tracer, *script]


def check_trace(results: Results, wl: str, done: Completed, run: dict, cfg: dict) -> bool:
    name = f"{wl}.trace"
    if done.rc != 0:
        return results.record(name, False, None, f"traced run failed: {done.failure()}")
    if not run["exists"]:
        return results.record(name, False, None, f"no run folder {run['dir']}")
    problems = []
    end = run["run_end"]
    if end is None:
        problems.append("manifest has no run_end")
    elif end.get("status") != "ok":
        problems.append(f"run_end status {end.get('status')!r} ({end.get('exception')})")
    if not run["traces"]:
        problems.append("no Kineto trace (*.pt.trace.json.gz)")
    problems += run["summary_errors"]
    if len(run["steps"]) != cfg["steps"]:
        problems.append(f"{len(run['steps'])} step records for {cfg['steps']} steps")
    if not any(s.get("in_profiler_window") for s in run["steps"]):
        problems.append("no step record is marked in_profiler_window")
    if not run["samples"]:
        problems.append("no device samples")
    for key in ("manifest_bad", "steps_bad", "samples_bad", "comms_bad"):
        if run[key]:
            problems.append(f"{run[key]} unparsable lines in the {key[:-4]} file")
    critical = [e for e in run["errors"] if e.get("part") in TRACER_CRITICAL_PARTS]
    minor = [e for e in run["errors"] if e.get("part") not in TRACER_CRITICAL_PARTS]
    problems += [f"tracer part {e.get('part')} failed: {e.get('message')}" for e in critical]
    profiler_steps = sum(s["profiler_steps"] for s in run["summaries"])
    figure = (f"{len(run['traces'])} trace(s), {len(run['steps'])} steps, "
              f"{len(run['samples'])} samples, {len(run['comms'])} comm records")
    detail = (f"{done.elapsed:.1f} s; {profiler_steps} ProfilerStep spans in the trace(s); "
              f"sampler {run['run_start'].get('sampler_source')}")
    if minor:
        detail += "; non-critical tracer parts off: " + "; ".join(
            f"{e.get('part')}: {e.get('message')}" for e in minor)
    if problems:
        return results.record(name, False, figure, "; ".join(problems) + f" ({detail})")
    return results.record(name, True, figure, detail)


def check_run_files(results: Results, wl: str, run: dict, gpu: bool) -> None:
    """Every check that only needs the run folder."""
    sizes = [(p.name, p.stat().st_size) for p in run["traces"]]
    big = [f"{n} is {s} bytes" for n, s in sizes if s >= TRACE_LIMIT_BYTES]
    if not sizes:
        results.record(f"{wl}.trace_size", False, None, "no trace file")
    else:
        results.record(f"{wl}.trace_size", not big, f"{max(s for _, s in sizes)} bytes",
                       "; ".join(big) if big else
                       f"{len(sizes)} file(s), largest {max(s for _, s in sizes)} bytes "
                       f"(limit {TRACE_LIMIT_BYTES})")

    samples = run["samples"]
    sources = Counter(s.get("source") for s in samples)
    expected = "nvml" if gpu else "psutil"
    sampler_source = run["run_start"].get("sampler_source")
    ok = bool(samples) and set(sources) == {expected} and sampler_source == expected
    results.record(f"{wl}.samples", ok, f"{len(samples)} {'/'.join(map(str, sources)) or 'none'}",
                   f"{dict(sources)} samples; run_start.sampler_source={sampler_source!r}"
                   + ("" if ok else f"; expected only {expected!r} samples"
                      f" (sampler_reason: {run['run_start'].get('sampler_reason')})"))

    if gpu:
        check_gpu_files(results, wl, run)
    if wl in COMM_WORKLOADS:
        check_comms(results, wl, run, gpu)


def check_gpu_files(results: Results, wl: str, run: dict) -> None:
    summaries = run["summaries"]
    kernels = sum(s["kernels"] for s in summaries)
    nccl = sum(s["nccl_kernels"] for s in summaries)
    devices = sorted({d for s in summaries for d in s["devices"] if d})
    results.record(f"{wl}.kernels", kernels > 0, f"{kernels} kernels",
                   f"{kernels} kernel events ({nccl} NCCL), "
                   f"{sum(s['memcpy'] for s in summaries)} memcpy, "
                   f"{sum(s['cuda_runtime'] for s in summaries)} CUDA runtime events; "
                   f"distributedInfo.backend={summaries[0]['backend'] if summaries else None}; "
                   f"devices {devices}" + ("" if kernels else
                                           "; no ProfilerActivity.CUDA events were recorded"))

    nvml = [s for s in run["samples"] if s.get("source") == "nvml"]
    power = [s["power_w"] for s in nvml if s.get("power_w") is not None]
    used = [s["mem_used_bytes"] for s in nvml if s.get("mem_used_bytes") is not None]
    util = [s["sm_util_pct"] for s in nvml if s.get("sm_util_pct") is not None]
    ok = bool(power) and bool(used) and min(power) > 0 and min(used) > 0
    results.record(
        f"{wl}.nvml_values", ok,
        f"{min(power):.0f}-{max(power):.0f} W" if power else None,
        (f"{len(nvml)} NVML samples; power {min(power):.1f}-{max(power):.1f} W; memory used "
         f"{min(used) / 2**30:.2f}-{max(used) / 2**30:.2f} GiB; SM util "
         f"{min(util):.0f}-{max(util):.0f}%" if ok else
         f"{len(nvml)} NVML samples, {len(power)} with power (min {min(power, default=None)}), "
         f"{len(used)} with memory used (min {min(used, default=None)})"))


def check_comms(results: Results, wl: str, run: dict, gpu: bool) -> None:
    comms = run["comms"]
    ops = Counter(c.get("op") for c in comms)
    problems = []
    if not comms:
        problems.append("no collective records")
    if wl == "ddp" and not {"broadcast", "all_reduce"} <= set(ops):
        problems.append(f"DDP should record its broadcast and bucket all_reduce, got {dict(ops)}")
    fields = ("step", "op", "source", "pg", "pg_size", "dtype", "bytes", "start_ns", "end_ns",
              "duration_us", "timing", "algbw_gbps", "busbw_gbps")
    malformed = [c for c in comms if any(f not in c for f in fields)
                 or c.get("pg_size") != 1 or c.get("bytes", 0) < 0
                 or c.get("duration_us", -1) < 0 or c.get("end_ns", 0) < c.get("start_ns", 0)]
    if malformed:
        problems.append(f"{len(malformed)} malformed records, e.g. {malformed[0]}")
    timings = Counter(c.get("timing") for c in comms)
    if not gpu and set(timings) - {"host"}:
        problems.append(f"on CPU every record should be timed 'host', got {dict(timings)}")
    results.record(f"{wl}.comm_records", not problems, f"{len(comms)} records",
                   "; ".join(problems) if problems else
                   f"ops {dict(ops)}; sources {dict(Counter(c.get('source') for c in comms))};"
                   f" timing {dict(timings)}")
    if not gpu:
        return
    durations = sorted(c.get("duration_us", 0) for c in comms)
    not_event = [c for c in comms if c.get("timing") != "cuda_event"]
    zero = [c for c in comms if not c.get("duration_us", 0) > 0]
    backends = {c.get("backend") for c in run["clock_sync"]} | {
        (run["run_end"] or {}).get("backend")}
    backends.discard(None)
    problems = []
    if not comms:
        problems.append("no collective records")
    if not_event:
        problems.append(f"{len(not_event)} of {len(comms)} records not timed by CUDA events "
                        f"(timing {dict(Counter(c.get('timing') for c in not_event))})")
    if zero:
        problems.append(f"{len(zero)} records with duration <= 0, e.g. {zero[0].get('op')} "
                        f"{zero[0].get('bytes')} bytes (NCCL does no device work for an in-place "
                        f"collective in a 1-rank world, so its event pair can be 0 us apart)")
    if backends != {"nccl"}:
        problems.append(f"process-group backend {sorted(backends)} (expected nccl)")
    figure = (f"median {statistics.median(durations):.1f} us" if durations else None)
    results.record(f"{wl}.comm_cuda_event", not problems, figure,
                   "; ".join(problems) if problems else
                   f"{len(comms)} cuda_event records on nccl; duration {durations[0]:.1f}-"
                   f"{durations[-1]:.1f} us, median {statistics.median(durations):.1f} us")


def check_memory(results: Results, wl: str, run: dict, analysis: dict | None) -> None:
    steps = run["steps"]
    bad = [s for s in steps
           if not (s.get("cuda_peak_allocated_bytes") or 0) > 0
           or (s.get("cuda_peak_reserved_bytes") or 0) < (s.get("cuda_peak_allocated_bytes") or 0)
           or not (s.get("cuda_total_bytes") or 0) > 0]
    peaks = [s["cuda_peak_allocated_bytes"] for s in steps if s.get("cuda_peak_allocated_bytes")]
    problems = []
    if not steps:
        problems.append("no step records")
    if bad:
        problems.append(f"{len(bad)} of {len(steps)} step records lack CUDA peaks or total, "
                        f"e.g. {bad[0]}")
    analysed = [s.get("peak_allocated_bytes") for s in (analysis or {}).get("steps", [])]
    if analysis is not None and (not analysed or any(v is None for v in analysed)):
        problems.append(f"the analysis' per-step table lacks peak_allocated_bytes ({analysed})")
    figure = f"peak {max(peaks) / 2**30:.2f} GiB" if peaks else None
    results.record(f"{wl}.cuda_memory", not problems, figure,
                   "; ".join(problems) if problems else
                   f"{len(steps)} step records; peak allocated {min(peaks) / 2**30:.2f}-"
                   f"{max(peaks) / 2**30:.2f} GiB of {steps[0]['cuda_total_bytes'] / 2**30:.0f} "
                   f"GiB; the analysis reports peaks for {len(analysed)} analysed step(s)")


def run_analysis(results: Results, runner: Runner, wl: str, run_dir: Path, cfg: dict,
                 gpu: bool) -> dict | None:
    done = runner.run(f"analysis-{wl}", [sys.executable, "-m", "analysis.breakdown", str(run_dir),
                                         "--format", "json", "--no-cache"],
                      timeout=cfg["analysis_timeout"])
    name = f"{wl}.breakdown"
    if done.rc != 0:
        results.record(name, False, None, f"analysis failed: {done.failure()}")
        return None
    try:
        doc = json.loads(done.stdout)
    except ValueError as exc:
        results.record(name, False, None, f"analysis printed no JSON document ({exc}); "
                                          f"stdout tail: {_tail(done.stdout)}")
        return None
    runner.logs[f"analysis-{wl}.json"] = done.stdout
    parts = ("compute_only_ns", "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns")
    problems, worst = [], 0
    steps = doc.get("steps") or []
    if not steps:
        problems.append("no step analysed")
    for row in steps:
        try:
            diff = abs(sum(row[p] for p in parts) - row["step_ns"])
        except (KeyError, TypeError) as exc:
            problems.append(f"step row without parts ({exc}): {row}")
            break
        worst = max(worst, diff)
        if diff > SUM_TOLERANCE_NS:
            problems.append(f"rank {row.get('rank')} step {row.get('step')}: parts sum to "
                            f"{sum(row[p] for p in parts)} ns, step_ns {row['step_ns']}")
        if not row["step_ns"] > 0:
            problems.append(f"rank {row.get('rank')} step {row.get('step')}: step_ns "
                            f"{row['step_ns']}")
    for rank in doc.get("ranks") or []:
        total = rank.get("breakdown") or {}
        if total and abs(sum(total.get(p, 0) for p in parts) - total.get("step_ns", 0)) > \
                SUM_TOLERANCE_NS * max(1, total.get("steps", 1)):
            problems.append(f"rank {rank.get('rank')} totals do not add up: {total}")
    kinds = {row.get("kind") for row in steps}
    expected = "gpu" if gpu else "cpu"
    if steps and kinds != {expected}:
        problems.append(f"breakdown kind {sorted(map(str, kinds))}, expected {expected!r}")
    if doc.get("problems"):
        problems_text = "; analysis problems: " + " | ".join(map(str, doc["problems"]))[:400]
    else:
        problems_text = ""
    unavailable = doc.get("unavailable") or {}
    if unavailable:
        problems.append(f"tables unavailable: {unavailable}")
    first = steps[0] if steps else {}
    figure = f"{len(steps)} steps, max |sum - step| {_int(worst)} ns"
    detail = (f"kind {sorted(map(str, kinds))}; step {_int(first.get('step'))}: "
              f"{_int(first.get('step_ns'))} ns = compute {_int(first.get('compute_only_ns'))} + "
              f"comm {_int(first.get('comm_only_ns'))} + overlap {_int(first.get('overlap_ns'))} + "
              f"memcpy {_int(first.get('memcpy_ns'))} + idle {_int(first.get('idle_ns'))}; "
              f"{done.elapsed:.1f} s{problems_text}")
    results.record(name, not problems, figure,
                   ("; ".join(problems) + f" ({detail})") if problems else detail)
    return doc


def _int(value):
    """Whole numbers without the '.0' JSON floats bring; anything else as it is."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def check_hta_columns(results: Results, wl: str, doc: dict | None) -> dict | None:
    name = f"{wl}.hta_columns"
    if doc is None:
        results.record(name, False, None, "no analysis document (see the breakdown check)")
        return None
    ranks = doc.get("ranks") or []
    if not ranks:
        results.record(name, False, None, "no rank in the analysis document")
        return None
    hta = ranks[0].get("hta_compatible") or {}
    columns = ("idle_us", "compute_us", "non_compute_us", "kernel_time_us")
    if any(hta.get(c) is None for c in columns):
        results.record(name, False, None, f"HTA-compatible columns missing: {hta}")
        return None
    diff = abs(hta["idle_us"] + hta["compute_us"] + hta["non_compute_us"] - hta["kernel_time_us"])
    ok = hta["kernel_time_us"] > 0 and diff <= 1.0
    results.record(name, ok, f"kernel time {hta['kernel_time_us']:.0f} us",
                   f"idle {hta['idle_us']:.1f} + compute {hta['compute_us']:.1f} + non-compute "
                   f"{hta['non_compute_us']:.1f} vs kernel time {hta['kernel_time_us']:.1f} us "
                   f"(|diff| {diff:.3f} us)")
    return hta


HTA_CODE = r"""
import json, sys
from hta.trace_analysis import TraceAnalysis
frame = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
print("HTA_RESULT " + frame.to_json(orient="records"))
"""
HTA_COLUMNS = {"idle_us": "idle_time", "compute_us": "compute_time",
               "non_compute_us": "non_compute_time", "kernel_time_us": "kernel_time"}


def check_hta_match(results: Results, runner: Runner, wl: str, run: dict, ours: dict | None,
                    work: Path, cfg: dict) -> dict | None:
    name = f"{wl}.hta_match"
    if not _importable_in_env("hta", runner.env):
        results.skip(name, "skipped: the hta package (holistictraceanalysis) is not importable "
                           "here; optional (docs/gpu-validation.md says how to carry it)")
        return None
    if ours is None or not run.get("traces"):
        results.record(name, False, None, "nothing to compare: no trace or no HTA-compatible "
                                          "columns of ours")
        return None
    folder = work / f"hta-{wl}"
    folder.mkdir(exist_ok=True)
    for trace in run["traces"]:  # only the trace: HTA reads every *.json(.gz) it finds
        shutil.copy2(trace, folder / trace.name)
    done = runner.run(f"hta-{wl}", [sys.executable, "-c", HTA_CODE, str(folder)],
                      timeout=cfg["hta_timeout"])
    rows = None
    for line in done.stdout.splitlines():
        if line.startswith("HTA_RESULT "):
            rows = json.loads(line[len("HTA_RESULT "):])
    if done.rc != 0 or not rows:
        results.record(name, False, None, f"HTA failed on the trace: {done.failure()}")
        return None
    row = rows[0]
    theirs = {}
    for ours_key, prefix in HTA_COLUMNS.items():
        match = [k for k in row if k.startswith(prefix) and "pctg" not in k]
        theirs[ours_key] = float(row[match[0]]) if match else None
    kernel = theirs.get("kernel_time_us") or 0.0
    if not kernel or any(v is None for v in theirs.values()):
        results.record(name, False, None, f"HTA's row lacks the columns: {row}")
        return None
    deviations = {k: abs(ours[k] - theirs[k]) / kernel for k in HTA_COLUMNS}
    worst = max(deviations.values())
    results.record(name, worst <= HTA_TOLERANCE, f"max {worst:.3%} of kernel time",
                   "; ".join(f"{k}: ours {ours[k]:.1f} vs HTA {theirs[k]:.1f}" for k in HTA_COLUMNS))
    return theirs


def _importable_in_env(module: str, env: dict) -> bool:
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    saved = list(sys.path)
    sys.path[:0] = paths
    importlib.invalidate_caches()
    try:
        return importlib.util.find_spec(module) is not None
    finally:
        sys.path[:] = saved


def check_utilisation(results: Results, runs: dict) -> None:
    figures, rose = [], []
    for wl, run in runs.items():
        util = [(s["t_ns"], s["sm_util_pct"]) for s in run.get("samples") or []
                if s.get("source") == "nvml" and s.get("sm_util_pct") is not None]
        if not util:
            figures.append(f"{wl}: no NVML utilisation samples")
            continue
        util.sort()
        first, peak = util[0][1], max(v for _, v in util)
        busy = sum(1 for _, v in util if v > first)
        figures.append(f"{wl}: {first:.0f}% -> max {peak:.0f}% ({busy}/{len(util)} samples above "
                       f"the start)")
        if peak >= 1 and peak > first:
            rose.append((peak, wl))
    best = max(rose) if rose else None
    results.record("nvml.utilisation_rises", bool(rose),
                   f"max {best[0]:.0f}% in {best[1]}" if best else None,
                   "; ".join(figures) or "no run with NVML samples")


# ---- overhead -------------------------------------------------------------------------------------------
def probe_main(argv: list[str]) -> None:
    """`_probe OUT.json PROFILER SCRIPT [ARGS]`: run SCRIPT as __main__, stamping every step end.

    Every arm of the overhead measurement runs through here, so that untraced, traced and
    bare-profiler step times are taken by the same optimizer-step hook. Registered after the
    tracer's hook, it counts the tracer's step-end work in the step. PROFILER is "-" or
    "skip_first,wait,warmup,active,repeat": a bare torch.profiler with that schedule (CPU and, on
    a GPU, CUDA activities, gzipped traces), stepped at each step end, the tracer's yardstick.
    """
    import runpy

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    out, profiler_spec, script, *args = argv
    profile = None
    if profiler_spec != "-":
        from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

        skip_first, wait, warmup, active, repeat = (int(v) for v in profiler_spec.split(","))
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        profile = torch.profiler.profile(
            activities=activities,
            schedule=schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active,
                              repeat=repeat),
            on_trace_ready=tensorboard_trace_handler(out + ".traces", worker_name="rank0",
                                                     use_gzip=True))
        profile.start()
    stamps: list[int] = []

    def on_step(*_):
        if profile is not None:
            profile.step()
        stamps.append(time.perf_counter_ns())

    register_optimizer_step_post_hook(on_step)
    start = time.perf_counter_ns()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        if profile is not None:
            profile.stop()
        Path(out).write_text(json.dumps({"start_ns": start, "step_end_ns": stamps}))


def profiler_actions(steps: int, skip_first: int, wait: int, warmup: int, active: int,
                     repeat: int) -> list[str]:
    """torch.profiler.schedule's action for each step: none, warmup, record or save (the
    recording step whose end exports a trace)."""
    cycle = wait + warmup + active
    actions = []
    for k in range(steps + 1):
        if k < skip_first or (repeat and (k - skip_first) // cycle >= repeat):
            actions.append("none")
            continue
        mod = (k - skip_first) % cycle
        actions.append("none" if mod < wait else "warmup" if mod < wait + warmup else
                       "save" if mod == cycle - 1 else "record")
    return actions


OVERHEAD_ARMS = ("untraced", "traced", "profiler")


def overhead(results: Results, runner: Runner, work: Path, cfg: dict, gpu: bool,
             max_ratio: float | None = None) -> None:
    """The tracer's cost per step, the way benchmarks/tracer_overhead.py defines it (that
    benchmark is CPU-only and uses two ranks, which one GPU cannot host):

    * outside windows: traced / untraced median step time, over steps that neither record nor
      end by starting the profiler;
    * inside windows: traced / bare torch.profiler (same schedule and activities), over
      recording steps whose end does not export a trace.

    One DDP run (world size 1) per arm and repeat, the arms' order rotating between repeats;
    the first steps are left out. The windows fill the second half of each run back to back.
    """
    steps, discard = cfg["overhead_steps"], cfg["overhead_discard"]
    window = {"skip_first": steps // 2, "wait": 0, "warmup": 1, "active": 3, "repeat": 0}
    actions = profiler_actions(steps, **window)
    outside_steps = [k for k in range(discard, steps)
                     if actions[k] == "none" and actions[k + 1] == "none"]
    inside_steps = [k for k in range(discard, steps) if actions[k] in ("warmup", "record")]
    window_steps = [k for k in range(steps) if actions[k] != "none"]
    spec = ",".join(str(window[k]) for k in ("skip_first", "wait", "warmup", "active", "repeat"))
    tracer_window = [f"--{k.replace('_', '-')}={v}" for k, v in window.items()]
    script = ["workloads/ddp.py", "--steps", str(steps), *cfg["overhead_model"]]
    pooled = {arm: {"outside": [], "inside": []} for arm in OVERHEAD_ARMS}
    per_run = []
    names = ("overhead.outside_windows", "overhead.inside_windows")
    for repeat in range(cfg["overhead_pairs"]):
        shift = repeat % len(OVERHEAD_ARMS)
        for arm in OVERHEAD_ARMS[shift:] + OVERHEAD_ARMS[:shift]:
            out = work / f"overhead-{arm}-{repeat}.json"
            probe = [str(SCRIPT), "_probe", str(out), spec if arm == "profiler" else "-",
                     *script]
            if arm == "traced":
                cmd = [sys.executable, "-m", "tracer.record", "--out", str(work), "--run-name",
                       f"overhead-{repeat}", *tracer_window, "--sample-hz",
                       cfg["overhead_sample_hz"], *probe]
            else:
                cmd = [sys.executable, *probe]
            done = runner.run(f"overhead-{arm}-{repeat}", cmd, timeout=cfg["overhead_timeout"])
            problem = None
            if done.rc != 0 or not out.is_file():
                problem = f"{arm} run {repeat} failed: {done.failure()}"
            else:
                stamps = json.loads(out.read_text())
                runner.logs[out.name] = json.dumps(stamps)
                ends = [stamps["start_ns"], *stamps["step_end_ns"]]
                ms = [(b - a) / 1e6 for a, b in zip(ends, ends[1:])]
                if len(ms) != steps:
                    problem = f"{arm} run {repeat}: {len(ms)} step times for {steps} steps"
            if arm == "traced" and problem is None:
                records, _ = read_jsonl(work / f"overhead-{repeat}" / "rank0.steps.jsonl")
                marked = [k for k, r in enumerate(records) if r.get("in_profiler_window")]
                if marked != window_steps:
                    problem = (f"traced run {repeat}: steps {marked[:8]}... are marked "
                               f"in_profiler_window, the schedule says {window_steps[:8]}...")
            if problem:
                for name in names:
                    results.record(name, False, None, problem)
                return
            outside = [ms[k] for k in outside_steps]
            inside = [ms[k] for k in inside_steps]
            pooled[arm]["outside"] += outside
            pooled[arm]["inside"] += inside
            per_run.append(f"{arm}{repeat} {statistics.median(outside):.2f}/"
                           f"{statistics.median(inside):.2f}")

    def median(arm, kind):
        return statistics.median(pooled[arm][kind])

    where = (f"DDP {' '.join(cfg['overhead_model'])}, {steps} steps, world size 1 on "
             f"{'NCCL' if gpu else 'gloo'}, {cfg['overhead_pairs']} run(s) per arm; per-run "
             f"medians outside/inside (ms): {', '.join(per_run)}")
    noisy = "" if gpu else " (CPU mode: noisy, says little about a GPU)"
    outside_ratio = median("traced", "outside") / median("untraced", "outside")
    ok = math.isfinite(outside_ratio) and (max_ratio is None or outside_ratio <= max_ratio)
    bar = f"bar {max_ratio:g}x" if max_ratio is not None else "reported, not a pass bar"
    results.record(names[0], ok, f"{outside_ratio:.3f}x",
                   f"traced {median('traced', 'outside'):.3f} ms vs untraced "
                   f"{median('untraced', 'outside'):.3f} ms median step over "
                   f"{len(pooled['traced']['outside'])} steps; project goal < 1.01 "
                   f"(benchmarks/tracer_overhead.py), {bar}{noisy}; {where}")
    inside_ratio = median("traced", "inside") / median("profiler", "inside")
    results.record(names[1], math.isfinite(inside_ratio), f"{inside_ratio:.3f}x",
                   f"traced {median('traced', 'inside'):.3f} ms vs bare torch.profiler "
                   f"{median('profiler', 'inside'):.3f} ms median recording step (exports left "
                   f"out) over {len(pooled['traced']['inside'])} steps; untraced "
                   f"{median('untraced', 'inside'):.3f} ms; project goal < 1.03, reported, not "
                   f"a pass bar{noisy}; {where}")


# ---- fixtures and the output folder -------------------------------------------------------------------
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
                   f"`python scripts/gpu_validation.py --install-fixtures {tar_path.name}`")


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
    """What breaks the fetch limits in OUTDIR, counting the results files still to be written
    (and a tee'd `log`, whatever its name, when none is there yet)."""
    problems, files = [], set()
    for path in outdir.rglob("*"):
        rel = path.relative_to(outdir)
        for part in rel.parts:
            if not FETCH_NAME_RE.match(part):
                problems.append(f"name {part!r} has characters other than letters, digits, . _ -")
        if path.is_symlink():
            problems.append(f"{rel} is a link")
        elif path.is_file():
            files.add(str(rel))
            if len(rel.parts) > FETCH_MAX_DEPTH:
                problems.append(f"{rel} is deeper than OUTDIR/a/b/file")
        elif not path.is_dir():
            problems.append(f"{rel} is not a plain file")
    files |= set(FINAL_FILES)
    count = len(files) + (1 if expect_log and not any(
        f not in FINAL_FILES and not f.endswith((".tar", ".tar.gz")) for f in files) else 0)
    if count > FETCH_MAX_FILES:
        problems.append(f"{count} files (a log included), more than {FETCH_MAX_FILES}: "
                        f"{sorted(files)}")
    return problems, count


def check_layout(results: Results, outdir: Path) -> None:
    problems, count = layout_problems(outdir)
    results.record("outdir.layout", not problems, f"{count} files",
                   "; ".join(sorted(set(problems))) if problems else
                   f"{count} files counting results.json, results.md and a tee'd log; all at "
                   f"depth 1; names fit")


# ---- installing fixtures ------------------------------------------------------------------------------
def install_fixtures(tar_path: Path, dest: Path, allow_cpu: bool) -> int:
    if not tar_path.is_file():
        print(f"gpu_validation: error: {tar_path} is not a file", file=sys.stderr)
        return 2
    with tarfile.open(tar_path) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        bad = [n for n in names if n.startswith("/") or ".." in Path(n).parts
               or not n.startswith("gpu/")]
        bad += [m.name for m in members if not (m.isfile() or m.isdir())]
        if bad:
            print(f"gpu_validation: error: {tar_path} has unexpected members {bad[:5]}",
                  file=sys.stderr)
            return 2
        provenance = {}
        if "gpu/provenance.jsonl" in names:
            provenance = json.loads(tar.extractfile("gpu/provenance.jsonl").read().decode())
        if provenance.get("partial"):
            print(f"gpu_validation: warning: {tar_path} comes from a run that stopped early; "
                  f"check its results.md before committing these fixtures", file=sys.stderr)
        if provenance.get("mode") != "gpu" and not allow_cpu:
            print(f"gpu_validation: error: {tar_path} was made in mode "
                  f"{provenance.get('mode')!r}, not on a GPU; tests/data/gpu/ takes GPU traces "
                  f"only (--allow-cpu overrides, for testing the installer)", file=sys.stderr)
            return 1
        if dest.exists():
            shutil.rmtree(dest)  # one fixture set, from one validation run
        dest.mkdir(parents=True)
        count = 0
        for member in members:
            if not member.isfile():
                continue
            target = dest / Path(member.name).relative_to("gpu")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    folders = sorted(p.name for p in dest.iterdir() if p.is_dir())
    print(f"installed {count} files into {dest}: {', '.join(folders)} (made "
          f"{provenance.get('created')} on {provenance.get('device_name') or 'no GPU'}); run "
          f"`python -m pytest tests/test_gpu_fixtures.py`, then commit {dest}")
    return 0


# ---- main -------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/gpu_validation.py",
        description="Validate ranktrace's GPU paths on a real GPU (docs/gpu-validation.md).")
    parser.add_argument("outdir", nargs="?", type=Path,
                        help="where results.json, results.md, fixtures.tar and logs.tar.gz go")
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps and overhead repetitions (the device-tool command)")
    parser.add_argument("--cpu", action="store_true",
                        help="run the flow without a GPU (gloo, psutil); GPU checks are skipped")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                        help="seconds the whole run may take; subprocess timeouts are cut to it")
    parser.add_argument("--wheels", type=Path, metavar="DIR",
                        help="a folder of wheels to pip-install missing modules from (no network)")
    parser.add_argument("--max-overhead", type=float, metavar="RATIO",
                        help="fail overhead.outside_windows above this ratio (default: report only)")
    parser.add_argument("--work", type=Path, metavar="DIR",
                        help="where the runs are traced (default: a temporary folder)")
    parser.add_argument("--keep-work", action="store_true", help="do not delete the work folder")
    parser.add_argument("--install-fixtures", type=Path, metavar="TAR",
                        help="unpack a fixtures.tar into tests/data/gpu/ and exit")
    parser.add_argument("--dest", type=Path, default=FIXTURES_DEST,
                        help="with --install-fixtures: the folder to fill")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="with --install-fixtures: accept a tar made with --cpu")
    parser.add_argument("--list-checks", action="store_true",
                        help="print the checks as JSON and exit")
    return parser


class guarded:
    """A bug in a check (data this script did not expect) fails the checks whose names start with
    `prefix`, with the exception, and lets the run go on to the next workload."""

    def __init__(self, results: Results, prefix: str):
        self.results, self.prefix = results, prefix

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None or not issubclass(kind, Exception) or issubclass(
                kind, (BudgetExhausted, Interrupted)):
            return False
        import traceback

        traceback.print_exception(kind, exc, tb)
        where = traceback.extract_tb(tb)[-1]
        self.results.not_run([n for n in self.results.checks if n.startswith(self.prefix)],
                             f"the check code crashed: {kind.__name__}: {exc} (line "
                             f"{where.lineno}, {where.name}); see the log")
        return True


def _on_sigterm(signum, frame):
    raise Interrupted(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_probe"]:
        probe_main(argv[1:])
        return 0
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_checks:
        print(json.dumps([{"name": n, "scope": s, "description": d}
                          for n, s, d in planned_checks()], indent=2))
        return 0
    if args.install_fixtures is not None:
        return install_fixtures(args.install_fixtures, args.dest, args.allow_cpu)
    if args.outdir is None:
        parser.error("OUTDIR is required")
    outdir = args.outdir.resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    gpu = not args.cpu
    budget = Budget(args.budget)
    command = ["python", "scripts/gpu_validation.py", *argv]
    results = Results(outdir, "gpu" if gpu else "cpu", args.quick, budget, command)
    results.save()
    cfg = settings(gpu, args.quick)
    if args.work:  # a fresh folder inside it: run names must not collide with earlier runs
        args.work.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="run-", dir=args.work.resolve()))
    else:
        work = Path(tempfile.mkdtemp(prefix="ranktrace-gpu-validation-"))
    runner = Runner(budget, base_env(gpu, []))
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    runs: dict[str, dict] = {}
    hta_numbers: dict[str, dict] = {}
    analysis_figures: dict[str, dict] = {}
    print(f"ranktrace GPU validation: mode {'gpu' if gpu else 'cpu'}"
          f"{' --quick' if args.quick else ''}, budget {budget.total:g} s, work folder {work}, "
          f"results in {outdir}", flush=True)
    stop_reason = None
    try:
        print(f"== preflight ({budget.elapsed():.0f} s)", flush=True)
        if not preflight(results, runner, gpu, args.wheels, work):
            stop_reason = "preflight failed (see the preflight checks)"
        if stop_reason is None:
            print(f"== tracing {', '.join(WORKLOADS)} ({budget.elapsed():.0f} s)", flush=True)
            traced = runner.run_many([(f"trace-{wl}", trace_command(wl, work, cfg),
                                       cfg["trace_timeout"]) for wl in WORKLOADS],
                                     cfg["parallel"])
            for wl in WORKLOADS:
                done = traced[f"trace-{wl}"]
                if isinstance(done, BudgetExhausted):
                    raise done
                print(f"== checking {wl} ({budget.elapsed():.0f} s)", flush=True)
                with guarded(results, f"{wl}."):
                    run = runs[wl] = read_run(work / wl)
                    if not check_trace(results, wl, done, run, cfg) and not run.get("traces"):
                        results.not_run([n for n in results.checks if n.startswith(wl + ".")],
                                        f"the traced {wl} run produced no trace")
                        continue
                    check_run_files(results, wl, run, gpu)
                    doc = run_analysis(results, runner, wl, work / wl, cfg, gpu)
                    if gpu:
                        check_memory(results, wl, run, doc)
                        ours = check_hta_columns(results, wl, doc)
                        if ours is not None:
                            analysis_figures[wl] = ours
                        theirs = check_hta_match(results, runner, wl, run, ours, work, cfg)
                        if theirs is not None:
                            hta_numbers[wl] = theirs
            if gpu:
                with guarded(results, "nvml."):
                    check_utilisation(results, runs)
            provenance = provenance_of(
                results, command, runs,
                settings={k: v for k, v in cfg.items() if not k.endswith("timeout")},
                hta_compatible=analysis_figures, hta=hta_numbers)
            with guarded(results, "fixtures."):
                write_fixtures(results, outdir, runs, provenance)
            print(f"== overhead ({budget.elapsed():.0f} s)", flush=True)
            with guarded(results, "overhead."):
                overhead(results, runner, work, cfg, gpu, args.max_overhead)
    except BudgetExhausted as exc:
        stop_reason = str(exc)
        print(f"!! {stop_reason}", flush=True)
    except (Interrupted, KeyboardInterrupt) as exc:
        runner.kill_all()
        stop_reason = f"interrupted ({exc or 'Ctrl-C'})"
        print(f"!! {stop_reason}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            write_logs(outdir, runner.logs)
        except OSError as exc:
            results.notes.append(f"logs.tar.gz not written: {exc}")
        if results.pending("fixtures.tar"):
            found = {wl: runs.get(wl) or read_run(work / wl) for wl in WORKLOADS}
            found = {wl: run for wl, run in found.items() if run.get("exists")}
            if found:
                write_fixtures(results, outdir, found,
                               provenance_of(results, command, found, partial=True))
        if stop_reason:
            results.notes.append(f"stopped early: {stop_reason}")
        check_layout(results, outdir)
        elapsed = budget.elapsed()
        results.record("time_budget", elapsed < TIME_LIMIT_S, f"{elapsed:.1f} s",
                       f"{elapsed:.1f} s in all (limit {TIME_LIMIT_S:.0f} s, budget "
                       f"{budget.total:g} s)")
        results.finish(stop_reason or "an earlier step failed")
        results.save()
        write_atomic(outdir / "results.md", results.markdown())
        if not args.keep_work and not args.work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work folder kept: {work}", flush=True)
    counts = results.counts()
    print(f"== done in {budget.elapsed():.1f} s: {counts.get('passed', 0)} passed, "
          f"{counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped", flush=True)
    if results.failed:
        print("FAILED CHECKS:", flush=True)
        not_run: dict[str, list[str]] = {}
        for check in results.failed:
            if check["detail"].startswith("not run: "):
                not_run.setdefault(check["detail"], []).append(check["name"])
            else:
                print(f"  {check['name']}: {check['detail']}", flush=True)
        for detail, names in not_run.items():
            print(f"  {len(names)} checks {detail}: {', '.join(names)}", flush=True)
        print(f"VERDICT: FAILED (results in {outdir})", flush=True)
        return 1
    print(f"VERDICT: PASSED{' (GPU checks skipped: --cpu)' if not gpu else ''} "
          f"(results in {outdir})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
