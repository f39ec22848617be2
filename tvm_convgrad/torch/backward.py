"""Which dX and dW a backward call runs: the package's kernels or PyTorch's, one choice per GEMM.

The mode (:func:`set_backward`, or the environment variable ``TVM_CONVGRAD_BACKWARD`` at import):

* ``"auto"`` (the default): each GEMM of a signature (its dX, its dW) runs the package's kernel
  unless PyTorch's ``convolution_backward`` is faster for that layer by :data:`MARGIN`. The first
  call of a signature times both on its own tensors, alternating (:data:`ROUNDS` each, medians);
  later calls take the choice made (:func:`backward_choices` lists them). Where both GEMMs are
  PyTorch's, one ``convolution_backward`` call computes them.
* ``"ours"``: the package's kernels for every call; ``"pytorch"``: PyTorch's wherever it can take
  the call.

Only the first-order eager backward chooses (:func:`.ops._backward`); gradients of gradients
(``create_graph=True``) and traced calls run the package's operators. PyTorch's cannot take the
call as the package does where an axis is padded differently on its two sides (the package's
``padding="same"`` with an even kernel) or the tensors are float64 (the package's sums in float32,
see :mod:`.ops`): those run the package's kernels in every mode.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Optional

import torch

from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients

__all__ = ["GEMMS", "MARGIN", "MODES", "ROUNDS", "backward_choices", "get_backward", "gradients", "pytorch_gradients", "set_backward"]

MODES = ("auto", "ours", "pytorch")
GEMMS = ("dx", "dw")
MARGIN = 1.05
"""``"auto"`` runs PyTorch's GEMM where the package's takes at least this many times as long."""
ROUNDS = 7
"""Timed calls of each side, alternating, when ``"auto"`` meets a signature's GEMM."""

_choices: dict[tuple[Conv2dGradients, str], bool] = {}


def _check(mode: str, name: str = "mode") -> str:
    if mode not in MODES:
        raise ConvGradError("tvm_convgrad.torch.set_backward", name, mode, f"must be one of {list(MODES)}")
    return mode


_mode = _check(os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"), "TVM_CONVGRAD_BACKWARD")


def set_backward(mode: str) -> None:
    """``"auto"``, ``"ours"`` or ``"pytorch"`` (see the module docstring); forgets the choices made."""
    global _mode
    _mode = _check(mode)
    _choices.clear()


def get_backward() -> str:
    """The current mode."""
    return _mode


def backward_choices() -> dict[tuple[Conv2dGradients, str], bool]:
    """``{(call, "dx" | "dw"): the package's kernel?}`` of the GEMMs ``"auto"`` has timed."""
    return dict(_choices)


def pytorch_gradients(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride, pads, dilation,
                      groups: int) -> Optional[Callable[[bool, bool], tuple]]:  # fmt: skip
    """PyTorch's gradients of the call as a function of which to compute, ``(dx, dw) -> (dX or None,
    dW or None)`` (one ``convolution_backward`` call), or None where it cannot take the call as the
    package does (see the module docstring)."""
    top, bottom, left, right = pads
    if top != bottom or left != right or input.dtype == torch.float64:
        return None

    def gradients(dx: bool, dw: bool) -> tuple:
        grad_input, grad_weight, _ = torch.ops.aten.convolution_backward(grad_output, input, weight, None, list(stride), [top, left],
                                                                         list(dilation), False, [0, 0], groups, [dx, dw, False])  # fmt: skip
        return (grad_input if dx else None), (grad_weight if dw else None)

    return gradients


def _ms(fn: Callable[[], torch.Tensor]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _ours_holds(ours: Callable[[], torch.Tensor], theirs: Callable[[], torch.Tensor]) -> bool:
    """Both timed, alternating: the package's GEMM within :data:`MARGIN` of PyTorch's?"""
    ours(), theirs()  # built and warm
    times_ours, times_torch = [], []
    for _ in range(ROUNDS):
        times_ours.append(_ms(ours))
        times_torch.append(_ms(theirs))
    return statistics.median(times_ours) < MARGIN * statistics.median(times_torch)


def _package_runs(call: Conv2dGradients, gemm: str, ours: Callable[[], torch.Tensor], theirs: Optional[Callable[[], torch.Tensor]]) -> bool:
    """Whether the package's kernel runs ``call``'s GEMM ``gemm`` (``"auto"``: timed on first meeting it)."""
    if theirs is None or _mode == "ours":
        return True
    if _mode == "pytorch":
        return False
    key = (call, gemm)
    if key not in _choices:
        _choices[key] = _ours_holds(ours, theirs)
    return _choices[key]


def gradients(call: Conv2dGradients, needs: tuple[bool, bool], ours_dx: Callable[[], torch.Tensor], ours_dw: Callable[[], torch.Tensor],
              theirs: Optional[Callable[[bool, bool], tuple]]) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:  # fmt: skip
    """dX and dW of ``call`` (None where ``needs`` says not): each the package's (``ours_dx()``,
    ``ours_dw()``) or PyTorch's (``theirs``, see :func:`pytorch_gradients`) as the mode says, PyTorch's
    two in one call."""
    dx = needs[0] and not _package_runs(call, "dx", ours_dx, theirs and (lambda: theirs(True, False)[0]))
    dw = needs[1] and not _package_runs(call, "dw", ours_dw, theirs and (lambda: theirs(False, True)[1]))
    grad_input, grad_weight = theirs(dx, dw) if dx or dw else (None, None)
    if needs[0] and not dx:
        grad_input = ours_dx()
    if needs[1] and not dw:
        grad_weight = ours_dw()
    return grad_input, grad_weight
