"""``ScheduleConvs``: every ``relax.nn.conv2d`` of a module on the package's forward kernel, and a CPU
schedule for the module's other PrimFuncs.

:class:`ScheduleConvs` replaces each ``relax.nn.conv2d`` call (in any Relax function of the module:
an inference module's ``main``, a trainer's ``backbone`` / ``backbone_loss`` / adjoint) by a
``call_tir`` of oneDNN's ``Convolution`` on the cube (:func:`tvm_convgrad.frontends.onednn.convolution`)
scheduled for the target: NCHW / NHWC activations and OIHW / HWIO weights read in place, other
permutations permuted around it, float32 / float16 / bfloat16 (another ``out_dtype`` cast after).
Calls of other types or geometries the operator does not take keep Relax's own conv2d.

The elementwise epilogue ``FuseOps`` would fuse after a convolution runs inside its kernel, as
oneDNN's post-ops (:mod:`tvm_convgrad.params.post_ops`) applied to each value as it is written
out: a chain of ``add`` / ``multiply`` / ``maximum`` / ``minimum`` (either side), ``subtract`` /
``divide`` (the convolution's value on the left) with a tensor that broadcasts to the output (a
bias ``(1, C, 1, 1)``, a residual), ``nn.relu``, ``nn.leakyrelu``, ``clip`` (ReLU6),
``sigmoid``, ``nn.silu``, ``tanh``. A value joins the kernel only when the chain is its one use
(in a trainer, ReLU's input is read again by its gradient: the chain stops before the ReLU).

:class:`ScheduleLoops` gives every PrimFunc that is not scheduled yet (what ``LegalizeOps`` made of
the elementwise, broadcast and reduction ops around the convolutions) the CPU rule of
:mod:`tvm_convgrad.schedule.cpu.generic`: parallel outer loops, vectorized inner ones.

    >>> mod = tvm_convgrad.relax.ScheduleConvs("llvm")(mod)          # before LegalizeOps
    >>> mod = relax.transform.LegalizeOps()(mod)
    >>> mod = tvm_convgrad.relax.ScheduleLoops("llvm")(mod)          # the rest
    >>> ex = tvm.compile(mod, "llvm")
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor
from tvm.s_tir import dlight
from tvm.target import Target

from ..compile import resolve_target
from ..errors import ConvGradError
from ..params.post_ops import PostOp, broadcasts
from ..schedule.cpu.generic import LoopsRule
from .gradient import DTYPES, Conv2dCall, algorithm_for, permute, scheduled_func

__all__ = ["ScheduleConvs", "ScheduleLoops", "forward_func"]

CONV2D = "relax.nn.conv2d"


def forward_func(call: Conv2dCall, target: Target, post_ops: Sequence[PostOp] = ()) -> tvm.tirx.PrimFunc:
    """The forward of ``call`` scheduled for ``target``: ``(x, w, *src1) -> y`` in the call's
    native layouts, ``post_ops`` applied to each value of y as it is written (``"auto"`` chosen for
    ``target``, the one in scope)."""
    with target:
        y = call.gradients.forward("conv2d_forward", post_ops=post_ops, algorithm=algorithm_for(target))
    return scheduled_func(y, target)


_COMMUTATIVE = {"relax.add": "add", "relax.multiply": "mul", "relax.maximum": "max", "relax.minimum": "min"}
_VALUE_FIRST = {"relax.subtract": "sub", "relax.divide": "div"}
_UNARY = {"relax.nn.relu": ("relu", 0.0), "relax.sigmoid": ("logistic", 0.0), "relax.tanh": ("tanh", 0.0), "relax.nn.silu": ("swish", 1.0)}


@dataclass(frozen=True)
class _Epilogue:
    """One post-op of a convolution's epilogue: oneDNN's ``alg``, ``alpha`` / ``beta``, and a
    binary one's operand (a Relax expression broadcast to the output)."""

    alg: str
    alpha: float = 0.0
    beta: float = 0.0
    operand: relax.Expr | None = None

    def signature(self) -> tuple:
        """What the kernel depends on: the alg, its constants, the operand's shape and type."""
        ty = self.operand.ty if self.operand is not None else None
        return self.alg, self.alpha, self.beta, None if ty is None else (tuple(int(d) for d in ty.shape.values), str(ty.dtype))

    def post_op(self, k: int) -> PostOp:
        if self.operand is None:
            return PostOp.eltwise(self.alg, self.alpha, self.beta)
        shape, dtype = self.signature()[3]
        return PostOp.binary(self.alg, te.placeholder(shape, dtype, name=f"src1_{k}"))


def _number(expr) -> float | None:
    value = getattr(expr, "value", None)  # FloatImm / IntImm, or a PrimValue holding one
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


