"""The step probe of the overhead measurements: runs a training script, stamping every step end.

    python benchmarks/overhead_probe.py --out OUT.json [--pin] [--profiler SPEC]
        [--tracer-off PARTS] SCRIPT [ARGS]

Every arm of an overhead comparison (untraced, traced, a bare torch.profiler) runs the script
through `run_probe`, so that all of them take step times the same way: a global optimizer-step
post hook, registered after the tracer's, stamps the end of each step, so a step's time includes
whatever the tracer does at its end. At each step end it reads three clocks:

* `wall_ns`: `time.perf_counter_ns()` (`start_ns`: the same clock as the script starts);
* `process_cpu_ns`: CPU time of the whole process, every thread (the tracer's and gloo's too);
* `thread_cpu_ns`: CPU time of the main thread, the one that runs the training step.

Under the tracer it also times, on the main thread's CPU clock, the tracer's own step end
(`tracer_step_end_ns`, one figure per step), and with `--part-costs` every hook of every part
on its own thread's clock (`part_costs`, see PartCosts).

With several ranks each writes `OUT.json.rank<R>`; with one, OUT.json. Beside the stamps it
writes what explains them: per-thread CPU time and context switches over the measured steps (from
`/proc/self/task`), garbage collections, and the interpreter and torch state that could make a
step slower without showing up in the tracer's own code (a trace or profile function, an enabled
profiler, the GIL switch interval, signal handlers). `benchmarks/tracer_overhead.py` and
`scripts/gpu_validation.py` import this module.

`--profiler skip_first,wait,warmup,active,repeat` runs a bare torch.profiler with that schedule
(CPU, plus CUDA where available; gzipped traces next to OUT), stepped at each step end: the
yardstick for the tracer inside its windows; `--record-shapes` has it record operator input
shapes, as the tracer's profiler does by default; `--profile-memory` has it record allocations
and Python stacks too, as the tracer's --profile-memory does.

`--tracer-off scalars,memory,steps` switches off, inside a traced run, parts of the tracer that
have no option of their own, so that the benchmark can measure each part alone: `scalars` (the
TensorBoard writer), `memory` (step-end memory figures and the RSS read), `steps` (the step-end
worker thread: step records and everything it writes are then written once, at the end).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

TRACER_PARTS_WITHOUT_OPTION = ("scalars", "memory", "steps")
THREAD_WINDOW_FROM = 10  # per-thread CPU is counted from this step end to the script's end


def pin_to_one_core(local_rank: int) -> None:
    """Every thread of this rank (the tracer's included) on one core, a different one per rank.

    Left to the scheduler, where two ranks' threads land on two cores changes a step's time by
    up to half from one run to the next, which would drown a 1% difference. Threads started
    later inherit the core of the thread that starts them.
    """
    cores = sorted(os.sched_getaffinity(0))
    core = {cores[local_rank % len(cores)]}
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), core)
        except OSError:
            pass  # a thread that just ended


def thread_cpu_clocks() -> dict[int, int]:
    """Native thread id -> CPU ns, read from the thread's own CPU clock (ns resolution) for
    every Python thread; the others (gloo's, the autograd engine's) only have /proc's ticks."""
    clocks = {}
    for thread in threading.enumerate():
        try:
            clocks[thread.native_id] = time.clock_gettime_ns(
                time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError, AttributeError):
            pass  # ended meanwhile, or not started
    return clocks


def thread_table() -> dict[str, dict]:
    """Per thread of this process: CPU ns (user + system) and voluntary/involuntary switches."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    clocks = thread_cpu_clocks()
    ticks_ns = 1e9 / os.sysconf("SC_CLK_TCK")
    table = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2:].split()
        switches = dict(line.split(":\t") for line in status.splitlines()
                        if line.endswith(tuple("0123456789")) and "ctxt_switches" in line)
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        name = names.get(int(tid), comm)
        ticks = int((int(fields[11]) + int(fields[12])) * ticks_ns)
        table[f"{name}[{tid}]"] = {
            "cpu_ns": clocks.get(int(tid), ticks),
            "voluntary": int(switches.get("voluntary_ctxt_switches", 0)),
            "involuntary": int(switches.get("nonvoluntary_ctxt_switches", 0))}
    return table


def thread_delta(before: dict, after: dict) -> dict:
    zero = {"cpu_ns": 0, "voluntary": 0, "involuntary": 0}
    return {name: {k: v - before.get(name, zero)[k] for k, v in figures.items()}
            for name, figures in after.items()}


def interpreter_state() -> dict:
    """What could slow every step down without being the tracer's own code."""
    import torch

    tracer_module = sys.modules.get("tracer")
    tracing = getattr(getattr(tracer_module, "_step_callback", None), "__self__", None)
    from torch.optim import optimizer

    hooks = getattr(optimizer, "_global_optimizer_post_hooks", {})
    return {
        "trace_function": repr(sys.gettrace()),
        "profile_function": repr(sys.getprofile()),
        "threading_trace": repr(getattr(threading, "_trace_hook", None)),
        "threading_profile": repr(getattr(threading, "_profile_hook", None)),
        "switch_interval_s": sys.getswitchinterval(),
        "gc_enabled": gc.isenabled(),
        "gc_threshold": gc.get_threshold(),
        "gc_tracked_objects": len(gc.get_objects()),
        "modules_loaded": len(sys.modules),
        "torch_profiler_enabled": bool(torch.autograd._profiler_enabled()),
        "torch_profiler_type": str(torch._C._autograd._profiler_type()),
        "torch_threads": torch.get_num_threads(),
        "optimizer_post_hooks": len(hooks),
        "sigterm_handler": repr(signal.getsignal(signal.SIGTERM)),
        "sigint_handler": repr(signal.getsignal(signal.SIGINT)),
        "threads": sorted(t.name for t in threading.enumerate()),
        "traced": tracing is not None,
        "tracer_parts": None if tracing is None else {
            part: tracing.in_use(part) is not None
            for part in ("comms", "sampler", "scalars", "memory", "profiler")},
    }


def switch_off_tracer_parts(parts: list[str]) -> None:
    """Benchmark-only: switch off tracer parts that have no option, in the running tracer."""
    import tracer

    tracing = getattr(tracer._step_callback, "__self__", None)
    if tracing is None:
        raise SystemExit("--tracer-off needs the script to run under python -m tracer.record")
    if "scalars" in parts and (scalars := _drop_part(tracing, "scalars")) is not None:
        scalars.close()
    if "memory" in parts:
        _drop_part(tracing, "memory")
    if "steps" in parts:
        # Step records then pile up in memory and are written by the closer, at the end.
        tracing.worker.stop(timeout=1.0)


def _drop_part(tracing, name: str):
    """Benchmark-only: the session stops using its part `name` (it calls no hook of it again);
    the part, or None if it was not in use."""
    part = tracing.in_use(name)
    if part is None:
        return None
    tracing.parts.remove(part)
    tracing._named.pop(name, None)
    tracing._refresh_hooks()
    return part


class PartCosts:
    """Benchmark-only: CPU time, on the calling thread's clock, spent in each hook of each tracer
    part in use (`part.hook`), in the step-end worker's passes (`worker.pass`, every hook of a
    pass together), in the sampler's samples (`sampler.sample`) and in reading torch's Flight
    Recorder (`flight.dump`). Load inflates every figure alike, so that their shares say where
    the tracer's time goes; each wrapped call adds two clock reads (about 1 us)."""

    def __init__(self):
        self.spent: dict[str, list[int]] = {}  # key -> [ns, calls]

    def wrap(self, key: str, fn):
        spent = self.spent.setdefault(key, [0, 0])

        def timed(*args, **kwargs):
            started = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.thread_time_ns() - started
                spent[1] += 1

        return timed

    def install(self, tracing) -> None:
        # The session's module, wherever the tracer of this run keeps it (--baseline runs an
        # older one)
        hooks = sys.modules[type(tracing).__module__]._HOOKS
        for part in tracing.parts:
            for hook in hooks:
                if part in tracing._hooked.get(hook, ()):
                    setattr(part, hook, self.wrap(f"{part.name}.{hook}", getattr(part, hook)))
        tracing._refresh_hooks()
        worker = tracing.worker
        worker._write_pending = self.wrap("worker.pass", worker._write_pending)
        sampler = tracing.in_use("sampler")
        if sampler is not None:
            sampler._take_sample = self.wrap("sampler.sample", sampler._take_sample)
        flight = tracing.in_use("flight")
        if flight is not None:
            flight._dump = self.wrap("flight.dump", flight._dump)


class CallCounter:
    """Counts every Python and C function call of the main thread over a span of steps.

    The counts do not depend on the machine's load, unlike any clock: what a traced step runs
    that an untraced one does not shows up as a difference between the two arms' counts.
    """

    def __init__(self):
        self.calls: dict[str, int] = {}

    def __call__(self, frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            key = f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"
        elif event == "c_call":
            key = f"<C>:{getattr(arg, '__module__', None)}.{getattr(arg, '__qualname__', arg)}"
        else:
            return
        self.calls[key] = self.calls.get(key, 0) + 1


class StepProbe:
    """Stamps each step end with the wall clock, the process's and the main thread's CPU."""

    def __init__(self, profile=None, count_calls: tuple[int, int] | None = None,
                 part_costs: bool = False):
        self.profile = profile
        self.count_calls = count_calls
        self.part_costs = PartCosts() if part_costs else None
        self.counter: CallCounter | None = None
        self.start_ns: int | None = None  # perf_counter_ns when the script starts
        self.wall_ns: list[int] = []
        # The main thread's CPU in the tracer's own step end, per step (traced runs only)
        self.tracer_step_end_ns: list[int] = []
        self.process_cpu_ns: list[int] = []
        self.thread_cpu_ns: list[int] = []
        self.gc_collections = [0, 0, 0]
        self.gc_ns = 0
        self.threads_before: dict | None = None
        self.state: dict | None = None
        self._gc_started = 0

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self.on_step)
        self._time_tracer_step_end()
        gc.callbacks.append(self._on_gc)
        self.start_ns = time.perf_counter_ns()

    def on_step(self, *_) -> None:
        if self.profile is not None:
            self.profile.step()
        self.wall_ns.append(time.perf_counter_ns())
        self.process_cpu_ns.append(time.process_time_ns())
        self.thread_cpu_ns.append(time.thread_time_ns())
        if len(self.wall_ns) == THREAD_WINDOW_FROM:
            # This costs the next step a few hundred microseconds: one step in hundreds, in
            # every arm alike.
            self.state = interpreter_state()
            self.threads_before = thread_table()
        if self.count_calls is not None:
            if len(self.wall_ns) == self.count_calls[0]:
                self.counter = CallCounter()
                sys.setprofile(self.counter)
            elif len(self.wall_ns) == self.count_calls[1]:
                sys.setprofile(None)

    def _time_tracer_step_end(self) -> None:
        """Benchmark-only: time, on the main thread's CPU clock, what the tracer does at each
        step end (its tracer.stepclock callback), when the script runs under the tracer. Two
        clock reads a step (about 1 us) are added to the traced step."""
        import tracer

        tracing = getattr(tracer._step_callback, "__self__", None)
        if tracing is None:
            return
        if self.part_costs is not None:
            self.part_costs.install(tracing)
        clock, on_step_end = tracing.clock, tracing.clock.on_step_end
        spent = self.tracer_step_end_ns

        def timed(*args) -> None:
            started = time.thread_time_ns()
            try:
                on_step_end(*args)
            finally:
                spent.append(time.thread_time_ns() - started)

        clock.on_step_end = timed

    def _on_gc(self, phase: str, info: dict) -> None:
        if len(self.wall_ns) < THREAD_WINDOW_FROM:
            return
        if phase == "start":
            self._gc_started = time.perf_counter_ns()
        else:
            self.gc_collections[info["generation"]] += 1
            self.gc_ns += time.perf_counter_ns() - self._gc_started

    def result(self) -> dict:
        threads = (thread_delta(self.threads_before, thread_table())
                   if self.threads_before is not None else {})
        return {"start_ns": self.start_ns, "wall_ns": self.wall_ns,
                "process_cpu_ns": self.process_cpu_ns,
                "thread_cpu_ns": self.thread_cpu_ns, "gc_collections": self.gc_collections,
                "gc_ns": self.gc_ns, "threads_from_step": THREAD_WINDOW_FROM,
                "threads": threads, "state": self.state,
                "tracer_step_end_ns": self.tracer_step_end_ns,
                "part_costs": None if self.part_costs is None else self.part_costs.spent,
                "calls": None if self.counter is None else {
                    "steps": self.count_calls[1] - self.count_calls[0],
                    "counts": self.counter.calls}}


def bare_profiler(spec: str, trace_dir: str, rank: int, record_shapes: bool = False,
                  profile_memory: bool = False):
    """A started torch.profiler with schedule `skip_first,wait,warmup,active,repeat`;
    `profile_memory` also records allocations and Python stacks (as the tracer's
    --profile-memory does)."""
    import torch
    from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

    skip_first, wait, warmup, active, repeat = (int(v) for v in spec.split(","))
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    profile = torch.profiler.profile(
        activities=activities,
        schedule=schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active,
                          repeat=repeat),
        on_trace_ready=tensorboard_trace_handler(trace_dir, worker_name=f"rank{rank}",
                                                 use_gzip=True),
        record_shapes=record_shapes, profile_memory=profile_memory, with_stack=profile_memory)
    profile.start()
    return profile


