"""The machine's fp32 FMA peak for one vector ISA, measured with a register-only TVM kernel.

A roofline needs the real limit, not another library's matmul: each core runs a loop of
independent multiply-adds on accumulators that never leave the registers (as many as the plan's
register file hides the FMA latency with), no loads, no stores, the vector width of the target's
ISA. ``2 * lanes * accumulators * iterations * cores`` flops over the median time is the peak the
gradients' register tiles can at best approach on the same target.

>>> peak = measure_fma_peak(isa_target("avx2"))
>>> peak.gflops, peak.isa
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm.script import tirx as T
from tvm.target import Target

from ..isa import IsaPlan, isa_plan
from ..schedule.common import target_cores

__all__ = ["FmaPeak", "FmaProbe", "build_fma_peak", "fma_peak_func", "measure_fma_peak"]

_ITERATIONS = 100_000


def fma_peak_func(lanes: int, accumulators: int, cores: int, iterations: int = _ITERATIONS) -> tvm.tirx.PrimFunc:
    """``fma_peak(acc, b, c)``: per core, ``acc = acc * b + c`` on ``accumulators`` vectors of
    ``lanes`` fp32 for ``iterations`` rounds, the accumulators in registers throughout.

    ``acc`` is ``(cores, accumulators, lanes)`` (read at the start, written at the end), ``b`` and
    ``c`` are ``(lanes,)``.
    """

    @T.prim_func
    def fma_peak(
        acc: T.Buffer((cores, accumulators, lanes), "float32"),
        b: T.Buffer((lanes,), "float32"),
        c: T.Buffer((lanes,), "float32"),
    ):
        T.func_attr({"global_symbol": "fma_peak", "tirx.noalias": True})
        for core in T.parallel(cores):
            reg = T.decl_buffer((accumulators, lanes), "float32", scope="local")
            for i in T.unroll(accumulators):
                for lane in T.vectorized(lanes):
                    reg[i, lane] = acc[core, i, lane]
            for _ in T.serial(iterations):
                for i in T.unroll(accumulators):
                    for lane in T.vectorized(lanes):
                        reg[i, lane] = reg[i, lane] * b[lane] + c[lane]
            for i in T.unroll(accumulators):
                for lane in T.vectorized(lanes):
                    acc[core, i, lane] = reg[i, lane]

    return fma_peak


@dataclass(frozen=True)
class FmaPeak:
    """The measured peak: GFLOP/s per sample and how it was measured."""

    isa: str
    mcpu: str
    lanes: int
    accumulators: int
    cores: int
    samples_gflops: tuple[float, ...]

    @property
    def gflops(self) -> float:
        """The best sample: a peak is what the machine can do; a busy moment only lowers it."""
        return max(self.samples_gflops)

    def __str__(self) -> str:
        return (
            f"fp32 FMA peak {self.gflops:.0f} GFLOP/s ({self.isa}, mcpu {self.mcpu}, {self.cores} cores, "
            f"{self.accumulators} x {self.lanes}-lane accumulators per core)"
        )


def _accumulators(plan: IsaPlan) -> int:
    """Enough independent chains to cover the FMA latency on two pipes, leaving the operands room."""
    return plan.registers - 4 if plan.registers > 16 else 12


def build_fma_peak(target: Target):
    """Compile the peak kernel for ``target`` (its ISA's vector width and every core of ``num-cores``)."""
    plan = isa_plan(target)
    cores = target_cores(target)
    func = fma_peak_func(plan.lanes, _accumulators(plan), cores)
    return tvm.compile(tvm.IRModule({"fma_peak": func}), target=target), plan, cores


class FmaProbe:
    """The compiled peak kernel with its buffers: ``sample(ms)`` runs it for at least ``ms``
    milliseconds on every core and returns GFLOP/s (the bench uses short samples to tell a quiet
    machine from one whose cores another tenant is using)."""

    def __init__(self, target: Target):
        executable, self.plan, self.cores = build_fma_peak(target)
        self.target = target
        self.accumulators = _accumulators(self.plan)
        dev = tvm.cpu(0)
        lanes = self.plan.lanes
        self._args = (
            tvm.runtime.tensor(np.full((self.cores, self.accumulators, lanes), 0.5, "float32"), dev),
            tvm.runtime.tensor(np.full(lanes, 0.999, "float32"), dev),
            tvm.runtime.tensor(np.full(lanes, 0.001, "float32"), dev),
        )
        self._mod, self._dev = executable.mod, dev
        self.flops = 2 * lanes * self.accumulators * _ITERATIONS * self.cores

    def samples(self, repeat: int, min_repeat_ms: int) -> tuple[float, ...]:
        evaluator = self._mod.time_evaluator("fma_peak", self._dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
        return tuple(self.flops / t / 1e9 for t in evaluator(*self._args).results)

    def sample(self, min_repeat_ms: int = 10) -> float:
        return self.samples(1, min_repeat_ms)[0]

    def measure(self, repeat: int = 5, min_repeat_ms: int = 100) -> FmaPeak:
        samples = self.samples(repeat, min_repeat_ms)
        return FmaPeak(self.plan.name, str(self.target.attrs.get("mcpu", "")), self.plan.lanes, self.accumulators, self.cores, samples)


def measure_fma_peak(target: Target, repeat: int = 5, min_repeat_ms: int = 100) -> FmaPeak:
    """Run the peak kernel on this machine: ``repeat`` samples of at least ``min_repeat_ms``."""
    return FmaProbe(target).measure(repeat, min_repeat_ms)
