"""The ranktrace trace contract: file names, record fields, units and the schema version.

The tracer writes these files and the analysis reads them; both import this module, and
`docs/trace-format.md` describes it for users. Rename, remove or change the meaning of a field
here, bump SCHEMA_VERSION, and update the docs in the same commit. Adding an optional field or a
new file keeps the version: readers ignore fields and files they do not know, and files written
before the addition simply lack it.

Units: times are integers in nanoseconds (`*_ns`, Unix epoch from `time.time_ns()` on the
rank's host clock) unless a name says `_us`; sizes are bytes; bandwidths are GB/s (1e9 bytes/s).
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

SCHEMA_VERSION = 1

# ---- file names inside one run folder (traces/<run>/) ------------------------------------------
# Kineto traces keep torch's `<worker>.<span>.pt.trace.json.gz` shape so that torch-tb-profiler
# reads them as worker `rank{R}` and HTA can load the folder as it is. Nothing else in a run folder
# ends in `.json` or `.gz`, for the same reason.
KINETO_TRACE_RE = re.compile(r"^(?P<worker>.+?)\.(?P<span>\d+)\.pt\.trace\.json(?:\.gz)?$")
RANK_WORKER_RE = re.compile(r"^rank(?P<rank>\d+)$")
MANIFEST_FILE = "rank{rank}.manifest.jsonl"
COMMS_FILE = "rank{rank}.comms.jsonl"
SAMPLES_FILE = "rank{rank}.samples.jsonl"
STEPS_FILE = "rank{rank}.steps.jsonl"
# One IssueRecord per collective and p2p op, written when the op is issued (its CommRecord in
# COMMS_FILE follows when it completes).
ISSUED_FILE = "rank{rank}.issued.jsonl"
# One StackDump per SIGUSR1, SIGTERM, or exception raised by a collective; written unbuffered.
STACKS_FILE = "rank{rank}.stacks.jsonl"
# torch's own format, never loaded by us
MEMORY_SNAPSHOT_FILE = "rank{rank}.step{step}.memory_snapshot.pickle"
# The same snapshot as one MemorySnapshotRecord, what the analysis reads (no unpickling)
MEMORY_SNAPSHOT_RECORD_FILE = "rank{rank}.step{step}.memory_snapshot.jsonl"
MEMORY_SNAPSHOT_RECORD_RE = re.compile(r"^rank(?P<rank>\d+)\.step(?P<step>\d+)"
                                       r"\.memory_snapshot\.jsonl$")
# A MemoryProfileRecord for profiler windows 1, 2, 4, 8, ..., with --profile-memory
MEMORY_PROFILE_FILE = "rank{rank}.memory.jsonl"
# Windows asked for by python -m tracer.capture (CaptureAsk), and the windows the ranks plan
# (CaptureRequest), each one per file, numbered in the order they were made.
CAPTURE_ASK_FILE = "capture.ask{index}.jsonl"
CAPTURE_REQUEST_FILE = "capture.request{index}.jsonl"
# The process that started the ranks itself (torch.multiprocessing.spawn, elastic_launch,
# multiprocessing.Process): its Launch records and how it ended (LauncherRecord). Not a rank's
# file: the analysis reads ranks from `rank{R}.*` names only.
LAUNCHER_FILE = "launcher.manifest.jsonl"
TEMP_SUFFIX = ".tmp"  # files are written as <name>.tmp then renamed
# The JSON-lines record files of a rank, by kind; and the endings of a Kineto trace file.
RECORD_FILES = (MANIFEST_FILE, STEPS_FILE, COMMS_FILE, SAMPLES_FILE)
TRACE_SUFFIXES = (".json", ".json.gz")


def worker_name(rank: int) -> str:
    """The Kineto worker name for a rank, as torch-tb-profiler shows it."""
    return f"rank{rank}"


def kineto_trace_file(rank: int, span_ns: int) -> str:
    return f"{worker_name(rank)}.{span_ns}.pt.trace.json.gz"


# ---- collective and p2p ops ---------------------------------------------------------------------
CommOp = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
    "gather", "scatter", "send", "recv", "barrier",
]
COMM_OPS: tuple[str, ...] = CommOp.__args__  # type: ignore[attr-defined]

# How an op was issued, so users can tell DDP bucket traffic from their own calls. "native": issued
# by torch's C++ code (DDP's reducer: gradient buckets, bucket rebuilds, DDP's start-up checks),
# seen in torch's Flight Recorder rather than by a Python hook.
CommSource = Literal["c10d", "ddp", "functional", "p2p", "native"]
COMM_SOURCES: tuple[str, ...] = CommSource.__args__  # type: ignore[attr-defined]


TIMING_ISSUE = "issue"  # CommRecord.timing of an op whose end is unknown
NATIVE_SOURCE = "native"

# Which framework issued an op itself (CommRecord.issuer, IssueRecord.issuer): DDP (its gradient
# buckets, its start-up checks and broadcasts, its comm hooks' ops), FSDP1
# (FullyShardedDataParallel) or FSDP2 (fully_shard). The tracer infers it from the units it saw
# built (docs/tracer.md, Collective hooks: who issued an op); absent: none of these, or not known.
CommIssuer = Literal["ddp", "fsdp1", "fsdp2"]
COMM_ISSUERS: tuple[str, ...] = CommIssuer.__args__  # type: ignore[attr-defined]
ISSUER_DDP, ISSUER_FSDP1, ISSUER_FSDP2 = COMM_ISSUERS


def bus_factor(op: str, group_size: int) -> float:
    """busbw / algbw for `op` over `group_size` ranks, as nccl-tests defines it.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n;
    broadcast, reduce, send, recv 1; barrier moves no payload and gets 0.
    """
    n = max(int(group_size), 1)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op == "barrier":
        return 0.0
    return 1.0


def bandwidth_gbps(op: str, nbytes: int, group_size: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s. `nbytes` is nccl-tests' size S (see CommRecord.bytes)."""
    if seconds <= 0 or nbytes <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, group_size)


