"""HTA's rules as analysis.rank.hta implements them: device events launched by kept host events,
the compute kernels by HTA's name patterns, and kernels merged in their shared start order,
against np.isin, HTA's own rule and intervals.hta_merged on small built arrays."""

import numpy as np
import pandas as pd
import pytest

from analysis.core import intervals
from analysis.rank import hta


@pytest.mark.parametrize("correlation", [
    np.array([-1, 5, 6, 7, 5, 6, 7, 8, -1, 9], dtype=np.int64),  # compact ids: the table
    np.array([-1, 5, 6, 7 << 40, 5, 6, 7 << 40, 8, -1, 9], dtype=np.int64),  # sparse: np.isin
    np.array([-1, 5, 6, 7, 5, 6, 7, 8, np.nan, 9], dtype=np.float64),  # not integers: np.isin
])
def test_device_events_launched_by_kept_host_events_are_np_isin(correlation):
    host = np.array([True, True, False, True, False, False, False, False, True, False])
    device = ~host
    found = hta._launched_by(correlation, host, device)
    assert found.tolist() == np.isin(correlation, np.unique(correlation[host])).tolist()
    # Ids 5 and 7<<40 or 7 were launched by kept host events, 6, 8 and 9 were not.
    assert (found & device).tolist() == [False, False, False, False, True, False, True, False,
                                         False, False]
    nothing = np.zeros(len(host), dtype=bool)
    assert not hta._launched_by(correlation, nothing, device).any()


@pytest.mark.parametrize("name", [
    "ampere_sgemm_32x128_nt", "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_SendRecv",
    "nccl_no_kernel_word", "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "dma_copy",
    "cudaDeviceSynchronize", "Event Sync", "void copy<Memcpy>(int)", "MemsetLater", "xMemset",
    "first line\\nSync after a newline", "first line\nSync after a newline",
    "nccl\nKernel", "void at::native::vectorized_elementwise_kernel<4>(int)", "",
])
def test_hta_is_compute_is_hta_patterns_rule(name):
    assert hta.hta_is_compute(name) == hta._compute_by_patterns(name)


def test_merged_kernels_in_the_shared_start_order_are_hta_merged():
    # Ties in start, negative-length intervals (HTA's rounding), and two nested subsets.
    ts = np.array([5.0, 1.0, 3.0, 1.0, 9.0, 3.0, 7.0, 2.0])
    end = np.array([6.0, 4.0, 2.5, 2.0, 12.0, 8.0, 7.5, 2.0])
    among = np.array([True, True, True, True, True, True, False, True])
    masks = hta._NameMasks(pd.Series(["k"] * len(ts)), set())
    by_start = masks.by_start(ts, among)
    for rows in (among, among & (ts != 3.0), np.array([0, 0, 1, 1, 0, 1, 0, 0], dtype=bool)):
        assert hta._merged(ts, end, rows, by_start) == intervals.hta_merged(ts[rows], end[rows])
    # 1-4, 1-2, 2-2, 3-2.5, 3-8 and 5-6 join into 1-8 (7 us busy), 9-12 apart (3 us).
    assert hta._merged(ts, end, among, by_start) == (10.0, 1.0, 12.0)
