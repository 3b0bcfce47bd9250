"""The perf model of one op: its kind, FLOPs and bytes moved, from its name and the shapes,
types and scalar arguments the profiler recorded (docs/mfu.md gives every formula).

Kinds: "gemm", "conv", "attention" (their FLOPs are the model FLOPs that MFU counts), and
"memory" (elementwise ops, norms, copies: judged by bytes, their FLOPs one per output element);
None for an op the model does not know. Shapes are Kineto's `Input Dims` (one list per input,
[] for a scalar or a non-tensor), types its `Input type`.
"""

from __future__ import annotations

import ast
import math
import re

from analysis.core.op_names import (
    ATTENTION_BACKWARD_OPS,
    CONV_OPS,
    ELEMENTWISE_RE,
    GEMM_OPS,
    NORM_RE,
    is_compute_op,
)
from analysis.core.peaks import DTYPE_OF_TYPE

COMPUTE_KINDS = ("gemm", "conv", "attention")
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "double": 8}
_ELEMENT_OF_TYPE = {"double": 8, "float": 4, "c10::BFloat16": 2, "c10::Half": 2,
                    "long int": 8, "int": 4, "bool": 1, "unsigned char": 1, "signed char": 1,
                    "short int": 2}


def dtype_of(types) -> str | None:
    """The table's dtype (analysis.core.peaks.DTYPES) of the first tensor input, or None."""
    for t in types or ():
        if t in DTYPE_OF_TYPE:
            return DTYPE_OF_TYPE[t]
        if t and t in _ELEMENT_OF_TYPE:
            return "double" if t == "double" else None
    return None


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape)


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                           and d >= 0 for d in shape)


def _shapes(dims, count: int, start: int = 0):
    """`count` tensor shapes from position `start` of the inputs, or None."""
    if not isinstance(dims, list) or len(dims) < start + count:
        return None
    shapes = dims[start:start + count]
    return shapes if all(_is_shape(s) and s for s in shapes) else None


def _matmul_flops(a: list, b: list) -> int | None:
    """2 * batch * M * K * N of torch.matmul(a, b), its broadcasting and 1-D cases included."""
    a, b = list(a), list(b)
    if len(a) == 1:
        a = [1] + a
    if len(b) == 1:
        b = b + [1]
    if a[-1] != b[-2]:
        return None
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b))
    return 2 * batch * a[-2] * a[-1] * b[-1]


def gemm_flops(name: str, dims) -> int | None:
    if name in ("aten::mm", "aten::bmm", "aten::matmul"):
        shapes = _shapes(dims, 2)
        return None if shapes is None else _matmul_flops(*shapes)
    if name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation"):
        shapes = _shapes(dims, 2, start=1)
        return None if shapes is None else _matmul_flops(*shapes)
    if name == "aten::linear":  # input [..., K], weight [N, K]
        shapes = _shapes(dims, 2)
        if shapes is None or len(shapes[1]) != 2 or shapes[0][-1] != shapes[1][1]:
            return None
        return 2 * _numel(shapes[0][:-1]) * shapes[0][-1] * shapes[1][0]
    return None


