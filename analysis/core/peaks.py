"""Dense datasheet peaks of accelerators, by the device name NVML or ROCm reports and by dtype.

Every figure is the vendor's dense peak (no 2:4 structured sparsity) in TFLOP/s, and the peak
memory bandwidth in GB/s (1e9 bytes/s); docs/mfu.md lists the rows, their sources and the figures
that are uncertain. `fp32` is the non-tensor-core FP32 peak on NVIDIA parts and the FP32 matrix
peak on AMD ones (what an FP32 GEMM can reach on each); None where the part has no such mode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class DevicePeak:
    device: str  # the table's name of the part
    tflops: dict  # dtype (DTYPES) -> dense TFLOP/s, or None where the part lacks the mode
    memory_gbps: float
    source: str  # the vendor datasheet the figures come from
    uncertain: str = ""  # what in the row is uncertain, and why; "" where nothing is


def _row(device, fp32, tf32, half, fp8, gbps, source, uncertain=""):
    return DevicePeak(device, {"fp32": fp32, "tf32": tf32, "bf16": half, "fp16": half,
                               "fp8": fp8}, gbps, source, uncertain)


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/a100)"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/h100)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/h200)"
_B200 = "NVIDIA HGX B200 / DGX B200 datasheet, per GPU (nvidia.com/dgx-b200)"
_MI300 = "AMD Instinct MI300X data sheet (amd.com/en/products/accelerators/instinct/mi300)"
_MI325 = "AMD Instinct MI325X data sheet (amd.com/en/products/accelerators/instinct/mi300)"
_MI250 = "AMD Instinct MI250X / MI250 data sheets (amd.com/en/products/accelerators/instinct)"

# (pattern searched in the lower-cased device name, row); the first match wins, so a more
# specific name comes before a more general one.
TABLE: list[tuple[str, DevicePeak]] = [
    (r"a100.*(?:40gb|pcie-40)", _row("A100 40GB", 19.5, 156, 312, None, 1555, _A100)),
    (r"a100.*80gb.*pcie", _row("A100 80GB PCIe", 19.5, 156, 312, None, 1935, _A100)),
    (r"a100", _row("A100 80GB SXM", 19.5, 156, 312, None, 2039, _A100)),
    (r"h100.*pcie", _row("H100 PCIe", 51.0, 378, 756, 1513, 2000, _H100)),
    (r"h100.*nvl", _row("H100 NVL", 60.0, 417.5, 835, 1670.5, 3900, _H100,
                        "the datasheet gives sparse figures only; dense taken as half")),
    (r"h100", _row("H100 SXM", 67.0, 494.7, 989.4, 1978.9, 3350, _H100)),
    (r"h200.*nvl", _row("H200 NVL", 60.0, 417.5, 835, 1670.5, 4800, _H200,
                        "the datasheet gives sparse figures only; dense taken as half")),
    (r"h200", _row("H200 SXM", 67.0, 494.7, 989.4, 1978.9, 4800, _H200)),
    (r"b200", _row("B200 (HGX, 1000 W)", 75.0, 1100, 2250, 4500, 8000, _B200,
                   "FP32 is quoted as 75 to 80 and TF32 as 1100 to 1125 TFLOP/s, and the "
                   "bandwidth as 7.7 or 8 TB/s, in different NVIDIA documents; GB200's B200 "
                   "runs at 1200 W and is faster")),
    (r"l40s", _row("L40S", 91.6, 183, 362.05, 733, 864,
                   "NVIDIA L40S datasheet (nvidia.com/l40s)")),
    (r"\bl4\b", _row("L4", 30.3, 60, 121, 242.5, 300, "NVIDIA L4 datasheet (nvidia.com/l4)",
                     "the datasheet gives tensor-core figures with sparsity only; dense "
                     "taken as half")),
    (r"mi325", _row("MI325X", 163.4, 653.7, 1307.4, 2614.9, 6000, _MI325)),
    (r"mi300", _row("MI300X", 163.4, 653.7, 1307.4, 2614.9, 5300, _MI300)),
    (r"mi250x", _row("MI250X", 95.7, None, 383, None, 3276.8, _MI250)),
    (r"mi250", _row("MI250", 90.5, None, 362.1, None, 3276.8, _MI250,
                    "ROCm may name an MI250 'MI250X/MI250'; such a name gets MI250X's row")),
]

# Kineto's "Input type" names (and torch dtype names) -> the table's dtype.
DTYPE_OF_TYPE = {
    "float": "fp32", "float32": "fp32", "c10::BFloat16": "bf16", "bfloat16": "bf16",
    "c10::Half": "fp16", "half": "fp16", "float16": "fp16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
}


def device_peak(device_name: str | None) -> DevicePeak | None:
    """The table's row for a device name as NVML or ROCm reports it, or None."""
    if not device_name:
        return None
    name = str(device_name).lower()
    for pattern, row in TABLE:
        if re.search(pattern, name):
            return row
    return None


def peak_tflops(device_name: str | None, dtype: str, tf32: bool = False) -> float | None:
    """The dense peak for `dtype` (one of DTYPES) on the device, None where unknown. An fp32
    GEMM runs on tensor cores where TF32 is allowed (`tf32`; torch's default is not to)."""
    row = device_peak(device_name)
    if row is None:
        return None
    if dtype == "fp32" and tf32 and row.tflops.get("tf32"):
        return row.tflops["tf32"]
    return row.tflops.get(dtype)