def output_path(out: str, rank: int) -> Path:
    return Path(out if os.environ.get("WORLD_SIZE", "1") == "1" else f"{out}.rank{rank}")


def run_probe(out: str, script: str, script_args: list[str], profiler: str | None = None,
              pin: bool = False, tracer_off: list[str] = (),
              count_calls: tuple[int, int] | None = None, record_shapes: bool = False,
              part_costs: bool = False, profile_memory: bool = False) -> None:
    """Run `script` as __main__ with `script_args`, stamping each step end; write OUT."""
    rank = int(os.environ.get("RANK", "0"))
    if pin:
        pin_to_one_core(int(os.environ.get("LOCAL_RANK", "0")))
    if tracer_off:
        switch_off_tracer_parts(list(tracer_off))
    profile = None
    if profiler:
        profile = bare_profiler(profiler, tempfile.mkdtemp(prefix="bare-profiler-",
                                                           dir=os.path.dirname(out) or None), rank,
                                record_shapes, profile_memory)
    probe = StepProbe(profile, count_calls, part_costs)
    probe.install()
    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        if profile is not None:
            profile.stop()
        output_path(out, rank).write_text(json.dumps(probe.result()))


def parts_list(text: str) -> list[str]:
    parts = [p for p in text.split(",") if p]
    unknown = sorted(set(parts) - set(TRACER_PARTS_WITHOUT_OPTION))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(unknown)}; known: "
                                         f"{', '.join(TRACER_PARTS_WITHOUT_OPTION)}")
    return parts


