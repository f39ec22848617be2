"""The gradient of ``relax.nn.conv2d`` on the package's kernels, for Relax's ``Gradient`` pass.

:func:`conv2d_gradient` is a Relax primal-gradient function (the ``FPrimalGradient`` attribute of
``relax.nn.conv2d``): for a call ``y = conv2d(x, w)`` and its output's adjoint ``dy`` it returns
``[dx, dw]`` as ``call_tir`` of two PrimFuncs added to the module being differentiated, each the
package's operator scheduled for the target:

* ``dx``: ``ConvolutionBackwardData(dy, w)`` (the dX cube: stride phases, no multiply by inserted
  zeros; dilation, asymmetric pads, groups and depthwise as the forward has them);
* ``dw``: ``ConvolutionBackwardWeights(x, dy)`` (the dW cube; only the taps the kernel has).

Layouts: NCHW and NHWC activations and OIHW and HWIO weights are read and written in place (the
layout stages of the operators, inlined into the kernels' packs); any other permutation of those
letters is permuted to NCHW / OIHW with ``relax.op.permute_dims`` around them. Types: float32,
float16, bfloat16 (a different ``out_dtype``: dy is cast to the inputs' type); for other types
(float64) the call keeps Relax's own gradient. :func:`conv2d_gradients` installs the function for
the duration of a ``with`` block.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import tvm
from tvm import relax, te
from tvm.target import Target

from ..compile import lower, resolve_target
from ..errors import ConvGradError
from ..frontends.conv2d import Conv2dGradients

__all__ = [
    "SCHEDULED", "Conv2dCall", "algorithm_for", "conv2d_gradient", "conv2d_gradients", "gradient_funcs", "permute", "primal_gradient", "relu_gradient",
    "relu_gradients", "scheduled_func",
]  # fmt: skip

OP = "relax.nn.conv2d"
SCHEDULED = "tirx.is_scheduled"
DTYPES = ("float32", "float16", "bfloat16")
_NATIVE_DATA = {"NCHW": "NCX", "NHWC": "NXC"}
_NATIVE_KERNEL = {"OIHW": "OIX", "HWIO": "XIO", "OHWI": "OXI"}
_RELAX_KERNEL = {fmt: layout for layout, fmt in _NATIVE_KERNEL.items()}


@dataclass(frozen=True)
class Conv2dCall:
    """A ``relax.nn.conv2d`` call: its gradients in the operators' terms (the nearest native layouts:
    NCHW / NHWC activations, OIHW / HWIO / OHWI weights) and the layouts its own tensors are in."""

    gradients: Conv2dGradients
    data_layout: str
    kernel_layout: str

    @classmethod
    def of(cls, call: relax.Call) -> "Conv2dCall":
        attrs = call.attrs
        x, w = call.args
        x_shape = _shape(x, "data")
        w_shape = _shape(w, "weight")
        data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
        for name, layout, letters in (("data_layout", data_layout, "NCHW"), ("kernel_layout", kernel_layout, "OIHW")):
            if sorted(layout) != sorted(letters):
                raise ConvGradError(OP, name, layout, f"must be a permutation of {letters} (packed layouts have no gradient here)")
        top, left, bottom, right = (int(p) for p in attrs.padding)
        gradients = Conv2dGradients(
            tuple(x_shape[data_layout.index(c)] for c in "NCHW"), tuple(w_shape[kernel_layout.index(c)] for c in "OIHW"),
            tuple(int(s) for s in attrs.strides), (top, bottom, left, right), tuple(int(d) for d in attrs.dilation), int(attrs.groups),
            str(x.ty.dtype), _NATIVE_DATA.get(data_layout, "NCX"), _NATIVE_KERNEL.get(kernel_layout, "OIX"),
        )  # fmt: skip
        return cls(gradients, data_layout, kernel_layout)

    @property
    def native_layouts(self) -> tuple[str, str]:
        """The Relax spelling of the layouts the kernels read: ``(NCHW | NHWC, OIHW | HWIO | OHWI)``."""
        g = self.gradients
        return ("NHWC" if g.data_format == "NXC" else "NCHW"), _RELAX_KERNEL[g.weights_format]


def _shape(expr: relax.Expr, name: str) -> tuple[int, ...]:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or ty.ndim != 4:
        raise ConvGradError(OP, f"{name} shape", ty, "must be a 4-D tensor of known shape")
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError:
        raise ConvGradError(OP, f"{name} shape", ty.shape, "must be static (symbolic shapes are not supported)") from None


def gradient_funcs(gradients: Conv2dGradients, target: Target) -> tuple[tvm.tirx.PrimFunc, tvm.tirx.PrimFunc]:
    """``(dx, dw)``: the two operators' PrimFuncs, scheduled for ``target`` (dX takes ``(dy, w)``,
    dW ``(x, dy)``, in the gradients' layouts; ``"auto"`` chooses for ``target``, the one in scope)."""
    algorithm = algorithm_for(target)
    with target:
        dx, dw = gradients.input_grad(algorithm=algorithm), gradients.weight_grad(algorithm=algorithm)
    return scheduled_func(dx, target), scheduled_func(dw, target)


