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

import contextlib
import importlib.util
import json
import logging
import re
import shutil
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import tvm
import tvm_ffi
from tvm import s_tir, te, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from .build import _arguments, _prim_func, pass_context, resolve_target, schedule_key
from .errors import ConvGradError
from .schedule import rule_for
from .schedule.cuda import with_limits
from .schedule.intrinsics import cuda_intrinsics
from .schedule.isa import host_can_run

__all__ = ["TuneReport", "open_database", "runner_from", "tune", "tuned_schedule", "workload_key"]

RPC_URL = re.compile(r"^rpc://(?P<host>[^:/]+):(?P<port>\d+)/(?P<key>[\w.\-]+)$")
WORKLOAD = "main"
"""The function name every record is stored under (traces name it)."""

BUILD_TIMEOUT_S = 60
POPULATION = 128  # evolutionary search population: the rule's space is small (a few tile samples)
RUN_TIMEOUT_S = 60
REMEASURE_ROUNDS = 5  # the default and the best candidate, alternately, each round
KEEP_MARGIN = 0.05
"""A record is kept only when the best candidate is this much faster than the default (and is
not the default's own schedule): on a shared 2-core machine the same kernel re-timed differs by
up to ~8% (bench --schedule tuned, default vs default; some kernels run in one of two speeds per
process, up to 1.5x apart), and records kept on 1-10% gains timed 0.86-1.04x the default afterwards."""


def workload_key(func: tirx.PrimFunc) -> tvm.IRModule:
    """The module a gradient's records are stored under: the PrimFunc with its ``kernel_name``
    (the global symbol and the result stage's attribute) replaced by ``main``, so that the same
    workload under another name finds the same records."""
    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else WORKLOAD
    text = tvm.ir.save_json(func).replace(json.dumps(name), json.dumps(WORKLOAD))
    return tvm.IRModule({WORKLOAD: tvm.ir.load_json(text)})


def _compile_candidate(mod: tvm.IRModule, target: Target, _params=None):
    """The builder's compile, as :func:`tvm_convgrad.build` compiles (its pass context); it does
    not import every tensor intrinsic as MetaSchedule's default does (about a minute per
    builder process on a small machine)."""
    with pass_context(target):
        return tvm.compile(mod, target=target).mod


def _use_every_core():
    """Runner worker initializer: TVM's thread pool on every usable core, as in the processes
    that import the package (TVM's own default is half the cores on x86: on 2 cores, 1 thread)."""
    import tvm_convgrad  # noqa: F401 - sets TVM_NUM_THREADS before the pool starts


def runner_from(runner: str | ms.runner.Runner, timeout_s: float = RUN_TIMEOUT_S) -> ms.runner.Runner:
    """``"local"``, ``"rpc://HOST:PORT/KEY"`` (a TVM RPC tracker and the key its device servers
    registered under) or a MetaSchedule ``Runner``. Each candidate: 3 repeats of >= 50 ms. The
    local runner's workers use every core; start RPC servers with ``TVM_NUM_THREADS`` set to the
    device's cores (TVM's default is half of them on x86)."""
    if isinstance(runner, ms.runner.Runner):
        return runner
    evaluator = ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=50)
    if runner == "local":
        return ms.runner.LocalRunner(timeout_sec=timeout_s, evaluator_config=evaluator, initializer=_use_every_core)
    match = RPC_URL.match(str(runner))
    if match is None:
        raise ConvGradError("tune", "runner", runner, "must be 'local', 'rpc://HOST:PORT/KEY' or a meta_schedule Runner")
    config = ms.runner.RPCConfig(tracker_host=match["host"], tracker_port=int(match["port"]), tracker_key=match["key"],
                                 session_timeout_sec=int(timeout_s))  # fmt: skip
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, max_workers=1)


