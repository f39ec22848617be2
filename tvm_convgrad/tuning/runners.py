"""Where tuning builds and times its candidates: the builder (the package's compile), the runner
(``"local"``, a TVM RPC tracker's device servers, or any MetaSchedule ``Runner``), and the
measurement of the rule's default beside the best candidate by the same runner."""

from __future__ import annotations

import re
import shutil
import statistics
from pathlib import Path
from typing import Sequence

import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from ..compile import pass_context
from ..compile.ptxas import ptx_of, ptxas_report, spilled, target_arch
from ..errors import ConvGradError
from ..schedule.cpu.marks import lower_marks

__all__ = ["BUILD_TIMEOUT_S", "RPC_URL", "RUN_TIMEOUT_S", "SPILLS", "InProcessBuilder", "compile_candidate", "compile_schedule", "local_builder", "measure", "release", "runner_from", "use_every_core"]

RPC_URL = re.compile(r"^rpc://(?P<host>[^:/]+):(?P<port>\d+)/(?P<key>[\w.\-]+)$")
BUILD_TIMEOUT_S = 60
RUN_TIMEOUT_S = 60


SPILLS = "spills registers"
"""In a candidate's build error where the search rejected it for spilling (:func:`compile_candidate`)."""


def compile_schedule(mod: tvm.IRModule, target: Target, _params=None):
    """The builder's compile, as :func:`tvm_convgrad.build` compiles (its pass context); it does
    not import every tensor intrinsic as MetaSchedule's default does (about a minute per
    builder process on a small machine)."""
    with pass_context(target):
        return tvm.compile(lower_marks(mod), target=target).mod


def compile_candidate(mod: tvm.IRModule, target: Target, _params=None):
    """:func:`compile_schedule` for a search's candidate; on CUDA, where ``ptxas`` is on PATH, a
    candidate whose kernels spill registers to local memory is not built (as one over a block's
    threads or shared memory is not, by MetaSchedule's ``VerifyGPUCode``): the search never keeps
    a kernel that spills, whatever a runner timed."""
    module = compile_schedule(mod, target)
    if target.kind.name == "cuda" and shutil.which("ptxas"):
        spilling = spilled(ptxas_report(ptx_of(module, target), target_arch(target)))
        if spilling:
            raise RuntimeError(f"rejected: {SPILLS}: " + "; ".join(map(str, spilling)))
    return module


def use_every_core():
    """Runner worker initializer: TVM's thread pool on every usable core, as in the processes
    that import the package (TVM's own default is half the cores on x86: on 2 cores, 1 thread)."""
    from ..machine import use_every_core as on_every_core

    on_every_core()  # before the worker's thread pool starts


def runner_from(runner: str | ms.runner.Runner, timeout_s: float = RUN_TIMEOUT_S) -> ms.runner.Runner:
    """``"local"``, ``"rpc://HOST:PORT/KEY"`` (a TVM RPC tracker and the key its device servers
    registered under) or a MetaSchedule ``Runner``. Each candidate: 3 repeats of >= 50 ms. The
    local runner's workers use every core; start RPC servers with ``TVM_NUM_THREADS`` set to the
    device's cores (TVM's default is half of them on x86)."""
    if isinstance(runner, ms.runner.Runner):
        return runner
    evaluator = ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=50)
    if runner == "local":
        return ms.runner.LocalRunner(timeout_sec=timeout_s, evaluator_config=evaluator, initializer=use_every_core)
    match = RPC_URL.match(str(runner))
    if match is None:
        raise ConvGradError("tune", "runner", runner, "must be 'local', 'rpc://HOST:PORT/KEY' or a meta_schedule Runner")
    config = ms.runner.RPCConfig(tracker_host=match["host"], tracker_port=int(match["port"]), tracker_key=match["key"],
                                 session_timeout_sec=int(timeout_s))  # fmt: skip
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, max_workers=1)



def release(runner: ms.runner.Runner) -> None:
    """End the worker processes of a runner this package made (a local or RPC runner keeps a
    worker pool as long as it lives; its processes would otherwise wait for the garbage
    collector, or outlive the program)."""
    pool = getattr(runner, "pool", None)
    if pool is not None:
        pool.shutdown(wait=True)


def local_builder() -> ms.builder.LocalBuilder:
    """MetaSchedule's local builder of the search's candidates, compiling as
    :func:`compile_candidate` does (a pool of worker processes, started for each batch)."""
    return ms.builder.LocalBuilder(f_build=compile_candidate, timeout_sec=BUILD_TIMEOUT_S)


class InProcessBuilder:
    """The builds of the schedules :func:`measure` compares (the rule's default among them, built
    whatever they spill), in this process, as :func:`compile_schedule` does, each exported as a
    MetaSchedule artifact for the runner. A ``LocalBuilder`` would start a worker process to check
    its build function and a pool of them for each call (about 4 s each on 2 cores: 13 of a
    2-trial tuning run's 31 s), for the two or three schedules the package's own ``build``
    compiles in-process anyway."""

    def build(self, inputs: Sequence[ms.builder.BuilderInput]) -> list[ms.builder.BuilderResult]:
        from tvm.s_tir.meta_schedule.builder.local_builder import default_export

        results = []
        for built in inputs:
            try:
                results.append(ms.builder.BuilderResult(default_export(compile_schedule(built.mod, built.target)), None))
            except Exception as err:  # noqa: BLE001 - reported as the builder's error, as a LocalBuilder reports it
                results.append(ms.builder.BuilderResult(None, f"{type(err).__name__}: {err}"))
        return results


def measure(builder, runner, mods: Sequence[tvm.IRModule], target: Target, func: tirx.PrimFunc, rounds: int = 1) -> list[list[float]]:
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

