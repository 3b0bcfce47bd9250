"""The events frame's columns, the Kineto categories and the event names the analysis knows.

Which events count as device work, host ops, communication, data loading or synchronisation is
decided here, by category and name, and nowhere else; docs/definitions.md gives the reasons. This
module imports neither numpy nor pandas: the trace decoder (analysis.ingest.kineto) runs
before the command imports them (analysis.ingest.parse_ahead); analysis.core.events selects events
by them.
"""

from __future__ import annotations

import re

# ---- columns ------------------------------------------------------------------------------------
EVENT_COLUMNS = [
    "name", "cat", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "stream", "correlation",
    "is_gpu", "is_comm", "collective", "in_nelems", "out_nelems", "comm_dtype", "group_size",
    "pg_name", "pg_desc", "input_dims", "input_type", "op_args",
]
# The arguments of communication events: text (or None), and numbers (NaN where absent).
COMM_TEXT_COLUMNS = ("collective", "comm_dtype", "pg_name", "pg_desc", "input_dims",
                     "input_type")
# The arguments that the FLOP count reads, of the host ops the perf model knows
# (analysis.core.op_names): the JSON text [Input Dims, Input type, Concrete Inputs, flops], each
# null where the event has none; None on every other event.
OP_ARGS_COLUMN = "op_args"
TEXT_COLUMNS = (*COMM_TEXT_COLUMNS, OP_ARGS_COLUMN)
NUMBER_COLUMNS = ("in_nelems", "out_nelems", "group_size")
# The ProfilerStep spans of a trace: one row per step number.
STEP_COLUMNS = ["step", "start_ns", "end_ns"]

# ---- categories (lower-cased, pre-1.10 names mapped) ---------------------------------------------
KERNEL_CAT = "kernel"
CPU_OP_CAT = "cpu_op"
GPU_CATS = frozenset({KERNEL_CAT, "gpu_memcpy", "gpu_memset"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset"})
HOST_OP_CATS = frozenset({CPU_OP_CAT, "user_annotation"})
PYTHON_CAT = "python_function"
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# Kineto's categories before torch 1.10 (the TensorBoard plugin's samples use them).
LEGACY_CATS = {
    "operator": CPU_OP_CAT, "memcpy": "gpu_memcpy", "memset": "gpu_memset",
    "runtime": "cuda_runtime", "driver": "cuda_driver", "python": PYTHON_CAT,
}


def normal_cat(cat) -> str:
    """A Kineto category as the events frame holds it."""
    text = "" if cat is None else str(cat).lower()
    return LEGACY_CATS.get(text, text)


# ---- names --------------------------------------------------------------------------------------
# Device kernels that count as communication in our breakdown (docs/definitions.md, "GPU traces"),
# searched anywhere in the name, case-insensitively.
COMM_KERNEL_PATTERNS = (
    r"^(?:nccl|rccl|msccl)\w*?kernel",  # NCCL, RCCL, MSCCL collectives and p2p
    r"(?:deep_ep|dpsk::ep)::",  # DeepEP expert-parallel dispatch/combine (intra- and internode)
    r"nvshmem",  # NVSHMEM one-sided puts, gets and collectives
    r"cross_device_reduce",  # vLLM's custom all-reduce
    r"symm_mem|symmetric_memory|multimem|one_shot_all_reduce|two_shot_all_reduce",  # torch
)
COMM_KERNEL_RE = re.compile("|".join(f"(?:{p})" for p in COMM_KERNEL_PATTERNS), re.IGNORECASE)
# Host ops that count as communication: the backends' own ops and c10d's.
HOST_COMM_RE = re.compile(
    r"^(?:gloo:|nccl:|mpi:|ucc:|c10d::|c10d_functional::|_c10d_functional::|record_param_comms$)")
PROFILER_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# What the host was doing in an idle gap (docs/definitions.md, "Idle gaps").
DATA_LOADING_RE = re.compile(r"DataLoader|dataloader")
SYNC_RE = re.compile(
    r"Synchronize|^(?:cuda|hip)Mem(?:cpy|set)(?:WithStream)?$|^aten::_local_scalar_dense$")

# HTA 0.5.0's kernel classes, regular expressions copied as they are (their precedence quirks
# included): communication ^nccl.*Kernel; memory ^Memcpy|^Memset|^dma; non-compute also
# anything containing Memcpy or Sync.
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NON_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
HTA_DEVICE_SYNC_NAMES = ("Event Sync", "Context Sync")