def _int_list(text) -> list[int] | None:
    """A Concrete Inputs value such as "[1, 1]" as a list of ints, or None."""
    try:
        value = ast.literal_eval(text) if isinstance(text, str) and text else None
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _conv_forward(x: list, w: list, stride, padding, dilation, transposed: bool,
                  output_padding, groups: int) -> int | None:
    spatial = len(x) - 2
    if spatial < 1 or len(w) != len(x):
        return None
    stride, padding, dilation = ((v * spatial if len(v) == 1 else v)
                                 for v in (stride, padding, dilation))
    if transposed:  # every input element meets Cout/groups * prod(kernel) weights
        return 2 * _numel(x) * _numel(w[1:])
    out = []
    for i in range(spatial):
        size = (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        if size <= 0:
            return None
        out.append(size)
    return 2 * x[0] * w[0] * _numel(out) * _numel(w[1:])


def conv_flops(name: str, dims, concrete) -> int | None:
    """Forward: 2 * N * Cout * prod(output spatial) * Cin/groups * prod(kernel);
    convolution_backward: that for each of grad_input and grad_weight its output_mask asks."""
    concrete = concrete if isinstance(concrete, list) else []
    backward = name == "aten::convolution_backward"
    start = 1 if backward else 0  # backward: (grad_output, input, weight, bias_sizes, ...)
    shapes = _shapes(dims, 2, start=start)
    if shapes is None:
        return None
    x, w = shapes
    at = start + 3  # stride, padding, dilation follow input, weight, bias
    values = [_int_list(concrete[i]) if i < len(concrete) else None for i in range(at, at + 3)]
    if any(v is None for v in values):
        return None
    if name in ("aten::conv1d", "aten::conv2d", "aten::conv3d"):
        groups = _int_list(concrete[at + 3]) if len(concrete) > at + 3 else [1]
        transposed = False
    else:
        groups = _int_list(concrete[at + 5]) if len(concrete) > at + 5 else None
        transposed = len(concrete) > at + 3 and concrete[at + 3] == "True"
    if not groups:
        return None
    forward = _conv_forward(x, w, *values, transposed, None, groups[0])
    if forward is None or not backward:
        return forward
    mask = concrete[at + 6] if len(concrete) > at + 6 else ""
    flags = re.findall(r"True|False", mask) if isinstance(mask, str) else []
    asked = sum(f == "True" for f in flags[:2]) if flags else 2
    return forward * asked


def attention_flops(name: str, dims) -> int | None:
    """Forward: 2*B*H*L*S*E (Q K^T) + 2*B*H*L*S*Ev (scores V); backward (grad_out, q, k, v, ...):
    2*B*H*L*S*(3E + 2Ev), as torch.utils.flop_counter counts both; no causal discount."""
    backward = name in ATTENTION_BACKWARD_OPS
    shapes = _shapes(dims, 3, start=1 if backward else 0)
    if shapes is None or any(len(s) != 4 for s in shapes):
        return None
    q, k, v = shapes
    if name in ("aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                "aten::_flash_attention_backward", "aten::_efficient_attention_backward"):
        q, k, v = ([s[0], s[2], s[1], s[3]] for s in (q, k, v))  # [B, L, H, E] layouts
    b, h, length, e = q
    source, ev = k[2], v[3]
    if backward:
        return 2 * b * h * length * source * (3 * e + 2 * ev)
    return 2 * b * h * length * source * (e + ev)


def memory_bytes(name: str, dims, types) -> tuple[int, int] | None:
    """(FLOPs, bytes) of an elementwise op or norm: every tensor input read once and an output
    the size of the largest input written once (an in-place op's output is its first input);
    FLOPs one per output element."""
    if not isinstance(dims, list):
        return None
    types = types if isinstance(types, list) else []
    sizes, largest = 0, (0, 0)
    for i, shape in enumerate(dims):
        kind = types[i] if i < len(types) else ""
        element = _ELEMENT_OF_TYPE.get(kind)
        if element is None or not _is_shape(shape):
            continue
        numel = _numel(shape)
        sizes += numel * element
        largest = max(largest, (numel, element))
    if not sizes:
        return None
    return largest[0], sizes + largest[0] * largest[1]


def op_model(name: str, dims, types, concrete=None) -> tuple[str | None, float, float]:
    """(kind, FLOPs, bytes) of one op; (None, nan, nan) for an op the model does not know, and
    (kind, nan, nan) for a known op whose shapes were not recorded."""
    nan = math.nan
    if is_compute_op(name):
        kind = ("gemm" if name in GEMM_OPS else "conv" if name in CONV_OPS else "attention")
        flops = (gemm_flops(name, dims) if kind == "gemm" else conv_flops(name, dims, concrete)
                 if kind == "conv" else attention_flops(name, dims))
        if flops is None:
            return kind, nan, nan
        return kind, float(flops), float(_tensor_bytes(dims, types) + _output_bytes(
            name, kind, flops, dims, types))
    if NORM_RE.match(name) or ELEMENTWISE_RE.match(name):
        counted = memory_bytes(name, dims, types)
        return ("memory", nan, nan) if counted is None else ("memory", *map(float, counted))
    return None, nan, nan


def _tensor_bytes(dims, types) -> int:
    """Bytes of the tensor inputs (a GEMM's or conv's operands; the output is not recorded)."""
    types = types if isinstance(types, list) else []
    total = 0
    for i, shape in enumerate(dims if isinstance(dims, list) else ()):
        element = _ELEMENT_OF_TYPE.get(types[i] if i < len(types) else "")
        if element and _is_shape(shape):
            total += _numel(shape) * element
    return total


def _output_bytes(name: str, kind: str, flops: int, dims, types) -> float:
    """Bytes of the output, which the trace does not record: FLOPs / (2 * the reduced length)
    elements (K of a GEMM, Cin/groups * prod(kernel) of a convolution), the query's size for
    attention, none for backward ops (their bytes are an underestimate); of the first
    input's element size."""
    element = next((_ELEMENT_OF_TYPE[t] for t in (types or ()) if t in _ELEMENT_OF_TYPE), 0)
    shapes = [s for s in dims if _is_shape(s) and s]
    if not element or len(shapes) < 2:
        return 0.0
    if kind == "gemm":
        first = shapes[1] if name in ("aten::addmm", "aten::baddbmm",
                                      "aten::_addmm_activation") and len(shapes) > 2 else shapes[0]
        return flops / (2 * first[-1]) * element if first[-1] else 0.0
    if kind == "conv" and name != "aten::convolution_backward":
        reduced = _numel(shapes[1][1:])
        return flops / (2 * reduced) * element if reduced else 0.0
    if kind == "attention" and name not in ATTENTION_BACKWARD_OPS:
        return _numel(shapes[0]) * element  # the output has the query's shape (Ev = E)
    return 0.0