@derived_object
class _Progress(ms.measure_callback.PyMeasureCallback):
    """A progress bar over the trials, and every failed trial with its reason."""

    def __init__(self, total: int, progress: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", disable=not progress, dynamic_ncols=True)
        self.best_s = float("inf")
        self.trials = 0
        self.failures: list[str] = []
        self.curve: list[float] = []

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        for built, ran in zip(builder_results, runner_results):
            self.trials += 1
            error = built.error_msg or ran.error_msg
            if error:
                self.failures.append(f"trial {self.trials}: {'build' if built.error_msg else 'run'}: {str(error).strip().splitlines()[0]}")
            else:
                self.best_s = min(self.best_s, statistics.median(float(s) for s in ran.run_secs))
            self.curve.append(self.best_s)
        self.bar.update(len(builder_results))
        if self.best_s < float("inf"):
            self.bar.set_postfix(best=f"{self.best_s * 1e3:.3f} ms", failed=len(self.failures))


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
        if self.failures:
            lines.append(f"  {len(self.failures)} trial(s) failed, first: {self.failures[0]}")
        return "\n".join(lines)


def _no_table(data: str) -> None:
    """In place of MetaSchedule's per-iteration table in notebooks (pandas, and one table per
    iteration): the progress bar and the report say what it would."""


def _quiet_meta_schedule_console():
    """MetaSchedule's console shows warnings only (its per-trial tables go to ``logs/``); handlers
    without a name (a second run in one process, a test runner's) would break its logging config."""
    meta = logging.getLogger("tvm.s_tir.meta_schedule")
    meta.setLevel(logging.WARNING)
    meta.handlers = [h for h in meta.handlers if h.get_name()]
    tvm.register_global_func("s_tir.meta_schedule.print_interactive_table", _no_table, override=True)


TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin"


@contextlib.contextmanager
def _tensor_intrinsics_quickly(target: Target):
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


def _mutators(target: Target) -> dict:
    """MetaSchedule's default mutators of the target kind, given explicitly: with any of a space's
    rules, postprocs or mutators left "from-target", ``TuneContext`` builds the target's whole
    default rule set, and on an x86 CPU with VNNI (Cascade Lake and later, Zen 4 / 5) that set
    asks for the ``dot_16x4_vnni`` tensor intrinsic, which is not registered while tuning (see
    :func:`_tensor_intrinsics_quickly`). The rules' space needs none of those rules."""
    return ms.mutator.Mutator.create("cuda" if target.kind.name == "cuda" else "llvm")


def _cost_model() -> str:
    return "xgb" if importlib.util.find_spec("xgboost") else "random"


def _measure(builder, runner, mods: Sequence[tvm.IRModule], target: Target, func: tirx.PrimFunc, rounds: int = 1) -> list[list[float]]:
    """Seconds of each module (median of the runner's repeats), built once as the trials are and
    run ``rounds`` times, the modules alternately: ``[round][module]``."""
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    try:
        for result in built:
            if result.error_msg:
                raise RuntimeError(f"building a schedule to compare failed: {result.error_msg}")
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        device = "cuda" if target.kind.name == "cuda" else "cpu"
        inputs = [ms.runner.RunnerInput(b.artifact_path, device, args_info) for b in built]
        times = []
        for _ in range(rounds):
            times.append([])
            for future in runner.run(inputs):
                result = future.result()
                if result.error_msg:
                    raise RuntimeError(f"running a schedule to compare failed: {result.error_msg}")
                times[-1].append(statistics.median(float(s) for s in result.run_secs))
        return times
    finally:
        for b in built:
            if b.artifact_path:
                shutil.rmtree(Path(b.artifact_path).parent, ignore_errors=True)


def _seed_with_the_default(database, mod: tvm.IRModule, rule, target: Target, builder, runner, func: tirx.PrimFunc):
    """The rule's default, measured, as the first record of the trials: the evolutionary search
    starts its population from the best measured records, so it mutates the default's tiles
    instead of only random points of the space. (The design space's decisions are the default.)
    A resumed run finds its workload, and so this record, already there."""
    if database.has_workload(mod):
        return
    sch = s_tir.Schedule(mod)
    rule.schedule(sch, target, tunable=True)
    ((seconds,),) = _measure(builder, runner, [sch.mod], target, func)
    record = ms.database.TuningRecord(sch.trace, database.commit_workload(mod), [seconds], target,
                                      ms.arg_info.ArgInfo.from_prim_func(func))  # fmt: skip
    database.commit_tuning_record(record)


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
    args, _ = _arguments(outputs)
    name = str(args[-1].op.attrs["kernel_name"])
    named = _prim_func(args, name, target)
    func = named.with_attr("global_symbol", WORKLOAD)
    mod = tvm.IRModule({WORKLOAD: func})
    rule = rule_for(target)
    work_dir = Path(work_dir)
    best_dir = Path(database) if database is not None else work_dir / "best"
    space = ms.space_generator.ScheduleFn(lambda sch: rule.design_spaces(sch, target), sch_rules=[], postprocs=postprocs,
                                          mutator_probs=_mutators(target))  # fmt: skip
    builder = ms.builder.LocalBuilder(f_build=_compile_candidate, timeout_sec=BUILD_TIMEOUT_S)
    run = runner_from(runner)
    cost_model = _cost_model()
    bar = _Progress(trials, progress)
    callbacks = [*ms.measure_callback.MeasureCallback.create("default"), bar]
    _quiet_meta_schedule_console()
    print(f"tuning {name}: {trials} trials, cost model {cost_model}" + ("" if cost_model == "xgb" else " (pip install xgboost for XGBoost)"))
    start = time.perf_counter()
    (work_dir / "trials").mkdir(parents=True, exist_ok=True)
    trials_db = ms.database.JSONDatabase(work_dir=str(work_dir / "trials"))
    _seed_with_the_default(trials_db, mod, rule, target, builder, run, func)
    with _tensor_intrinsics_quickly(target):
        ms.tune_tir(
            mod, target, str(work_dir / "trials"), max_trials_global=trials, num_trials_per_iter=min(16, trials),
            builder=builder, runner=run, database=trials_db, cost_model=cost_model, measure_callbacks=callbacks,
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
        rounds = _measure(builder, run, [default_mod, tuned.mod], target, func, REMEASURE_ROUNDS)
        default_s = statistics.median(r[0] for r in rounds)
        best_s = statistics.median(r[1] for r in rounds)
    else:
        default_s = best_s = _measure(builder, run, [default_mod], target, func)[0][0]
    kept = tuned is not None and best_s < default_s * (1 - KEEP_MARGIN)
    keep = open_database(best_dir, create=True)  # exists even when empty: build falls back to the default
    if kept:
        record = ms.database.TuningRecord(best.trace, keep.commit_workload(workload_key(named)), [best_s], target, best.args_info)
        keep.commit_tuning_record(record)  # into the cached database build() reads too
    return TuneReport(
        name=name, target=str(target), runner=runner if isinstance(runner, str) else type(runner).__name__,
        cost_model=cost_model, trials=bar.trials, default_ms=default_s * 1e3, best_ms=best_s * 1e3, kept=kept,
        database=str(best_dir), work_dir=str(work_dir), seconds=time.perf_counter() - start,
        failures=bar.failures, curve_ms=[t * 1e3 for t in bar.curve],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Records at build time
# ---------------------------------------------------------------------------------------------

_DATABASES: dict[str, ms.database.Database] = {}


def open_database(path: str | Path, create: bool = False) -> ms.database.Database:
    """The JSON database in folder ``path`` (cached)."""
    path = Path(path)
    key = str(path.resolve())
    if key not in _DATABASES:
        if not create and not (path / "database_workload.json").exists():
            raise ConvGradError("build", "schedules", str(path), "must be a folder holding a MetaSchedule JSON database "
                                "(database_workload.json, database_tuning_record.json)")  # fmt: skip
        path.mkdir(parents=True, exist_ok=True)
        _DATABASES[key] = ms.database.JSONDatabase(work_dir=str(path))
    return _DATABASES[key]


def tuned_schedule(func: tirx.PrimFunc, target: Target, path: str | Path) -> s_tir.Schedule | None:
    """The schedule of ``func`` from the best record of the database at ``path``, or None."""
    database = open_database(path)
    key = workload_key(func)
    if not database.has_workload(key):
        return None
    record = database.query_tuning_record(key, target, WORKLOAD)
    if record is None:
        return None
    if target.kind.name == "cuda":
        cuda_intrinsics()  # the trace tensorizes with them
    sch = s_tir.Schedule(tvm.IRModule({WORKLOAD: func}))
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch
