"""Run a kernel on random data and compare every output element with the float64 reference.

Used by the command line (``demo``, ``run``) and the tests. Inputs are drawn uniformly from
[-1, 1] and rounded to the kernel's input dtype; the reference sees the rounded values, so the
only differences are the kernel's fp32 accumulation and the final rounding to ``res_dtype``:

    |result - reference| <= 4 * K * 2**-24  +  eps(res_dtype) * |reference|

with ``K`` the reduction length (each product is at most 1 in magnitude). A wrong index gives
errors of the order of the values themselves, far above that bound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from .. import layout, reference
from ..compile import ArgSpec, Kernel, numpy_dtype
from ..dsl.compute.depthwise import depthwise
from ..params import FILTER_OP, FORWARD_OP, ConvGradParams
from ..params.framework import DATA_GRADIENTS, FrameworkCall

__all__ = ["Check", "Inputs", "check_kernel", "error_bound", "expected_result", "framework_expected", "kernel_arrays", "random_inputs"]

_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


@dataclass(frozen=True)
class Inputs:
    """Random NCHW / OIHW inputs of one gradient (already rounded to the input dtype)."""

    x: np.ndarray  # (N, Cin, H, W)        dW and the forward
    dy: np.ndarray  # (N, Cout, Ho, Wo)     the gradients
    w: np.ndarray  # (Cout, Cin_g, KH, KW)  dX and the forward
    bias: np.ndarray | None  # (Cin,)      dX with tensor_bias; the forward's (Cout,)


def random_inputs(params: ConvGradParams, seed: int = 0, bias: ArgSpec | None = None) -> Inputs:
    """Uniform [-1, 1] inputs; ``bias`` is the kernel's ``tensor_bias`` argument, if it has one."""
    g = params.geom
    rng = np.random.default_rng(seed)

    def draw(shape, dtype=params.in_dtype):
        return rng.uniform(-1.0, 1.0, shape).astype(dtype)

    bias_array = draw(bias.shape, bias.dtype) if bias is not None else None
    return Inputs(draw(g.input_sizes), draw(g.output_sizes), draw(g.filter_sizes), bias_array)


def kernel_arrays(params: ConvGradParams, inputs: Inputs) -> list[np.ndarray]:
    """The kernel's input arrays (TBE layouts, argument order) for NCHW / OIHW ``inputs``."""
    if params.op == FILTER_OP:
        return [layout.nchw_to_5hd(inputs.x), layout.nchw_to_5hd(inputs.dy)]
    if params.op == FORWARD_OP:
        arrays = [layout.nchw_to_5hd(inputs.x), layout.oihw_to_fracz(inputs.w, params.geom.groups)]
        return arrays + ([inputs.bias] if inputs.bias is not None else [])
    arrays = [layout.oihw_to_fracz(inputs.w, params.geom.groups), layout.nchw_to_5hd(inputs.dy)]
    return arrays + ([inputs.bias] if inputs.bias is not None else [])


def expected_result(params: ConvGradParams, inputs: Inputs) -> np.ndarray:
    """The whole TBE-layout result in float64 (dW: every block entry, but 0 off the own-group
    entries on the depthwise path; dX: pad channels = 0)."""
    g = params.geom
    if params.op == FILTER_OP:
        dw = reference.conv2d_backprop_filter_tbe(inputs.x, inputs.dy, g.filter_sizes, g.strides, g.pads, g.dilations, g.groups)
        if depthwise(params):  # the depthwise path writes 0 for TBE's cross-slot entries
            dw = dw * reference.own_group_entries(g.filter_sizes, g.groups)
        return dw
    if params.op == FORWARD_OP:
        bias = None if inputs.bias is None else inputs.bias[: g.cout]
        y = reference.conv_forward_nd(inputs.x, inputs.w, g.strides, g.pads[::2], g.dilations, g.groups, g.pads[1::2], bias)
        return layout.nchw_to_5hd(y).reshape(g.batch, -1, g.ho * g.wo, layout.C0)
    dx = reference.conv2d_backprop_input(inputs.w, inputs.dy, (g.h, g.w), g.strides, g.pads, g.dilations, g.groups)
    if inputs.bias is not None:
        dx = dx + inputs.bias[: g.cin].astype(np.float64)[None, :, None, None]
    return layout.nchw_to_5hd(dx).reshape(layout.shape_dx_result(g.input_sizes))


def reduction_length(params: ConvGradParams) -> int:
    g = params.geom
    if params.op == FILTER_OP:
        return g.batch * g.ho * g.wo * (g.depth.out if g.depth else 1)
    if params.op == FORWARD_OP:
        return g.group.cin1_g * 16 * g.kd * g.kh * g.kw + 1
    return g.group.cout1_g * 16 * g.kd * g.kh * g.kw + 1


def error_bound(params: ConvGradParams, expected: np.ndarray, res_dtype: str | None = None) -> np.ndarray:
    """Elementwise allowed ``|result - expected|``: fp32 accumulation (and fp32 products of
    float32 inputs) plus rounding to ``res_dtype`` (default: the compute's; a framework
    operator's result is in its type T)."""
    return 4 * reduction_length(params) * 2.0**-24 + _EPS[res_dtype or params.res_dtype] * np.abs(expected)


@dataclass(frozen=True)
class Check:
    """Outcome of :func:`check_kernel`."""

    max_abs_error: float
    max_abs_reference: float
    worst_ratio: float  # max over elements of |error| / allowed error; <= 1 passes
    result: np.ndarray
    expected: np.ndarray
    unwritten: int = 0  # result elements still NaN: the kernel never wrote them (see _run_poisoned)

    @property
    def ok(self) -> bool:
        return self.worst_ratio <= 1.0  # (False where an element is NaN)

    @property
    def relative_error(self) -> float:
        """max |error| / max |reference|."""
        return self.max_abs_error / max(self.max_abs_reference, 1e-30)

    def __str__(self) -> str:
        rel = self.relative_error
        verdict = "OK" if self.ok else f"MISMATCH, {self.unwritten} elements unwritten" if self.unwritten else "MISMATCH"
        return f"max |error| {self.max_abs_error:.3g} (relative {rel:.2g}, {self.worst_ratio:.2g} of the bound): {verdict}"


