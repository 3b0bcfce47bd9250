"""The live view's model: every rank's state from the records read so far, and the view drawn
from it once a refresh (docs/viewing.md defines each number).

Pure: batches of decoded records in (ranktrace.watch.tail), a WatchView out; nothing here reads
a file or a clock. Which processes are gone is told from outside (mark_gone).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from ranktrace.watch.phases import PhaseChange, PhaseDetector
from ranktrace.watch.series import StepSeries
from ranktrace.watch.tail import Batch
from ranktrace.watch.waits import ArrivalBook, WaitedFor, summarise, waited_for, within_recent
from tracer import schema

# Steps the job's step time waits for a lagging rank before it is taken without it.
MAX_PENDING_STEPS = 4096
# Step times kept per rank and for the job: the recent ones are taken from them (recent).
KEPT_STEPS = 512
SERIES_POINTS = 256  # the step-time series handed to the view, at most
KEPT_PROBLEMS = 5
MIB = 1 << 20


def recent(values: deque, at_least: int, window_s: float, ms=lambda v: v) -> list:
    """The newest `values` that are the recent steps (waits.within_recent; the span from their
    `ms` summed)."""
    taken, spanned_ms = [], 0.0
    for value in reversed(values):
        if not within_recent(len(taken), spanned_ms / 1e3, at_least, window_s):
            break
        taken.append(value)
        spanned_ms += ms(value)
    return taken[::-1]


@dataclass
class RankState:
    rank: int
    start: schema.RunStart | None = None
    end: schema.RunEnd | None = None
    offset_ns: int | None = None  # clock_sync: this rank's clock minus rank 0's
    last_step: schema.StepRecord | None = None
    durations_ms: deque = None  # the last steps' times
    samples: deque = None  # (samples, ms) of the last steps that record samples
    sample_memory: tuple[int, str] | None = None  # from the newest device sample
    gone: str | None = None  # why it counts as ended without run_end
    ignored: bool = False  # written with a newer schema than this watch reads

    def __post_init__(self):
        self.durations_ms = deque(maxlen=KEPT_STEPS)
        self.samples = deque(maxlen=KEPT_STEPS)

    @property
    def finished(self) -> bool:
        return self.end is not None or self.gone is not None


@dataclass(frozen=True)
class RankRow:
    """One rank's row."""

    rank: int
    host: str | None
    step: int | None  # the last step recorded
    step_ms: float | None  # median of the recent steps (RunModel.recent_steps)
    last_ms: float | None  # the last step's time
    wait_ms: float | None  # median wait for peers a step (None: no settled op)
    wait_share: float | None  # wait_ms / step_ms
    late_ms: float | None  # median lateness a step
    memory_bytes: int | None
    memory_kind: str | None  # "CUDA peak", "RSS", "GPU used"
    samples_per_s: float | None
    state: str  # "starting", "running", "ok", "failed", "interrupted", "gone", ...


@dataclass(frozen=True)
class CaptureWindow:
    """A window opened off the fixed schedule (schema.CaptureRequest, schema.CaptureRecord)."""

    first_step: int
    steps: int
    trigger: str
    trigger_rank: int | None
    ratio: float | None
    traced_ranks: int  # ranks that wrote its capture record and traced it
    missed_ranks: int  # ranks that learnt of it too late


@dataclass(frozen=True)
class RankEnded:
    rank: int
    status: str  # run_end's status, or "gone"
    exit_code: int | None
    why: str | None  # run_end's exception, or why it counts as gone


@dataclass(frozen=True)
class WatchView:
    run_name: str | None
    world_size: int | None
    rows: list[RankRow]  # one per rank seen, by rank
    waited_for: WaitedFor | None
    job_step_ms: float | None  # median over the recent steps of the job's step time
    newest_step: int | None  # the newest step every running rank has ended
    phases: list[PhaseChange]
    captures: list[CaptureWindow]
    series: list[float]  # the job's step time over the run, SERIES_POINTS values at most
    series_steps: tuple[int, int] | None  # first and last step of the series
    series_range: tuple[float, float] | None  # fastest and slowest step of the series
    problems: list[str]  # the newest few
    problem_count: int
    ended: bool  # every rank of the world has ended or is gone