# ---- records ------------------------------------------------------------------------------------
class CommRecord(msgspec.Struct, omit_defaults=True):
    """One collective or p2p op, one line of rank{R}.comms.jsonl."""

    step: int  # optimizer steps completed on this rank when the op was issued (0-based)
    op: str  # one of COMM_OPS
    source: str  # one of COMM_SOURCES
    pg: str  # process group name ("0" is the default group)
    pg_size: int  # ranks in that group
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    # nccl-tests size S: all_reduce/broadcast/reduce/send/recv: the tensor; all_gather and gather:
    # the gathered output (n x one rank's part); reduce_scatter and scatter: the full input (n x one
    # part); all_to_all: all that one rank sends; barrier: 0.
    bytes: int
    start_ns: int  # host clock when the op was issued
    # host clock at completion: observed on CPU; start_ns + duration for CUDA-event timing
    end_ns: int
    duration_us: float  # the op's time: CUDA events on GPU, host clock around completion on CPU
    # "cuda_event", "host", or TIMING_ISSUE ("issue"): only the issue time is known (a native op
    # on gloo, or on NCCL without TORCH_NCCL_ENABLE_TIMING=1): end_ns == start_ns, duration_us,
    # algbw_gbps and busbw_gbps are 0.0, and the op's end is unknown, not instantaneous
    timing: str
    algbw_gbps: float  # bytes / duration
    busbw_gbps: float  # algbw * bus_factor(op, pg_size)
    peer: int | None = None  # global rank of the other side, for send/recv
    async_op: bool = False  # issued with async_op=True (or as a functional collective)
    # The op's IssueRecord.position; absent in files written before issue records existed.
    # Native ops (source "native") count positions in a namespace of their own (IssueRecord).
    position: int | None = None
    # The op ended with an error (the process group's timeout, a dead peer); end_ns is when the
    # error was seen
    failed: bool = False
    # One of COMM_ISSUERS: DDP or FSDP issued it; absent otherwise, and in files written before
    # the field existed (source then tells how it was issued).
    issuer: str | None = None


