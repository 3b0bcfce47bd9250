"""The peak the tracer records (tracer.probes.peak_tflops): measured on CPU within its bound
without touching the script's random numbers, threads or grad mode; or --peak-tflops."""

import subprocess
import sys
import time

import pytest
import torch

from helpers.launch import REPO
from tracer import schema
from tracer.options.config import ConfigError, TracerConfig
from tracer.probes import peak_tflops


def test_the_cpu_measurement_is_bounded_and_leaves_rng_threads_and_grad_mode_alone():
    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    interop = torch.get_num_interop_threads()
    start = time.perf_counter()
    measured = peak_tflops.measure_cpu_tflops()
    assert time.perf_counter() - start < 1.0  # 0.2 s budget, plus the first call's set-up
    assert 0 < measured < 100
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert torch.get_num_threads() == threads and torch.get_num_interop_threads() == interop
    assert torch.is_grad_enabled()


@pytest.mark.slow  # starts Python processes
def test_after_the_measurement_a_script_can_still_set_its_thread_counts():
    code = ("from tracer.probes import peak_tflops; import torch; "
            "peak_tflops.measure_cpu_tflops(0.05); "
            "torch.set_num_interop_threads(1); torch.set_num_threads(1); print('ok')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_part_records_the_option_or_its_measurement_in_run_start():
    given = peak_tflops.PeakPart(12.5, "option")
    given.start()
    assert given.run_start_fields() == {"peak_tflops": 12.5, "peak_source": "option"}
    measured = peak_tflops.PeakPart(None, "measured")
    measured.start()
    fields = measured.run_start_fields()
    assert fields["peak_source"] == "measured" and fields["peak_tflops"] > 0
    start = schema.RunStart(schema_version=1, run_name="r", rank=0, local_rank=0, world_size=1,
                            host="h", pid=1, start_ns=1, argv=[], script="s", script_args=[],
                            torch_version="t", config={}, **fields)
    decoded = schema.decoder(schema.ManifestRecord).decode(schema.ENCODER.encode(start))
    assert decoded.peak_tflops == fields["peak_tflops"] and decoded.peak_source == "measured"


def test_peak_tflops_must_be_a_finite_number_at_least_zero():
    assert TracerConfig().peak_tflops == 0.0 and TracerConfig(peak_tflops=3).peak_tflops == 3
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="--peak-tflops"):
            TracerConfig(peak_tflops=bad)