def step_span(text: str) -> tuple[int, int]:
    first, _, last = text.partition(":")
    try:
        span = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FROM:TO step numbers, got {text!r}") from None
    if not 0 < span[0] < span[1]:
        raise argparse.ArgumentTypeError(f"expected 0 < FROM < TO, got {text!r}")
    return span


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where the stamps go (.rank<R> added with ranks)")
    p.add_argument("--pin", action="store_true", help="pin each rank to its own core")
    p.add_argument("--profiler", metavar="SPEC",
                   help="bare torch.profiler, schedule skip_first,wait,warmup,active,repeat")
    p.add_argument("--record-shapes", action="store_true",
                   help="the bare profiler records operator input shapes (as the tracer does "
                        "by default)")
    p.add_argument("--profile-memory", action="store_true",
                   help="the bare profiler records allocations and Python stacks (as the "
                        "tracer's --profile-memory)")
    p.add_argument("--tracer-off", type=parts_list, default=[], metavar="PARTS",
                   help=f"tracer parts to switch off: {', '.join(TRACER_PARTS_WITHOUT_OPTION)}")
    p.add_argument("--count-calls", type=step_span, metavar="FROM:TO",
                   help="count the main thread's function calls from step end FROM to TO")
    p.add_argument("--part-costs", action="store_true",
                   help="time each hook of each tracer part on its thread's CPU clock")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    run_probe(args.out, args.script, args.script_args, args.profiler, args.pin, args.tracer_off,
              args.count_calls, args.record_shapes, args.part_costs, args.profile_memory)


if __name__ == "__main__":
    main()
