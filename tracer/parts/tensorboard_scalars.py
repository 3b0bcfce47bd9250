"""Per-step and per-sample scalars for TensorBoard's Scalars tab, written into the run folder.

The event file lies directly in `traces/<run>/`, next to the Kineto traces, so TensorBoard shows
our scalars and torch-tb-profiler's views under the same run name. Every rank writes its own
file there; tags start with `rank{R}/` so the ranks' series never mix. `docs/viewing.md` lists
the tags and their units.

This writes TensorBoard's event format itself (TFRecord framing of `Event` protos, which is all
`SummaryWriter` does underneath) because it runs for every step: one `Event` carrying all of a
step's values, where `SummaryWriter.add_scalar` costs about 30 us per value, over 200 us a step,
plus a writer thread. The frames' CRC-32C is google-crc32c's C code: tensorboard's own is pure
Python, about 40 us an event on the step-end worker (docs/benchmarks.md), and is used only where
google-crc32c is missing. Records are buffered and
written at least every `flush_s` seconds, so a crash loses about that much. A failure to write
switches the writer off with one line on stderr and a note in `error`; training goes on.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time

from tensorboard.compat.proto import event_pb2, summary_pb2

try:
    from google_crc32c import value as _crc32c
except ImportError:  # a dependency, but the scalars go on without it, 40 us an event slower
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as _crc32c

from tracer.parts.buffered_file import BufferedFile
from tracer.schema import DeviceSample, StepRecord

MIB = 1024 * 1024  # memory sizes are shown in MiB, as torch.cuda and nvidia-smi show them
MB = 1e6  # transfer volumes and rates are decimal, like GB/s in the schema
# Sets of tags whose Event is kept for reuse: a step's and a sample's, each with or without its
# optional values; more only from a stream of samples whose fields come and go.
MAX_KEPT_EVENTS = 32

# DeviceSample fields that describe the sampled accelerator, with their tag names and scales.
_GPU_FIELDS = (
    ("sm_util_pct", "sm_util_pct", 1.0),
    ("mem_util_pct", "mem_util_pct", 1.0),
    ("mem_used_bytes", "mem_used_mib", 1.0 / MIB),
    ("power_w", "power_w", 1.0),
    ("sm_clock_mhz", "sm_clock_mhz", 1.0),
    ("temp_c", "temp_c", 1.0),
    ("pcie_tx_bytes_s", "pcie_tx_mb_per_s", 1.0 / MB),
    ("pcie_rx_bytes_s", "pcie_rx_mb_per_s", 1.0 / MB),
    ("nvlink_tx_bytes_s", "nvlink_tx_mb_per_s", 1.0 / MB),
    ("nvlink_rx_bytes_s", "nvlink_rx_mb_per_s", 1.0 / MB),
)
# Fields that describe the rank's process and its host, whatever the sample's source.
_HOST_FIELDS = (
    ("cpu_process_pct", "cpu_process_pct", 1.0),
    ("cpu_system_pct", "cpu_system_pct", 1.0),
    ("rss_bytes", "rss_mib", 1.0 / MIB),
    ("net_sent_bytes_s", "net_sent_mb_per_s", 1.0 / MB),
    ("net_recv_bytes_s", "net_recv_mb_per_s", 1.0 / MB),
)

# Two writers of one rank opened in the same second by one process (tests, restarts in-process)
# still get distinct files.
_writer_ids = itertools.count()


def event_file_name(rank: int) -> str:
    """`events.out.tfevents.<time>.<host>.<pid>.<n>.rank<R>`: "tfevents" is what TensorBoard
    looks for, and the name ends in `.rank<R>`, never `.json` or `.gz`, which HTA would load."""
    host = socket.gethostname().replace(os.sep, "_") or "host"
    return (f"events.out.tfevents.{int(time.time()):010d}.{host}.{os.getpid()}."
            f"{next(_writer_ids)}.rank{rank}")


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data` (the same value as tensorboard's pure-Python one)."""
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _frame(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC-32C, the payload, the payload's masked CRC-32C."""
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


def open_scalars(setup):
    """The registry's factory of the scalars writer (a tracer.session.part_registry.PartSetup)."""
    return setup.build(ScalarsWriter, setup.run_dir, setup.rank, budget=setup.budget)


class ScalarsWriter(BufferedFile):
    name = "scalars"
    off_what = "TensorBoard scalars are off"

    def __init__(self, run_dir: str, rank: int, flush_s: float = 1.0, budget=None):
        """`budget`: a tracer.parts.buffered_file.RecordBudget shared with the record files
        (--max-record-mb)."""
        super().__init__(flush_s, budget)
        self.rank = rank
        self.path = run_dir  # the file's path once it is named
        self.events = 0
        self._prefix = f"rank{rank}/"
        self._gpu_tags: dict = {}  # device index -> [(field, tag, scale)]
        self._host_tags = [(field, f"{self._prefix}host/{name}", scale)
                           for field, name, scale in _HOST_FIELDS]
        # TensorBoard's data server keeps one point per step of a series (a new point preempts
        # those at the same or a later step), and several samples fall within one training
        # step: device samples are numbered on their own.
        self._sample_index = 0
        self._events: dict[tuple[str, ...], event_pb2.Event] = {}  # see _event_of
        self._event_lock = threading.Lock()
        try:
            os.makedirs(run_dir, exist_ok=True)
            self.open_file(os.path.join(run_dir, event_file_name(rank)), "xb")
            self.append(_frame(event_pb2.Event(
                wall_time=time.time(), file_version="brain.Event:2").SerializeToString()), None)
            self.flush()
        except Exception as exc:  # never let the tracer's scalars stop the training
            self._fail(exc)

    def on_step_record(self, record: StepRecord, notes: dict) -> None:
        self.add_step(record, notes.get("comm_algbw_gbps"))

    def on_sample(self, sample: DeviceSample, step: int) -> None:
        self.add_sample(sample, step)

    def add_step(self, record: StepRecord, comm_algbw_gbps: float | None) -> None:
        """Step time (ms), peak memory and RSS (MiB), comm ops, volume (MB) and algbw (GB/s)."""
        if self._file is None:
            return
        try:
            p = self._prefix
            values = [(p + "step/time_ms", (record.end_ns - record.start_ns) / 1e6),
                      (p + "comm/ops", record.comm_ops),
                      (p + "comm/volume_mb", record.comm_bytes / MB)]
            if comm_algbw_gbps is not None:
                values.append((p + "comm/algbw_gbps", comm_algbw_gbps))
            if record.cuda_peak_allocated_bytes is not None:
                values.append((p + "memory/cuda_peak_allocated_mib",
                               record.cuda_peak_allocated_bytes / MIB))
            if record.cuda_peak_reserved_bytes is not None:
                values.append((p + "memory/cuda_peak_reserved_mib",
                               record.cuda_peak_reserved_bytes / MIB))
            if record.rss_bytes is not None:
                values.append((p + "memory/rss_mib", record.rss_bytes / MIB))
            self._write(record.step, record.end_ns, values, record.step)
        except Exception as exc:
            self._fail(exc)

    def add_sample(self, sample: DeviceSample, step: int) -> None:
        """One device sample; also records the training `step` it fell in (samples/train_step).

        Its TensorBoard step is the sample's number on this rank, not `step`: use the Relative
        or Wall axis to line samples up with the per-step scalars."""
        if self._file is None:
            return
        try:
            values = [(f"{self._prefix}samples/train_step", step)]
            gpu_tags = self._gpu_tags.get(sample.device)
            if gpu_tags is None:
                group = "gpu" if sample.device is None else f"gpu{sample.device}"
                gpu_tags = self._gpu_tags[sample.device] = [
                    (field, f"{self._prefix}{group}/{name}", scale)
                    for field, name, scale in _GPU_FIELDS]
            for tags in (gpu_tags, self._host_tags):
                for field, tag, scale in tags:
                    value = getattr(sample, field)
                    if value is not None:
                        values.append((tag, value * scale))
            with self._lock:
                index = self._sample_index
                self._sample_index += 1
            self._write(index, sample.t_ns, values, step)
        except Exception as exc:
            self._fail(exc)

    def _write(self, step: int, t_ns: int, values: list, train_step: int) -> None:
        """One event at TensorBoard step `step`; `train_step` (the training step) is for the
        budget."""
        tags = tuple(tag for tag, _ in values)
        with self._event_lock:
            event = self._event_of(tags)
            event.wall_time = t_ns / 1e9
            event.step = step
            for value, (_, number) in zip(event.summary.value, values):
                value.simple_value = number
            data = _frame(event.SerializeToString())
        if self.append(data, train_step):
            self.events += 1

    def _event_of(self, tags: tuple[str, ...]):
        """The Event whose summary holds `tags`, in that order, kept for the next event with
        the same tags: filling it in costs a third of building one (protobuf objects)."""
        event = self._events.get(tags)
        if event is None:
            if len(self._events) >= MAX_KEPT_EVENTS:
                self._events.clear()
            event = self._events[tags] = event_pb2.Event(summary=summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=tag) for tag in tags]))
        return event
