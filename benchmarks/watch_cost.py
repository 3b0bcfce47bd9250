"""CPU cost of `ranktrace watch` on a large job: it must hold 256 ranks at one refresh a second
on one core.

A writer process writes a synthetic run folder as the tracer does (per rank: the manifest's
run_start and clock_sync, step records, one all-reduce record per op on the default group, a
device sample per 0.1 s; `.tmp` files flushed every 0.2 s, renamed with run_end at the end), at
--steps-per-s steps a second on every rank, in real time. This process runs the watch's
refresh (ranktrace.watch.command.Watcher: read what was appended, update the model, build the
view) and draws the frame into a 100x30 rich console writing to memory, once a second, and
times each refresh on its own thread's CPU clock. It says how far the view lagged behind the
writer (steps), so that a refresh that kept up cheaply by reading less is caught.

    python benchmarks/watch_cost.py --ranks 256 --seconds 30 --steps-per-s 10
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ranktrace.watch import render  # noqa: E402
from ranktrace.watch.command import Watcher  # noqa: E402
from ranktrace.watch.options import WatchOptions  # noqa: E402
from tracer import schema  # noqa: E402

FLUSH_S = 0.2


class SyntheticRun:
    """A run folder written as the tracer writes one, with made-up times.

    Every rank's step `s` starts at `t0 + s * step_ms` (on rank 0's clock) and lasts
    `step_ms`; its ops are issued `issue_ms` into the step. From step `slow_from` on,
    `slow_rank` issues them `slow_ms` late and every rank's step lasts `slow_ms` longer (the
    others wait for it). Rank r's clock runs `r` microseconds ahead, as its clock_sync says.
    """

    def __init__(self, folder: str, ranks: int, step_ms: float = 100.0, ops_per_step: int = 4,
                 slow_rank: int | None = None, slow_from: int | None = None,
                 slow_ms: float = 0.0, sample_hz: float = 10.0, pid: int | None = None,
                 samples: int | None = None):
        self.folder = folder
        self.ranks = ranks
        self.step_ms = step_ms
        self.ops_per_step = ops_per_step
        self.slow_rank, self.slow_from, self.slow_ms = slow_rank, slow_from, slow_ms
        self.sample_hz = sample_hz
        self.pid = os.getpid() if pid is None else pid
        self.samples = samples
        self.files: dict[tuple[int, str], io.BufferedWriter] = {}
        self.next_step = 0
        self.position = 0
        self.t0 = time.time_ns()
        self.step_start = [self.t0] * ranks
        self.sample_t = self.t0
        self.flushed = time.monotonic()

    def offset(self, rank: int) -> int:
        return rank * 1000

    def _path(self, rank: int, pattern: str) -> str:
        return os.path.join(self.folder, pattern.format(rank=rank) + schema.TEMP_SUFFIX)

    def _write(self, rank: int, pattern: str, record) -> None:
        key = (rank, pattern)
        handle = self.files.get(key)
        if handle is None:
            handle = self.files[key] = open(self._path(rank, pattern), "ab")
        handle.write(schema.ENCODER.encode(record) + b"\n")

    def start(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        name = os.path.basename(os.path.normpath(self.folder))
        for rank in range(self.ranks):
            self._write(rank, schema.MANIFEST_FILE, schema.RunStart(
                schema_version=schema.SCHEMA_VERSION, run_name=name, rank=rank,
                local_rank=rank, world_size=self.ranks, host=socket.gethostname(),
                pid=self.pid, start_ns=self.t0 + self.offset(rank), argv=[], script="synthetic",
                script_args=[], torch_version="synthetic", config={}))
            self._write(rank, schema.MANIFEST_FILE, schema.ClockSync(
                rank=rank, offset_ns=self.offset(rank), uncertainty_ns=1000, round_trips=8))
        self.flush()

    def late_ms(self, rank: int, step: int) -> float:
        slow = self.slow_from is not None and step >= self.slow_from
        return self.slow_ms if slow and rank == self.slow_rank else 0.0

    def step_length_ms(self, step: int) -> float:
        slow = self.slow_from is not None and step >= self.slow_from
        return self.step_ms + (self.slow_ms if slow else 0.0)

    def write_step(self) -> int:
        """Every rank's next step (records and their ops); the step written."""
        step = self.next_step
        length = int(self.step_length_ms(step) * 1e6)
        for rank in range(self.ranks):
            start = self.step_start[rank]
            own = self.offset(rank)
            for op in range(self.ops_per_step):
                issue = start + int((self.step_ms / 2 + op + self.late_ms(rank, step)) * 1e6)
                self._write(rank, schema.COMMS_FILE, schema.CommRecord(
                    step=step, op="all_reduce", source="c10d", pg="0", pg_size=self.ranks,
                    dtype="float32", bytes=1 << 20, start_ns=issue + own,
                    end_ns=issue + own + 500_000, duration_us=500.0, timing="host",
                    algbw_gbps=2.0, busbw_gbps=4.0, position=self.position + op))
            self._write(rank, schema.STEPS_FILE, schema.StepRecord(
                step=step, start_ns=start + own, end_ns=start + length + own,
                rss_bytes=(1 << 30) + rank * (1 << 20), comm_ops=self.ops_per_step,
                comm_bytes=self.ops_per_step << 20, samples=self.samples))
            self.step_start[rank] = start + length
        self.position += self.ops_per_step
        self.next_step += 1
        self._write_samples(self.step_start[0])
        if time.monotonic() - self.flushed >= FLUSH_S:
            self.flush()
        return step

    def _write_samples(self, until_ns: int) -> None:
        if self.sample_hz <= 0:
            return
        every = int(1e9 / self.sample_hz)
        while self.sample_t + every <= until_ns:
            self.sample_t += every
            for rank in range(self.ranks):
                self._write(rank, schema.SAMPLES_FILE, schema.DeviceSample(
                    t_ns=self.sample_t + self.offset(rank), source="psutil",
                    cpu_process_pct=99.0, cpu_system_pct=50.0, rss_bytes=1 << 30))

    def flush(self) -> None:
        for handle in self.files.values():
            handle.flush()
        self.flushed = time.monotonic()

    def end(self, ranks=None, status: str = "ok") -> None:
        """run_end on `ranks` (default all), their files renamed; the others' files stay
        `.tmp`, cut where they are, as a killed rank's."""
        chosen = range(self.ranks) if ranks is None else ranks
        for rank in chosen:
            self._write(rank, schema.MANIFEST_FILE, schema.RunEnd(
                rank=rank, end_ns=self.step_start[rank] + self.offset(rank), status=status,
                exit_code=0 if status == "ok" else 1, steps=self.next_step, windows=0,
                samples=0, comm_ops=self.next_step * self.ops_per_step, bytes_written=0,
                errors=0))
        self.flush()
        for (rank, pattern), handle in list(self.files.items()):
            if rank in chosen:
                handle.close()
                path = self._path(rank, pattern)
                os.replace(path, path[:-len(schema.TEMP_SUFFIX)])
                del self.files[rank, pattern]

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()
        self.files.clear()


