"""The schedule-rule protocol every target implements, in the shape of TVM's dlight rules.

A rule is a ``dlight.ScheduleRule`` for one target kind: :meth:`Rule.apply` takes a PrimFunc (a
gradient made by :mod:`tvm_convgrad.dsl` or a frontend) and a Target and returns an
``s_tir.Schedule`` (None for a function or a target it does not take). Its choices come from one
``Config`` dataclass per target, made by :meth:`Rule.get_config` from the target and the function,
as ``dlight.gpu.Matmul`` keeps a ``Config`` per target from ``get_configs(target)``. Each mad of
the function is scheduled by the class the rule registers for the mad's kind
(:class:`~tvm_convgrad.dsl.compute.stages.Formulation`, the mad's ``convgrad.formulation``
attribute): a third target implements ``get_config``, ``schedule`` and its formulation classes.

``tunable=True`` makes the rule's tile sizes MetaSchedule samples (``sample_perfect_tile``) whose
default decisions are its deterministic choices, so that :func:`tvm_convgrad.tune` searches the
rule's own space; :meth:`Rule.design_spaces` gives MetaSchedule that space (one schedule, or one
per alternative the rule leaves open).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule
from tvm.target import Target

from ..dsl.compute.stages import FORMULATION, Formulation
from .common import stage_blocks

__all__ = ["Config", "Rule", "mads"]


@dataclass(frozen=True)
class Config:
    """What a rule decides per target (and function) before it schedules: the base of each rule's
    own ``Config`` dataclass."""


class Rule(ScheduleRule):
    """A schedule rule for the target kind :attr:`kind` (``dlight.ApplyDefaultSchedule`` takes it too)."""

    kind: ClassVar[str]

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == self.kind

    @abstractmethod
    def get_config(self, target: Target, func: tirx.PrimFunc) -> Config:
        """The rule's choices for ``func`` on ``target``."""

    @abstractmethod
    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False, config: Config | None = None) -> s_tir.Schedule:
        """Schedule the gradient held by ``sch`` in place and return it (MetaSchedule's design
        space runs this on its own traced schedule); ``config`` defaults to :meth:`get_config`'s."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool = False) -> s_tir.Schedule | None:
        """The rule's schedule of ``func`` (None for another target kind)."""
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return self.schedule(s_tir.Schedule(func, error_render_level="none"), target, tunable)

    def design_spaces(self, sch: s_tir.Schedule, target: Target) -> list[s_tir.Schedule]:
        """MetaSchedule's design spaces for ``sch`` (an unscheduled traced schedule): the tunable schedule."""
        return [self.schedule(sch, target, tunable=True)]


def mads(sch: s_tir.Schedule) -> list[tuple[s_tir.schedule.SBlockRV, Formulation]]:
    """The mads under the root block, in program order, each with its :class:`Formulation`."""
    found = []
    for block in stage_blocks(sch):
        kind = sch.get(block).annotations.get(FORMULATION)
        if kind is not None:
            found.append((block, Formulation(str(kind))))
    return found