def algorithm_for(target: Target) -> str:
    """The algorithm of the forward, dX and dW on ``target``: ``"auto"`` (Winograd where it pays) on a CPU,
    the cube's ``"direct"`` elsewhere (the Winograd mad has a CPU schedule only)."""
    return "auto" if target.kind.name == "llvm" else "direct"


def scheduled_func(result: te.Tensor, target: Target) -> tvm.tirx.PrimFunc:
    """The operator's PrimFunc scheduled for ``target``, ready for a Relax module (``call_tir``):
    no global symbol of its own, marked scheduled (no later pass reschedules it)."""
    mod = lower(result, target)
    (func,) = mod.functions.values()
    return func.without_attr("global_symbol").with_attr(SCHEDULED, True)


def permute(expr: relax.Expr, source: str, dest: str) -> relax.Expr:
    """``expr`` (in layout ``source``, e.g. ``"NHWC"``) in layout ``dest`` (itself when they are the same)."""
    return expr if source == dest else relax.op.permute_dims(expr, [source.index(c) for c in dest])


def conv2d_gradient(target: str | dict | Target = "llvm", fallback=None):
    """The primal-gradient function of ``relax.nn.conv2d`` on the package's kernels for ``target``;
    ``fallback`` (Relax's own) takes the calls of other types."""
    target = resolve_target(target)

    def gradient(orig_var: relax.Var, orig_call: relax.Call, output_grad: relax.Var, ctx: relax.BlockBuilder) -> list[relax.Expr]:
        x, w = orig_call.args
        if str(x.ty.dtype) not in DTYPES and fallback is not None:
            return fallback(orig_var, orig_call, output_grad, ctx)
        call = Conv2dCall.of(orig_call)
        g = call.gradients
        if g.dtype not in DTYPES:
            raise ConvGradError(OP, "data dtype", g.dtype, f"must be one of {list(DTYPES)}")
        dx_func, dw_func = gradient_funcs(g, target)
        native_data, native_kernel = call.native_layouts
        out_layout = str(orig_call.attrs.out_layout) or call.data_layout
        dy = permute(output_grad, out_layout, native_data)
        if str(output_grad.ty.dtype) != g.dtype:
            dy = relax.op.astype(dy, g.dtype)
        x_native, w_native = permute(x, call.data_layout, native_data), permute(w, call.kernel_layout, native_kernel)
        dx = relax.call_tir(ctx.add_func(dx_func, "conv2d_input_grad"), [dy, w_native], relax.TensorType(g.activation(g.x_shape), g.dtype))
        dw = relax.call_tir(ctx.add_func(dw_func, "conv2d_weight_grad"), [x_native, dy], relax.TensorType(g.weights(), g.dtype))
        return [permute(dx, native_data, call.data_layout), permute(dw, native_kernel, call.kernel_layout)]

    return gradient


@contextlib.contextmanager
def primal_gradient(op_name: str, make):
    """Within the block, Relax's ``Gradient`` pass differentiates ``op_name`` with ``make(own)``
    (``own``: Relax's gradient of it, or None); Relax's own is restored on exit."""
    op = tvm.ir.Op.get(op_name)
    own = op.get_attr("FPrimalGradient")
    op.reset_attr("FPrimalGradient")
    tvm.ir.register_op_attr(op_name, "FPrimalGradient", make(own))
    try:
        yield
    finally:
        op.reset_attr("FPrimalGradient")
        if own is not None:
            tvm.ir.register_op_attr(op_name, "FPrimalGradient", own)


def conv2d_gradients(target: str | dict | Target = "llvm"):
    """Within the ``with`` block, Relax's ``Gradient`` pass differentiates ``relax.nn.conv2d`` with
    :func:`conv2d_gradient` for ``target``; Relax's own gradient is restored on exit."""
    return primal_gradient(OP, lambda own: conv2d_gradient(target, fallback=own))


def relu_gradient(orig_var: relax.Var, orig_call: relax.Call, output_grad: relax.Var, ctx: relax.BlockBuilder) -> list[relax.Expr]:
    """ReLU's gradient read from its output, as PyTorch's ``threshold_backward``: ``where(y > 0,
    dy, 0)``. Relax's own reads the input (``where(x < 0, 0, dy)``: the same but at ``x == 0``,
    where PyTorch's is 0), so the input is read twice and the ReLU cannot join the convolution
    before it (:class:`~tvm_convgrad.relax.ScheduleConvs`); read from the output, it can."""
    zero = relax.const(0, str(orig_var.ty.dtype))
    return [relax.op.where(relax.op.greater(orig_var, zero), output_grad, zero)]


def relu_gradients():
    """Within the ``with`` block, ``relax.nn.relu`` is differentiated by :func:`relu_gradient`."""
    return primal_gradient("relax.nn.relu", lambda own: relu_gradient)
