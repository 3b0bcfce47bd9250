"""Names, element sizes and nccl-tests message sizes of collective and p2p ops.

Torch, NCCL and gloo spell one collective and one dtype many ways; these functions map every
spelling onto `tracer.schema.COMM_OPS` and torch dtype names (docs/report.md, "Names", "Bytes").
"""

from __future__ import annotations

import json
import math
import re

# A communication kernel whose collective neither it nor its host side names (e.g. an NCCL
# SendRecv kernel, which serves send, recv and all_to_all alike, launched without
# record_param_comms): its time still counts as communication.
UNKNOWN_OP = "other"
# The point-to-point ops: matched by (group, src, dst), not by a group's order.
P2P_OPS = ("send", "recv")
# The group of an op that names none (gloo's CPU ops, kernels without a group).
UNKNOWN_PG = "unknown"

# ---- names ---------------------------------------------------------------------------------------
# Torch spells one collective many ways: record_param_comms' "Collective name" (allreduce,
# _allgather_base, allgather_into_tensor_coalesced, ...), op names (c10d::allreduce_,
# nccl:all_reduce, gloo:all_gather) and kernel names (ncclDevKernel_AllGather_RING_LL). With the
# prefix and underscores gone, each starts with one of these stems; longer stems come first so
# that "reducescatter" is not read as "reduce" nor "allgather" as "gather".
_OP_STEMS = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("sendrecv", None),  # NCCL's SendRecv kernel: send, recv or all_to_all, the kernel can't tell
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
)
_NAME_PREFIX_RE = re.compile(
    r"^(?:c10d::|c10d_functional::|_c10d_functional::|nccl:|gloo:|mpi:|ucc:|"
    r"ncclDevKernel_|ncclKernel_|rcclKernel_?|rcclDevKernel_)",
    re.IGNORECASE,
)


def canonical_op(name) -> str | None:
    """The schema op (one of schema.COMM_OPS) that a torch/NCCL/gloo name stands for, else None.

    None also for names that move no tensor of their own, such as "wait" or "coalesced".
    """
    if not isinstance(name, str) or not name:
        return None
    text = _NAME_PREFIX_RE.sub("", name.strip())
    text = text.split("(")[0].replace("_", "").lower()
    if text.startswith("coalesced") or text.startswith("wait"):
        return None
    for stem, op in _OP_STEMS:
        if text.startswith(stem):
            return op
    return None



# Communication kernels outside NCCL (analysis.core.events.COMM_KERNEL_PATTERNS) name their op their
# own way: DeepEP's dispatch and combine exchange tokens between all experts' ranks
# (all_to_all); vLLM's cross_device_reduce and torch's symmetric-memory one/two-shot and
# multimem kernels, like NVSHMEM's reduce kernels, all-reduce.
_KERNEL_OPS = (
    (re.compile(r"(?:deep_ep|dpsk::ep)::.*(?:dispatch|combine)|alltoall|all_to_all",
                re.IGNORECASE), "all_to_all"),
    (re.compile(r"cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce|all_?reduce|"
                r"nvshmem\w*reduce", re.IGNORECASE), "all_reduce"),
)


def comm_kernel_op(name) -> str | None:
    """The op of a communication kernel: canonical_op's, else the op its library's naming
    gives (_KERNEL_OPS), else None (counted as UNKNOWN_OP)."""
    op = canonical_op(name)
    if op is not None or not isinstance(name, str):
        return op
    return next((op for pattern, op in _KERNEL_OPS if pattern.search(name)), None)

# Element sizes in bytes, keyed by every spelling a trace or record uses: torch names
# ("float32"), c10 ScalarType names in record_param_comms ("Float", "BFloat16") and the C++
# type names in gloo ops' "Input type" ("float", "c10::BFloat16", "long int").
_DTYPE_SIZES = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex32": 4, "complex64": 8,
    "complex128": 16, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "qint8": 1, "quint8": 1,
    "qint32": 4, "quint4x2": 1, "quint2x4": 1,
}
_DTYPE_ALIASES = {
    # c10 ScalarType names
    "float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16",
    "byte": "uint8", "char": "int8", "short": "int16", "int": "int32", "long": "int64",
    "bool": "bool", "complexhalf": "complex32", "complexfloat": "complex64",
    "complexdouble": "complex128", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    # C++ type names
    "c10::half": "float16", "c10::bfloat16": "bfloat16", "long int": "int64",
    "long long": "int64", "int64_t": "int64", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128", "c10::complex<c10::half>": "complex32",
    "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2",
}


def canonical_dtype(name) -> str | None:
    """The torch dtype name (without "torch.") for any spelling above, else None."""
    if not isinstance(name, str) or not name:
        return None
    text = name.strip()
    if text.startswith("torch."):
        text = text[len("torch."):]
    if text in _DTYPE_SIZES:
        return text
    lowered = text.lower()
    if lowered in _DTYPE_SIZES:
        return lowered
    return _DTYPE_ALIASES.get(lowered)


def dtype_size(name) -> int | None:
    dtype = canonical_dtype(name)
    return _DTYPE_SIZES.get(dtype) if dtype else None


def _positive(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def message_bytes(op, in_nelems, out_nelems, element_size, group_size) -> float:
    """nccl-tests' size S in bytes for one op, from its element counts; NaN when unknown.

    all_gather: the gathered output; reduce_scatter: the full input; all_to_all: all one rank
    sends; gather: the gathered output; scatter: the full input; barrier: 0; the rest: the tensor.
    When the count S needs is missing, the other side times the group size stands in for it.
    """
    if op == "barrier":
        return 0.0
    size = _positive(element_size)
    if size is None:
        return float("nan")
    n_in, n_out, n = _positive(in_nelems), _positive(out_nelems), _positive(group_size)
    if op in ("all_gather", "gather"):
        nelems = n_out if n_out is not None else (n_in * n if n_in and n else None)
    elif op in ("reduce_scatter", "scatter"):
        nelems = n_in if n_in is not None else (n_out * n if n_out and n else None)
    elif op == "recv":
        nelems = n_out if n_out is not None else n_in
    else:
        nelems = n_in if n_in is not None else n_out
    if nelems is None:
        # A zero-element op still moved nothing; only a missing count is unknown.
        zero_in = _is_zero(in_nelems) and (_is_zero(out_nelems) or out_nelems is None)
        return 0.0 if zero_in else float("nan")
    return nelems * size


def _is_zero(value) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


# ---- "Input Dims" and "Input type" of an op without message counts ------------------------------
def first_tensor_nelems(dims_text) -> float | None:
    if dims_text is None:
        return None
    try:
        dims = json.loads(dims_text) if isinstance(dims_text, str) else dims_text
    except ValueError:
        return None
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if isinstance(first, list) and first and all(isinstance(d, list) for d in first):
        return float(sum(math.prod(d) for d in first))  # a TensorList
    if isinstance(first, list) and all(isinstance(d, (int, float)) for d in first):
        return float(math.prod(first)) if first else None
    return None


def first_input_type(types_text):
    if types_text is None:
        return None
    try:
        types = json.loads(types_text) if isinstance(types_text, str) else types_text
    except ValueError:
        return types_text if isinstance(types_text, str) else None
    if isinstance(types, list):
        return types[0] if types and isinstance(types[0], str) else None
    return types if isinstance(types, str) else None
