"""The post-ops of a forward convolution (:mod:`tvm_convgrad.params.post_ops`) as TE expressions
on a ``dst`` value, in ``dst``'s own layout (so a binary post-op's ``src1`` is read at ``dst``'s
index, broadcast)."""

from __future__ import annotations

from typing import Sequence

from tvm import tirx

from ..params.post_ops import PostOp

__all__ = ["apply_post_ops"]

ACC = "float32"

_BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "max": tirx.max,
    "min": tirx.min,
}


def _eltwise(op: PostOp, x):
    alpha, beta = tirx.const(op.alpha, ACC), tirx.const(op.beta, ACC)
    if op.alg == "relu":
        zero = tirx.const(0.0, ACC)
        return tirx.max(x, zero) if op.alpha == 0 else tirx.Select(x > zero, x, alpha * x)
    if op.alg == "clip":
        return tirx.min(tirx.max(x, alpha), beta)
    if op.alg == "linear":
        return alpha * x + beta
    if op.alg == "logistic":
        return tirx.sigmoid(x)
    if op.alg == "swish":
        return x * tirx.sigmoid(alpha * x)
    if op.alg == "tanh":
        return tirx.tanh(x)
    raise ValueError(f"eltwise post-op {op.alg!r}")  # (the rules admit none other)


def _broadcast(src1, index: Sequence) -> tuple:
    """``index`` of ``dst`` as an index of ``src1`` (numpy broadcasting: right-aligned, extent-1 axes at 0)."""
    shape = [int(d) for d in src1.shape]
    tail = index[len(index) - len(shape) :] if shape else ()
    return tuple(0 if d == 1 else i for d, i in zip(shape, tail))


def apply_post_ops(post_ops: Sequence[PostOp], value, index: Sequence):
    """``value`` (fp32, ``dst[index]``'s sums) with ``post_ops`` applied in order, still fp32."""
    for op in post_ops:
        if op.is_binary:
            value = _BINARY[op.alg](value, op.src1(*_broadcast(op.src1, index)).astype(ACC))
        else:
            value = _eltwise(op, value)
    return value