class IssueRecord(msgspec.Struct, omit_defaults=True):
    """One collective or p2p op at the moment it is issued, one line of rank{R}.issued.jsonl.

    Written before the op is handed to torch, so an op that never completes (a hang, a dead
    peer, a timeout) is still on record. Its CommRecord, with the same (pg, position), follows
    when it completes."""

    step: int  # as CommRecord.step
    op: str
    source: str
    pg: str
    pg_size: int
    # Collectives: 0-based index of this op among this rank's collectives on `pg` over the whole
    # run (every member issues a group's collectives in the same order, so the same position is
    # the same op on every member). send/recv: index among this rank's ops of the same kind
    # (send or recv) with the same peer on `pg`, so send #k from a to b matches recv #k at b.
    # Source "native": a namespace of its own, never compared with the others' positions: the
    # op's Flight Recorder sequence number on `pg` minus 1 (collective_seq_id for collectives,
    # p2p_seq_id for send/recv), which torch counts over every op of the group, so it is the
    # same op on every member and has gaps where the hooks' ops are.
    position: int
    dtype: str
    bytes: int  # as CommRecord.bytes
    issue_ns: int  # host clock when the op was issued (CommRecord.start_ns)
    peer: int | None = None
    async_op: bool = False
    issuer: str | None = None  # as CommRecord.issuer


class StackFrame(msgspec.Struct, omit_defaults=True):
    file: str
    line: int
    function: str


class ThreadStack(msgspec.Struct, omit_defaults=True):
    name: str
    thread_id: int
    main: bool
    frames: list[StackFrame]  # outermost first, as in a Python traceback; tracer frames left out


class StackDump(msgspec.Struct, omit_defaults=True):
    """The Python stack of every thread and the ops issued but not completed, at one moment;
    one line of rank{R}.stacks.jsonl."""

    rank: int
    t_ns: int
    # "sigusr1" (the user asked; training goes on), "sigterm", or "exception" (a collective
    # raised, e.g. the process group's timeout; `exception` says which)
    reason: str
    threads: list[ThreadStack]
    pending: list[IssueRecord]  # issued, not completed, oldest first
    exception: str | None = None  # "TypeName: first line of the message"


class DeviceSample(msgspec.Struct, omit_defaults=True):
    """One sample of one device (NVML) or of the process and host (psutil),
    rank{R}.samples.jsonl."""

    t_ns: int
    source: str  # "nvml" or "psutil"
    device: int | None = None  # NVML device index; None for psutil
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None
    nvlink_tx_bytes_s: float | None = None
    nvlink_rx_bytes_s: float | None = None
    cpu_process_pct: float | None = None  # 100 = one core
    cpu_system_pct: float | None = None  # 100 = all cores busy
    rss_bytes: int | None = None
    net_sent_bytes_s: float | None = None
    net_recv_bytes_s: float | None = None


class StepRecord(msgspec.Struct, omit_defaults=True):
    """One training step (optimizer step to optimizer step), rank{R}.steps.jsonl."""

    step: int  # 0-based index of the step that just finished
    start_ns: int
    end_ns: int
    in_profiler_window: bool = False  # the profiler was recording (warmup or active) during it
    cuda_peak_allocated_bytes: int | None = None  # torch.cuda.max_memory_allocated over the step
    cuda_peak_reserved_bytes: int | None = None
    cuda_total_bytes: int | None = None  # the device's capacity
    # The process's RSS at the step's end: the last of the tracer's readings (the step-end
    # worker's, about 5 a second, and the psutil sampler's) taken by end_ns, read at rss_t_ns;
    # absent where RSS cannot be read
    rss_bytes: int | None = None
    rss_t_ns: int | None = None  # when rss_bytes was read: by end_ns (after it only before
    # the first reading)
    comm_ops: int = 0
    comm_bytes: int = 0
    # The CPU time the process (every thread) used from start_ns to the step's record, right
    # after end_ns, by time.process_time_ns: the tracer's work at the step end before start_ns
    # is not in it; absent in files written before this field existed.
    cpu_ns: int | None = None
    # Samples the whole job trained in the step (the global batch), as the script set it with
    # tracer.set_samples_per_step() or --samples-per-step said; absent when neither did.
    samples: int | None = None


