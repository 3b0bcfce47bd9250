"""The checks this validation makes, and their results: results.json and results.md."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .config import (
    BUDGET_OVERRUN_S,
    COMM_WORKLOADS,
    OUTDIR_MAX_FILES,
    TAR_LIMIT_BYTES,
    TRACE_LIMIT_BYTES,
    WORKLOADS,
)

if TYPE_CHECKING:
    from .runner import Budget


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
        ("outdir.layout", "both", f"OUTDIR is small and flat, to be copied off the machine as "
                                  f"it is: at most {OUTDIR_MAX_FILES} files (a tee'd log "
                                  f"included), no deeper than OUTDIR/a/b/file, names of "
                                  f"letters, digits, . _ -"),
        ("time_budget", "both", f"the whole run kept within --budget (+{BUDGET_OVERRUN_S:.0f} s "
                                f"for writing the results)"),
    ]
    return checks


class Results:
    """Every planned check with its status; saved as results.json after each change."""

    def __init__(self, outdir: Path, mode: str, quick: bool, budget: Budget, argv: list[str]):
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
            "tool": "scripts/gpu_validation", "format": 1, "mode": self.mode,
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
