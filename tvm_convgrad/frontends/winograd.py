"""The forward, the stride-1 dX and the dW by Winograd's F(2x2, 3x3) (:mod:`tvm_convgrad.dsl.compute.winograd`)
on a framework operator's tensors, read and written where they lie (NCX / NXC activations, OIX /
XIO / OXI weights).

An operator asks for it with its ``algorithm`` (oneDNN's ``convolution_direct``,
``convolution_winograd``, ``convolution_auto``):

* ``"direct"`` (the default): the cube;
* ``"winograd"``: F(2x2, 3x3), a :class:`~tvm_convgrad.errors.ConvGradError` where it does not
  apply (:func:`~tvm_convgrad.dsl.compute.winograd.winograd_applies`);
* ``"auto"``: F(2x2, 3x3) where it applies and pays (:func:`~tvm_convgrad.dsl.compute.winograd_rules.winograd_pays`)
  on the target the kernel is for (the one in scope, ``with target:``, else this CPU: ``"llvm"``),
  else the cube: what the training clients run. A bf16 one where the target would run it on the
  exact path (:func:`exact_bf16`), its sums in fp32 as there.
"""

from __future__ import annotations

from typing import Sequence

from tvm import te
from tvm.target import Target

from ..compile.target import resolve_target
from ..dsl.compute.stages import WINO_WT
from ..dsl.compute.winograd import forward_shape, input_grad_shape, output_index, weight_index, winograd_applies, winograd_conv, winograd_filter_grad
from ..dsl.compute.winograd_rules import paired_winograd_pays, winograd_pays
from ..errors import ConvGradError
from ..isa import isa_plan
from ..params.framework import ConvView, split_weights, weights_index
from ..params.onednn import algorithm_choice

__all__ = ["exact_bf16", "paired_winograd", "use_winograd", "winograd_data_grad", "winograd_filter_grad_result", "winograd_forward"]


def use_winograd(op: str, algorithm: str, view: ConvView, input_grad: bool = False, post_ops: Sequence = (), filter_grad: bool = False,
                 planar: bool = False, pairs: bool = False) -> bool:  # fmt: skip
    """Whether the forward (``input_grad``: the dX; ``filter_grad``: the dW) of ``view`` runs as
    F(2x2, 3x3) for ``algorithm`` (a forward with ``post_ops`` keeps the cube; ``planar``: the
    activations are channel-planar, NCX); ``pairs``: whether a bf16 forward's, dX's or dW's pair
    form does (:func:`paired_winograd`)."""
    if pairs:
        return paired_winograd(op, algorithm, view, input_grad, post_ops, filter_grad)
    algorithm = algorithm_choice(op, algorithm)
    if algorithm == "direct" or view.rank != 2 or post_ops:
        if algorithm == "winograd":
            raise ConvGradError(op, "algorithm", algorithm, "needs 2 spatial axes and no post-ops")
        return False
    geom = view.geometry()
    applies = winograd_applies(geom, view.dtype, input_grad)
    if algorithm == "winograd" and not applies:
        raise ConvGradError(op, "algorithm", algorithm, "applies to float32 or bfloat16 3x3 convolutions at stride 1 without dilation or "
                            "groups, pads of at most 2, whole 16-channel blocks and an output of at least 2 x 2")  # fmt: skip
    if not applies or algorithm == "winograd":
        return applies
    plan = _cpu_plan()
    if view.dtype != "float32" and not exact_bf16(plan, input_grad or filter_grad):
        return False
    return winograd_pays(geom, input_grad, filter_grad, plan is not None and plan.registers_per_row > 1, planar)


def paired_winograd(op: str, algorithm: str, view: ConvView, input_grad: bool = False, post_ops: Sequence = (), filter_grad: bool = False) -> bool:
    """Whether the bf16-pair form of a bf16 forward, dX (``input_grad``) or dW (``filter_grad``) of
    ``view`` runs as F(2x2, 3x3) with its GEMMs on bf16 pairs (:func:`~tvm_convgrad.dsl.compute.winograd.winograd_conv`'s
    ``pairs``): for ``"auto"`` where it applies and pays on AVX-512 (:func:`~tvm_convgrad.dsl.compute.winograd_rules.paired_winograd_pays`).
    ``"winograd"`` keeps its exact form (the transforms and sums in fp32, no operand rounded):
    the pair form rounds the transformed tiles and weights to bf16 (see the module docstring of
    :mod:`tvm_convgrad.dsl.compute.winograd`), which only ``"auto"`` trades for speed."""
    if algorithm_choice(op, algorithm) != "auto" or view.rank != 2 or post_ops or view.dtype != "bfloat16":
        return False
    geom = view.geometry()
    return winograd_applies(geom, view.dtype, input_grad) and paired_winograd_pays(geom, input_grad, filter_grad)


def exact_bf16(plan, gradient: bool) -> bool:
    """Whether a CPU of ``plan`` runs a bf16 forward (``gradient``: dX or dW) on the exact path
    (bf16 widened to fp32, fp32 FMAs), which F(2x2, 3x3) replaces by choice: not where
    ``vdpbf16ps`` pays (Zen 4/5: the bf16-pair form) nor a gradient on AMX tiles (3-11x
    ``vdpbf16ps`` there). An Emerald Rapids guest (2 cores, 2026-12-02), bf16 NCHW, F(2x2, 3x3) against the
    exact cube, forward / dX: 64 -> 64 on 28x28 N=32 9.9 / 9.5 against 15.6 / 13.7 ms (PyTorch's
    22.9 / 22.8), 128 on 14x14 5.5 / 5.5 against 10.0 / 10.8, 256 on 7x7 7.4 / 7.0 against 10.6 / 12.2."""
    return plan is not None and not plan.bf16_dot_pays and not (gradient and plan.amx_bf16)