# ---- memory ------------------------------------------------------------------------------------
# What torch's memory profiler sorts tensors into (MemoryProfileRecord.categories), in this
# order; "other": its autograd details and the tensors it could not place.
MemoryCategory = Literal["parameter", "gradient", "optimizer_state", "activation", "temporary",
                         "input", "other"]
MEMORY_CATEGORIES: tuple[str, ...] = MemoryCategory.__args__  # type: ignore[attr-defined]
MEMORY_OTHER = "other"


class MemoryProfileRecord(msgspec.Struct, omit_defaults=True):
    """torch's memory profiler over one profiler window (--profile-memory; windows 1, 2, 4, 8,
    ...): the tensors alive on the rank's device at the window's peak, by category; one line of
    rank{R}.memory.jsonl."""

    rank: int
    t_ns: int  # when the window ended and this was computed
    device: str  # "cpu", or "cuda:N" once the script uses CUDA
    first_step: int  # the window's first and last traced steps (ProfilerStep#N)
    last_step: int
    peak_bytes: int  # every tensor the profiler saw alive at the peak, those from before it too
    categories: dict[str, int]  # MEMORY_CATEGORIES -> bytes at the peak; they sum to peak_bytes
    peak_step: int | None = None  # the traced step the peak fell in


class SnapshotBlock(msgspec.Struct, omit_defaults=True):
    """One block of a CUDA allocator segment, as torch.cuda.memory._snapshot() gives it."""

    address: int
    size: int  # bytes the allocator set aside (rounded up)
    requested_size: int  # bytes the caller asked for
    # "active_allocated" (a live tensor), "active_pending_free" (freed, its stream's work not
    # yet done) or "inactive" (free, cached by the allocator)
    state: str
    # The Python frames of its allocation, innermost first as torch gives them (unlike a
    # ThreadStack's), at most SNAPSHOT_MAX_FRAMES; empty unless allocation history was on
    # (--memory-snapshot)
    frames: list[StackFrame] = []


SNAPSHOT_MAX_FRAMES = 32
SNAPSHOT_BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


class SnapshotSegment(msgspec.Struct, omit_defaults=True):
    """One segment the CUDA allocator reserved from the device (cudaMalloc or an expandable
    mapping), with its blocks."""

    device: int
    address: int
    total_size: int  # bytes reserved
    allocated_size: int  # bytes in active_allocated blocks
    active_size: int  # bytes in active blocks (allocated or pending free)
    requested_size: int
    stream: int
    segment_type: str  # "large" or "small" (the pool of blocks of 1 MB and less)
    blocks: list[SnapshotBlock] = []
    is_expandable: bool = False


class OutOfMemory(msgspec.Struct, omit_defaults=True):
    """The allocation that failed, as the allocator's out-of-memory observer tells it."""

    device: int
    requested_bytes: int
    device_allocated_bytes: int  # what the allocator had allocated on the device then
    device_free_bytes: int  # what the device said was free


class MemorySnapshotRecord(msgspec.Struct, omit_defaults=True):
    """A CUDA allocator snapshot that the analysis reads without unpickling; the only line of
    rank{R}.step{S}.memory_snapshot.jsonl, beside the pickle of the same snapshot."""

    rank: int
    step: int  # steps completed when it was taken (as in the file name)
    t_ns: int  # when it was taken
    reason: str  # "oom" (the first out-of-memory error) or "end" (--memory-snapshot)
    segments: list[SnapshotSegment]
    device_total_bytes: int | None = None  # the capacity of the rank's device
    oom: OutOfMemory | None = None  # reason "oom", when the allocator's observer saw it
    frames_dropped: int = 0  # frames left out: C++ frames, and past SNAPSHOT_MAX_FRAMES


SNAPSHOT_REASONS = ("oom", "end")


