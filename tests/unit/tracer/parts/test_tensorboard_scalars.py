"""ScalarsWriter: what it writes reads back in TensorBoard's own reader, and a failing disk never
reaches the training."""

import os
import threading

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tracer import schema
from tracer.parts import buffered_file
from tracer.parts.tensorboard_scalars import MIB, ScalarsWriter
from tracer.schema import DeviceSample, StepRecord

T0 = 1_790_000_000_000_000_000  # ns


def read_scalars(path):
    """{tag: [(step, value, wall_time)]} of an event file or of every event file in a folder."""
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def event_files(folder):
    return sorted(f for f in os.listdir(folder) if "tfevents" in f)


def step_record(step, **fields):
    return StepRecord(step=step, start_ns=T0 + step * 50_000_000,
                      end_ns=T0 + step * 50_000_000 + 12_500_000, **fields)


def test_steps_read_back_with_units(tmp_path):
    writer = ScalarsWriter(str(tmp_path), rank=1)
    for step in range(3):
        writer.add_step(step_record(step, cuda_peak_allocated_bytes=(step + 1) * 256 * MIB,
                                    cuda_peak_reserved_bytes=1024 * MIB,
                                    cuda_total_bytes=80 * 1024 * MIB, rss_bytes=3 * MIB // 2,
                                    comm_ops=4, comm_bytes=(step + 1) * 2_500_000),
                        comm_algbw_gbps=1.5 * (step + 1))
    writer.close()
    assert writer.error is None

    got = read_scalars(writer.path)
    assert sorted(got) == [
        "rank1/comm/algbw_gbps", "rank1/comm/ops", "rank1/comm/volume_mb",
        "rank1/memory/cuda_peak_allocated_mib", "rank1/memory/cuda_peak_reserved_mib",
        "rank1/memory/rss_mib", "rank1/step/time_ms"]
    assert [s for s, _, _ in got["rank1/step/time_ms"]] == [0, 1, 2]
    assert [v for _, v, _ in got["rank1/step/time_ms"]] == [12.5, 12.5, 12.5]
    assert [v for _, v, _ in got["rank1/memory/cuda_peak_allocated_mib"]] == [256, 512, 768]
    assert [v for _, v, _ in got["rank1/memory/cuda_peak_reserved_mib"]] == [1024] * 3
    assert [v for _, v, _ in got["rank1/memory/rss_mib"]] == [1.5] * 3
    assert [v for _, v, _ in got["rank1/comm/ops"]] == [4] * 3
    assert [v for _, v, _ in got["rank1/comm/volume_mb"]] == [2.5, 5.0, 7.5]
    assert [v for _, v, _ in got["rank1/comm/algbw_gbps"]] == [1.5, 3.0, 4.5]
    # The point's wall time is the step's end on the rank's clock.
    assert got["rank1/step/time_ms"][2][2] == pytest.approx((T0 + 112_500_000) / 1e9, abs=1e-6)


def test_step_without_gpu_or_comm_timing_leaves_those_tags_out(tmp_path):
    writer = ScalarsWriter(str(tmp_path), rank=0)
    writer.add_step(step_record(0, rss_bytes=100 * MIB), comm_algbw_gbps=None)
    writer.close()
    got = read_scalars(writer.path)
    assert sorted(got) == ["rank0/comm/ops", "rank0/comm/volume_mb", "rank0/memory/rss_mib",
                           "rank0/step/time_ms"]
    assert got["rank0/comm/ops"][0][1] == 0
    assert got["rank0/memory/rss_mib"][0][1] == 100