class RunModel:
    def __init__(self, recent_steps: int = 20, window_s: float = 2.0):
        # The medians are taken over the steps of the last window_s seconds, and at least the
        # last recent_steps of them.
        self.recent_steps = recent_steps
        self.window_s = window_s
        self.ranks: dict[int, RankState] = {}
        self.world_size: int | None = None
        self.run_name: str | None = None
        self.book = ArrivalBook()
        self.pending_steps: dict[int, list[float]] = {}
        self.series = StepSeries()
        self.job_steps: deque[float] = deque(maxlen=KEPT_STEPS)
        self.newest_step: int | None = None
        self.detector = PhaseDetector()
        self.requests: dict[tuple[int, int], schema.CaptureRequest] = {}
        self.captured: dict[tuple[int, int], dict[int, schema.CaptureRecord]] = {}
        self.problems: deque[str] = deque(maxlen=KEPT_PROBLEMS)
        self.problem_count = 0
        self.events: list = []  # PhaseChange, CaptureWindow, RankEnded since drain_events

    def rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank)
        return state

    def note(self, problem: str) -> None:
        self.problems.append(problem)
        self.problem_count += 1

    def take(self, batch: Batch) -> None:
        """One poll's records: manifests first (the clock offsets the ops need)."""
        for problem in batch.problems:
            self.note(problem)
        for rank, records in batch.records["manifest"]:
            for record in records:
                self._manifest(rank, record)
        for rank, records in batch.records["steps"]:
            state = self.rank(rank)
            if not state.ignored:
                self._steps(state, records)
        for rank, records in batch.records["comms"]:
            state = self.rank(rank)
            if not state.ignored:
                self.book.add(rank, records, state.offset_ns or 0)
        for rank, records in batch.records["samples"]:
            self._sample(self.rank(rank), records[-1])
        for request in batch.requests:
            key = (request.first_step, request.steps)
            if key not in self.requests and key not in self.captured:
                self.events.append(self._window(key, request))
            self.requests.setdefault(key, request)
        self._emit_steps()

    def _manifest(self, rank: int, record) -> None:
        state = self.rank(rank)
        if isinstance(record, schema.RunStart):
            if record.schema_version > schema.SCHEMA_VERSION:
                state.ignored = True
                self.note(f"rank {rank}: written with trace schema version "
                          f"{record.schema_version}, newer than this watch reads "
                          f"({schema.SCHEMA_VERSION}); its records are ignored")
            state.start = record
            self.world_size = max(self.world_size or 0, record.world_size)
            self.run_name = self.run_name or record.run_name
        elif isinstance(record, schema.ClockSync):
            state.offset_ns = record.offset_ns
        elif isinstance(record, schema.RunEnd):
            state.end = record
            self.events.append(RankEnded(rank, record.status, record.exit_code,
                                         record.exception))
        elif isinstance(record, schema.CaptureRecord):
            key = (record.first_step, record.steps)
            new = key not in self.captured
            self.captured.setdefault(key, {})[rank] = record
            if new and key not in self.requests:
                self.events.append(self._window(key, record))
        elif isinstance(record, schema.TracerError):
            self.note(f"rank {rank}: tracer part '{record.part}' failed: {record.message}")
        elif isinstance(record, schema.TracerProblem):
            self.note(f"rank {rank}: tracer part '{record.part}': {record.message}")

    def _steps(self, state: RankState, records: list[schema.StepRecord]) -> None:
        for record in records:
            if state.last_step is not None and record.step <= state.last_step.step:
                continue  # read again (a file replaced): already counted
            state.last_step = record
            if record.step == 0:
                continue  # the script's set-up, not a training step
            ms = (record.end_ns - record.start_ns) / 1e6
            state.durations_ms.append(ms)
            if record.samples:
                state.samples.append((record.samples, ms))
            self.pending_steps.setdefault(record.step, []).append(ms)

    def _sample(self, state: RankState, sample: schema.DeviceSample) -> None:
        if sample.mem_used_bytes is not None:
            state.sample_memory = (sample.mem_used_bytes, "GPU used")
        elif sample.rss_bytes is not None:
            state.sample_memory = (sample.rss_bytes, "RSS")

    def _emit_steps(self) -> None:
        """The job's step time (the median over ranks) of each step every running rank has
        ended, in step order, into the series and the phase detector."""
        if not self.pending_steps:
            return
        running = [s.last_step.step if s.last_step else -1 for s in self.ranks.values()
                   if not s.finished and not s.ignored and s.start is not None]
        horizon = min(running) if running else max(self.pending_steps)
        for step in sorted(self.pending_steps):
            if step > horizon and len(self.pending_steps) <= MAX_PENDING_STEPS:
                break
            ms = statistics.median(self.pending_steps.pop(step))
            self.newest_step = step
            self.series.add(step, ms)
            self.job_steps.append(ms)
            change = self.detector.add(step, ms)
            if change is not None:
                self.events.append(change)

    def mark_gone(self, rank: int, why: str) -> None:
        """`rank` ended without run_end (its process is gone, or it has been silent)."""
        state = self.rank(rank)
        if not state.finished:
            state.gone = why
            self.events.append(RankEnded(rank, "gone", None, why))
            self._emit_steps()

    def missing_ranks(self) -> list[int]:
        """Ranks of the world that wrote nothing yet."""
        return [r for r in range(self.world_size or 0) if r not in self.ranks]

    def ended(self) -> bool:
        """Every rank of the world has ended (run_end) or is gone."""
        return (self.world_size is not None and not self.missing_ranks()
                and all(s.finished for s in self.ranks.values()))

    def drain_events(self) -> list:
        events, self.events = self.events, []
        return events

    def _window(self, key: tuple[int, int], source) -> CaptureWindow:
        records = self.captured.get(key, {})
        missed = sum(1 for r in records.values() if r.missed)
        return CaptureWindow(first_step=key[0], steps=key[1], trigger=source.trigger,
                             trigger_rank=source.trigger_rank, ratio=source.ratio,
                             traced_ranks=len(records) - missed, missed_ranks=missed)

    def view(self) -> WatchView:
        job = recent(self.job_steps, self.recent_steps, self.window_s)
        job_ms = statistics.median(job) if job else None
        summary = summarise(self.book, self.recent_steps, self.window_s)
        rows = [self._row(state, summary) for _, state in sorted(self.ranks.items())]
        windows = {**{k: self._window(k, r) for k, r in self.requests.items()},
                   **{k: self._window(k, next(iter(r.values())))
                      for k, r in self.captured.items()}}
        series = self.series
        return WatchView(
            run_name=self.run_name, world_size=self.world_size, rows=rows,
            waited_for=waited_for(summary, job_ms), job_step_ms=job_ms,
            newest_step=self.newest_step, phases=list(self.detector.changes),
            captures=[windows[k] for k in sorted(windows)],
            series=series.means(SERIES_POINTS),
            series_steps=(series.first_step, series.last_step) if series.buckets else None,
            series_range=(series.low, series.high) if series.buckets else None,
            problems=list(self.problems), problem_count=self.problem_count,
            ended=self.ended())

    def _row(self, state: RankState, summary) -> RankRow:
        last = state.last_step
        steps = recent(state.durations_ms, self.recent_steps, self.window_s)
        step_ms = statistics.median(steps) if steps else None
        wait = summary.wait_ms.get(state.rank)
        memory = _memory(last) or state.sample_memory
        counted = recent(state.samples, self.recent_steps, self.window_s, ms=lambda v: v[1])
        done = sum(ms for _, ms in counted)
        return RankRow(
            rank=state.rank, host=state.start.host if state.start else None,
            step=last.step if last else None, step_ms=step_ms,
            last_ms=state.durations_ms[-1] if state.durations_ms else None,
            wait_ms=wait, wait_share=wait / step_ms if wait is not None and step_ms else None,
            late_ms=summary.late_ms.get(state.rank),
            memory_bytes=memory[0] if memory else None, memory_kind=memory[1] if memory else None,
            samples_per_s=sum(n for n, _ in counted) / done * 1e3 if done else None,
            state=_state(state))


def _memory(step: schema.StepRecord | None) -> tuple[int, str] | None:
    if step is None:
        return None
    if step.cuda_peak_allocated_bytes is not None:
        return step.cuda_peak_allocated_bytes, "CUDA peak"
    if step.rss_bytes is not None:
        return step.rss_bytes, "RSS"
    return None


def _state(state: RankState) -> str:
    if state.ignored:
        return "newer schema"
    if state.end is not None:
        return state.end.status
    if state.gone is not None:
        return "gone"
    if state.start is None or state.last_step is None:
        return "starting"
    return "running"