DDP_BUCKETS_FROM_HOOK = "comm hook"
DDP_BUCKETS_FROM_PROFILER = "profiler windows"


class RunStart(msgspec.Struct, tag="run_start", tag_field="kind", omit_defaults=True):
    schema_version: int
    run_name: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    start_ns: int
    argv: list[str]  # the command line as the user typed it, tracer options included
    script: str
    script_args: list[str]
    torch_version: str
    config: dict  # the tracer's resolved options
    attempt: int = 0  # TORCHELASTIC_RESTART_COUNT
    cuda_version: str | None = None
    nccl_version: str | None = None
    device_name: str | None = None
    sampler_source: str | None = None  # "nvml" or "psutil"
    sampler_reason: str | None = None  # why psutil was used instead of NVML
    # Where DDP's gradient buckets are seen: DDP_BUCKETS_FROM_HOOK (every bucket in the comms
    # records, --ddp-bucket-hook) or DDP_BUCKETS_FROM_PROFILER (in the Kineto traces' windows
    # only); absent when collectives are not recorded, and in files written before it existed.
    ddp_buckets: str | None = None
    # The peak TFLOP/s MFU is judged against (docs/mfu.md), and where it comes from: "option"
    # (--peak-tflops) or "measured" (a short fp32 matmul on CPU before the script started);
    # absent on GPUs without --peak-tflops (the analysis takes the datasheet's for device_name).
    peak_tflops: float | None = None
    peak_source: str | None = None
    # How the script started this rank itself (one of LAUNCHERS), which then recorded the
    # launch in LAUNCHER_FILE; absent under torchrun and in a process the user started.
    launched_by: str | None = None
    # The CPUs the rank's process may run on (its affinity mask, else the host's count): with
    # the ranks on its host, whether they compete for cores; absent in files written before.
    cpus: int | None = None
    # The ids of those CPUs (the affinity mask, sorted; absent where the OS keeps none): ranks
    # of one host whose masks differ share only the CPUs their masks have in common.
    cpu_ids: list[int] | None = None
    # Where the rank's model computes: "cuda" (the tracer saw a CUDA device) or "cpu"; absent
    # in files written before this field existed.
    device_type: str | None = None


class ClockSync(msgspec.Struct, tag="clock_sync", tag_field="kind", omit_defaults=True):
    """This rank's host clock minus rank 0's: subtract offset_ns to put our times on rank 0's
    clock."""

    rank: int
    offset_ns: int
    uncertainty_ns: int  # half the best round trip
    round_trips: int
    backend: str | None = None
    world_size: int | None = None


class TracerError(msgspec.Struct, tag="error", tag_field="kind", omit_defaults=True):
    """A part of the tracer that failed and switched itself off; training went on."""

    rank: int
    t_ns: int
    part: str  # "profiler", "sampler", "comms", "memory", "scalars", "manifest", ...
    message: str


# The counts every run_end carries, 0 when the part that counts them was off (as defaults,
# omit_defaults would leave them out).
RUN_END_COUNTS = {"windows": 0, "samples": 0, "comm_ops": 0}


class RunEnd(msgspec.Struct, tag="run_end", tag_field="kind", omit_defaults=True):
    rank: int
    end_ns: int
    status: str  # "ok", "failed" or "interrupted"
    exit_code: int
    steps: int
    windows: int
    samples: int
    comm_ops: int
    bytes_written: int
    errors: int
    backend: str | None = None
    world_size: int | None = None
    exception: str | None = None  # "TypeName: message" of the script's exception
    # Share of the asked device samples that were not taken, after the sampler's first second,
    # when it is at least SAMPLER_LAG_MIN_MISSED_PCT (sustained lag); absent otherwise.
    samples_missed_pct: float | None = None
    # Processes the script started with torch.multiprocessing.spawn / start_processes that
    # could not be traced as ranks (this process is one rank of several, or had traced training
    # of its own first; docs/tracer.md, Ranks the script starts itself).
    untraced_processes: int = 0
    # Steps completed when --max-record-mb was reached: step, comm and sample records and
    # scalars stop there (Kineto traces and the manifest go on); absent when never reached.
    record_cap_step: int | None = None
    # Ops torch's Flight Recorder ring overwrote before the tracer read it (record_id gaps):
    # native ops missing from the comms records; absent when none were lost.
    native_ops_lost: int = 0


