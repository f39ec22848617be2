"""A gradient as :func:`tvm_convgrad.build` compiles it (:class:`Workload`): its argument tensors in
call order, its validated parameters and, for a framework operator, its call; and its PrimFunc.

Argument order: the operator's inputs in TBE order, then the result: ``conv2d_backprop_filter``:
``(input_x, out_backprop, dw)``; ``conv2d_backprop_input``: ``(filters, out_backprop[, tensor_bias],
dx)``; a framework operator's in its own order. The compiled function's symbol is the result's
``kernel_name``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from tvm import te, tirx
from tvm.target import Target

from ..dsl import bf16_pairs_form, framework_call, result_info
from ..dsl.compute import ARGUMENT_STAGES, formulation
from ..errors import ConvGradError
from ..isa import isa_plan
from ..params import FILTER_OP, ConvGradParams
from ..params.framework import FrameworkCall

__all__ = ["Workload"]

_INT32_LIMIT = 2**31


@dataclass(frozen=True, eq=False)
class Workload:
    """The argument tensors of a gradient (``args``: inputs, then the result), its parameters
    (None for a graph the package did not make), its framework call (None for TBE's DSL) and,
    for a bf16 gradient, the builder of its bf16-pair form (:func:`tvm_convgrad.dsl.attach`)."""

    args: tuple[te.Tensor, ...]
    params: ConvGradParams | None
    call: FrameworkCall | None
    bf16_pairs: Callable[..., te.Tensor] | None = None

    @classmethod
    def of(cls, tensors: te.Tensor | Sequence[te.Tensor]) -> Workload:
        """The workload of a result tensor (of :mod:`tvm_convgrad.dsl` or a frontend: its inputs
        are known) or of an explicit argument list ``[inputs..., result]``."""
        args, params = _arguments(tensors)
        return cls(tuple(args), params, framework_call(args[-1]), bf16_pairs_form(args[-1]))

    def for_target(self, target: Target) -> Workload:
        """The form ``target`` compiles: a bf16 gradient's 2-D dW and dX in AMX tiles where it has
        AMX-BF16 (:func:`tvm_convgrad.isa.has_amx_bf16`), a bf16 gradient or forward in bf16 pairs on
        ``vdpbf16ps`` where that is faster than the fp32 FMA
        (:attr:`tvm_convgrad.isa.IsaPlan.bf16_dot_pays`: not on Intel's cores), else this one as it
        is (the exact fp32 path)."""
        plan = isa_plan(target) if self.bf16_pairs is not None and target.kind.name == "llvm" else None
        if plan is None or not plan.bf16_dot:
            return self
        if plan.bf16_dot_pays:
            return self.paired(plan.amx_bf16)
        tiles = self.paired(amx=True) if plan.amx_bf16 else self
        return tiles if tiles.formulation == "cube-amx" else self

    def paired(self, amx: bool = False) -> Workload:
        """This gradient in its bf16-pair form (the same arguments, a result computed by the
        pair mads; ``amx``: a 2-D dW's or dX's in the AMX tile plan's layout); a workload without one (not
        bf16, or not a framework operator) is returned as it is."""
        if self.bf16_pairs is None:
            return self
        return Workload((*self.inputs, self.bf16_pairs(amx=amx)), self.params, self.call)

    @property
    def output(self) -> te.Tensor:
        return self.args[-1]

    @property
    def inputs(self) -> tuple[te.Tensor, ...]:
        return self.args[:-1]

    @property
    def name(self) -> str:
        """The kernel name: the compiled function's symbol."""
        return str(self.output.op.attrs["kernel_name"])

    @property
    def flops(self) -> int:
        return int(self.output.op.attrs["flops"])

    @property
    def formulation(self) -> str:
        """``cube``, ``cube-bf16``, ``cube-amx``, ``cout-lanes``, ``cout-lanes-bf16``, ``pixel-lanes``,
        ``depthwise`` (see :class:`~tvm_convgrad.dsl.compute.Formulation`), or ``zero`` (a dX no tap
        reaches: no mad)."""
        return formulation(t.op.attrs for t in _graph_tensors(self.output) if isinstance(t.op, te.ComputeOp))

    def prim_func(self, target: Target, name: str | None = None) -> tirx.PrimFunc:
        """The unscheduled PrimFunc, its symbol ``name`` (default: the kernel name): 64-bit indices on
        CPUs (address arithmetic without sign extensions), 32-bit on GPUs where every tensor allows it."""
        largest = max(math.prod(int(d) for d in t.shape) for t in _graph_tensors(self.output))
        wide = target.kind.name == "llvm" and not self._grouped_pairs or largest >= _INT32_LIMIT
        func = te.create_prim_func(list(self.args), index_dtype_override="int64" if wide else None)
        return func.with_attr("global_symbol", name or self.name)


    @property
    def _grouped_pairs(self) -> bool:
        """A bf16-pair mad whose tensorized rows lie under a fused loop, which takes 32-bit indices
        on CPUs too: a grouped dW (the fused (group, Cout-block) core loop), F(2x2, 3x3)'s forward or
        dX on pairs (a register tile across a task's rows and images of tiles; its dW's tiles are
        loops of their own, and keep 64-bit indices). With 64-bit ones, TVM 0.27's
        ``blockize`` (under the ``dpbf16`` tensorize) fails there ("The dtype of the extent of an
        IterVar (int32) must match its associated Var's dtype (int64)"); with 32-bit ones the hot
        loop is the same but for one sign extension per step."""
        p = self.params
        if self.formulation == "winograd-bf16":
            return p is None or p.op != FILTER_OP
        return p is not None and p.op == FILTER_OP and p.geom.group.g_extend > 1 and self.formulation in ("cube-bf16", "cube-amx")


def _placeholders(output: te.Tensor) -> list[te.Tensor]:
    """The placeholders ``output`` reads, in TBE argument order (``ARGUMENT_STAGES``)."""
    stages = {t.op.name: t for t in _graph_tensors(output)}
    found: list[te.Tensor] = []
    for readers in ARGUMENT_STAGES.get(output.op.tag, ()):
        for stage in (stages[name] for name in readers if name in stages):
            for inp in stage.op.input_tensors:
                if isinstance(inp.op, te.PlaceholderOp) and not any(inp.same_as(f) for f in found):
                    found.append(inp)
    for t in stages.values():  # any others (a graph this package did not make): in walk order
        if isinstance(t.op, te.PlaceholderOp) and not any(t.same_as(f) for f in found):
            found.append(t)
    return found


def _graph_tensors(output: te.Tensor) -> list[te.Tensor]:
    tensors, stack, seen = [], [output], set()
    while stack:
        t = stack.pop()
        if hash(t.op) in seen:
            continue
        seen.add(hash(t.op))
        tensors.append(t)
        stack.extend(t.op.input_tensors)
    return tensors


def _arguments(tensors: te.Tensor | Sequence[te.Tensor]) -> tuple[list[te.Tensor], ConvGradParams | None]:
    """``(arguments in order, params)`` for a result tensor or an explicit argument list."""
    if isinstance(tensors, te.Tensor):
        info = result_info(tensors)
        if info is not None:
            return [*info[1], tensors], info[0]
        output, inputs = tensors, _placeholders(tensors)
    else:
        if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, te.Tensor) for t in tensors):
            raise ConvGradError("build", "tensors", tensors, "must be a result te.Tensor or a list [inputs..., result]")
        *inputs, output = tensors
        needed = _placeholders(output)
        missing = [t.op.name for t in needed if not any(t.same_as(i) for i in inputs)]
        extra = [t.op.name for t in inputs if not any(t.same_as(n) for n in needed)]
        if missing or extra:
            raise ConvGradError(
                "build", "tensors", [t.op.name for t in tensors],
                f"the inputs must be exactly the placeholders the result reads: missing {missing}, not read {extra}",
            )  # fmt: skip
    if "kernel_name" not in output.op.attrs:
        raise ConvGradError("build", "tensors", output.op.name, "the result must come from tvm_convgrad.dsl (or a frontend)")
    info = result_info(output)
    return [*inputs, output], (info[0] if info else None)

