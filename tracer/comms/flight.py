"""The Flight Recorder part: the ops torch's C++ code issues (DDP's reducer: its gradient
buckets, bucket rebuilds, start-up checks), which no Python hook sees, read from torch's Flight
Recorder (FR) ring buffer on the step-end worker and written as CommRecords of source "native"
(docs/tracer.md, Collective hooks: the Flight Recorder).

An FR entry that a hooked call on the same thread created (a span of the recorder's
`issue_spans`) is the hooks' own op, recorded by them, and is left out here. Pure conversion in
tracer.comms.flight_entries; this module drains, places entries in their steps, and paces.
"""

from __future__ import annotations

import bisect
import collections
import math
import os
import threading
import time
from collections.abc import Callable

import msgspec

from tracer.comms.flight_entries import (
    FrDump,
    NativeOp,
    is_done,
    native_op,
    span_index,
    within_span,
)
from tracer.parts.log import say
from tracer.parts.part import Part

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
# NCCL times each op with CUDA events, and FR entries get its duration_ms, only with this set
# when the process group is created; torch still reads the older name as well.
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
OLD_NCCL_TIMING_ENV = "NCCL_ENABLE_TIMING"
# With one hardware queue, NCCL's timing events keep its kernels from overlapping with compute
# (pytorch/pytorch#143890): timing is then left off unless the user asks for it.
CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
OLD_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # torch's older name, which it still reads
# Entries the ring keeps when the user set no size: a full dump and its decode take about 10 us
# per entry with the GIL held (docs/benchmarks.md), so 512 cost about 5 ms at most per drain.
BUFFER_SIZE = 512
MIN_INTERVAL_S = 0.2  # at most one drain per step-end worker pass (step_worker.PERIOD_S)
MAX_INTERVAL_S = 2.0  # step records wait for the drain after their end: at most this long
FILL_SHARE = 0.5  # drain before the ring holds this share of entries new since the last drain
COST_SHARE = 0.0025  # and no more often than a dump's time / this (0.25% of the wall time)
# The training thread dumps the ring at a step's end when the worker's drain is this late: the
# entries expected since the last drain reach this share of the ring, at the rate a second or the
# rate a step the last drain saw (a rate a second seen in slow steps says little of fast ones;
# the worker's pacing drains before half the ring is new, so on time it never comes to this). The
# worker's pass can come late on a loaded machine, or when it waits for the GIL behind fast steps.
# The dump is kept for the worker, which reads it (and writes every record) before its own.
OVERDUE_SHARE = 0.75
MAX_KEPT_DUMPS = 64  # dumps kept for a worker that does not come: at most about 64 x 0.2 MB
SETTLE_NS = 50_000_000  # an entry created this long before a dump is in it
FIRST_ISSUES_KEPT = 4096  # steps' first issue times kept for a reader that has not taken them


def open_flight(setup):
    """The registry's factory: the part, or None (the comms part off, torch without FR, or the
    user switched FR off with a buffer size of 0)."""
    recorder = setup.built("comms")
    if recorder is None:
        return None  # no comms file to write to: --no-comms
    try:
        import torch._C._distributed_c10d as c10d_c
        dump = c10d_c._dump_fr_trace_json
    except (ImportError, AttributeError) as exc:
        setup.report("flight", f"this torch has no Flight Recorder dump ({type(exc).__name__}: "
                               f"{exc}); ops issued by torch's C++ code (DDP's buckets) are "
                               f"recorded in the profiler's windows only")
        return None
    size = buffer_size(os.environ)
    if size <= 0:
        setup.report("flight", f"{BUFFER_ENV}=0 keeps torch's Flight Recorder off; ops issued by "
                               f"torch's C++ code (DDP's buckets) are recorded in the profiler's "
                               f"windows only")
        return None
    nccl_timing(os.environ)
    return setup.build(FlightRecorder, recorder, lambda: dump(includeCollectives=True,
                                                              onlyActive=False),
                       setup.track_step_ends(), size)


def buffer_size(environ) -> int:
    """The ring's size: the user's, or BUFFER_SIZE, which is then set in `environ` for the
    process groups the script creates (torch reads it when it creates one)."""
    for name in (BUFFER_ENV, OLD_BUFFER_ENV):
        text = environ.get(name)
        if text is not None:
            try:
                return int(text)
            except ValueError:
                return 0  # torch would refuse it as well
    environ[BUFFER_ENV] = str(BUFFER_SIZE)
    return BUFFER_SIZE


