"""The peak TFLOP/s that MFU is judged against, recorded in run_start (docs/mfu.md).

--peak-tflops gives it ("option"). Otherwise, on CPU, it is measured once, before the script
starts: the best rate of a few fp32 matmuls of tensors made with torch.full (no random numbers
drawn), within MEASURE_BUDGET_S, on the threads torch already has (no thread setting is
touched; torch.set_num_threads and set_num_interop_threads still work in the script
afterwards). On GPUs nothing is measured: the analysis takes the datasheet's peak of the device
name (analysis.core.peaks).
"""

from __future__ import annotations

import time

from tracer.parts.part import Part

MEASURE_BUDGET_S = 0.2
MATMUL_SIZE = 256  # 2 * 256^3 = 34 MFLOP a product: a few ms on one core
MAX_REPEATS = 50


def open_peak(setup):
    """The registry's factory: a part where there is a peak to record, else None."""
    config = setup.config
    if config.peak_tflops > 0:
        return setup.build(PeakPart, float(config.peak_tflops), "option")
    if setup.use_cuda:
        return None
    return setup.build(PeakPart, None, "measured")


def measure_cpu_tflops(budget_s: float = MEASURE_BUDGET_S, size: int = MATMUL_SIZE) -> float:
    """The best fp32 matmul rate seen within `budget_s`, in TFLOP/s."""
    import torch

    with torch.no_grad():
        a = torch.full((size, size), 0.5, dtype=torch.float32)
        b = torch.full((size, size), 0.25, dtype=torch.float32)
        out = torch.empty((size, size), dtype=torch.float32)
        torch.mm(a, b, out=out)  # the first call sets up the kernels
        flops = 2.0 * size ** 3
        best = 0.0
        deadline = time.perf_counter() + budget_s
        for _ in range(MAX_REPEATS):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            seconds = time.perf_counter() - start
            if seconds > 0:
                best = max(best, flops / seconds / 1e12)
            if time.perf_counter() > deadline:
                break
    return best


class PeakPart(Part):
    name = "peak"

    def __init__(self, peak_tflops: float | None, source: str):
        self.peak_tflops = peak_tflops
        self.source = source

    def start(self) -> None:
        """Before the script's first line: the measurement, where there is one to make."""
        if self.peak_tflops is None:
            measured = measure_cpu_tflops()
            if not measured > 0:
                raise RuntimeError("the matmul benchmark measured no time")
            self.peak_tflops = measured

    def run_start_fields(self) -> dict:
        if self.peak_tflops is None:
            return {}
        return {"peak_tflops": round(self.peak_tflops, 6), "peak_source": self.source}
