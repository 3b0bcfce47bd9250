"""The datasheet peaks (analysis.core.peaks): device names as NVML and ROCm report them, one
row each, dtypes, and every row's source."""

import pytest

from analysis.core import peaks

NAMES = {  # the name NVML / ROCm reports -> (the table's row, dense bf16 TFLOP/s, GB/s)
    "NVIDIA A100-SXM4-80GB": ("A100 80GB SXM", 312, 2039),
    "NVIDIA A100-SXM4-40GB": ("A100 40GB", 312, 1555),
    "NVIDIA A100 80GB PCIe": ("A100 80GB PCIe", 312, 1935),
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4, 3350),
    "NVIDIA H100 PCIe": ("H100 PCIe", 756, 2000),
    "NVIDIA H100 NVL": ("H100 NVL", 835, 3900),
    "NVIDIA H200": ("H200 SXM", 989.4, 4800),
    "NVIDIA H200 NVL": ("H200 NVL", 835, 4800),
    "NVIDIA B200": ("B200 (HGX, 1000 W)", 2250, 8000),
    "NVIDIA L4": ("L4", 121, 300),
    "NVIDIA L40S": ("L40S", 362.05, 864),
    "AMD Instinct MI250X": ("MI250X", 383, 3276.8),
    "AMD Instinct MI250": ("MI250", 362.1, 3276.8),
    "AMD Instinct MI300X": ("MI300X", 1307.4, 5300),
    "AMD Instinct MI325X": ("MI325X", 1307.4, 6000),
}


@pytest.mark.parametrize("name", list(NAMES))
def test_each_reported_device_name_finds_its_row(name):
    row = peaks.device_peak(name)
    device, bf16, gbps = NAMES[name]
    assert (row.device, row.tflops["bf16"], row.memory_gbps) == (device, bf16, gbps)
    assert peaks.peak_tflops(name, "bf16") == bf16 == peaks.peak_tflops(name, "fp16")


def test_unknown_and_missing_names_have_no_peak():
    assert peaks.device_peak("Tesla T4") is None and peaks.device_peak(None) is None
    assert peaks.peak_tflops("cpu", "fp32") is None


def test_fp32_is_the_plain_peak_unless_tf32_is_allowed_and_missing_modes_are_none():
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 67.0
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == 494.7
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1978.9
    assert peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peaks.peak_tflops("AMD Instinct MI250X", "fp32", tf32=True) == 95.7  # no TF32 mode


def test_every_row_has_a_source_and_its_dense_peaks_grow_as_precision_drops():
    for _, row in peaks.TABLE:
        assert row.source and set(row.tflops) == set(peaks.DTYPES) and row.memory_gbps > 0
        known = [row.tflops[d] for d in ("fp32", "tf32", "bf16", "fp8") if row.tflops[d]]
        assert known == sorted(known)
