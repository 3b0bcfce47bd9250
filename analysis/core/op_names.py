"""The host ops that the perf model of one op knows (analysis.rank.op_model): GEMMs,
convolutions and attention (their FLOPs are the model FLOPs), and the elementwise ops and norms
judged by the bytes they move (docs/mfu.md, "Which ops are counted").

Kept here, below the trace decoder, so that the decoder keeps the arguments (`Input Dims`,
`Input type`, `Concrete Inputs`, `flops`) of these ops only (analysis.ingest.kineto). This
module imports neither numpy nor pandas.
"""

from __future__ import annotations

import re

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                      "aten::linear", "aten::_addmm_activation"})
CONV_OPS = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
                      "aten::_convolution", "aten::convolution_backward"})
ATTENTION_OPS = frozenset({
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
    "aten::scaled_dot_product_attention",
})
ATTENTION_BACKWARD_OPS = frozenset({
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_flash_attention_backward", "aten::_efficient_attention_backward",
})
NORM_RE = re.compile(r"^aten::(?:native_)?(?:layer|batch|group|rms|_fused_rms)_norm"
                     r"(?:_backward)?$|^aten::_batch_norm_impl_index(?:_backward)?$")
ELEMENTWISE_RE = re.compile(
    r"^aten::(?:add|sub|mul|div|neg|exp|log|sqrt|rsqrt|pow|relu|gelu|silu|sigmoid|tanh|"
    r"clamp|clamp_min|clamp_max|threshold|where|abs|sign|reciprocal|addcmul|addcdiv|lerp|"
    r"maximum|minimum|copy|fill|zero|softmax|_softmax|log_softmax|_log_softmax|dropout|"
    r"native_dropout|masked_fill|erf|sin|cos|square|sum|mean|"
    r"threshold_backward|gelu_backward|silu_backward|sigmoid_backward|tanh_backward|"
    r"_softmax_backward_data|_log_softmax_backward_data|native_dropout_backward)_?$")


def is_compute_op(name: str) -> bool:
    """A GEMM, convolution or attention op (forward or backward)."""
    return (name in GEMM_OPS or name in CONV_OPS or name in ATTENTION_OPS
            or name in ATTENTION_BACKWARD_OPS)


def is_modelled_op(name: str) -> bool:
    """An op the perf model knows: a compute op, an elementwise op or a norm."""
    return is_compute_op(name) or bool(NORM_RE.match(name) or ELEMENTWISE_RE.match(name))