def nccl_timing(environ) -> bool:
    """Whether NCCL will time its ops: TORCH_NCCL_ENABLE_TIMING=1 is set in `environ` (before
    the script creates its process groups, which read it) unless the user set it or its older
    name, whose value is kept, or set CUDA_DEVICE_MAX_CONNECTIONS=1 (CONNECTIONS_ENV). gloo
    ignores it."""
    for name in (NCCL_TIMING_ENV, OLD_NCCL_TIMING_ENV):
        if name in environ:
            return environ[name].strip().lower() in ("1", "true", "yes", "y", "on")
    if environ.get(CONNECTIONS_ENV, "").strip() == "1":
        return False
    environ[NCCL_TIMING_ENV] = "1"
    return True


class FlightRecorder(Part):
    """Drains the FR ring on the step-end worker; when the worker's drain is overdue
    (OVERDUE_SHARE), the training thread dumps the ring at a step's end and keeps the dump for
    the worker to read first; its last drain at the script's end (a clean one, an exception such
    as a process group's timeout, SIGTERM)."""

    name = "flight"

    def __init__(self, recorder, dump: Callable[[], bytes | str], step_ends, size: int, *,
                 clock_ns: Callable[[], int] = time.time_ns):
        """`recorder`: the comms part (its writer, issued file, issue spans and counts);
        `dump()` FR's JSON; `step_ends` tracer.steps.step_clock.StepClock.ends; `size` the
        ring's."""
        self.recorder = recorder
        self.rank = getattr(recorder, "rank", None)
        self._dump = dump
        self._decoder = msgspec.json.Decoder(FrDump)
        self._step_ends = step_ends
        self._ends: list[int] = []  # step ends not yet pruned, of steps _ends_base onwards
        self._ends_base = 0
        self.size = size
        self._clock_ns = clock_ns
        self._spans = recorder.issue_spans = collections.deque()
        recorder.flight_recorded = True
        self._last_id = -1  # the highest record_id looked at
        self._waiting: dict[int, NativeOp] = {}  # record_id -> native op issued, not done
        self._per_step: dict[int, list[int]] = {}  # step -> [native ops, bytes] not yet amended
        self._known_ns = 0  # step records ending before this have every native op counted
        self._next_drain = 0.0  # monotonic time
        self._last_drain = None  # monotonic time of the last drain
        self._overdue_at = math.inf  # monotonic time the training thread dumps the ring
        self._overdue_s = math.inf  # the time the ring takes to fill 3/4 at the rate last seen
        self._steps_since = 0  # steps ended since the last drain or kept dump
        self._overdue_steps = math.inf  # steps that fill 3/4 of the ring at the last rate a step
        self._kept: list[tuple[int, bytes | str]] = []  # (host time, dump) of the training thread
        self._lock = threading.Lock()  # one drain or dump at a time
        self.interval_s = MIN_INTERVAL_S
        self._sizes: dict[str, int] = {}  # pg name -> its size
        self.ops = 0  # native ops recorded
        self.lost = 0  # entries the ring overwrote before a drain saw them
        self.unknown: dict[str, int] = {}  # profiling names not recorded -> how many
        self.drains = 0  # the worker's drains (and the last one)
        self.overdue_dumps = 0  # dumps the training thread took
        self.hooked = 0  # entries the hooks recorded, left out
        self.dump_s = 0.0  # time in dumps and decoding, all drains together
        self._said_lost = False
        # (step, host time its first collective or p2p op was created), of each step in order,
        # for the capture watch (tracer.capture.capture_watch), which takes them from the left.
        self.first_issues: collections.deque = collections.deque(maxlen=FIRST_ISSUES_KEPT)
        self._first_issue_step = -1

    # ---- the hooks --------------------------------------------------------------------------
    def on_worker_pass(self) -> None:
        if time.monotonic() >= self._next_drain:
            self.drain()

    def on_step(self) -> None:
        self._steps_since += 1
        if ((self._steps_since >= self._overdue_steps or time.monotonic() >= self._overdue_at)
                and self._lock.acquire(blocking=False)):
            try:
                self._keep_dump()
            finally:
                self._lock.release()

    def _keep_dump(self) -> None:
        """The ring as it is now, kept for the worker's next drain: the training thread pays
        for the dump only; the records are written on the worker, as always."""
        now = self._clock_ns()
        started = time.perf_counter()
        dump = self._dump()
        self.dump_s += time.perf_counter() - started
        if len(self._kept) < MAX_KEPT_DUMPS:
            self._kept.append((now, dump))
        self.overdue_dumps += 1
        self._overdue_at = time.monotonic() + self._overdue_s
        self._steps_since = 0

    def steps_known_until(self) -> int | None:
        return self._known_ns

    def amend_step_record(self, record) -> None:
        with self._lock:
            counts = self._per_step.pop(record.step, None)
            for old in [s for s in self._per_step if s < record.step]:
                del self._per_step[old]  # a step whose record never came (the record cap)
        if counts is not None:
            record.comm_ops += counts[0]
            record.comm_bytes += counts[1]

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        self.drain(final=True)
        self.close()

    def run_end_fields(self) -> dict:
        return {"native_ops_lost": self.lost} if self.lost else {}

    def close(self) -> None:
        self.recorder.issue_spans = None

    def fail(self, message: str) -> bool:
        self.close()  # the hooks stop noting spans nobody reads any more
        self.recorder.flight_recorded = False
        return Part.fail(self, message)

    # ---- draining ---------------------------------------------------------------------------
    def drain(self, final: bool = False) -> None:
        """Record the entries new since the last drain (the kept dumps' first, in the order
        they were taken), and the waiting ones now done."""
        with self._lock:
            self.drains += 1
            kept, self._kept = self._kept, []
            new = 0
            for taken_ns, raw in kept:
                started = time.perf_counter()
                dump = self._decoder.decode(raw)
                self.dump_s += time.perf_counter() - started
                new += self._read(taken_ns, dump, False)
            now = self._clock_ns()
            started = time.perf_counter()
            dump = self._decoder.decode(self._dump())
            spent = time.perf_counter() - started
            self.dump_s += spent
            new += self._read(now, dump, final)
            self._pace(spent, new)
            self._pace_steps(new, len(kept))
            if final:
                self._say_unknown()

    def _read(self, now: int, dump: FrDump, final: bool) -> int:
        """Record what `dump`, taken at host time `now`, holds: the entries new since the last
        dump read, and the waiting ones now done. Returns how many were created since then (the
        new ones, and those the ring lost)."""
        while self._step_ends:
            self._ends.append(self._step_ends.popleft())
        spans = span_index(list(self._spans))
        entries = sorted(dump.entries, key=lambda e: e.record_id)
        first_id = self._last_id
        new_ids = [e.record_id for e in entries if e.record_id > self._last_id]
        if new_ids and new_ids[0] > self._last_id + 1:
            self._count_lost(new_ids[0] - self._last_id - 1)
        done_by = None if final else now
        for entry in entries:
            if entry.record_id > self._last_id:
                self._last_id = entry.record_id
                self._note_first_issue(entry.time_created_ns)
                if within_span(spans, entry):
                    self.hooked += 1
                else:
                    self._issue(entry, dump, done_by)
            waiting = self._waiting.get(entry.record_id)
            if waiting is not None and is_done(entry, done_by):
                del self._waiting[entry.record_id]
                self._write(waiting, entry)
        if entries:
            oldest = entries[0].record_id
            for record_id in [r for r in self._waiting if r < oldest]:
                del self._waiting[record_id]  # overwritten before it was seen done
        self._prune(now - SETTLE_NS)
        self._known_ns = now - SETTLE_NS
        return new_ids[-1] - first_id if new_ids else 0  # the ring's lost entries too

    def _note_first_issue(self, created_ns: int) -> None:
        """Entries come in the order they were created: the first of a step is its first op."""
        step = self._step_of(created_ns)
        if step > self._first_issue_step:
            self._first_issue_step = step
            self.first_issues.append((step, created_ns))

    def _issue(self, entry, dump, done_by: int | None) -> None:
        """Record a new entry: its IssueRecord now, its CommRecord once it is done (is_done's
        `now_ns`: `done_by`)."""
        pg = entry.process_group[0] if entry.process_group else ""
        op = native_op(entry, self._pg_size(pg, dump), self._step_of(entry.time_created_ns),
                       lambda local: global_rank(pg, local))
        if op is None:
            name = entry.profiling_name
            self.unknown[name] = self.unknown.get(name, 0) + 1
            return
        owners = getattr(self.recorder, "owners", None)
        if owners is not None:
            op.issuer = owners.of_native(op.op, op.pg, op.dtype, op.elements, entry.thread_id,
                                         entry.time_created_ns)
        self.ops += 1
        self.recorder.native_ops += 1
        counts = self._per_step.setdefault(op.step, [0, 0])
        counts[0] += 1
        counts[1] += op.nbytes
        issues = getattr(self.recorder.timing, "issues_writer", None)
        if issues is not None:
            issues.write(op.issue_record())
        if is_done(entry, done_by):
            self._write(op, entry)
        else:
            self._waiting[entry.record_id] = op

    def _write(self, op: NativeOp, entry) -> None:
        self.recorder.writer.write(op.comm_record(entry))

    def _step_of(self, created_ns: int) -> int:
        """Steps completed when the entry was created (CommRecord.step)."""
        return self._ends_base + bisect.bisect_right(self._ends, created_ns)

    def _prune(self, before_ns: int) -> None:
        """Forget step ends and finished spans older than `before_ns`: every entry created
        before it was in this dump."""
        cut = bisect.bisect_left(self._ends, before_ns)
        if cut:
            del self._ends[:cut]
            self._ends_base += cut
        spans = self._spans
        while spans and spans[0][2] is not None and spans[0][2] < before_ns:
            spans.popleft()
        owners = getattr(self.recorder, "owners", None)
        if owners is not None:
            owners.prune(before_ns)

    def _pace(self, spent_s: float, new: int) -> None:
        """The next drain: soon enough that the ring cannot fill with new entries at the rate
        just seen (over the time since the last drain, however late it came), late enough that
        dumps take at most COST_SHARE of the time; and when the training thread drains itself,
        should the worker's pass come too late."""
        now = time.monotonic()
        elapsed = now - self._last_drain if self._last_drain is not None else self.interval_s
        self._last_drain = now
        rate = new / max(elapsed, 1e-3)
        fill_s = FILL_SHARE * self.size / rate if rate > 0 else MAX_INTERVAL_S
        interval = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, spent_s / COST_SHARE))
        self.interval_s = max(MIN_INTERVAL_S, min(interval, fill_s))
        self._next_drain = now + self.interval_s
        self._overdue_s = OVERDUE_SHARE * self.size / rate if rate > 0 else math.inf
        self._overdue_at = now + self._overdue_s

    def _pace_steps(self, new: int, kept: int) -> None:
        """The steps after which the training thread dumps the ring: the entries created a step
        since the last drain (over the steps since then, where the training thread kept no dump
        meanwhile) filling OVERDUE_SHARE of it."""
        steps, self._steps_since = self._steps_since, 0
        if steps and not kept:
            per_step = new / steps
            self._overdue_steps = (max(1, int(OVERDUE_SHARE * self.size / per_step))
                                   if per_step > 0 else math.inf)

    def _pg_size(self, pg: str, dump) -> int:
        size = self._sizes.get(pg)
        if size is None:
            size = self._sizes[pg] = group_size(pg, dump)
        return size

    def _count_lost(self, lost: int) -> None:
        self.lost += lost
        if not self._said_lost:
            self._said_lost = True
            say(f"torch's Flight Recorder ring ({self.size} entries) was overwritten before it "
                f"was read: {lost} ops are not in the comms records (run_end's native_ops_lost "
                f"counts all); a larger {BUFFER_ENV} keeps them", self.name, self.rank)

    def _say_unknown(self) -> None:
        if self.unknown:
            names = ", ".join(f"{name} x{n}" for name, n in sorted(self.unknown.items()))
            say(f"Flight Recorder ops of kinds the comms records have no name for were left "
                f"out: {names}", self.name, self.rank)
            self.unknown = {}


def global_rank(pg: str, local: int) -> int | None:
    """The global rank of rank `local` of group `pg`, None where torch no longer knows it."""
    try:
        import torch.distributed as dist
        for group, name in list(dist.distributed_c10d._world.pg_names.items()):
            if str(name) == pg:
                return int(dist.get_global_rank(group, local))
    except Exception:
        pass
    return None


def group_size(pg: str, dump) -> int:
    """The size of process group `pg` (its name): from torch while the group exists, else from
    the dump's pg_config; 0 when neither knows it."""
    try:
        import torch.distributed as dist
        for group, name in list(dist.distributed_c10d._world.pg_names.items()):
            if str(name) == pg:
                return int(group.size())
    except Exception:
        pass
    configs = dump.pg_config or {}
    config = configs.get(pg) or (next(iter(configs.values())) if len(configs) == 1 else None)
    if config is not None:
        try:
            return len(msgspec.json.decode(config.get("ranks", "[]")))
        except (msgspec.DecodeError, TypeError):
            return 0
    return 0
