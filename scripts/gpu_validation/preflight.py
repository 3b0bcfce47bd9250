"""Before anything is traced: the Python modules, CUDA, NCCL and NVML, and offline wheels.

Everything here imports only the standard library, so that a machine without pandas or msgspec
gets a clear verdict instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

from .config import REPO
from .results import Results
from .runner import Runner

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
    return (f"bring wheels for this machine (Python {python}, {machine}): on a machine with "
            f"network run `pip download --only-binary=:all: --python-version {version} "
            f"--platform manylinux2014_{machine} -d wheels {pips}`, copy the `wheels` folder "
            f"here, and rerun with `--wheels wheels` (docs/gpu-validation.md)")


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
    results.environment["hta_importable"] = importable_in_env("hta", runner.env)
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
                       f"missing: {names}{optional_text}. "
                       f"{install_note + '. ' if install_note else ''}"
                       + wheel_advice(required + optional, python, machine))
    else:
        results.record("preflight.modules", True, "all present",
                       f"torch {info.get('torch')}, Python {python}{optional_text}"
                       + (f"; {install_note}" if install_note else ""))
    if probe.rc != 0 or "torch_error" in info or not info:
        results.notes.append(
            f"preflight probe failed: {info.get('torch_error') or probe.failure()}")
    # Without these nothing can be traced; without the others (pandas: the analysis; pynvml: NVML
    # samples) the run goes on, so that one run still yields traces and every other check.
    blocking = [m for m, _, _ in required if m in TRACING_MODULES or m in PROJECT_PACKAGES]
    if blocking:
        results.notes.append(f"cannot trace without {', '.join(blocking)}")
    if not gpu:
        return not blocking and bool(info.get("gloo_available"))

    cuda_ok = bool(info.get("cuda_available")) and bool(info.get("cuda_kernel_ok"))
    results.record("preflight.cuda", cuda_ok, info.get("device_name"),
                   (f"{info.get('device_count')} device(s), {info.get('device_name')}, capability "
                    f"{info.get('capability')}, "
                    f"{info.get('device_total_bytes', 0) / 2**30:.0f} GiB,"
                    f" torch {info.get('torch')} built for CUDA {info.get('torch_cuda')}")
                   if cuda_ok else
                   f"no usable CUDA device (torch {info.get('torch')}, built for CUDA "
                   f"{info.get('torch_cuda')}, cuda_available={info.get('cuda_available')}"
                   f"{', ' + info['torch_error'] if 'torch_error' in info else ''}); on a machine "
                   f"without a GPU run with --cpu")
    results.record("preflight.nccl", bool(info.get("nccl_available")), info.get("nccl_version"),
                   f"NCCL {info.get('nccl_version')}" if info.get("nccl_available") else
                   f"torch.distributed has no NCCL "
                   f"({info.get('nccl_error', 'is_nccl_available() is False')})")
    nvml_ok = "nvml_error" not in info and info.get("nvml_power_w") is not None
    results.record("preflight.nvml", nvml_ok, info.get("nvml_driver"),
                   f"driver {info.get('nvml_driver')}, {info.get('nvml_device')}, "
                   f"{info.get('nvml_power_w')} W now" if nvml_ok else
                   f"NVML unusable: {info.get('nvml_error', 'no reading')}")
    if (info.get("nvml_device_count") or 0) > 1:
        results.notes.append(f"{info['nvml_device_count']} GPUs present; runs are restricted to "
                             f"CUDA_VISIBLE_DEVICES={runner.env.get('CUDA_VISIBLE_DEVICES')}")
    return not blocking and cuda_ok


def importable_in_env(module: str, env: dict) -> bool:
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    saved = list(sys.path)
    sys.path[:0] = paths
    importlib.invalidate_caches()
    try:
        return importlib.util.find_spec(module) is not None
    finally:
        sys.path[:] = saved