def framework_expected(call: FrameworkCall, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The float64 result of a framework operator's call on its input ``arrays`` (its own layouts,
    argument order), from the references written from ``framework_ops/*.md``."""
    first, second = (np.asarray(a, dtype=np.float64) for a in arrays[:2])
    if call.op == "DeconvGradFilter":
        return reference.deconv_grad_filter(first, second, call.dsp_params)
    v = call.view
    if call.op == "Convolution":  # (src, weights[, bias], *post-ops' src1) -> dst
        x, w = reference.from_data_format(first, call.data_format), reference.from_weights_format(second, call.weights_format)
        bias = np.asarray(arrays[2], dtype=np.float64) if call.bias else None
        y = reference.conv_forward_nd(x, w, v.strides, v.pads_begin, v.dilations, v.groups, v.pads_end, bias)
        return reference.post_ops(reference.to_data_format(y, call.data_format), _post_ops(call, arrays))
    if call.op in DATA_GRADIENTS:  # (diff_dst, weights) -> diff_src
        dy, w = reference.from_data_format(first, call.data_format), reference.from_weights_format(second, call.weights_format)
        dx = reference.conv_backward_data_nd(dy, w, v.spatial_in, v.strides, v.pads_begin, v.dilations, v.groups)
        return reference.to_data_format(dx, call.data_format)
    first, second = reference.from_data_format(first, call.data_format), reference.from_data_format(second, call.data_format)
    gradient = reference.conv_transpose_backward_weights if call.op == "ConvTransposeBackwardWeights" else reference.conv_backprop_filter_nd
    return reference.to_weights_format(gradient(first, second, v.kernel, v.strides, v.pads_begin, v.dilations, v.groups), call.weights_format)


def _post_ops(call: FrameworkCall, arrays: Sequence[np.ndarray]) -> list[tuple]:
    """A Convolution's post-ops as :func:`reference.post_ops` takes them: each binary one's
    ``src1`` from the kernel's inputs after ``(src, weights[, bias])``, in order."""
    src1 = iter(arrays[2 + call.bias :])
    return [(p.alg, p.alpha, p.beta, next(src1) if p.is_binary else None) for p in call.post_ops]


def post_op_bound(call: FrameworkCall, arrays: Sequence[np.ndarray], params: ConvGradParams, dtype: str) -> np.ndarray:
    """The allowed error of a Convolution with post-ops: the fp32 sums' bound carried through
    them (how far the post-ops' result moves when every sum moves by its bound either way: a
    ``div`` by a small ``src1`` magnifies it, a ``mul`` or a ``logistic`` shrinks it), each
    post-op's fp32 rounding, and the result's one rounding to ``dtype``."""
    sums = framework_expected(replace(call, post_ops=()), arrays[: 2 + call.bias])
    ops = _post_ops(call, arrays)
    result = reference.post_ops(sums, ops)
    moved = 4 * reduction_length(params) * 2.0**-24 + 2.0**-24 * np.abs(sums)
    moved = np.maximum(np.abs(reference.post_ops(sums + moved, ops) - result), np.abs(reference.post_ops(sums - moved, ops) - result))
    return 2 * moved + len(ops) * 2.0**-22 * (np.abs(result) + np.abs(sums)) + _EPS[dtype] * np.abs(result)


def _run_poisoned(kernel: Kernel, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``kernel``'s result on ``arrays``, written over a result array of NaNs: an element the
    kernel leaves unwritten (a pad it should zero) fails the check, where a fresh zeroed page would hide it."""
    poison = np.full(kernel.output.shape, np.nan, dtype=numpy_dtype(kernel.output.dtype))
    return kernel(*arrays, out=poison).numpy()


def check_kernel(kernel: Kernel, seed: int = 0) -> Check:
    """Run ``kernel`` on random inputs and compare it with the float64 reference, elementwise.

    A TBE kernel gets NCHW / OIHW inputs packed into its layouts and the reference of its whole
    TBE-layout result; a framework operator's kernel (``kernel.call``) inputs in its own layouts
    and the reference of its operator, the bound of fp32 sums rounded once to its type."""
    params = kernel.params
    if kernel.call is not None:
        rng = np.random.default_rng(seed)
        arrays = [rng.uniform(-1.0, 1.0, a.shape).astype(numpy_dtype(a.dtype)) for a in kernel.inputs]
        result = _run_poisoned(kernel, arrays)
        expected = framework_expected(kernel.call, arrays)
        if kernel.call.post_ops:
            bound = post_op_bound(kernel.call, arrays, params, kernel.output.dtype)
        else:
            bound = error_bound(params, expected, kernel.output.dtype)
    else:
        inputs = random_inputs(params, seed, kernel.inputs[2] if len(kernel.inputs) > 2 else None)
        result = _run_poisoned(kernel, kernel_arrays(params, inputs))
        expected = expected_result(params, inputs)
        bound = error_bound(params, expected)
    if result.shape != expected.shape:
        raise AssertionError(f"{kernel.name}: result shape {result.shape} != the reference's {expected.shape}")
    error = np.abs(result.astype(np.float64) - expected)
    ratio = error / bound
    return Check(float(error.max()), float(np.abs(expected).max()), float(ratio.max()), result, expected, int(np.isnan(result).sum()))
