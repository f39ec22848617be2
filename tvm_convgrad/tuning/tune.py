"""Autotuning on MetaSchedule, over the package's own schedule rules.

>>> report = tvm_convgrad.tune(dw, trials=64, work_dir="tune_dw")        # or runner="rpc://host:9190/key"
>>> print(report)                                                         # tuned vs the rule's default
>>> kernel = tvm_convgrad.build(dw, schedules=report.database)            # Kernel.schedule == "tuned:..."

The design space is the schedule rule of the target (:mod:`tvm_convgrad.schedule`) applied with
``tunable=True``: its tiles become MetaSchedule samples (``sample_perfect_tile``), so the search
explores the rule's own ISA-aware (or tensor-core) structure rather than MetaSchedule's generic
space; on CUDA a second design space switches the double buffering of the operand tiles. The
evolutionary search mutates those samples; each candidate is compiled as :func:`build` compiles
(the package's pass context) and timed by the runner: ``"local"`` (this machine) or
``"rpc://HOST:PORT/KEY"`` (the device servers registered under KEY with a TVM RPC tracker).

Files in ``work_dir`` (plain MetaSchedule JSON databases, inspectable and resumable: running again
with the same ``work_dir`` starts from the best records already there):

* ``trials/``: every candidate measured (``database_workload.json``, ``database_tuning_record.json``,
  MetaSchedule's logs under ``logs/``);
* ``best/`` (or ``database=``): the record :func:`build` uses, written only when the best
  candidate beat the rule's default by :data:`KEEP_MARGIN` (5%), both timed by the same runner in
  the same run, so that a kept record is faster by more than the machine's timing noise.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import tvm
import tvm_ffi
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from ..compile import Workload, resolve_target
from ..compile.records import WORKLOAD, open_database, schedule_key, workload_key
from ..errors import ConvGradError
from ..isa import host_can_run
from ..schedule import rule_for
from ..schedule.cuda import with_limits
from .runners import InProcessBuilder, local_builder, measure, release, runner_from
from .space import Progress, cost_model, design_space, quiet_meta_schedule_console, seed_with_the_default, tensor_intrinsics_quickly

__all__ = ["KEEP_MARGIN", "POPULATION", "REMEASURE_ROUNDS", "TuneReport", "tune"]

POPULATION = 128  # evolutionary search population: the rule's space is small (a few tile samples)
REMEASURE_ROUNDS = 5  # the default and the best candidate, alternately, each round
KEEP_MARGIN = 0.05
"""A record is kept only when the best candidate is this much faster than the default (and is
not the default's own schedule): on a shared 2-core machine the same kernel re-timed differs by
up to ~8% (bench --schedule tuned, default vs default; some kernels run in one of two speeds per
process, up to 1.5x apart), and records kept on 1-10% gains timed 0.86-1.04x the default afterwards."""



@dataclass
class TuneReport:
    """What a tuning run found, the default and the best candidate timed by the same runner."""

    name: str
    target: str
    runner: str
    cost_model: str
    trials: int
    default_ms: float
    best_ms: float
    kept: bool
    database: str
    work_dir: str
    seconds: float
    failures: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    """Candidates not built because their kernels spill registers (CUDA: :func:`.runners.compile_candidate`)."""
    curve_ms: list[float] = field(default_factory=list)
    """Best time so far after each trial (ms), for a trial curve."""

    @property
    def speedup(self) -> float:
        """default / tuned (1.0 when no candidate beat the default by the keep margin)."""
        return self.default_ms / self.best_ms if self.kept else 1.0

    def __str__(self) -> str:
        verdict = (f"kept: {self.speedup:.2f}x the default, record in {self.database}" if self.kept
                   else f"not kept: no candidate beat the default by {KEEP_MARGIN:.0%}")  # fmt: skip
        lines = [
            f"{self.name} on {self.target} ({self.runner}, cost model {self.cost_model}): {self.trials} trials in {self.seconds:.0f} s",
            f"  default {self.default_ms:.3f} ms, best candidate {self.best_ms:.3f} ms: {verdict}",
        ]
        if self.rejected:
            lines.append(f"  {len(self.rejected)} candidate(s) rejected for spilling registers")
        if self.failures:
            lines.append(f"  {len(self.failures)} trial(s) failed, first: {self.failures[0]}")
        return "\n".join(lines)



def tune(
    outputs: te.Tensor | Sequence[te.Tensor],
    target: str | dict | Target = "llvm",
    trials: int = 64,
    work_dir: str | Path = "tune_out",
    runner: str | ms.runner.Runner = "local",
    *,
    database: str | Path | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> TuneReport:
    """Tune a gradient (the result of ``dsl`` / a frontend, or ``[inputs..., result]``) for
    ``target`` with ``trials`` candidates of the schedule rule's space; see the module docstring.

    Returns a :class:`TuneReport`; ``report.database`` is the database :func:`build` takes as
    ``schedules=`` (``work_dir/best`` unless ``database`` names another, e.g. a shipped one)."""
    if not isinstance(trials, int) or trials < 1:
        raise ConvGradError("tune", "trials", trials, "must be an int >= 1")
    target = resolve_target(target)
    postprocs = []
    if target.kind.name == "cuda":
        if runner == "local" and not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):
            raise ConvGradError("tune", "runner", runner, "needs a CUDA GPU on this machine (there is none): "
                                "use runner='rpc://HOST:PORT/KEY' with the RPC server of a GPU machine")  # fmt: skip
        target = with_limits(target)
        postprocs = [ms.postproc.VerifyGPUCode()]  # a sampled tile over the threads or shared memory of a block: not built
    elif target.kind.name != "llvm":
        raise ConvGradError("tune", "target", target.kind.name, "must be an llvm or a cuda target")
    elif runner == "local" and not host_can_run(target):
        raise ConvGradError("tune", "runner", runner, f"cannot time {schedule_key(target)} code on this machine (its CPU lacks the "
                            "instructions): use runner='rpc://HOST:PORT/KEY' with the RPC server of a machine that has them")  # fmt: skip
    workload = Workload.of(outputs).for_target(target)
    name = workload.name
    named = workload.prim_func(target)
    func = named.with_attr("global_symbol", WORKLOAD)
    mod = tvm.IRModule({WORKLOAD: func})
    rule = rule_for(target)
    work_dir = Path(work_dir)
    best_dir = Path(database) if database is not None else work_dir / "best"
    space = design_space(rule, target, postprocs)
    builder, compare = local_builder(), InProcessBuilder()
    run = runner_from(runner)
    try:  # the runner's worker processes end with the run, also on an error or Ctrl-C
        model = cost_model()
        bar = Progress(trials, progress)
        callbacks = [*ms.measure_callback.MeasureCallback.create("default"), bar]
        quiet_meta_schedule_console()
        print(f"tuning {name}: {trials} trials, cost model {model}" + ("" if model == "xgb" else " (pip install xgboost for XGBoost)"))
        start = time.perf_counter()
        (work_dir / "trials").mkdir(parents=True, exist_ok=True)
        trials_db = ms.database.JSONDatabase(work_dir=str(work_dir / "trials"))
        seed_with_the_default(trials_db, mod, rule, target, compare, run, func)
        with tensor_intrinsics_quickly(target):
            ms.tune_tir(
                mod, target, str(work_dir / "trials"), max_trials_global=trials, num_trials_per_iter=min(16, trials),
                builder=builder, runner=run, database=trials_db, cost_model=model, measure_callbacks=callbacks,
                space=space, seed=seed, strategy=ms.search_strategy.EvolutionarySearch(population_size=POPULATION, init_min_unmeasured=16),
            )  # fmt: skip
        bar.bar.close()
        best = trials_db.query_tuning_record(mod, target, WORKLOAD)
        default_mod = tvm.IRModule({WORKLOAD: rule.apply(func, target).mod["main"]})
        tuned = None
        if best is not None:
            tuned = s_tir.Schedule(mod)
            best.trace.apply_to_schedule(tuned, remove_postproc=False)
            if tvm_ffi.structural_equal(tuned.mod, default_mod):  # the default itself: however it timed, nothing to keep
                tuned = None
        if tuned is not None:
            rounds = measure(compare, run, [default_mod, tuned.mod], target, func, REMEASURE_ROUNDS)
            default_s = statistics.median(r[0] for r in rounds)
            best_s = statistics.median(r[1] for r in rounds)
        else:
            default_s = best_s = measure(compare, run, [default_mod], target, func)[0][0]
        kept = tuned is not None and best_s < default_s * (1 - KEEP_MARGIN)
        keep = open_database(best_dir, create=True)  # exists even when empty: build falls back to the default
        if kept:
            record = ms.database.TuningRecord(best.trace, keep.commit_workload(workload_key(named)), [best_s], target, best.args_info)
            keep.commit_tuning_record(record)  # into the cached database build() reads too
        return TuneReport(
            name=name, target=str(target), runner=runner if isinstance(runner, str) else type(runner).__name__,
            cost_model=model, trials=bar.trials, default_ms=default_s * 1e3, best_ms=best_s * 1e3, kept=kept,
            database=str(best_dir), work_dir=str(work_dir), seconds=time.perf_counter() - start,
            failures=bar.failures, rejected=bar.rejected, curve_ms=[t * 1e3 for t in bar.curve],
        )  # fmt: skip
    finally:
        if run is not runner:  # a runner this call made (one passed in is the caller's to end)
            release(run)