def test_samples_are_numbered_and_scaled(tmp_path):
    writer = ScalarsWriter(str(tmp_path), rank=3)
    nvml = DeviceSample(t_ns=T0, source="nvml", device=3, sm_util_pct=87.0, mem_util_pct=40.0,
                        mem_used_bytes=2048 * MIB, mem_total_bytes=81920 * MIB, power_w=310.0,
                        sm_clock_mhz=1980.0, temp_c=61.0, pcie_tx_bytes_s=3e9,
                        pcie_rx_bytes_s=1.5e9, nvlink_tx_bytes_s=2e11, nvlink_rx_bytes_s=1e11,
                        cpu_process_pct=130.0, rss_bytes=512 * MIB)
    cpu = DeviceSample(t_ns=T0 + 100_000_000, source="psutil", cpu_process_pct=95.0,
                       cpu_system_pct=50.0, rss_bytes=640 * MIB, net_sent_bytes_s=2e6,
                       net_recv_bytes_s=4e6)
    # Two samples within training step 7, one in step 8.
    writer.add_sample(nvml, step=7)
    writer.add_sample(cpu, step=7)
    writer.add_sample(nvml, step=8)
    writer.close()

    got = read_scalars(writer.path)
    values = {tag: [v for _, v, _ in points] for tag, points in got.items()}
    assert values == {
        "rank3/samples/train_step": [7, 7, 8],
        "rank3/gpu3/sm_util_pct": [87, 87],
        "rank3/gpu3/mem_util_pct": [40, 40],
        "rank3/gpu3/mem_used_mib": [2048, 2048],
        "rank3/gpu3/power_w": [310, 310],
        "rank3/gpu3/sm_clock_mhz": [1980, 1980],
        "rank3/gpu3/temp_c": [61, 61],
        "rank3/gpu3/pcie_tx_mb_per_s": [3000, 3000],
        "rank3/gpu3/pcie_rx_mb_per_s": [1500, 1500],
        "rank3/gpu3/nvlink_tx_mb_per_s": [200000, 200000],
        "rank3/gpu3/nvlink_rx_mb_per_s": [100000, 100000],
        "rank3/host/cpu_process_pct": [130, 95, 130],
        "rank3/host/cpu_system_pct": [50],
        "rank3/host/rss_mib": [512, 640, 512],
        "rank3/host/net_sent_mb_per_s": [2],
        "rank3/host/net_recv_mb_per_s": [4],
    }
    # TensorBoard's step of a sample is its number on this rank, strictly increasing.
    assert [s for s, _, _ in got["rank3/samples/train_step"]] == [0, 1, 2]
    assert [s for s, _, _ in got["rank3/host/cpu_process_pct"]] == [0, 1, 2]
    assert got["rank3/host/net_sent_mb_per_s"][0][2] == pytest.approx((T0 + 1e8) / 1e9, abs=1e-6)


def test_ranks_share_the_run_folder(tmp_path):
    writers = [ScalarsWriter(str(tmp_path), rank=r) for r in range(2)]
    for step in range(4):
        for rank, writer in enumerate(writers):  # interleaved, as concurrent ranks would be
            writer.add_step(step_record(step, comm_ops=rank + 1), comm_algbw_gbps=None)
    for writer in writers:
        writer.close()

    names = event_files(tmp_path)
    assert len(names) == 2 and names[0] != names[1]
    assert sorted(n.rsplit(".", 1)[1] for n in names) == ["rank0", "rank1"]
    for name in names:
        # Nothing HTA or torch-tb-profiler would take for a Kineto trace.
        assert not name.endswith((".json", ".gz"))
        assert not schema.KINETO_TRACE_RE.match(name)

    got = read_scalars(tmp_path)  # the folder, as TensorBoard reads one run
    assert [v for _, v, _ in got["rank0/comm/ops"]] == [1, 1, 1, 1]
    assert [v for _, v, _ in got["rank1/comm/ops"]] == [2, 2, 2, 2]
    assert [s for s, _, _ in got["rank1/step/time_ms"]] == [0, 1, 2, 3]


def test_flushes_while_running_and_counts_bytes(tmp_path):
    writer = ScalarsWriter(str(tmp_path), rank=0, flush_s=0.0)
    writer.add_step(step_record(0), comm_algbw_gbps=2.0)
    # Not closed, as after a crash: the step is already on disk.
    assert read_scalars(writer.path)["rank0/comm/algbw_gbps"] == [
        (0, 2.0, pytest.approx((T0 + 12_500_000) / 1e9, abs=1e-6))]
    assert writer.bytes_written == os.path.getsize(writer.path)
    writer.add_step(step_record(1), comm_algbw_gbps=2.0)
    writer.close()
    assert writer.bytes_written == os.path.getsize(writer.path)
    assert writer.events == 2


def test_buffers_until_flush_interval(tmp_path):
    writer = ScalarsWriter(str(tmp_path), rank=0, flush_s=3600.0)
    size_at_open = os.path.getsize(writer.path)  # the file_version header only
    writer.add_step(step_record(0), comm_algbw_gbps=None)
    assert os.path.getsize(writer.path) == size_at_open
    writer.close()
    assert os.path.getsize(writer.path) > size_at_open
    assert "rank0/step/time_ms" in read_scalars(writer.path)


