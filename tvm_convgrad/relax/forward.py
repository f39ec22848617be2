"""``ScheduleConvs``: every ``relax.nn.conv2d`` of a module on the package's forward kernel, and a CPU
schedule for the module's other PrimFuncs.

:class:`ScheduleConvs` replaces each ``relax.nn.conv2d`` call (in any Relax function of the module:
an inference module's ``main``, a trainer's ``backbone`` / ``backbone_loss`` / adjoint) by a
``call_tir`` of oneDNN's ``Convolution`` on the cube (:func:`tvm_convgrad.frontends.onednn.convolution`)
scheduled for the target: NCHW / NHWC activations and OIHW / HWIO weights read in place, other
permutations permuted around it, float32 / float16 / bfloat16 (another ``out_dtype`` cast after).
Calls of other types or geometries the operator does not take keep Relax's own conv2d.

:class:`ScheduleLoops` gives every PrimFunc that is not scheduled yet (what ``LegalizeOps`` made of
the elementwise, broadcast and reduction ops around the convolutions) the CPU rule of
:mod:`tvm_convgrad.schedule.cpu.generic`: parallel outer loops, vectorized inner ones.

    >>> mod = tvm_convgrad.relax.ScheduleConvs("llvm")(mod)          # before LegalizeOps
    >>> mod = relax.transform.LegalizeOps()(mod)
    >>> mod = tvm_convgrad.relax.ScheduleLoops("llvm")(mod)          # the rest
    >>> ex = tvm.compile(mod, "llvm")
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.s_tir import dlight
from tvm.target import Target

from ..compile import resolve_target
from ..errors import ConvGradError
from ..schedule.cpu.generic import LoopsRule
from .gradient import DTYPES, Conv2dCall, permute, scheduled_func

__all__ = ["ScheduleConvs", "ScheduleLoops", "forward_func"]

CONV2D = "relax.nn.conv2d"


def forward_func(call: Conv2dCall, target: Target) -> tvm.tirx.PrimFunc:
    """The forward of ``call`` scheduled for ``target``: ``(x, w) -> y`` in the call's native layouts."""
    return scheduled_func(call.gradients.forward("conv2d_forward"), target)


@mutator
class _Forwards(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, target: Target):
        super().__init__(mod)
        self.mod_ = mod
        self.target = target
        self.op = tvm.ir.Op.get(CONV2D)
        self.funcs: dict = {}
        self.rewritten = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(self.op)):
            return call
        x, w = call.args
        if str(x.ty.dtype) not in DTYPES or str(w.ty.dtype) != str(x.ty.dtype):
            return call
        try:
            conv = Conv2dCall.of(call)
            key = conv.gradients
            if key not in self.funcs:
                self.funcs[key] = self.builder_.add_func(forward_func(conv, self.target), "conv2d_forward")
        except ConvGradError:  # a geometry the operator does not take: Relax's own conv2d stays
            return call
        g = conv.gradients
        native_data, native_kernel = conv.native_layouts
        y = relax.call_tir(self.funcs[key], [permute(x, conv.data_layout, native_data), permute(w, conv.kernel_layout, native_kernel)],
                           relax.TensorType(g.activation(g.y_shape), g.dtype))  # fmt: skip
        out_layout = str(call.attrs.out_layout) or conv.data_layout
        y = permute(y, native_data, out_layout)
        out_dtype = str(call.ty.dtype)
        self.rewritten += 1
        return relax.op.astype(y, out_dtype) if out_dtype != g.dtype else y

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod_.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="tvm_convgrad.ScheduleConvs")
class ScheduleConvs:
    """Every ``relax.nn.conv2d`` of the module on the package's forward kernel scheduled for
    ``target`` (see the module docstring); run it before ``LegalizeOps``. ``last_count``: how many
    calls the last run rewrote (one kernel per distinct signature)."""

    def __init__(self, target: str | dict | Target = "llvm"):
        self.target = resolve_target(target)
        self.last_count = 0

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Forwards(mod, self.target)
        mod = rewriter.run()
        self.last_count = rewriter.rewritten
        return mod


@tvm.transform.module_pass(opt_level=0, name="tvm_convgrad.ScheduleLoops")
class ScheduleLoops:
    """The CPU rule of :mod:`tvm_convgrad.schedule.cpu.generic` on every PrimFunc of the module not
    scheduled yet; run it after ``LegalizeOps`` (an ``llvm`` target; other targets: unchanged)."""

    def __init__(self, target: str | dict | Target = "llvm"):
        self.target = resolve_target(target)

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.target.kind.name != "llvm":
            return mod
        with self.target:
            return dlight.ApplyDefaultSchedule(LoopsRule())(mod)