def _epilogue(call: relax.Expr, value: relax.Var, out_ty: relax.TensorType) -> _Epilogue | None:
    """``call`` (the one use of ``value``, a convolution's output of type ``out_ty``) as a post-op
    of that convolution, or None."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or not call.args or not isinstance(call.ty, relax.TensorType):
        return None
    name, args = call.op.name, list(call.args)
    if name in _UNARY and len(args) == 1:
        alg, alpha = _UNARY[name]
        return _Epilogue(alg, alpha)
    if name == "relax.nn.leakyrelu":
        return _Epilogue("relu", float(call.attrs.alpha))
    if name == "relax.clip" and args[0].same_as(value):
        lo, hi = _number(args[1]), _number(args[2])
        return _Epilogue("clip", lo, hi) if lo is not None and hi is not None and lo <= hi else None
    if name in _COMMUTATIVE or (name in _VALUE_FIRST and args[0].same_as(value)):
        operand = args[1] if args[0].same_as(value) else args[0]
        ty = operand.ty
        if operand.same_as(value) or not isinstance(ty, relax.TensorType) or ty.shape is None or str(ty.dtype) != str(out_ty.dtype):
            return None
        try:
            shape, out_shape = tuple(int(d) for d in ty.shape.values), tuple(int(d) for d in call.ty.shape.values)
        except (TypeError, AttributeError):  # symbolic
            return None
        if out_shape != tuple(int(d) for d in out_ty.shape.values) or not broadcasts(shape, out_shape):
            return None
        return _Epilogue(_COMMUTATIVE.get(name) or _VALUE_FIRST[name], operand=operand)
    return None


@visitor
class _Uses(PyExprVisitor):
    """Each variable's bound value, its number of uses and its last user (the binding that reads it)."""

    def __init__(self):
        self.values: dict = {}
        self.uses: Counter = Counter()
        self.user: dict = {}
        self._binding = None

    def visit_var_binding_(self, binding: relax.VarBinding):
        self.values[binding.var] = binding.value
        self._binding = binding.var
        self.visit_expr(binding.value)
        self._binding = None

    def _use(self, var):
        self.uses[var] += 1
        self.user[var] = self._binding

    def visit_var_(self, var):
        self._use(var)

    def visit_dataflow_var_(self, var):
        self._use(var)


def _forward_call(call: relax.Call) -> Conv2dCall | None:
    """``call`` as a convolution the package's forward takes, or None (Relax's own conv2d stays)."""
    x, w = call.args
    if str(x.ty.dtype) not in DTYPES or str(w.ty.dtype) != str(x.ty.dtype):
        return None
    try:
        return Conv2dCall.of(call)
    except ConvGradError:  # a geometry the operator does not take
        return None


@mutator
class _Forwards(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, target: Target, epilogues: bool):
        super().__init__(mod)
        self.mod_ = mod
        self.target = target
        self.epilogues = epilogues
        self.op = tvm.ir.Op.get(CONV2D)
        self.funcs: dict = {}
        self.rewritten = 0
        self.fused = 0
        self.chains: dict = {}  # the chain's last variable -> (the conv2d call, its post-ops)
        self.dropped: set = set()  # the chain's other variables: their values are inside the kernel

    def _plan(self, func: relax.Function):
        """The epilogue chains of ``func``'s convolutions: each value the next one's only input.
        (Per function: the functions of a trainer share variables, read a different number of times.)"""
        self.chains, self.dropped = {}, set()
        uses = _Uses()
        uses.visit_expr(func)
        for var, value in uses.values.items():
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.same_as(self.op)):
                continue
            conv = _forward_call(value)
            if conv is None or str(value.attrs.out_layout) not in ("", conv.data_layout) or str(value.ty.dtype) != conv.gradients.dtype:
                continue
            if conv.native_layouts[0] != conv.data_layout:  # the output is permuted: the epilogue stays outside
                continue
            chain, end = [], var
            while uses.uses[end] == 1 and uses.user.get(end) is not None:
                user = uses.user[end]
                post_op = None if user in self.dropped or user in self.chains else _epilogue(uses.values[user], end, value.ty)
                if post_op is None:  # (an operator another chain took: a residual add of two convolutions goes to the first)
                    break
                self.dropped.add(end)
                chain.append(post_op)
                end = user
            if chain:
                self.chains[end] = (value, tuple(chain))

    def _forward(self, call: relax.Call, chain: tuple = ()) -> relax.Expr:
        """The package's forward for ``call`` (its arguments and the chain's operands as they are
        in the input module: the caller visits the result), its post-ops ``chain`` inside."""
        conv = _forward_call(call)
        g = conv.gradients
        key = (g, tuple(p.signature() for p in chain))
        if key not in self.funcs:
            post_ops = [p.post_op(k) for k, p in enumerate(chain)]
            self.funcs[key] = self.builder_.add_func(forward_func(conv, self.target, post_ops), "conv2d_forward")
        x, w = call.args
        native_data, native_kernel = conv.native_layouts
        args = [permute(x, conv.data_layout, native_data), permute(w, conv.kernel_layout, native_kernel)] + [p.operand for p in chain if p.operand is not None]
        y = relax.call_tir(self.funcs[key], args, relax.TensorType(g.activation(g.y_shape), g.dtype))
        self.rewritten += 1
        self.fused += len(chain)
        y = permute(y, native_data, str(call.attrs.out_layout) or conv.data_layout)
        out_dtype = str(call.ty.dtype)
        return relax.op.astype(y, out_dtype) if out_dtype != g.dtype else y

    def visit_var_binding_(self, binding: relax.VarBinding):
        var = binding.var
        if var in self.dropped:
            return
        if var in self.chains:
            binding = relax.VarBinding(var, self._forward(*self.chains[var]))
        super().visit_var_binding_(binding)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(self.op)) or _forward_call(call) is None:
            return call
        return self._forward(call)

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod_.functions_items():
            if isinstance(func, relax.Function):
                if self.epilogues:
                    self._plan(func)
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="tvm_convgrad.ScheduleConvs")
class ScheduleConvs:
    """Every ``relax.nn.conv2d`` of the module on the package's forward kernel scheduled for
    ``target``, with its elementwise epilogue inside (``epilogues``; see the module docstring);
    run it before ``LegalizeOps``. ``last_count``: how many calls the last run rewrote (one kernel
    per distinct signature), ``last_fused``: how many epilogue operators went into them."""

    def __init__(self, target: str | dict | Target = "llvm", epilogues: bool = True):
        self.target = resolve_target(target)
        self.epilogues = epilogues
        self.last_count = 0
        self.last_fused = 0

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Forwards(mod, self.target, self.epilogues)
        mod = rewriter.run()
        self.last_count, self.last_fused = rewriter.rewritten, rewriter.fused
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
