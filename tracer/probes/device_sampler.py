"""Samples the GPU this rank uses (NVML) or, without one, the process and host (psutil).

A daemon thread takes one DeviceSample every 1/hz seconds and writes it to a JsonlWriter,
which flushes at least once a second, so a crash loses at most the last second of samples.

NVML: the rank's CUDA device index is mapped to an NVML handle through the device's UUID
when CUDA is already initialised in this process (torch knows the UUID; nothing is
initialised on our behalf), otherwise through CUDA_VISIBLE_DEVICES (integer indices, or
GPU-/MIG- UUIDs and their unique prefixes). Each sample reads SM and memory utilisation,
memory used/total, power, SM clock, temperature, and, in one nvmlDeviceGetFieldValues call,
the PCIe and NVLink byte counters (NVLink per active link, summed), turned into bytes/s
between samples. Where the PCIe counters are missing, nvmlDeviceGetPcieThroughput (a 20 ms
measurement inside the driver) is used at most once a second. A query that fails the first
time it is tried (unsupported on this GPU, no permission) is left out of every later sample
without a word; one that worked and then fails means the device or driver is in trouble: the
sampler writes one line to stderr, sets `error` and stops sampling.

psutil (no pynvml, no NVML library, no GPU, or a device_index of None): process CPU % (100 =
one core), system CPU % (100 = every core busy), RSS, and network bytes/s sent and received,
psutil's figures, read on Linux through /proc files kept open (tracer.probes.procfs). `reason` says
why NVML was not used.

Falling behind (a sample that takes longer than the period, or a thread that wakes up more
than a period late) is noted, the first time, in `behind`, and never printed: on a busy machine a
late wake-up or two at start-up is normal. Lag that lasts is what matters: `missed_pct` is the
share of the asked samples that were not taken after the first second, when it is sustained
(see `sustained_lag_pct`); the tracer reports it once, in its summary line.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from tracer import schema
from tracer.parts.part import Part
from tracer.parts.record_files import SamplesWriter
from tracer.probes import procfs

_UNSUPPORTED_CODES = {3, 4, 13}  # NVML_ERROR_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND
_NVLINK_MAX_LINKS = 18
_PCIE_THROUGHPUT_MIN_INTERVAL_S = 1.0  # the driver measures for 20 ms per call and direction


class _Probe:
    """One query. `state`: "new" until it has run once, then "ok" or "off"."""

    __slots__ = ("name", "read", "state")

    def __init__(self, name, read):
        self.name, self.read, self.state = name, read, "new"


def _normalized_uuid(text) -> str:
    if isinstance(text, bytes):
        text = text.decode()
    text = str(text).strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def nvml_handle_for_cuda_device(nvml, device_index: int, environ=None,
                                 cuda_uuid: str | None = None):
    """The NVML handle of CUDA device `device_index` as this process numbers it."""
    if cuda_uuid:
        return _handle_by_uuid_prefix(nvml, _normalized_uuid(cuda_uuid))
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(device_index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if device_index >= len(entries):
        raise ValueError(f"CUDA device {device_index} is not among "
                         f"CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[device_index]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    if entry.upper().startswith("MIG-"):
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return _handle_by_uuid_prefix(nvml, _normalized_uuid(entry))


def _handle_by_uuid_prefix(nvml, wanted: str):
    matches = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if _normalized_uuid(nvml.nvmlDeviceGetUUID(handle)).startswith(wanted):
            matches.append(handle)
    if len(matches) != 1:
        raise ValueError(f"{len(matches)} NVML devices match UUID {wanted!r}")
    return matches[0]


def _cuda_uuid_if_initialized(device_index: int) -> str | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return str(torch.cuda.get_device_properties(device_index).uuid)
    except Exception:
        pass
    return None


def _opened(reader_type):
    """A tracer.probes.procfs reader, or None where its /proc file cannot be read as expected."""
    try:
        return reader_type()
    except (OSError, ValueError):
        return None


def sustained_lag_pct(asked: float, taken: int) -> float | None:
    """Percent of `asked` samples that were not taken, when that is sustained lag: at least
    schema.SAMPLER_LAG_MIN_ASKED asked and schema.SAMPLER_LAG_MIN_MISSED_PCT missed; else None."""
    if asked < schema.SAMPLER_LAG_MIN_ASKED:
        return None
    missed = max(0.0, round(100.0 * (1.0 - taken / asked), 1))
    return missed if missed >= schema.SAMPLER_LAG_MIN_MISSED_PCT else None


def open_sampler(setup):
    """The registry's factory of the samples file and the sampler that writes it (a
    tracer.session.part_registry.PartSetup)."""
    writer = setup.open_writer(schema.SAMPLES_FILE, SamplesWriter, setup.current_step)
    if writer is None:
        return None
    import torch

    device = (setup.launch.local_rank % torch.cuda.device_count()) if setup.use_cuda else None
    return setup.build(DeviceSampler, writer, setup.config.sample_hz, device)


class DeviceSampler(Part):
    name = "sampler"

    def __init__(self, writer, hz: float, device_index: int | None, *, nvml=None, environ=None):
        """`nvml` replaces the pynvml module (tests); `environ` replaces os.environ."""
        self.writer = writer
        self.hz = float(hz)
        self.device_index = device_index
        self.samples = 0
        self.behind: str | None = None  # how far it fell behind, the first time it did
        self.max_lag_s = 0.0  # worst lateness of a sample over the run
        self.judged_s = 0.0  # sampling time after the start-up grace, over which lag is judged
        self.judged_samples = 0  # samples taken in that time
        self.thread_cpu_s = 0.0  # CPU time the sampling thread used, for the cost benchmark
        self.reason: str | None = None
        self._latest = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None
        self._probes: list[_Probe] = []
        self._counters: dict[str, tuple[float, float]] = {}  # name -> (monotonic s, value)
        self._pcie_fallback_at = 0.0
        self._pcie_fallback_values = (None, None)
        self._nvml_device = None
        self._quiet_errors: tuple = (OSError,)  # what a query that never worked may raise
        self._readers: list = []  # the tracer.probes.procfs readers in use, closed with the sampler
        self.source = "psutil"
        if not self.hz > 0:
            self.period_s = float("inf")
            self.fail(f"sampling rate must be > 0 Hz, got {hz!r}; device sampling is off")
            self.reason = "sampling is off"
            return
        self.period_s = 1.0 / self.hz
        if device_index is None:
            self.reason = "no CUDA device"
        else:
            self._try_nvml(nvml, device_index, environ)
        if self.source == "psutil":
            self._setup_psutil()

    # ---- setup ----------------------------------------------------------------------------------
    def _try_nvml(self, nvml, device_index, environ) -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                self.reason = f"pynvml not importable ({exc})"
                return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self.reason = f"pynvml: {exc}"
            return
        try:
            handle = nvml_handle_for_cuda_device(nvml, device_index, environ,
                                                 _cuda_uuid_if_initialized(device_index))
            try:
                self._nvml_device = int(nvml.nvmlDeviceGetIndex(handle))
            except Exception:
                self._nvml_device = None  # MIG handles have no index of their own
        except Exception as exc:
            self.reason = f"pynvml: no NVML device for CUDA device {device_index} ({exc})"
            self._shutdown_nvml(nvml)
            return
        self._nvml, self._handle = nvml, handle
        self._quiet_errors = (nvml.NVMLError, OSError)
        self.source = "nvml"
        self._setup_nvml_probes()

    @staticmethod
    def _shutdown_nvml(nvml) -> None:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass

    def _setup_nvml_probes(self) -> None:
        nvml, handle = self._nvml, self._handle

        def utilization(sample):
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            sample.sm_util_pct = float(rates.gpu)
            sample.mem_util_pct = float(rates.memory)

        def memory(sample):
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            sample.mem_used_bytes = int(info.used)
            sample.mem_total_bytes = int(info.total)

        def power(sample):
            sample.power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0

        def sm_clock(sample):
            sample.sm_clock_mhz = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))

        def temperature(sample):
            sample.temp_c = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

        self._probes = [_Probe("utilization", utilization), _Probe("memory", memory),
                        _Probe("power", power),
                        _Probe("sm_clock", sm_clock), _Probe("temperature", temperature)]
        self._field_names, self._field_ids = self._counter_fields()
        if self._field_ids:
            self._probes.append(_Probe("pcie_nvlink_counters", self._read_counter_fields))
        if "pcie_tx" not in self._field_names:
            self._probes.append(_Probe("pcie_throughput", self._read_pcie_throughput))

    def _counter_fields(self):
        """(names, field ids) of the byte counters this device answers, asked once at setup."""
        nvml, handle = self._nvml, self._handle
        wanted = [("pcie_tx", (getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197), 0)),
                  ("pcie_rx", (getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198), 0))]
        tx = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138)
        rx = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)
        for link in self._active_nvlinks():
            wanted += [("nvlink_tx", (tx, link)), ("nvlink_rx", (rx, link))]
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, [field for _, field in wanted])
        except Exception:
            return [], []
        kept = [(name, field) for (name, field), value in zip(wanted, values)
                if value.nvmlReturn == 0]
        return [name for name, _ in kept], [field for _, field in kept]

    def _active_nvlinks(self) -> list[int]:
        nvml, handle = self._nvml, self._handle
        links = []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS)):
            try:
                enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
                if nvml.nvmlDeviceGetNvLinkState(handle, link) == enabled:
                    links.append(link)
            except Exception:
                break  # no NVLink, or no more links
        return links

    def _read_counter_fields(self, sample):
        values = self._nvml.nvmlDeviceGetFieldValues(self._handle, self._field_ids)
        now = time.monotonic()
        totals: dict[str, float] = {}
        for name, value in zip(self._field_names, values):
            if value.nvmlReturn != 0:
                raise RuntimeError(f"NVML field {value.fieldId} failed with code "
                                   f"{value.nvmlReturn}")
            number = float(_field_number(value))
            # NVLink throughput counters count KiB; the PCIe counters count bytes.
            if name.startswith("nvlink"):
                number *= 1024
            totals[name] = totals.get(name, 0.0) + number
        sample.pcie_tx_bytes_s = self._rate("pcie_tx", now, totals.get("pcie_tx"))
        sample.pcie_rx_bytes_s = self._rate("pcie_rx", now, totals.get("pcie_rx"))
        sample.nvlink_tx_bytes_s = self._rate("nvlink_tx", now, totals.get("nvlink_tx"))
        sample.nvlink_rx_bytes_s = self._rate("nvlink_rx", now, totals.get("nvlink_rx"))

    def _read_pcie_throughput(self, sample):
        now = time.monotonic()
        if now - self._pcie_fallback_at >= _PCIE_THROUGHPUT_MIN_INTERVAL_S:
            nvml = self._nvml
            throughput = nvml.nvmlDeviceGetPcieThroughput
            tx = throughput(self._handle, nvml.NVML_PCIE_UTIL_TX_BYTES) * 1024.0
            rx = throughput(self._handle, nvml.NVML_PCIE_UTIL_RX_BYTES) * 1024.0
            self._pcie_fallback_values = (tx, rx)
            self._pcie_fallback_at = now
        sample.pcie_tx_bytes_s, sample.pcie_rx_bytes_s = self._pcie_fallback_values

    def _rate(self, name, now, total):
        if total is None:
            return None
        previous = self._counters.get(name)
        self._counters[name] = (now, total)
        if previous is None or now <= previous[0] or total < previous[1]:
            return None  # first sample, or a counter that wrapped or was reset
        return (total - previous[1]) / (now - previous[0])

    def _setup_psutil(self) -> None:
        import psutil
        self._quiet_errors = (psutil.Error, OSError)
        process = psutil.Process()
        # The same figures as psutil's, from /proc files kept open (tracer.probes.procfs: a tenth of
        # the CPU per sample); psutil itself where /proc cannot be read (not Linux).
        system_cpu = _opened(procfs.SystemCpu)
        if system_cpu is None:
            psutil.cpu_percent(None)  # the first call only sets the reference point
        statm = _opened(procfs.StatmRss)
        net = _opened(procfs.NetBytes)
        self._readers = [r for r in (system_cpu, statm, net) if r is not None]
        last = [time.monotonic(), time.process_time()]

        def cpu(sample):
            # process_time is a clock read, much cheaper than parsing /proc/self/stat.
            now, used = time.monotonic(), time.process_time()
            elapsed = now - last[0]
            sample.cpu_process_pct = (used - last[1]) / elapsed * 100 if elapsed > 0 else 0.0
            last[0], last[1] = now, used
            sample.cpu_system_pct = (system_cpu.percent() if system_cpu is not None
                                     else psutil.cpu_percent(None))

        def rss(sample):
            sample.rss_bytes = statm.rss() if statm is not None else int(process.memory_info().rss)

        def network(sample):
            if net is not None:
                sent, received = net.read()
            else:
                counters = psutil.net_io_counters()
                sent, received = counters.bytes_sent, counters.bytes_recv
            now = time.monotonic()
            sample.net_sent_bytes_s = self._rate("net_sent", now, float(sent))
            sample.net_recv_bytes_s = self._rate("net_recv", now, float(received))

        self._probes = [_Probe("cpu", cpu), _Probe("rss", rss), _Probe("network", network)]

    # ---- running --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None or self.error is not None:
            return
        self._thread = threading.Thread(target=self._run, name="ranktrace-sampler", daemon=True)
        self._thread.start()

    def run_start_fields(self) -> dict:
        return {"sampler_source": self.source, "sampler_reason": self.reason}

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        self.close()

    def run_end_fields(self) -> dict:
        return {"samples": self.samples, "samples_missed_pct": self.missed_pct}

    def close(self) -> None:
        self.stop()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                # Stuck inside a driver call: leave the daemon thread and NVML alone.
                self.fail(f"the sampling thread did not stop within {timeout:g}s; left running")
                return
        if self._nvml is not None:
            self._shutdown_nvml(self._nvml)
            self._nvml = None
        readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()

    def latest(self):
        return self._latest

    def _run(self) -> None:
        cpu_start = time.thread_time()
        next_due = time.monotonic()
        judge_from = next_due + schema.SAMPLER_LAG_GRACE_S
        try:
            while not self._stop.is_set():
                woke = time.monotonic()
                self._check_lag("woke", woke - next_due)
                self._take_sample()
                if woke >= judge_from:
                    self.judged_samples += 1
                self.thread_cpu_s = time.thread_time() - cpu_start
                done = time.monotonic()
                self._check_lag("took", done - woke)
                next_due += self.period_s
                # Skip the samples already missed rather than rushing to catch up.
                if next_due < done:
                    next_due = done
                self._stop.wait(next_due - done)
        except Exception as exc:
            self._fail(f"sampling failed ({type(exc).__name__}: {exc})")
        finally:
            self.thread_cpu_s = time.thread_time() - cpu_start
            self.judged_s = max(0.0, time.monotonic() - judge_from)

    @property
    def missed_pct(self) -> float | None:
        """Share of the asked samples missed after the start-up grace, when the lag was
        sustained."""
        return sustained_lag_pct(self.judged_s * self.hz, self.judged_samples)

    def _check_lag(self, kind, seconds) -> None:
        if kind == "woke":
            self.max_lag_s = max(self.max_lag_s, seconds)
        if seconds <= self.period_s or self.behind is not None:
            return
        if kind == "took":
            self.behind = (
                f"a sample took {seconds * 1e3:.0f} ms, longer than the "
                f"{self.period_s * 1e3:.0f} ms period at {self.hz:g} Hz; samples are further "
                f"apart than asked"
            )
        else:
            self.behind = (
                f"the sampling thread woke {seconds * 1e3:.0f} ms late (period "
                f"{self.period_s * 1e3:.0f} ms at {self.hz:g} Hz); it was starved of CPU"
            )

    def _take_sample(self) -> None:
        sample = schema.DeviceSample(t_ns=time.time_ns(), source=self.source,
                                     device=self._nvml_device if self.source == "nvml" else None)
        for probe in self._probes:
            if probe.state == "off":
                continue
            try:
                probe.read(sample)
            except Exception as exc:
                if probe.state == "ok" or not isinstance(exc, self._quiet_errors):
                    raise RuntimeError(f"{probe.name} query failed: {exc}") from exc
                # Never worked here: unsupported on this device, left out quietly.
                probe.state = "off"
                continue
            probe.state = "ok"
        self._latest = sample
        self.samples += 1
        self.writer.write(sample)

    def _fail(self, message: str) -> None:
        self.fail(f"{message}; device sampling is off")


_FIELD_VALUE_MEMBERS = (
    "dVal",
    "uiVal",
    "ulVal",
    "ullVal",
    "sllVal",
    "siVal",
    "usVal",
)  # by NVML_VALUE_TYPE_*


def _field_number(value):
    kind = value.valueType
    member = _FIELD_VALUE_MEMBERS[kind] if 0 <= kind < len(_FIELD_VALUE_MEMBERS) else "ullVal"
    return getattr(value.value, member)
