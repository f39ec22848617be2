"""Which forward a ``conv2d`` call runs: PyTorch's or the package's kernel (the cube's third GEMM).

The mode (:func:`set_forward`, or the environment variable ``TVM_CONVGRAD_FORWARD`` at import):

* ``"auto"`` (the default): the package's forward where it is faster than PyTorch's for that layer.
  The first call of a signature (shapes, stride, pads, dilation, groups, type, layout, bias) times
  both on its own tensors, alternating (:data:`ROUNDS` each, medians), and keeps the package's only
  when it is faster by :data:`MARGIN` in two timings of three (:func:`wins`); later
  calls of the signature take the choice made (:func:`forward_choices` lists them), and so do later
  processes on this CPU (:mod:`.remembered`, beside the kernels kept on disk). A call whose forward
  is written out for its layout (:func:`.kernels.written_forward`) and whose tensors a step meets in
  memory takes the package's untimed (:func:`from_memory`). PyTorch's is
  ``F.conv2d``, or for a float32 1x1 at stride 1 its BLAS GEMM where that wins against ``F.conv2d``
  the same way (:mod:`.blas`).
* ``"ours"``: the package's kernel for every call it takes; ``"pytorch"``: PyTorch's for every call.

While ``torch.use_deterministic_algorithms(True)`` is in force, ``"auto"`` times nothing and runs
``F.conv2d`` (its choice where the package's is not faster): a choice made on a timing could differ
between two runs of a program, and with it the result's bits (see :mod:`.backward`).

float64 calls (``gradcheck``) always run PyTorch's forward (the package's sums in float32), and so
do calls whose tensors differ in type or are not on the CPU (PyTorch's error, or its device).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import tvm

from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients
from . import blas, outputs, remembered, settled
from .kernels import (DTYPES, CallPlan, aligned, as_layout, as_weights, depthwise_forward_kernel, forward_kernel,
                      is_channels_last, pointwise_forward_kernel, streamed_forward_kernel, tensors_plan, written_forward)

__all__ = ["FROM_MEMORY_BYTES", "MARGIN", "MODES", "PENDING", "ROUNDS", "elapsed_ms", "forward", "forward_choices", "from_memory",
           "get_forward", "ours", "ours_kernel", "pytorch", "pytorchs", "set_forward", "settled_way", "wins"]

MODES = ("auto", "ours", "pytorch")
MARGIN = 1.05
"""``"auto"`` keeps the package's forward when PyTorch's takes at least this many times as long."""
ROUNDS = 5
"""Timed calls of each forward, alternating, when ``"auto"`` meets a signature."""
FROM_MEMORY_BYTES = 4 << 20
"""The least input and output (together) of a call whose written-out forward ``"auto"`` takes untimed
(:func:`from_memory`)."""

_mode = os.environ.get("TVM_CONVGRAD_FORWARD", "auto")
_choices: dict[tuple[Conv2dGradients, bool], bool] = {}
_blas: set[tuple[Conv2dGradients, bool]] = set()
"""The signatures whose PyTorch forward ``"auto"`` runs as a BLAS GEMM (:mod:`.blas`)."""


def set_forward(mode: str) -> None:
    """``"auto"``, ``"ours"`` or ``"pytorch"`` (see the module docstring); forgets the choices made
    in this process (those kept on disk are recalled again: :func:`.remembered.forget` removes them)."""
    global _mode
    if mode not in MODES:
        raise ConvGradError("tvm_convgrad.torch.set_forward", "mode", mode, f"must be one of {list(MODES)}")
    _mode = mode
    _choices.clear()
    _blas.clear()
    settled.reset()


def get_forward() -> str:
    """The current mode."""
    return _mode


def forward_choices() -> dict[tuple[Conv2dGradients, bool], bool]:
    """``{(call, with bias): the package's forward?}`` of the signatures ``"auto"`` has timed."""
    return dict(_choices)


def _mode_in_force() -> str:
    """The mode the calls run by: the set one, but ``"auto"`` under
    ``torch.use_deterministic_algorithms(True)`` is ``"pytorch"``, untimed (see the module docstring)."""
    return "pytorch" if _mode == "auto" and torch.are_deterministic_algorithms_enabled() else _mode


def pytorchs(call: Conv2dGradients, bias: bool) -> bool:
    """Whether the calls of ``call``'s signature (``bias``: with one) run ``F.conv2d`` as the mode
    says: ``"pytorch"``, or ``"auto"`` having chosen it over the package's forward and the BLAS way
    (or deterministic, see the module docstring)."""
    mode = _mode_in_force()
    if mode == "pytorch":
        return True
    key = (call, bias)
    return mode == "auto" and _choices.get(key) is False and key not in _blas


def settled_way(call: Conv2dGradients, bias: bool) -> Optional[Callable]:
    """The forward of ``call``'s signature for good, as ``(input, weight, bias) -> output``: None for
    ``F.conv2d``'s (with the pads the call's, ``(top, left)``), :func:`ours` or the BLAS way;
    :data:`PENDING` while ``"auto"`` has not chosen. (Deterministic algorithms, under which ``"auto"``
    runs ``F.conv2d``, are the caller's to rule out; so are the tensors :func:`forward` gives to PyTorch.)"""
    if _mode == "pytorch":
        return None
    key = (call, bias)
    if _mode == "auto" and key not in _choices:
        return PENDING
    if _mode == "ours" or _choices[key]:
        return functools.partial(ours, call)
    return functools.partial(_blas_forward, call.data_format == "NXC") if key in _blas else None


PENDING = object()
""":func:`settled_way` of a signature ``"auto"`` has not timed."""


def _blas_forward(channels_last: bool, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return blas.forward(input, weight, bias, channels_last)


def pytorch(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, pads, dilation, groups: int) -> torch.Tensor:
    """PyTorch's convolution with ``pads = (top, bottom, left, right)``."""
    pt, pb, pl, pr = pads
    if pt == pb and pl == pr:
        return F.conv2d(input, weight, bias, tuple(stride), (pt, pl), tuple(dilation), groups)
    return F.conv2d(F.pad(input, (pl, pr, pt, pb)), weight, bias, tuple(stride), 0, tuple(dilation), groups)


def ours(call: Conv2dGradients, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The package's forward kernel of ``call`` on the tensors' memory (the output in the input's
    layout): a channels-last fp32 1x1's or depthwise layer's, or a weight-bound fp32 layer's, written
    out (:func:`.kernels.pointwise_forward_kernel`, :func:`.kernels.depthwise_forward_kernel`,
    :func:`.kernels.streamed_forward_kernel`), else the cube's."""
    out = outputs.empty(call.y_shape, input.dtype, call.data_format == "NXC")
    args = (as_layout(input, call), as_weights(weight, call)) + (() if bias is None else (aligned(bias),))
    ours_kernel(call, bias is not None)(*args, as_layout(out, call))
    return out


def ours_kernel(call: Conv2dGradients, bias: bool):
    """The compiled function :func:`ours` runs: ``(input, weight[, bias], output)`` in the call's
    layouts (the C++ node calls it itself for a settled signature, :mod:`.native`): a channels-last
    1x1's, depthwise layer's or weight-bound layer's written out, else the rule's."""
    return (pointwise_forward_kernel(call, bias) or depthwise_forward_kernel(call, bias) or streamed_forward_kernel(call, bias)
            or forward_kernel(call, bias).function)


def elapsed_ms(fn) -> float:
    """Milliseconds one call of ``fn`` takes (the automatic choices' timer, here and in :mod:`.backward`)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def from_memory(call: Conv2dGradients) -> bool:
    """Whether ``"auto"`` takes the package's forward of ``call`` untimed: a kernel written out for
    its layout (:func:`.kernels.written_forward`: a channels-last fp32 1x1 or depthwise layer) over
    :data:`FROM_MEMORY_BYTES` or more of input and output, which a training step meets in memory,
    the output freshly allocated, where a timing meets them in the caches, the output the one the
    last call freed. Those kernels ask for their streams ahead and write their output into memory
    kept mapped (:mod:`.outputs`); PyTorch's do neither, and timed hot the two ran alike:
    MobileNetV2 channels-last f32 at 32 x 112x112 (the Sapphire Rapids-class guest, steps
    interleaved in one process, 11 rounds): ``"auto"`` timing every forward kept PyTorch's for 26 of
    30 layers, 312 ms a step (stock 340); the depthwise forwards the package's 308, and the 1x1 ones
    too 293. Timed from memory instead (256 MB written before each call), the choices came out
    mixed: the 24 -> 144 1x1 on 28x28 1.95 ms against 1.77 in one process, 1.35 against 1.65 in
    another. At 8 x 64x64, all of them under 4 MB, timing them is right: every 1x1 forward the
    package's made that step slower (42.1 ms against 40.4)."""
    itemsize = tvm.DataType(call.dtype).bits // 8
    return (math.prod(call.x_shape) + math.prod(call.y_shape)) * itemsize >= FROM_MEMORY_BYTES and written_forward(call)


def wins(candidate: Callable[[], object], incumbent: Callable[[], object]) -> bool:
    """Up to three timings of both (:data:`ROUNDS` calls each, alternating, medians; a third only
    where the first two disagree): ``candidate`` at least :data:`MARGIN` faster in two of them?
    No one timing decides, since a choice is remembered for later processes and a shared machine's
    speed swings within a second: ResNet-18 bf16 NCHW's 64 -> 64 on 28x28 at N=32 (Zen 4), 1.3x
    faster hot, timed 4.95 against 5.34 ms and then 3.86 against 4.66 in a step's first forward,
    and a process that had needed both timings kept ``F.conv2d`` for it."""
    candidate(), incumbent()  # built and warm
    votes = []
    while votes.count(True) < 2 and votes.count(False) < 2:
        times_candidate, times_incumbent = [], []
        for _ in range(ROUNDS):
            times_candidate.append(elapsed_ms(candidate))
            times_incumbent.append(elapsed_ms(incumbent))
        votes.append(statistics.median(times_incumbent) >= MARGIN * statistics.median(times_candidate))
    return votes.count(True) == 2


def _choose(key, call: Conv2dGradients, input, weight, bias, stride, pads, dilation, groups, channels_last: bool) -> bool:
    """``"auto"``'s choice for a signature: PyTorch's way (``F.conv2d``, or its BLAS GEMM where
    :func:`.blas.applies` and that wins, :data:`_blas`), then the package's forward if it wins against
    that; the package's untimed where :func:`from_memory`."""
    if from_memory(call):
        return True
    theirs = functools.partial(pytorch, input, weight, bias, stride, pads, dilation, groups)
    with torch.no_grad():
        if blas.applies(input, weight, stride, pads, groups) and wins(functools.partial(blas.forward, input, weight, bias, channels_last), theirs):
            _blas.add(key)
            theirs = functools.partial(blas.forward, input, weight, bias, channels_last)
        return wins(functools.partial(ours, call, input, weight, bias), theirs)


def forward(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, pads, dilation, groups: int,
            channels_last: bool, plan: Optional[CallPlan] = None) -> torch.Tensor:  # fmt: skip
    """The convolution, by PyTorch or the package as the mode says (see the module docstring);
    ``plan``: the call's, where the caller has it."""
    mode = _mode_in_force()
    if mode == "pytorch" or input.dtype not in DTYPES or not input.is_cpu or weight.dtype != input.dtype \
            or (bias is not None and bias.dtype != input.dtype) or (is_channels_last(weight) and not channels_last):  # fmt: skip
        # (a channels-last weight beside an input that is not: PyTorch's result is channels-last,
        # its rule for either operand, and the package's kernel writes the input's layout)
        return pytorch(input, weight, bias, stride, pads, dilation, groups)
    call = (plan or tensors_plan(input, weight, stride, pads, dilation, groups, channels_last)).call
    if mode == "ours":
        return ours(call, input, weight, bias)
    key = (call, bias is not None)
    if key not in _choices:
        way = remembered.recall("forward", key)  # a choice an earlier process made
        if way not in ("ours", "blas", "pytorch"):
            _choices[key] = _choose(key, call, input, weight, bias, stride, pads, dilation, groups, channels_last)
            remembered.remember("forward", key, "ours" if _choices[key] else "blas" if key in _blas else "pytorch")
        else:
            _choices[key] = way == "ours"
            if way == "blas":
                _blas.add(key)
    if _choices[key]:
        return ours(call, input, weight, bias)
    if key in _blas:
        return blas.forward(input, weight, bias, channels_last)
    return pytorch(input, weight, bias, stride, pads, dilation, groups)
