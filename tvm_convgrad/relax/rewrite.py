"""``ConvGradients``: a differentiated module's conv2d gradients rewritten onto the package's kernels.

Relax's own gradient of ``relax.nn.conv2d`` (``relax.op._op_gradient.conv2d_grad``, NCHW / OIHW
only, no dilation) emits, for ``y = conv2d(x, w)``:

* dX: ``conv2d_transpose(dy, w, strides, padding, output_padding, dilation, groups)`` (layouts
  NCHW / IOHW): exactly ``ConvolutionBackwardData(dy, w)`` of the forward convolution whose input
  has the transpose's output size;
* dW (groups = 1): ``conv2d(x, dy, strides=dilation, padding, dilation=strides)`` with
  ``data_layout="CNHW"``, ``kernel_layout="IOHW"``, ``out_layout="CNHW"``: the weight gradient of
  the forward convolution with ``KH' x KW'`` taps (its output's extent), which Relax then crops to
  the kernel with ``strided_slice``. The package's dW computes the same ``KH' x KW'`` taps.

:class:`ConvGradients` replaces each such call (anywhere in the module's Relax functions) by a
``call_tir`` of the operator scheduled for the target. A call whose geometry the operators reject,
and Relax's grouped dW (it reshapes x to a CNHW grouped convolution first), stay as they are.
"""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.target import Target

from ..compile import resolve_target
from ..errors import ConvGradError
from ..frontends import onednn
from .gradient import scheduled_func

__all__ = ["ConvGradients"]


def _static(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError:
        return None


def _pads(attrs) -> tuple[list[int], list[int]]:
    top, left, bottom, right = (int(p) for p in attrs.padding)
    return [top, left], [bottom, right]


def input_grad(call: relax.Call, target: Target) -> tuple[tvm.tirx.PrimFunc, relax.TensorType] | None:
    """The dX PrimFunc equal to a ``conv2d_transpose`` call (NCHW / IOHW), or None."""
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or attrs.data_layout)) != ("NCHW", "IOHW", "NCHW"):
        return None
    dy_shape, w_shape, out = _static(call.args[0]), _static(call.args[1]), _static(call)
    dtype = str(call.ty.dtype)
    if None in (dy_shape, w_shape, out) or dtype != str(call.args[0].ty.dtype):
        return None
    begin, end = _pads(attrs)
    dy = te.placeholder(dy_shape, dtype, name="diff_dst")
    w = te.placeholder(w_shape, dtype, name="weights")  # the transpose's IOHW is the forward's OIHW
    result = onednn.convolution_backward_data(
        dy, w, list(out), strides=[int(s) for s in attrs.strides], pads_begin=begin, pads_end=end,
        dilations=[int(d) for d in attrs.dilation], groups=int(attrs.groups), data_format="NCX", weights_format="OIX",
        kernel_name="conv2d_input_grad",
    )  # fmt: skip
    return scheduled_func(result, target), relax.TensorType(out, dtype)


def weight_grad(call: relax.Call, target: Target) -> tuple[tvm.tirx.PrimFunc, relax.TensorType] | None:
    """The dW PrimFunc equal to Relax's weight-gradient ``conv2d`` (CNHW / IOHW -> CNHW, groups 1), or None."""
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("CNHW", "IOHW", "CNHW") or int(attrs.groups) != 1:
        return None
    x_shape, dy_shape, out = _static(call.args[0]), _static(call.args[1]), _static(call)
    dtype = str(call.ty.dtype)
    if None in (x_shape, dy_shape, out) or len(out) != 4 or dtype != str(call.args[0].ty.dtype):
        return None
    begin, end = _pads(attrs)
    x = te.placeholder(x_shape, dtype, name="src")  # (N, C, H, W) read as CNHW: the forward's x
    dy = te.placeholder(dy_shape, dtype, name="diff_dst")  # (N, O, Ho, Wo) read as IOHW: the forward's dy
    result = onednn.convolution_backward_weights(
        x, dy, list(out), strides=[int(d) for d in attrs.dilation], pads_begin=begin, pads_end=end,
        dilations=[int(s) for s in attrs.strides], data_format="NCX", weights_format="OIX", kernel_name="conv2d_weight_grad",
    )  # fmt: skip
    return scheduled_func(result, target), relax.TensorType(out, dtype)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, target: Target):
        super().__init__(mod)
        self.mod_ = mod
        self.target = target
        self.ops = {tvm.ir.Op.get("relax.nn.conv2d_transpose"): input_grad, tvm.ir.Op.get("relax.nn.conv2d"): weight_grad}
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        rule = self.ops.get(call.op) if isinstance(call.op, tvm.ir.Op) else None
        if rule is None:
            return call
        try:
            found = rule(call, self.target)
        except ConvGradError:  # a geometry the operators do not take: Relax's own op stays
            return call
        if found is None:
            return call
        func, ty = found
        name = "conv2d_input_grad" if rule is input_grad else "conv2d_weight_grad"
        self.rewritten += 1
        return relax.call_tir(self.builder_.add_func(func, name), list(call.args), ty)

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod_.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="tvm_convgrad.ConvGradients")
class ConvGradients:
    """Rewrite the conv2d gradients Relax's ``Gradient`` pass emitted (see the module docstring)
    into ``call_tir`` of the package's kernels scheduled for ``target``; run it after
    ``relax.transform.Gradient`` and before ``LegalizeOps``. ``last_count`` is how many calls the
    last run rewrote."""

    def __init__(self, target: str | dict | Target = "llvm"):
        self.target = resolve_target(target)
        self.last_count = 0

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Rewriter(mod, self.target)
        mod = rewriter.run()
        self.last_count = rewriter.rewritten
        return mod