class RankChange(msgspec.Struct, omit_defaults=True):
    """One rank's own view of a slowdown (docs/tracer.md, Capturing slow steps: the trigger):
    when its step times changed, and by how much, judged against its own steps before."""

    rank: int
    step: int  # the first step of the change (its first slow step)
    confirmed_step: int  # the step at which it had lasted long enough to be a change
    factor: float  # the median step time of the change / the median before it
    before_ms: float  # the median step time before the change (its running median)
    after_ms: float  # the median step time of the change's steps, up to confirmed_step
    # The median time from a step's start to its first collective or p2p op (torch's Flight
    # Recorder's creation time), over the steps before the change and the change's steps:
    # time the rank spent on its own before it could wait for a peer. Absent without the
    # Flight Recorder's times, or steps without a collective.
    sync_before_ms: float | None = None
    sync_after_ms: float | None = None

    @property
    def slowed_itself(self) -> bool | None:
        """Whether at least half the change came before the rank's first collective (it slowed
        on its own, not waiting for a peer); None without the times to tell."""
        if self.sync_before_ms is None or self.sync_after_ms is None:
            return None
        return self.sync_after_ms - self.sync_before_ms >= (self.after_ms - self.before_ms) / 2


class CaptureRecord(msgspec.Struct, tag="capture", tag_field="kind", omit_defaults=True):
    """A profiler window opened off the fixed schedule, at the same steps on every rank: when a
    rank's step times changed to slower ones and stayed so (slow_step), or on request
    (python -m tracer.capture)."""

    rank: int  # the rank that wrote this record
    t_ns: int  # when this rank learnt of the window
    trigger: str  # one of CAPTURE_TRIGGERS
    # slow_step: the step the change began on trigger_rank; on_demand: the newest step recorded
    # when it was asked
    trigger_step: int
    first_step: int  # the window's first traced step (its ProfilerStep#N)
    steps: int  # steps planned from first_step on
    # slow_step: the rank whose change began first (then the largest factor, then the lowest
    # rank); None for on_demand
    trigger_rank: int | None = None
    # slow_step: trigger_step's time / trigger_rank's running median before it; None on demand
    ratio: float | None = None
    # This rank learnt of the window after it had passed first_step's warm-up: no trace here.
    missed: bool = False
    # slow_step: the change on trigger_rank (RankChange's fields): its factor, the median step
    # time before it and of it, the step at which it was confirmed
    factor: float | None = None
    before_ms: float | None = None
    after_ms: float | None = None
    confirmed_step: int | None = None
    # slow_step: every rank that saw the same slowdown in its own step times, by the step its
    # change began (a rank that waits for a slow one slows at the same step or the next)
    ranks: list[RankChange] = []
    # slow_step, from `ranks`' RankChange.slowed_itself: the rank whose change came before its
    # first collective (the earliest, then the largest such growth), and the ranks whose change
    # came after it (they wait for a peer); None / [] where the times cannot tell
    late_rank: int | None = None
    waiting_ranks: list[int] = []
    # on_demand: the steps asked, when more than --max-window-steps (steps is then the bound)
    asked_steps: int | None = None
    # The window was closed early on this rank (CAPTURE_CUTS): its trace holds the steps before
    # cut_step only
    cut: str | None = None
    cut_step: int | None = None


CAPTURE_TRIGGERS = ("slow_step", "on_demand")
# Why a window was closed before its last step (--max-window-s, --max-window-mb); the trace
# carries the same reason in its metadata (WINDOW_CUT_METADATA).
CAPTURE_CUTS = ("time", "memory")
WINDOW_CUT_METADATA = "ranktrace_window_cut"


