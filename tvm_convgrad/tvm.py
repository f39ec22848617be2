"""A TBE-era ``tvm`` for the seed examples: ``from tvm_convgrad import tvm``.

``tvm.placeholder(shape, name=..., dtype=...)`` is ``tvm.te.placeholder``; ``compute``,
``reduce_axis``, ``sum``, ``select``, ``const`` and ``var`` are their TE / TIR counterparts.
Every other attribute is the real ``tvm`` package's (``tvm.cpu``, ``tvm.runtime``, ...).
"""

from __future__ import annotations

from typing import Any, Sequence

import tvm as _tvm
from tvm import te as _te
from tvm import tirx as _tirx

__all__ = ["placeholder", "compute", "reduce_axis", "sum", "select", "const", "var"]


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "placeholder", attrs: dict | None = None):
    """A TE placeholder (TBE signature; ``attrs`` is accepted and ignored, as off the chip)."""
    return _te.placeholder(tuple(shape), dtype=dtype, name=name)


compute = _te.compute
reduce_axis = _te.reduce_axis
sum = _te.sum  # noqa: A001 - TBE's name
const = _tirx.const
var = _te.var


def select(cond, true_value, false_value=None):
    """TBE's ``tvm.select``: ``if_then_else``; the 2-argument form yields 0 where ``cond`` fails."""
    if false_value is None:
        false_value = _tirx.const(0, true_value.dtype)
    return _te.if_then_else(cond, true_value, false_value)


def __getattr__(name: str) -> Any:
    return getattr(_tvm, name)