def write_in_real_time(folder: str, ranks: int, steps_per_s: float, seconds: float,
                       ops_per_step: int) -> None:
    """The writer process: `steps_per_s` steps a second on every rank, for `seconds`."""
    run = SyntheticRun(folder, ranks, step_ms=1e3 / steps_per_s, ops_per_step=ops_per_step)
    run.start()
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        run.write_step()
        time.sleep(max(0.0, began + run.next_step / steps_per_s - time.monotonic()))
    run.end()


def measure(ranks: int, seconds: float, steps_per_s: float, ops_per_step: int) -> dict:
    from rich.console import Console

    with tempfile.TemporaryDirectory() as parent:
        folder = os.path.join(parent, "synthetic-run")
        writer = multiprocessing.get_context("spawn").Process(
            target=write_in_real_time, args=(folder, ranks, steps_per_s, seconds, ops_per_step))
        writer.start()
        watcher = Watcher(WatchOptions(paths=(parent,)))
        console = Console(file=io.StringIO(), width=100, height=30, force_terminal=True)
        cpu, wall, lag = [], [], []
        began = time.monotonic()
        while writer.is_alive() or not watcher.following:
            tick = time.monotonic()
            thread_cpu = time.thread_time()
            watcher.tick(tick)
            if watcher.following:
                view = watcher.model.view()
                console.print(render.frame(view, 100, 30, watcher.where))
                console.file.seek(0)
                console.file.truncate()
                written = int((tick - began) * steps_per_s)
                lag.append(written - (view.newest_step or 0))
            cpu.append(time.thread_time() - thread_cpu)
            wall.append(time.monotonic() - tick)
            time.sleep(max(0.0, tick + 1.0 - time.monotonic()))
        writer.join()
        watcher.tick(time.monotonic())
        view = watcher.model.view()
    steady = cpu[3:] or cpu  # the first refreshes wait for the folder and read the start
    return {"refreshes": len(cpu), "cpu_median_ms": statistics.median(steady) * 1e3,
            "cpu_p90_ms": sorted(steady)[int(0.9 * (len(steady) - 1))] * 1e3,
            "cpu_max_ms": max(steady) * 1e3, "wall_max_ms": max(wall[3:] or wall) * 1e3,
            "cpu_share_pct": sum(steady) / len(steady) * 100,
            "lag_steps_median": statistics.median(lag[3:] or lag or [0]),
            "ranks_seen": len(view.rows), "ended": view.ended,
            "load": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--steps-per-s", type=float, default=10.0)
    parser.add_argument("--ops-per-step", type=int, default=4)
    args = parser.parse_args()
    result = measure(args.ranks, args.seconds, args.steps_per_s, args.ops_per_step)
    print(f"{args.ranks} ranks at {args.steps_per_s:g} steps/s, {args.ops_per_step} ops a step, "
          f"{result['refreshes']} refreshes over {args.seconds:g} s (load "
          f"{', '.join(f'{x:.2f}' for x in result['load'])}):")
    print(f"  CPU per refresh: median {result['cpu_median_ms']:.1f} ms, p90 "
          f"{result['cpu_p90_ms']:.1f} ms, max {result['cpu_max_ms']:.1f} ms "
          f"({result['cpu_share_pct']:.1f}% of one core); longest refresh "
          f"{result['wall_max_ms']:.0f} ms of wall time")
    print(f"  view behind the writer: median {result['lag_steps_median']:.0f} steps; "
          f"{result['ranks_seen']} ranks seen; ended: {result['ended']}")


if __name__ == "__main__":
    main()
