"""Which dX and dW a backward call runs: the package's kernels or PyTorch's, one choice per GEMM.

The mode (:func:`set_backward`, or the environment variable ``TVM_CONVGRAD_BACKWARD`` at import):

* ``"auto"`` (the default): each GEMM of a signature (its dX, its dW) runs the package's kernel
  or PyTorch's ``convolution_backward``, whichever way is faster for that layer: the first call of
  a signature times every way on its own tensors (the package's two GEMMs, PyTorch's two in one
  call, one of each), alternating (:data:`ROUNDS` each, medians), and keeps the package's unless
  another way is faster by :data:`MARGIN`, there and in a second timing of the two; later calls
  take the choice made, and so do later processes on this CPU (:mod:`.remembered`). Where the layer's forward is ``F.conv2d``, PyTorch's way of every GEMM
  is credited with :data:`FUNCTION_MS`: the call then runs as ``F.conv2d`` itself. PyTorch's way
  of a float32 1x1 at stride 1 is its BLAS GEMMs, and a float32 :func:`weight_bound` layer's dW its GEMM over im2col
  columns (:mod:`.blas`), where they win against its ``convolution_backward`` first
  (:func:`backward_choices` lists it per GEMM). The ways are timed whole, as they run: PyTorch's
  two GEMMs in one call cost less than each in a call of its own. A layer whose weights outweigh its
  work (:func:`weight_bound`) is timed with its caches emptied before each call, as a training
  step calls it.
* ``"ours"``: the package's kernels for every call; ``"pytorch"``: PyTorch's wherever it can take
  the call.

While ``torch.use_deterministic_algorithms(True)`` is in force, ``"auto"`` times nothing and runs the
package's kernels (its choice where nothing is faster): a choice made on a timing could differ
between two runs of a program, and with it the bits of every gradient after it (PyTorch's and the
package's GEMMs sum in different orders). The choices made before are kept for when it is off again.

Only the first-order eager backward chooses (:func:`.ops._backward`); gradients of gradients
(``create_graph=True``) and traced calls run the package's operators, except where an eager
call's forward and every gradient it needs are PyTorch's (:func:`pytorchs`, :func:`.forward.pytorchs`):
that call runs as ``F.conv2d`` itself, every order of its gradient PyTorch's. PyTorch's cannot take the
call as the package does where an axis is padded differently on its two sides (the package's
``padding="same"`` with an even kernel) or the tensors are float64 (the package's sums in float32,
see :mod:`.ops`): those run the package's kernels in every mode.
"""

from __future__ import annotations

import functools
import itertools
import os
import statistics
from typing import Callable, Optional

import torch
import tvm

from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients
from ..schedule.cpu import weight_stream
from ..schedule.cpu.weight_stream import COLD_PIXELS, COLD_WEIGHT_BYTES
from . import remembered, settled
from .forward import elapsed_ms, wins

__all__ = ["COLD_PIXELS", "COLD_WEIGHT_BYTES", "EVICT_BYTES", "FUNCTION_MS", "GEMMS", "MARGIN", "MODES", "ROUNDS",
           "backward_choices", "get_backward", "gradients", "ours_throughout", "pytorch_gradients", "pytorchs", "set_backward",
           "weight_bound"]

MODES = ("auto", "ours", "pytorch")
GEMMS = ("dx", "dw")
MARGIN = 1.05
"""``"auto"`` runs PyTorch's GEMMs where the package's take at least this many times as long."""
FUNCTION_MS = 0.075
"""What a call costs more, forward and backward, through the drop-in's ``autograd.Function`` than as
``F.conv2d``'s own (:func:`pytorchs`): a 1x1 16 -> 16 layer on 8 x 4x4, hot, every convolution
PyTorch's, 87-92 against 15 us over stock's (Zen 4, 2026-12-03). ``"auto"`` credits PyTorch's
way of every needed GEMM with it where the layer's forward is ``F.conv2d`` too (that call then
runs as ``F.conv2d`` itself): a way of one GEMM each that wins by less would leave the layer
slower than stock's."""
EVICT_BYTES = 64 << 20
"""What is written before each timed call of a :func:`weight_bound` layer."""
ROUNDS = 7
"""Timed calls of each way (the package's GEMMs, PyTorch's, one of each), alternating, when
``"auto"`` meets a signature."""