def test_sampler_thread_and_training_thread_together(tmp_path):
    writer = ScalarsWriter(str(tmp_path), rank=0, flush_s=0.0)
    sample = DeviceSample(t_ns=T0, source="psutil", cpu_process_pct=10.0)

    def sampler():
        for _ in range(300):
            writer.add_sample(sample, step=0)

    thread = threading.Thread(target=sampler)
    thread.start()
    for step in range(300):
        writer.add_step(step_record(step), comm_algbw_gbps=None)
    thread.join()
    writer.close()
    got = read_scalars(writer.path)
    assert [s for s, _, _ in got["rank0/host/cpu_process_pct"]] == list(range(300))
    assert [s for s, _, _ in got["rank0/step/time_ms"]] == list(range(300))
    assert writer.bytes_written == os.path.getsize(writer.path)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_full_disk_at_start_switches_off_with_one_line(tmp_path, monkeypatch, capsys):
    # /dev/full fails every write with ENOSPC, as a full disk does.
    monkeypatch.setattr(buffered_file, "open", lambda path, mode: open("/dev/full", "wb"),
                        raising=False)
    writer = ScalarsWriter(str(tmp_path), rank=5, flush_s=0.0)
    for step in range(3):
        writer.add_step(step_record(step), comm_algbw_gbps=1.0)
        writer.add_sample(DeviceSample(t_ns=T0, source="psutil", rss_bytes=MIB), step)
    writer.flush()
    writer.close()
    writer.close()

    assert writer.error is not None and "No space left on device" in writer.error
    assert writer.closed
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ranktrace: rank5 scalars: ")
    assert "No space left on device" in lines[0] and "TensorBoard scalars are off" in lines[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_disk_filling_up_mid_run_keeps_what_was_written(tmp_path, capsys):
    writer = ScalarsWriter(str(tmp_path), rank=2, flush_s=0.0)
    writer.add_step(step_record(0), comm_algbw_gbps=None)
    written = writer.bytes_written
    # From here on the file's descriptor fails every write with ENOSPC.
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, writer._file.fileno())
    os.close(full)
    writer.add_step(step_record(1), comm_algbw_gbps=None)
    writer.add_step(step_record(2), comm_algbw_gbps=None)
    writer.close()

    assert writer.error is not None and "No space left on device" in writer.error
    assert writer.bytes_written == written
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert [s for s, _, _ in read_scalars(writer.path)["rank2/step/time_ms"]] == [0]


def test_unusable_run_folder_switches_off_with_one_line(tmp_path, capsys):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    writer = ScalarsWriter(str(not_a_folder / "run"), rank=0)
    writer.add_step(step_record(0), comm_algbw_gbps=None)
    writer.add_sample(DeviceSample(t_ns=T0, source="psutil"), 0)
    writer.close()
    assert writer.error is not None and "(NotADirectoryError: " in writer.error
    assert writer.bytes_written == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"ranktrace: rank0 scalars: {writer.error}"]


def test_bad_record_does_not_raise(tmp_path, capsys):
    writer = ScalarsWriter(str(tmp_path), rank=0)
    writer.add_step(StepRecord(step=0, start_ns=T0, end_ns=None), comm_algbw_gbps=None)
    assert writer.error is not None and "(TypeError: " in writer.error
    assert len(capsys.readouterr().err.splitlines()) == 1
    writer.close()



def test_frame_checksums_are_tensorboards_own():
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    from tracer.parts.tensorboard_scalars import masked_crc32c

    # The empty string, one byte, a length header and a whole event, as TFRecord frames them.
    for data in (b"", b"\x00", b"\x08\x00\x00\x00\x00\x00\x00\x00", bytes(range(256)) * 3):
        assert masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)
    # CRC-32C's check value (RFC 3720), masked as TFRecord masks it.
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_events_are_the_bytes_of_freshly_built_protos(tmp_path):
    """Kept events are filled in anew each time: every value, the step and the wall time of
    each event are its own, whichever set of tags came before."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from tracer.parts.tensorboard_scalars import _frame

    writer = ScalarsWriter(str(tmp_path), rank=0)
    sent = []
    writer.append = lambda data, step: sent.append(data) or True
    batches = [(1, T0, [("a", 1.5), ("b", 2)]), (2, T0 + 5, [("a", -3.25), ("b", 7)]),
               (3, T0 + 9, [("a", 0.0)]), (4, T0 + 11, [("a", 4.0), ("b", 1e-9)])]
    for step, t_ns, values in batches:
        writer._write(step, t_ns, values, step)
    expected = [_frame(event_pb2.Event(wall_time=t_ns / 1e9, step=step, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in values]
    )).SerializeToString()) for step, t_ns, values in batches]
    assert sent == expected
    writer.close()


def test_frames_are_checksummed_alike_without_google_crc32c():
    """Where google-crc32c is missing, tensorboard's pure-Python CRC-32C frames the same bytes."""
    import subprocess
    import sys
    from pathlib import Path

    import tracer

    code = ("import sys; sys.modules['google_crc32c'] = None\n"
            "from tracer.parts import tensorboard_scalars as t\n"
            "print(t._crc32c.__module__, t.masked_crc32c(b'123456789'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(tracer.__file__).parents[1])  # where `import tracer` finds it
    module, value = out.stdout.split()
    crc = 0xE3069283  # CRC-32C's check value (RFC 3720)
    assert module.startswith("tensorboard.")
    assert int(value) == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
