"""Schedule rules, one per target kind, in the shape of TVM's dlight rules (:mod:`.base`: the protocol).

``rule_for(target).apply(func, target, tunable)`` returns an ``s_tir.Schedule``; the rules are
``dlight.ScheduleRule`` objects, so ``dlight.ApplyDefaultSchedule(CpuRule(), CudaRule())`` works too.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from ..errors import ConvGradError
from .base import Config, Rule
from .cpu import CpuConfig, CpuRule
from .cuda import CudaConfig, CudaRule

__all__ = ["Config", "CpuConfig", "CpuRule", "CudaConfig", "CudaRule", "Rule", "apply", "rule_for"]

_RULES: dict[str, Rule] = {rule.kind: rule for rule in (CpuRule(), CudaRule())}


def rule_for(target: Target) -> Rule:
    """The schedule rule of a target kind (``llvm`` or ``cuda``)."""
    try:
        return _RULES[target.kind.name]
    except KeyError:
        raise ConvGradError("build", "target", str(target.kind.name), f"must be one of {sorted(_RULES)}") from None


def apply(func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule:
    """Schedule ``func`` for ``target`` with its rule."""
    sch = rule_for(target).apply(func, target, tunable)
    assert sch is not None, f"{type(rule_for(target)).__name__} declined a {target.kind.name} function"
    return sch
