"""oneDNN's post-ops of a forward convolution: what is applied to each ``dst`` value as it is
written out, and their rules.

A post-op is one of oneDNN's primitive attributes (``dnnl::post_ops``), named as oneDNN names its
algorithms; they apply in order to the fp32 sums (after the bias), and the result is rounded once
to ``dst``'s type:

============  =====================================  ==========================================
kind          ``alg``                                ``value ->``
============  =====================================  ==========================================
eltwise       ``relu`` (``alpha``: negative slope)   ``x if x > 0 else alpha * x``
eltwise       ``clip``                               ``min(max(x, alpha), beta)``
eltwise       ``linear``                             ``alpha * x + beta``
eltwise       ``logistic``                           ``1 / (1 + exp(-x))``
eltwise       ``swish``                              ``x / (1 + exp(-alpha * x))``
eltwise       ``tanh``                               ``tanh(x)``
binary        ``add`` ``sub`` ``mul`` ``div``        ``x op src1[index]`` (``src1`` broadcast to
              ``max`` ``min``                        ``dst``'s shape numpy's way, read as fp32)
============  =====================================  ==========================================

What a Relax ``FuseOps`` would fuse after a convolution (a bias add, a residual add, ReLU / ReLU6)
is such a list; :class:`tvm_convgrad.relax.ScheduleConvs` builds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .rules import Rules

__all__ = ["BINARY", "ELTWISE", "PostOp", "post_op_rules"]

ELTWISE = ("relu", "clip", "linear", "logistic", "swish", "tanh")
BINARY = ("add", "sub", "mul", "div", "max", "min")
SRC1_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class PostOp:
    """One post-op: ``alg`` (:data:`ELTWISE` or :data:`BINARY`), a binary one's ``src1``
    (a ``te.Tensor`` of a shape that broadcasts to ``dst``'s), an eltwise one's ``alpha`` / ``beta``."""

    alg: str
    src1: Any = None
    alpha: float = 0.0
    beta: float = 0.0

    @classmethod
    def eltwise(cls, alg: str, alpha: float = 0.0, beta: float = 0.0) -> "PostOp":
        return cls(alg, None, alpha, beta)

    @classmethod
    def binary(cls, alg: str, src1: Any) -> "PostOp":
        return cls(alg, src1)

    @property
    def is_binary(self) -> bool:
        return self.alg in BINARY


def broadcasts(shape: Sequence[int], to: Sequence[int]) -> bool:
    """Whether ``shape`` broadcasts to ``to`` numpy's way (right-aligned, each extent 1 or equal)."""
    return len(shape) <= len(to) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(to)))


def post_op_rules(r: Rules, post_ops: Any, dst_shape: Sequence[int]) -> tuple[PostOp, ...]:
    """``post_ops`` checked against a ``dst`` of ``dst_shape``: a list of :class:`PostOp`, each
    alg known, eltwise ones without ``src1`` and with finite ``alpha`` / ``beta`` (``clip``: alpha
    <= beta), binary ones with a static ``src1`` of a float type that broadcasts to ``dst``."""
    if post_ops is None:
        return ()
    if not isinstance(post_ops, (list, tuple)):
        r.fail("post_ops", type(post_ops).__name__, "must be a list of PostOp")
    for k, op in enumerate(post_ops):
        name = f"post_ops[{k}]"
        if not isinstance(op, PostOp):
            r.fail(name, type(op).__name__, "must be a tvm_convgrad.PostOp (PostOp.eltwise / PostOp.binary)")
        if op.alg not in ELTWISE + BINARY:
            r.fail(f"{name}.alg", op.alg, f"must be one of the eltwise algs {list(ELTWISE)} or the binary ones {list(BINARY)}")
        for attr in ("alpha", "beta"):
            value = getattr(op, attr)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                r.fail(f"{name}.{attr}", value, "must be a finite number")
        if op.alg == "clip" and op.alpha > op.beta:
            r.fail(f"{name}.alpha", op.alpha, f"clip's lower bound must be <= its upper bound beta = {op.beta}")
        if not op.is_binary:
            if op.src1 is not None:
                r.fail(f"{name}.src1", type(op.src1).__name__, f"must be None: {op.alg!r} is an eltwise post-op")
            continue
        if op.src1 is None:
            r.fail(f"{name}.src1", None, f"must be a te.Tensor: {op.alg!r} is a binary post-op")
        r.tensor(f"{name}.src1", op.src1)
        shape = r.static_shape(f"{name}.src1.shape", op.src1, len(op.src1.shape), None)
        if not broadcasts(shape, dst_shape):
            r.fail(f"{name}.src1.shape", shape, f"must broadcast to dst's shape {tuple(dst_shape)} (each extent 1 or dst's, aligned right)")
        if str(op.src1.dtype) not in SRC1_DTYPES:
            r.fail(f"{name}.src1.dtype", str(op.src1.dtype), f"must be one of {list(SRC1_DTYPES)}")
    return tuple(post_ops)
