"""Tracing each workload, and the checks on what the traced run wrote."""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

from .config import COMM_WORKLOADS, TRACE_LIMIT_BYTES
from .results import Results
from .runner import Completed

# A tracer part that switches itself off here fails the run's trace check; others are noted.
TRACER_CRITICAL_PARTS = {"profiler", "comms", "sampler", "memory", "steps", "manifest", "clock"}


def trace_command(wl: str, work: Path, cfg: dict) -> list[str]:
    tracer = ["-m", "tracer.record", "--out", str(work), "--run-name", wl, *cfg["tracer"]]
    script = [f"workloads/{wl}.py", "--steps", str(cfg["steps"]), *cfg["model"]]
    if wl == "pipeline":
        script += ["--microbatches", "4"]
    if wl == "ddp":
        # Without the hook DDP's bucket all_reduces are seen in the profiler's windows only; the
        # comm checks need every bucket timed.
        tracer.append("--ddp-bucket-hook")
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
    # Ops read from torch's Flight Recorder (source native) carry the time their backend gives:
    # issue only on gloo, CUDA events on NCCL with TORCH_NCCL_ENABLE_TIMING=1 (docs/tracer.md).
    hooked = Counter(c.get("timing") for c in comms if c.get("source") != "native")
    native = Counter(c.get("timing") for c in comms if c.get("source") == "native")
    if not gpu and (set(hooked) - {"host"} or set(native) - {"issue"}):
        problems.append(f"on CPU every hooked record should be timed 'host' and every native "
                        f"one 'issue', got {dict(hooked)} and {dict(native)}")
    results.record(f"{wl}.comm_records", not problems, f"{len(comms)} records",
                   "; ".join(problems) if problems else
                   f"ops {dict(ops)}; sources {dict(Counter(c.get('source') for c in comms))};"
                   f" timing {dict(timings)}")
    if not gpu:
        return
    durations = sorted(c.get("duration_us", 0) for c in comms if c.get("timing") != "issue")
    timed = [c for c in comms if c.get("timing") != "issue"]
    not_event = [c for c in timed if c.get("timing") != "cuda_event"]
    zero = [c for c in timed if not c.get("duration_us", 0) > 0]
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