class CaptureRequest(msgspec.Struct, omit_defaults=True):
    """A window asked of every rank, one line of capture.request{N}.jsonl (or one value in
    torchrun's store): the fields CaptureRecord repeats. A rank ignores a request whose `run`
    is not its run folder's name."""

    trigger: str
    trigger_step: int
    first_step: int
    steps: int
    t_ns: int  # when it was asked
    trigger_rank: int | None = None
    ratio: float | None = None
    ask: int | None = None  # on_demand: the number of the CaptureAsk it answers
    run: str = ""  # the run folder's name (run_start.run_name)
    change: RankChange | None = None  # slow_step: the change the requesting rank saw
    asked_steps: int | None = None  # on_demand: the steps asked, when clipped


class CaptureAsk(msgspec.Struct, omit_defaults=True):
    """python -m tracer.capture's request, one line of capture.ask{N}.jsonl: a live rank turns
    it into a CaptureRequest from its own step (docs/tracer.md, Capturing slow steps)."""

    steps: int  # steps to trace; 0: the run's --active
    t_ns: int
    run: str = ""  # the run folder's name; an ask naming another run is ignored ("": any)


class TracerProblem(msgspec.Struct, tag="problem", tag_field="kind", omit_defaults=True):
    """Something the tracer was asked for and did not do as asked, or cut short: an ask or a
    request out of range (clipped or ignored), a window closed at its bound. The part goes on
    (unlike `error`); the same text was printed once on stderr as `ranktrace: ...`."""

    rank: int
    t_ns: int
    part: str  # "capture", "profiler"
    message: str


# The device sampler's lag counts as sustained when, judged after its first
# SAMPLER_LAG_GRACE_S seconds (start-up, when imports and process start compete for the CPU)
# and over at least SAMPLER_LAG_MIN_ASKED asked samples, at least this share of them was missed.
SAMPLER_LAG_GRACE_S = 1.0
SAMPLER_LAG_MIN_ASKED = 20
SAMPLER_LAG_MIN_MISSED_PCT = 20.0

ManifestRecord = RunStart | ClockSync | TracerError | RunEnd | CaptureRecord | TracerProblem

# How a script starts its ranks itself (Launch.launcher, RunStart.launched_by).
LAUNCHERS = ("torch.multiprocessing", "torch.distributed.launcher", "multiprocessing.Process")


class Launch(msgspec.Struct, tag="launch", tag_field="kind", omit_defaults=True):
    """The script started processes that are traced as ranks, in this run folder: one record
    per torch.multiprocessing.spawn / start_processes or elastic_launch call, and one per
    multiprocessing.Process started (whose process is a rank once it joins a process group)."""

    schema_version: int
    run_name: str
    host: str
    pid: int  # the launching process's
    t_ns: int
    argv: list[str]
    script: str
    script_args: list[str]
    config: dict  # the tracer's resolved options, which the ranks run with
    launcher: str  # one of LAUNCHERS
    processes: int  # processes started by this call
    start_method: str  # multiprocessing's: "spawn", "fork" or "forkserver"
    attempt: int = 0  # elastic_launch: the restart (TORCHELASTIC_RESTART_COUNT) it starts


class LaunchEnd(msgspec.Struct, tag="launch_end", tag_field="kind", omit_defaults=True):
    """How the launching process's script ended (its ranks' own ends are in their manifests)."""

    end_ns: int
    status: str  # one of RUN_STATUSES
    exit_code: int
    exception: str | None = None  # "TypeName: message" of the script's uncaught exception


LauncherRecord = Launch | LaunchEnd
RUN_STATUSES = ("ok", "failed", "interrupted")
# A manifest with a run_start but no run_end: the rank died before it could say (killed,
# OOM-killed).
STATUS_NO_END = "crashed"

_decoders: dict = {}


def decoder(record_type):
    """A cached msgspec JSON decoder for one record type (or ManifestRecord)."""
    dec = _decoders.get(record_type)
    if dec is None:
        dec = _decoders[record_type] = msgspec.json.Decoder(record_type)
    return dec


ENCODER = msgspec.json.Encoder()