def _cpu_plan():
    """The ISA plan of the target in scope (else this CPU's) where it is a CPU, else None: fewer
    layers gain from F(2x2, 3x3) where its 16-lane rows take several vector registers (AVX2, SSE,
    NEON)."""
    target = Target.current(allow_none=True) or resolve_target("llvm")
    return isa_plan(target) if target.kind.name == "llvm" else None


def _activation(tensor: te.Tensor, data_format: str):
    """``(n, c, row, col) -> value`` of an NCX / NXC activation, as fp32."""
    if data_format == "NCX":
        return lambda n, c, r, col: tensor[n, c, r, col].astype("float32")
    return lambda n, c, r, col: tensor[n, r, col, c].astype("float32")


def _lanes_last(w_at, lanes: int, others: int, staged: bool):
    """``w_at(lane, other, kh, kw)`` (``lane``: the channel ``wino_u`` puts on its 16 lanes) as it
    is, or where the layout's contiguous axis is the other channel (``staged``: an OXI forward, an
    XIO dX) a read of the copy ``wino_wt (others, 3, 3, lanes)`` made tap by tap before: a vector
    of ``wino_u`` would gather its 16 lanes from 16 rows per tap, 9 x 16 lines live per channel,
    which at 256 channels and more fall into 2-4 L1 sets (Emerald Rapids, the OXI forward against
    the staged one: 256 -> 256 on 14x14 N=4 5.70 -> 4.22 ms, N=8 9.32 -> 7.89, 7x7 N=32 11.05 ->
    9.65; an OIX layout, its taps contiguous, gathers without that and keeps its reads)."""
    if not staged:
        return w_at
    copy = te.compute((others, 3, 3, lanes), lambda other, kh, kw, lane: w_at(lane, other, kh, kw), name=WINO_WT)
    return lambda lane, other, kh, kw: copy[other, kh, kw, lane]


def _result(y5: te.Tensor, shape: Sequence[int], data_format: str, dtype: str, name: str, attrs: dict) -> te.Tensor:
    """The result in ``data_format`` of ``shape``: each value ``wino_y``'s at its tile, in ``dtype``."""

    def value(*index):
        n, c, r, col = (index[0], index[1], index[2], index[3]) if data_format == "NCX" else (index[0], index[3], index[1], index[2])
        return y5[output_index(n, r, col, c)].astype(dtype)

    return te.compute(tuple(shape), value, name=name, attrs=attrs)


def winograd_forward(src: te.Tensor, weights: te.Tensor, bias: te.Tensor | None, view: ConvView, data_format: str, weights_format: str,
                     shape, name: str, attrs: dict, pairs: bool = False) -> te.Tensor:  # fmt: skip
    """``dst`` of the forward, of ``shape`` in ``data_format``, by F(2x2, 3x3) (``pairs``: its GEMMs
    on bf16 pairs)."""

    def w_at(co, ci, kh, kw):
        return weights[weights_index(weights_format, co, ci, (kh, kw))].astype("float32")

    geom = view.geometry()
    bias_at = None if bias is None else (lambda co: bias[co].astype("float32"))
    w_at = _lanes_last(w_at, geom.cout, geom.cin, weights_format == "OXI")  # (Cout on the lanes, Cin contiguous)
    y5 = winograd_conv(_activation(src, data_format), w_at, forward_shape(geom), bias_at, planar=data_format == "NCX", pairs=pairs)
    return _result(y5, shape, data_format, view.dtype, name, attrs)


def winograd_data_grad(dy: te.Tensor, weights: te.Tensor, view: ConvView, data_format: str, weights_format: str, shape, name: str,
                       attrs: dict, pairs: bool = False) -> te.Tensor:  # fmt: skip
    """``diff_src`` of the stride-1 dX, of ``shape`` in ``data_format``, by F(2x2, 3x3): the
    convolution of dy with the weight rotated 180 degrees, its channels transposed (``pairs``: its
    GEMMs on bf16 pairs)."""

    def w_at(ci, co, kh, kw):  # (the dX's output channel is the forward's input channel)
        return weights[weights_index(weights_format, co, ci, (2 - kh, 2 - kw))].astype("float32")

    geom = view.geometry()
    w_at = _lanes_last(w_at, geom.cin, geom.cout, weights_format == "XIO")  # (Cin on the lanes, Cout contiguous)
    y5 = winograd_conv(_activation(dy, data_format), w_at, input_grad_shape(geom), planar=data_format == "NCX", pairs=pairs)
    return _result(y5, shape, data_format, view.dtype, name, attrs)


def winograd_filter_grad_result(x: te.Tensor, dy: te.Tensor, view: ConvView, data_format: str, weights_format: str, shape, name: str,
                                attrs: dict, dtype: str | None = None, pairs: bool = False) -> te.Tensor:  # fmt: skip
    """The weight gradient of ``shape`` in ``weights_format`` by F(2x2, 3x3) transposed
    (:func:`~tvm_convgrad.dsl.compute.winograd.winograd_filter_grad`), rounded once to ``dtype``
    (None: the inputs' type; a bf16 call's ``"float32"``: its sums unrounded)."""
    w = winograd_filter_grad(_activation(x, data_format), _activation(dy, data_format), forward_shape(view.geometry()), data_format == "NCX", pairs)

    def value(*index):
        o, i, (kh, kw) = split_weights(index, weights_format)
        return w[weight_index(o, i, kh, kw)].astype(dtype or view.dtype)

    return te.compute(tuple(shape), value, name=name, attrs=attrs)