_choices: dict[tuple[Conv2dGradients, str], bool] = {}
_blas: set[tuple[Conv2dGradients, tuple[bool, bool]]] = set()
"""The signatures (and needed gradients) whose PyTorch GEMMs ``"auto"`` runs as BLAS GEMMs (:mod:`.blas`)."""
_given_up: dict[tuple[Conv2dGradients, tuple[bool, bool]], frozenset] = {}
"""The GEMMs PyTorch's run, per signature and needed gradients, as the mode says: worked out once
(the choices above), looked up by every later call."""


def _check(mode: str, name: str = "mode") -> str:
    if mode not in MODES:
        raise ConvGradError("tvm_convgrad.torch.set_backward", name, mode, f"must be one of {list(MODES)}")
    return mode


_mode = _check(os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"), "TVM_CONVGRAD_BACKWARD")


def set_backward(mode: str) -> None:
    """``"auto"``, ``"ours"`` or ``"pytorch"`` (see the module docstring); forgets the choices made
    in this process (those kept on disk are recalled again: :func:`.remembered.forget` removes them)."""
    global _mode
    _mode = _check(mode)
    _choices.clear()
    _given_up.clear()
    _blas.clear()
    settled.reset()


def get_backward() -> str:
    """The current mode."""
    return _mode


def backward_choices() -> dict[tuple[Conv2dGradients, str], bool]:
    """``{(call, "dx" | "dw"): the package's kernel?}`` of the GEMMs ``"auto"`` has timed."""
    return dict(_choices)


def _mode_in_force() -> str:
    """The mode the calls run by: the set one, but ``"auto"`` under
    ``torch.use_deterministic_algorithms(True)`` is ``"ours"``, untimed (see the module docstring)."""
    return "ours" if _mode == "auto" and torch.are_deterministic_algorithms_enabled() else _mode


def _evenly_padded(pads) -> bool:
    """Whether ``pads = (top, bottom, left, right)`` pad each axis alike on both sides, as
    PyTorch's ``convolution_backward`` takes them."""
    top, bottom, left, right = pads
    return top == bottom and left == right


def pytorchs(call: Conv2dGradients, needs: tuple[bool, bool]) -> bool:
    """Whether the first-order backward of ``call``'s signature runs PyTorch's ``convolution_backward``
    for every gradient in ``needs`` (dX, dW) as the mode says: ``"pytorch"`` where PyTorch's can take the
    call, or ``"auto"`` having chosen it for each (not the BLAS way); True when none is needed."""
    if not any(needs):
        return True
    if not _evenly_padded(call.pads):
        return False
    mode = _mode_in_force()
    if mode == "pytorch":
        return True
    key = (call, needs)
    given_up = _given_up.get(key)
    return mode == "auto" and given_up is not None and len(given_up) == sum(needs) and key not in _blas


def ours_throughout(call: Conv2dGradients, needs: tuple[bool, bool]) -> bool:
    """Whether the first-order backward of ``call``'s signature runs the package's kernel for every
    gradient in ``needs``, settled without PyTorch's way at hand: ``"ours"``, or ``"auto"`` having
    chosen the package's for each before. The caller then runs the kernels as they are, without
    making PyTorch's way (:func:`pytorch_gradients`) or asking :func:`gradients`. Inside a step, where
    the interpreter's code and data come back from memory after each kernel, those two took 24 of the
    38 us of glue around a call's kernels (perf_counter checkpoints); the steps' medians moved 0.3-0.6%
    (MobileNetV2 channels-last f32 at 8 x 64x64, 50 calls a step, Zen 4, 2026-12-03)."""
    mode = _mode_in_force()
    if mode == "ours":
        return True
    given_up = _given_up.get((call, needs)) if mode == "auto" else None
    return given_up is not None and not given_up


def pytorch_gradients(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride, pads, dilation,
                      groups: int) -> Optional[Callable[[bool, bool], tuple]]:  # fmt: skip
    """PyTorch's gradients of the call as a function of which to compute, ``(dx, dw) -> (dX or None,
    dW or None)`` (one ``convolution_backward`` call), or None where it cannot take the call as the
    package does (see the module docstring).

    The tensors are read detached: ``convolution_backward`` of a tensor that requires grad costs
    ~13 us a call more, even with grad mode off (a 8 x 16 x 4x4 layer's, 104-109 against 117-125 us)."""
    if not _evenly_padded(pads) or input.dtype == torch.float64:
        return None
    top, _, left, _ = pads

    def gradients(dx: bool, dw: bool) -> tuple:
        grad_input, grad_weight, _ = torch.ops.aten.convolution_backward(
            grad_output.detach(), input.detach(), weight.detach(), None, list(stride), [top, left], list(dilation), False, [0, 0], groups,
            [dx, dw, False])  # fmt: skip
        return (grad_input if dx else None), (grad_weight if dw else None)

    return gradients


def _run(given_up: frozenset, needs: tuple[bool, bool], ours_dx: Callable[[], torch.Tensor], ours_dw: Callable[[], torch.Tensor],
         theirs: Optional[Callable[[bool, bool], tuple]], ours_both: Optional[Callable[[], tuple]] = None,
         ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:  # fmt: skip
    """The needed gradients: PyTorch's for the GEMMs in ``given_up`` (one call), the package's for the rest;
    dX the last made, so that the backward's next node reads it from cache. ``ours_both() -> (dX, dW)``:
    the package's two in one kernel (a depthwise or 1x1 layer's), where both are needed and none given up."""
    if ours_both is not None and not given_up and all(needs):
        return ours_both()
    grad_weight = ours_dw() if needs[1] and "dw" not in given_up else None
    theirs_dx, theirs_dw = theirs("dx" in given_up, "dw" in given_up) if given_up else (None, None)
    grad_input = ours_dx() if needs[0] and "dx" not in given_up else theirs_dx
    return grad_input, (theirs_dw if "dw" in given_up else grad_weight)


def weight_bound(call: Conv2dGradients) -> bool:
    """Whether ``call``'s GEMMs read more bytes of weights than they do work: at least
    :data:`COLD_WEIGHT_BYTES` of weights over at most :data:`COLD_PIXELS` output pixels (each weight
    is used twice per pixel). In a training step such a layer's weights come from memory, not from
    the cache a call timed again and again leaves them in: ResNet-18's 512 -> 512 3x3 on 2x2 maps
    at N=8, float32 (9.4 MB of weights, 32 pixels), the package's dX against PyTorch's 1.31 / 1.16
    ms hot, 2.24 / 1.66 with 64 MB written before each call, 2.84 in a step; timed hot, ``"auto"``
    had kept the package's in some processes and PyTorch's in others, the steps 1.10-1.14 against
    1.16-1.20 (Sapphire Rapids-class guest, 2026-12-05/06). (The rule is
    :func:`tvm_convgrad.schedule.cpu.weight_stream.weight_bound`'s, whose kernel streams such a
    float32 layer's weights for its dX.)"""
    n, _, ho, wo = call.y_shape
    o, i, kh, kw = call.w_shape
    return weight_stream.weight_bound(n * ho * wo, o * i * kh * kw * tvm.DataType(call.dtype).bits // 8)


def _timings(runs: dict[frozenset, Callable[[], object]], cold: bool = False) -> dict[frozenset, float]:
    """Each way of running the backward timed :data:`ROUNDS` times, the ways alternating: medians (ms);
    ``cold``: :data:`EVICT_BYTES` written before each timed call, the caches emptied of its tensors."""
    for run in runs.values():  # built and warm
        run()
    evict = torch.empty(EVICT_BYTES if cold else 0, dtype=torch.uint8)
    times: dict[frozenset, list[float]] = {given_up: [] for given_up in runs}
    for _ in range(ROUNDS):
        for given_up, run in runs.items():
            if cold:
                evict.fill_(1)
            times[given_up].append(elapsed_ms(run))
    return {given_up: statistics.median(t) for given_up, t in times.items()}


def _choose(needs: tuple[bool, bool], ours_dx, ours_dw, theirs, credit_ms: float = 0.0, ours_both=None,
            cold: bool = False) -> frozenset:  # fmt: skip
    """The GEMMs that run PyTorch's: every way timed whole (:func:`_timings`), the package's for all
    kept unless another way is :data:`MARGIN` faster -- in that timing and again in a second one
    of the two alone (a shared machine's speed swings within a second; a wrong switch to PyTorch's
    cost a ResNet-50 layer twice its time). PyTorch's way of every needed GEMM is timed
    ``credit_ms`` less (:data:`FUNCTION_MS`, where the call then runs as ``F.conv2d``); ``cold``: each
    timed call after the caches are emptied (:func:`_timings`)."""
    needed = [gemm for gemm, need in zip(GEMMS, needs) if need]
    ways = [frozenset(c) for r in range(len(needed) + 1) for c in itertools.combinations(needed, r)]
    runs = {given_up: functools.partial(_run, given_up, needs, ours_dx, ours_dw, theirs, ours_both) for given_up in ways}
    everything = frozenset(needed)

    def credited(medians: dict) -> dict:
        return {way: t - credit_ms if way == everything else t for way, t in medians.items()}

    medians = credited(_timings(runs, cold))
    fastest = min(medians, key=medians.get)
    if medians[frozenset()] < MARGIN * medians[fastest]:
        return frozenset()
    again = credited(_timings({frozenset(): runs[frozenset()], fastest: runs[fastest]}, cold))
    return fastest if again[frozenset()] >= MARGIN * again[fastest] else frozenset()


def gradients(call: Conv2dGradients, needs: tuple[bool, bool], ours_dx: Callable[[], torch.Tensor], ours_dw: Callable[[], torch.Tensor],
              theirs: Optional[Callable[[bool, bool], tuple]],
              theirs_blas: Optional[Callable[[], Callable[[bool, bool], tuple]]] = None, credit_ms: float = 0.0,
              ours_both: Optional[Callable[[], tuple]] = None,
              ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:  # fmt: skip
    """dX and dW of ``call`` (None where ``needs`` says not): each the package's (``ours_dx()``,
    ``ours_dw()``) or PyTorch's (``theirs``, see :func:`pytorch_gradients`) as the mode says,
    PyTorch's two in one call; in ``"auto"``, PyTorch's are its BLAS GEMMs (made by
    ``theirs_blas()``, a 1x1's or a weight-bound layer's, :mod:`.blas`: only where they are timed or chosen) where those win
    against ``theirs`` (:func:`.forward.wins`). ``credit_ms``: :func:`_choose`'s, for PyTorch's
    convolution (not its BLAS way). ``ours_both``: the package's two in one kernel (:func:`_run`)."""
    mode = _mode_in_force()
    if theirs is None or mode == "ours":
        return _run(frozenset(), needs, ours_dx, ours_dw, theirs, ours_both)
    key = (call, needs)
    given_up = _given_up.get(key)
    recalled = remembered.recall("backward", key) if given_up is None and mode == "auto" else None
    if recalled is not None and _recallable(recalled, needs):  # the choice an earlier process made
        given_up = _given_up[key] = frozenset(recalled["pytorch"])
        _keep(call, needs, given_up)
        if recalled["blas"] and theirs_blas is not None:
            _blas.add(key)
    if given_up is None:
        blas_way = theirs_blas() if theirs_blas is not None and mode == "auto" else None
        if blas_way is not None and wins(functools.partial(blas_way, *needs), functools.partial(theirs, *needs)):
            _blas.add(key)
    if key in _blas:
        theirs = theirs_blas()
    if given_up is None:
        given_up = _given_up[key] = _ways(call, needs, ours_dx, ours_dw, theirs, 0.0 if key in _blas else credit_ms, ours_both)
        if mode == "auto":
            remembered.remember("backward", key, {"pytorch": sorted(given_up), "blas": key in _blas})
    return _run(given_up, needs, ours_dx, ours_dw, theirs, ours_both)


def _keep(call: Conv2dGradients, needs: tuple[bool, bool], given_up: frozenset):
    """Record the choice of each GEMM of ``call`` in ``needs``: the package's unless in ``given_up``."""
    _choices.update({(call, gemm): gemm not in given_up for gemm, need in zip(GEMMS, needs) if need})


def _recallable(recalled, needs: tuple[bool, bool]) -> bool:
    """Whether a remembered backward choice has the form :func:`gradients` writes: PyTorch's GEMMs among
    those needed, and whether they run as BLAS GEMMs."""
    needed = {gemm for gemm, need in zip(GEMMS, needs) if need}
    return isinstance(recalled, dict) and isinstance(recalled.get("pytorch"), list) and set(recalled["pytorch"]) <= needed \
        and isinstance(recalled.get("blas"), bool)  # fmt: skip


def _ways(call: Conv2dGradients, needs: tuple[bool, bool], ours_dx, ours_dw, theirs, credit_ms: float = 0.0,
          ours_both=None) -> frozenset:  # fmt: skip
    """The GEMMs of ``call`` that run PyTorch's in the mode, ``"pytorch"`` or ``"auto"`` (chosen by
    timing the first time a GEMM is met, see :func:`_choose`; :func:`gradients` runs ``"ours"``)."""
    if _mode == "pytorch":
        return frozenset(gemm for gemm, need in zip(GEMMS, needs) if need)
    keys = [(call, gemm) for gemm, need in zip(GEMMS, needs) if need]
    if any(key not in _choices for key in keys):
        _keep(call, needs, _choose(needs, ours_dx, ours_dw, theirs, credit_ms, ours_both, weight_bound(call)))
    return frozenset(gemm for (_, gemm) in keys if not _choices[(call, gemm)])
