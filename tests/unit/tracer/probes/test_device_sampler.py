"""Tests of tracer.probes.device_sampler: psutil samples, periodic flushing, the NVML path with
a fake pynvml."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from tracer import schema
from tracer.parts.record_files import JsonlWriter
from tracer.probes.device_sampler import (
    DeviceSampler,
    nvml_handle_for_cuda_device,
    sustained_lag_pct,
)

HANG_GUARD_S = 10.0  # only bounds how long a broken sampler can stall the suite


class ListWriter:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


def wait_until(condition, timeout=HANG_GUARD_S, interval=0.01):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def ranktrace_lines(capfd):
    return [line for line in capfd.readouterr().err.splitlines() if line.startswith("ranktrace")]


# ---- fake pynvml --------------------------------------------------------------------------------
class FakeNVMLError(Exception):
    MESSAGES = {2: "Invalid Argument", 3: "Not Supported", 12: "NVML Shared Library Not Found",
                15: "GPU is lost"}

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return self.MESSAGES.get(self.value, f"NVML error {self.value}")


class FakeNVML:
    """Two GPUs; counters grow by fixed amounts per field query."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18

    PCIE_TX_STEP = 3_000_000  # bytes per query
    PCIE_RX_STEP = 1_000_000
    NVLINK_TX_STEP_KIB = 500  # per link per query
    NVLINK_RX_STEP_KIB = 250

    def __init__(self, uuids=("GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-bbbc3333-0000"),
                 nvlinks=2, pcie_counters=True, unsupported=(), fail_after=None, block=None,
                 slow_s=0.0):
        self.uuids = list(uuids)
        self.nvlinks = nvlinks
        self.pcie_counters = pcie_counters
        self.unsupported = set(unsupported)  # query names that always answer Not Supported
        self.fail_after = fail_after  # utilization answers this many times, then the GPU is lost
        self.block = block  # an Event utilization waits on after its first answer
        self.slow_s = slow_s
        self.calls = {}
        self.field_queries = 0
        self.inits = 0
        self.shutdowns = 0

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.unsupported:
            raise FakeNVMLError(3)

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.uuids):
            raise FakeNVMLError(2)
        return ("gpu", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid.upper().startswith("MIG-"):
            return ("mig", uuid)
        return ("gpu", self.uuids.index(uuid))

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle[1]].encode()  # older pynvml returns bytes

    def nvmlDeviceGetIndex(self, handle):
        if handle[0] != "gpu":
            raise FakeNVMLError(3)
        return handle[1]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._count("utilization")
        n = self.calls["utilization"]
        if self.fail_after is not None and n > self.fail_after:
            raise FakeNVMLError(15)
        if self.block is not None and n > 1:
            self.block.wait()
        if self.slow_s:
            time.sleep(self.slow_s)
        return SimpleNamespace(gpu=70 + handle[1], memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._count("memory")
        return SimpleNamespace(used=5 * 2**30, total=80 * 2**30, free=75 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._count("power")
        return 312_500  # mW

    def nvmlDeviceGetClockInfo(self, handle, clock):
        self._count("clock")
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._count("temperature")
        return 61

    def nvmlDeviceGetNvLinkState(self, handle, link):
        self._count("nvlink_state")
        if self.nvlinks == 0:
            raise FakeNVMLError(3)
        if link >= self.nvlinks:
            raise FakeNVMLError(2)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetFieldValues(self, handle, fields):
        self.field_queries += 1
        n = self.field_queries
        steps = {197: self.PCIE_TX_STEP, 198: self.PCIE_RX_STEP,
                 138: self.NVLINK_TX_STEP_KIB, 139: self.NVLINK_RX_STEP_KIB}
        values = []
        for field_id, scope in fields:
            supported = self.pcie_counters if field_id in (197, 198) else scope < self.nvlinks
            values.append(SimpleNamespace(
                fieldId=field_id, scopeId=scope, nvmlReturn=0 if supported else 3, valueType=3,
                value=SimpleNamespace(ullVal=steps[field_id] * n)))
        return values

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        self._count("pcie_throughput")
        return 4000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 2000  # KiB/s


def run_sampler(sampler, min_samples=3):
    sampler.start()
    assert wait_until(lambda: sampler.samples >= min_samples or sampler.error is not None)
    sampler.stop()


# ---- psutil -------------------------------------------------------------------------------------
def test_psutil_samples_have_real_values():
    writer = ListWriter()
    sampler = DeviceSampler(writer, 20, None)
    assert (sampler.source, sampler.reason) == ("psutil", "no CUDA device")
    run_sampler(sampler, min_samples=4)
    records = writer.records
    assert sampler.samples == len(records) >= 4 and sampler.error is None
    assert sampler.latest() is records[-1]
    own_rss = psutil.Process().memory_info().rss
    for record in records:
        assert record.source == "psutil" and record.device is None and record.sm_util_pct is None
        assert own_rss / 2 < record.rss_bytes < own_rss * 2
        assert record.cpu_process_pct >= 0 and 0 <= record.cpu_system_pct <= 100
    assert records[0].net_sent_bytes_s is None  # a rate needs two readings
    assert all(r.net_sent_bytes_s >= 0 and r.net_recv_bytes_s >= 0 for r in records[1:])
    assert [r.t_ns for r in records] == sorted(r.t_ns for r in records)


def test_sample_count_follows_the_rate():
    writer = ListWriter()
    sampler = DeviceSampler(writer, 20, None)
    sampler.start()
    time.sleep(1.0)
    sampler.stop()
    # 20 Hz for a second is about 20 samples; the bounds only catch a sampler that ignores hz.
    assert 5 <= sampler.samples <= 60


def test_missing_nvml_library_gives_reason():
    sampler = DeviceSampler(ListWriter(), 10, 0)
    if sampler.source == "nvml":
        sampler.stop()
        pytest.skip("this machine has a working NVML")
    assert sampler.reason.startswith("pynvml: ")


def test_samples_reach_disk_while_sampling(tmp_path):
    path = str(tmp_path / "rank0.samples.jsonl")
    writer = JsonlWriter(path, "sampler")
    sampler = DeviceSampler(writer, 20, None)
    sampler.start()
    tmp_file = path + schema.TEMP_SUFFIX
    decoder = schema.decoder(schema.DeviceSample)

    def lines_on_disk():
        with open(tmp_file, "rb") as f:
            return [decoder.decode(line) for line in f if line.strip()]

    try:
        assert wait_until(lambda: len(lines_on_disk()) > 0), "nothing flushed while running"
        first = len(lines_on_disk())
        assert wait_until(lambda: len(lines_on_disk()) > first), "flushed only once"
        assert all(r.rss_bytes > 0 for r in lines_on_disk())
        assert not os.path.exists(path)  # still the temporary file: the run is not over
    finally:
        sampler.stop()
        writer.close()
    with open(path, "rb") as f:
        assert sum(1 for line in f if line.strip()) == sampler.samples


def test_zero_rate_is_an_error_not_a_crash(capfd):
    sampler = DeviceSampler(ListWriter(), 0, None)
    sampler.start()
    sampler.stop()
    assert sampler.samples == 0 and "must be > 0" in sampler.error
    assert len(ranktrace_lines(capfd)) == 1


# ---- NVML with a fake pynvml --------------------------------------------------------------------
def test_nvml_sample_reads_every_metric(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNVML()
    writer = ListWriter()
    sampler = DeviceSampler(writer, 50, 1, nvml=nvml, environ={})
    assert (sampler.source, sampler.reason) == ("nvml", None)
    run_sampler(sampler)
    first, second = writer.records[:2]
    assert (first.source, first.device) == ("nvml", 1)
    assert (first.sm_util_pct, first.mem_util_pct) == (71.0, 30.0)
    assert (first.mem_used_bytes, first.mem_total_bytes) == (5 * 2**30, 80 * 2**30)
    assert (first.power_w, first.sm_clock_mhz, first.temp_c) == (312.5, 1980.0, 61.0)
    # rates need two readings
    assert first.pcie_tx_bytes_s is None and first.nvlink_tx_bytes_s is None
    assert second.pcie_tx_bytes_s > 0 and second.nvlink_rx_bytes_s > 0
    # One field query per sample, so every counter moved over the same interval.
    assert second.pcie_tx_bytes_s / second.pcie_rx_bytes_s == pytest.approx(3.0)
    links = 2
    assert second.nvlink_tx_bytes_s / second.pcie_tx_bytes_s == pytest.approx(
        links * FakeNVML.NVLINK_TX_STEP_KIB * 1024 / FakeNVML.PCIE_TX_STEP)
    assert "pcie_throughput" not in nvml.calls  # the counters made the slow query unnecessary
    assert nvml.shutdowns == 1 and sampler.error is None


def test_nvml_without_nvlink_or_pcie_counters_skips_them_quietly(capfd):
    nvml = FakeNVML(nvlinks=0, pcie_counters=False, unsupported={"power"})
    writer = ListWriter()
    sampler = DeviceSampler(writer, 50, 0, nvml=nvml, environ={})
    run_sampler(sampler, min_samples=4)
    assert sampler.error is None and ranktrace_lines(capfd) == []
    assert all(r.nvlink_tx_bytes_s is None and r.nvlink_rx_bytes_s is None for r in writer.records)
    assert all(r.power_w is None for r in writer.records)
    assert all(r.sm_util_pct == 70.0 for r in writer.records)
    # PCIe from the 20 ms driver measurement instead, at most once a second.
    assert writer.records[0].pcie_tx_bytes_s == 4000 * 1024.0
    assert nvml.calls["pcie_throughput"] == 2  # TX and RX, once
    assert nvml.calls["power"] == 1  # an unsupported query is not retried every sample
    assert nvml.field_queries <= 1  # asked once at setup, never answered: not asked again


def test_nvml_error_mid_run_writes_one_line_and_stops(capfd, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    nvml = FakeNVML(fail_after=3)
    writer = ListWriter()
    sampler = DeviceSampler(writer, 100, 0, nvml=nvml, environ={})
    sampler.start()
    assert wait_until(lambda: sampler.error is not None)
    samples = sampler.samples
    time.sleep(0.1)
    sampler.stop()
    assert samples == 3 and sampler.samples == 3 and len(writer.records) == 3
    assert "GPU is lost" in sampler.error
    assert ranktrace_lines(capfd) == [f"ranktrace: sampler: {sampler.error}"]
    assert nvml.shutdowns == 1


def test_stop_returns_even_when_a_query_hangs(capfd):
    release = threading.Event()
    nvml = FakeNVML(block=release)
    sampler = DeviceSampler(ListWriter(), 50, 0, nvml=nvml, environ={})
    sampler.start()
    assert wait_until(lambda: nvml.calls.get("utilization", 0) >= 2)
    try:
        sampler.stop(timeout=0.2)
        assert "did not stop" in sampler.error
        assert nvml.shutdowns == 0  # never pull NVML away from a thread that is inside it
        assert len(ranktrace_lines(capfd)) == 1
    finally:
        release.set()
        sampler._thread.join(HANG_GUARD_S)  # let it finish here, not inside the next test
        capfd.readouterr()


def test_sustained_lag_is_measured_quietly_and_start_up_lag_is_not_reported(capfd, monkeypatch):
    # Each sample takes 80 ms against a 50 ms period: at most 62.5% of the asked samples can be
    # taken, whatever the machine's load.
    monkeypatch.setattr(schema, "SAMPLER_LAG_GRACE_S", 0.0)
    nvml = FakeNVML(slow_s=0.08)
    sampler = DeviceSampler(ListWriter(), 20, 0, nvml=nvml, environ={})
    run_sampler(sampler, min_samples=schema.SAMPLER_LAG_MIN_ASKED)
    assert "longer than the 50 ms period" in sampler.behind
    assert sampler.judged_samples == sampler.samples
    assert sampler.missed_pct is not None and sampler.missed_pct >= 30
    assert ranktrace_lines(capfd) == []  # nothing at start-up: the summary line says it once
    assert sampler.error is None


@pytest.mark.parametrize("asked,taken,missed", [
    (100, 100, None), (100, 81, None), (100, 80, 20.0), (100, 37, 63.0),
    (100, 120, None),  # more than asked (boundary effects): no lag
    (19.9, 0, None),  # too few asked to judge
    (20, 0, 100.0),
])
def test_sustained_lag_is_a_fifth_or_more_of_the_asked_samples_missed(asked, taken, missed):
    assert sustained_lag_pct(asked, taken) == missed


def test_a_starved_wake_up_is_noted_but_not_printed(capfd):
    sampler = DeviceSampler(ListWriter(), 20, None)
    sampler._check_lag("woke", 0.4)
    sampler._check_lag("woke", 0.9)
    assert "woke 400 ms late" in sampler.behind and sampler.max_lag_s == 0.9
    assert ranktrace_lines(capfd) == []
    assert sampler.missed_pct is None  # never ran: nothing judged


# ---- CUDA device index -> NVML handle -----------------------------------------------------------
def test_handle_mapping_honours_cuda_visible_devices():
    nvml = FakeNVML()
    assert nvml_handle_for_cuda_device(nvml, 1, {}) == ("gpu", 1)
    assert nvml_handle_for_cuda_device(nvml, 0, {"CUDA_VISIBLE_DEVICES": "2,0"}) == ("gpu", 2)
    assert nvml_handle_for_cuda_device(nvml, 1, {"CUDA_VISIBLE_DEVICES": "2, 0"}) == ("gpu", 0)
    assert nvml_handle_for_cuda_device(nvml, 0, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}) == ("gpu", 0)
    assert nvml_handle_for_cuda_device(
        nvml, 1, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa1111-0000,GPU-bbbc"}
    ) == ("gpu", 2)
    assert nvml_handle_for_cuda_device(nvml, 0, {"CUDA_VISIBLE_DEVICES": "MIG-1234"}) == (
        "mig",
        "MIG-1234",
    )
    # torch's UUID has no "GPU-" prefix; it wins over the environment once CUDA is up.
    assert nvml_handle_for_cuda_device(
        nvml, 0, {"CUDA_VISIBLE_DEVICES": "0"}, cuda_uuid="bbbb2222-0000"
    ) == ("gpu", 1)
    with pytest.raises(ValueError, match="2 NVML devices match"):
        nvml_handle_for_cuda_device(nvml, 0, {"CUDA_VISIBLE_DEVICES": "GPU-bbb"})
    with pytest.raises(ValueError, match="not among"):
        nvml_handle_for_cuda_device(nvml, 2, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_unmappable_device_falls_back_to_psutil_with_reason():
    nvml = FakeNVML()
    sampler = DeviceSampler(ListWriter(), 10, 1, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "0"})
    assert sampler.source == "psutil"
    assert "no NVML device for CUDA device 1" in sampler.reason
    assert nvml.shutdowns == 1


def test_mig_device_samples_what_it_answers():
    nvml = FakeNVML(
        unsupported={"utilization", "power", "clock", "temperature"}, nvlinks=0, pcie_counters=False
    )
    writer = ListWriter()
    sampler = DeviceSampler(writer, 50, 0, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "MIG-77"})
    run_sampler(sampler)
    record = writer.records[-1]
    assert (
        record.device is None and record.mem_used_bytes == 5 * 2**30 and record.sm_util_pct is None
    )
