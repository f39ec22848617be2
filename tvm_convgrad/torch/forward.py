"""Which forward a ``conv2d`` call runs: PyTorch's or the package's kernel (the cube's third GEMM).

The mode (:func:`set_forward`, or the environment variable ``TVM_CONVGRAD_FORWARD`` at import):

* ``"auto"`` (the default): the package's forward where it is faster than PyTorch's for that layer.
  The first call of a signature (shapes, stride, pads, dilation, groups, type, layout, bias) times
  both on its own tensors, alternating (:data:`ROUNDS` each, medians), and keeps the package's only
  when it is faster by :data:`MARGIN`, in that timing and in a second one; later calls of the
  signature take the choice made
  (:func:`forward_choices` lists them).
* ``"ours"``: the package's kernel for every call it takes; ``"pytorch"``: PyTorch's for every call.

float64 calls (``gradcheck``) always run PyTorch's forward (the package's sums in float32), and so
do calls whose tensors differ in type or are not on the CPU (PyTorch's error, or its device).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients
from .kernels import DTYPES, CallPlan, as_layout, as_weights, forward_kernel, memory_format, tensors_plan

__all__ = ["MARGIN", "MODES", "ROUNDS", "elapsed_ms", "forward", "forward_choices", "get_forward", "ours", "pytorch", "set_forward"]

MODES = ("auto", "ours", "pytorch")
MARGIN = 1.05
"""``"auto"`` keeps the package's forward when PyTorch's takes at least this many times as long."""
ROUNDS = 5
"""Timed calls of each forward, alternating, when ``"auto"`` meets a signature."""

_mode = os.environ.get("TVM_CONVGRAD_FORWARD", "auto")
_choices: dict[tuple[Conv2dGradients, bool], bool] = {}


def set_forward(mode: str) -> None:
    """``"auto"``, ``"ours"`` or ``"pytorch"`` (see the module docstring); ``"auto"`` forgets
    the choices made so far."""
    global _mode
    if mode not in MODES:
        raise ConvGradError("tvm_convgrad.torch.set_forward", "mode", mode, f"must be one of {list(MODES)}")
    _mode = mode
    _choices.clear()


def get_forward() -> str:
    """The current mode."""
    return _mode


def forward_choices() -> dict[tuple[Conv2dGradients, bool], bool]:
    """``{(call, with bias): the package's forward?}`` of the signatures ``"auto"`` has timed."""
    return dict(_choices)


def pytorch(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, pads, dilation, groups: int) -> torch.Tensor:
    """PyTorch's convolution with ``pads = (top, bottom, left, right)``."""
    pt, pb, pl, pr = pads
    if pt == pb and pl == pr:
        return F.conv2d(input, weight, bias, tuple(stride), (pt, pl), tuple(dilation), groups)
    return F.conv2d(F.pad(input, (pl, pr, pt, pb)), weight, bias, tuple(stride), 0, tuple(dilation), groups)


def ours(call: Conv2dGradients, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The package's forward kernel of ``call`` on the tensors' memory (the output in the input's layout)."""
    out = torch.empty(call.y_shape, dtype=input.dtype, memory_format=memory_format(call.data_format == "NXC"))
    args = (as_layout(input, call), as_weights(weight, call)) + (() if bias is None else (bias.contiguous(),))
    forward_kernel(call, bias is not None).function(*args, as_layout(out, call))
    return out


def elapsed_ms(fn) -> float:
    """Milliseconds one call of ``fn`` takes (the automatic choices' timer, here and in :mod:`.backward`)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _ours_is_faster(call: Conv2dGradients, input, weight, bias, stride, pads, dilation, groups) -> bool:
    """Both forwards timed on these tensors, alternating, twice (the second only where the first
    says so: a shared machine's speed swings within a second): the package's at least
    :data:`MARGIN` faster in both?"""
    with torch.no_grad():
        ours(call, input, weight, bias)  # built and warm
        pytorch(input, weight, bias, stride, pads, dilation, groups)
    return all(_ours_won(call, input, weight, bias, stride, pads, dilation, groups) for _ in range(2))


def _ours_won(call: Conv2dGradients, input, weight, bias, stride, pads, dilation, groups) -> bool:
    """One timing of both forwards (:data:`ROUNDS` each, alternating): the package's at least :data:`MARGIN` faster?"""
    with torch.no_grad():
        times_ours, times_torch = [], []
        for _ in range(ROUNDS):
            times_ours.append(elapsed_ms(lambda: ours(call, input, weight, bias)))
            times_torch.append(elapsed_ms(lambda: pytorch(input, weight, bias, stride, pads, dilation, groups)))
    return statistics.median(times_torch) >= MARGIN * statistics.median(times_ours)


def forward(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, pads, dilation, groups: int,
            channels_last: bool, plan: Optional[CallPlan] = None) -> torch.Tensor:  # fmt: skip
    """The convolution, by PyTorch or the package as the mode says (see the module docstring);
    ``plan``: the call's, where the caller has it."""
    if _mode == "pytorch" or input.dtype not in DTYPES or not input.is_cpu or weight.dtype != input.dtype \
            or (bias is not None and bias.dtype != input.dtype):  # fmt: skip
        return pytorch(input, weight, bias, stride, pads, dilation, groups)
    call = (plan or tensors_plan(input, weight, stride, pads, dilation, groups, channels_last)).call
    if _mode == "ours":
        return ours(call, input, weight, bias)
    key = (call, bias is not None)
    if key not in _choices:
        _choices[key] = _ours_is_faster(call, input, weight, bias, stride, pads, dilation, groups)
    return ours(call, input, weight, bias) if _choices[key] else pytorch(input, weight, bias, stride, pads, dilation, groups)
