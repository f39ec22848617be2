"""The search space tuning hands MetaSchedule: the schedule rule's own design spaces with
MetaSchedule's mutators named explicitly (so none of its default rules is built), the rule's default
measured as the first record, the cost model, and a quiet console with a progress bar."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import statistics
import sys
import types

import tvm
from tvm import s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from ..schedule.cuda.intrinsics import cuda_intrinsics
from .runners import SPILLS, measure

__all__ = [
    "TENSOR_INTRINSICS", "Progress", "cost_model", "design_space", "mutators", "quiet_meta_schedule_console", "seed_with_the_default",
    "tensor_intrinsics_quickly",
]  # fmt: skip


@derived_object
class Progress(ms.measure_callback.PyMeasureCallback):
    """A progress bar over the trials, every failed trial with its reason, and the candidates
    rejected for spilling registers (not failures: the search's own limit)."""

    def __init__(self, total: int, progress: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", disable=not progress, dynamic_ncols=True)
        self.best_s = float("inf")
        self.trials = 0
        self.failures: list[str] = []
        self.rejected: list[str] = []
        self.curve: list[float] = []

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        for built, ran in zip(builder_results, runner_results):
            self.trials += 1
            error = built.error_msg or ran.error_msg
            if built.error_msg and f"rejected: {SPILLS}" in built.error_msg:
                self.rejected.append(f"trial {self.trials}: " + built.error_msg.split(f"rejected: {SPILLS}: ")[-1].strip().splitlines()[0])
            elif error:
                self.failures.append(f"trial {self.trials}: {'build' if built.error_msg else 'run'}: {str(error).strip().splitlines()[0]}")
            else:
                self.best_s = min(self.best_s, statistics.median(float(s) for s in ran.run_secs))
            self.curve.append(self.best_s)
        self.bar.update(len(builder_results))
        if self.best_s < float("inf"):
            self.bar.set_postfix(best=f"{self.best_s * 1e3:.3f} ms", failed=len(self.failures))



def _no_table(data: str) -> None:
    """In place of MetaSchedule's per-iteration table in notebooks (pandas, and one table per
    iteration): the progress bar and the report say what it would."""


def quiet_meta_schedule_console():
    """MetaSchedule's console shows warnings only (its per-trial tables go to ``logs/``); handlers
    without a name (a second run in one process, a test runner's) would break its logging config."""
    meta = logging.getLogger("tvm.s_tir.meta_schedule")
    meta.setLevel(logging.WARNING)
    meta.handlers = [h for h in meta.handlers if h.get_name()]
    tvm.register_global_func("s_tir.meta_schedule.print_interactive_table", _no_table, override=True)


TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin"


@contextlib.contextmanager
def tensor_intrinsics_quickly(target: Target):
    """MetaSchedule's ``TuneContext`` imports every tensor intrinsic TVM has, for the generic rules
    that tensorize: about a minute of TVMScript parsing per process on a 2-core machine. The CPU
    rule's space tensorizes nothing, so for an ``llvm`` target the import is answered with an empty
    module while the tuning runs (and forgotten after it: a later real import loads them all); for
    ``cuda`` they are imported in seconds (:func:`.schedule.intrinsics.cuda_intrinsics`)."""
    if target.kind.name == "cuda":
        cuda_intrinsics()
    if target.kind.name != "llvm" or TENSOR_INTRINSICS in sys.modules:
        yield
        return
    stub = types.ModuleType(TENSOR_INTRINSICS)
    sys.modules[TENSOR_INTRINSICS] = stub
    try:
        yield
    finally:
        if sys.modules.get(TENSOR_INTRINSICS) is stub:
            del sys.modules[TENSOR_INTRINSICS]


def mutators(target: Target) -> dict:
    """MetaSchedule's default mutators of the target kind, given explicitly: with any of a space's
    rules, postprocs or mutators left "from-target", ``TuneContext`` builds the target's whole
    default rule set, and on an x86 CPU with VNNI (Cascade Lake and later, Zen 4 / 5) that set
    asks for the ``dot_16x4_vnni`` tensor intrinsic, which is not registered while tuning (see
    :func:`tensor_intrinsics_quickly`). The rules' space needs none of those rules."""
    return ms.mutator.Mutator.create("cuda" if target.kind.name == "cuda" else "llvm")


def cost_model() -> str:
    return "xgb" if importlib.util.find_spec("xgboost") else "random"


def seed_with_the_default(database, mod: tvm.IRModule, rule, target: Target, builder, runner, func: tirx.PrimFunc):
    """The rule's default, measured, as the first record of the trials: the evolutionary search
    starts its population from the best measured records, so it mutates the default's tiles
    instead of only random points of the space. (The design space's decisions are the default.)
    A resumed run finds its workload, and so this record, already there."""
    if database.has_workload(mod):
        return
    sch = s_tir.Schedule(mod)
    rule.schedule(sch, target, tunable=True)
    ((seconds,),) = measure(builder, runner, [sch.mod], target, func)
    record = ms.database.TuningRecord(sch.trace, database.commit_workload(mod), [seconds], target,
                                      ms.arg_info.ArgInfo.from_prim_func(func))  # fmt: skip
    database.commit_tuning_record(record)


def design_space(rule, target: Target, postprocs: list) -> ms.space_generator.ScheduleFn:
    """The rule's design spaces (:meth:`~tvm_convgrad.schedule.Rule.design_spaces`) as MetaSchedule's
    space: no MetaSchedule schedule rules, ``postprocs``, the target kind's mutators."""
    return ms.space_generator.ScheduleFn(lambda sch: rule.design_spaces(sch, target), sch_rules=[], postprocs=postprocs,
                                         mutator_probs=mutators(target))  # fmt: skip
