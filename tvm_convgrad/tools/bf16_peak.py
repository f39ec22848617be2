"""The machine's bf16 dot-product peak on AVX512-BF16, measured with a register-only ``vdpbf16ps`` loop.

``vdpbf16ps zmm_acc, zmm_a, zmm_b`` adds, in each of its 16 fp32 lanes, the products of two bf16
pairs: 32 multiply-adds, 64 flops per instruction. Each core runs a loop of such instructions on
accumulators that never leave the registers (28 of the 32 zmm registers, as the fp32 peak of
:mod:`.peak` uses), no loads, no stores: ``64 * accumulators * iterations * cores`` flops over the
time is the bf16 roofline (on a Zen 4 about 1.7x the fp32 FMA peak).

TVM 0.27 cannot type the intrinsic's ``<32 x bfloat>`` operands (its bf16 legalization rewrites
bf16 vectors): the call goes through the LLVM IR helper the bf16 kernels use
(:data:`tvm_convgrad.schedule.cpu.bf16.DPBF16_LLVM`, imported with ``pragma_import_llvm``);
marked ``alwaysinline``, it is one ``vdpbf16ps`` in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm.script import tirx as T
from tvm.target import Target

from ..errors import ConvGradError
from ..isa import has_bf16_dot
from ..schedule.cpu.bf16 import DPBF16, DPBF16_LLVM
from ..schedule.common import target_cores

__all__ = ["Bf16Peak", "bf16_peak_func", "build_bf16_peak", "measure_bf16_peak"]

_ITERATIONS = 100_000
ACCUMULATORS = 28
LANES = 16
FLOPS_PER_DOT = 2 * 2 * LANES  # 16 lanes x 2 bf16 pairs x (multiply + add)

def bf16_peak_func(accumulators: int, cores: int, iterations: int = _ITERATIONS) -> tvm.tirx.PrimFunc:
    """``bf16_peak(acc, a, b)``: per core, ``acc = dpbf16(acc, a, b)`` on ``accumulators`` zmm
    accumulators for ``iterations`` rounds. ``acc`` is ``(cores, accumulators * 16)`` float32,
    ``a`` and ``b`` are 16 int32 (32 bf16)."""
    size = accumulators * LANES

    @T.prim_func
    def bf16_peak(acc: T.Buffer((cores, size), "float32"), a: T.Buffer((LANES,), "int32"), b: T.Buffer((LANES,), "int32")):
        T.func_attr({"global_symbol": "bf16_peak", "tirx.noalias": True})
        for core in T.parallel(cores):
            reg = T.decl_buffer((size,), "float32", scope="local")
            for i in T.unroll(size):
                reg[i] = acc[core, i]
            with T.attr(0, "pragma_import_llvm", DPBF16_LLVM):
                for _ in T.serial(iterations):
                    for i in T.unroll(accumulators):
                        reg[T.ramp(i * LANES, 1, LANES)] = T.call_pure_extern(
                            "float32x16", DPBF16, reg[T.ramp(i * LANES, 1, LANES)], a[T.ramp(0, 1, LANES)], b[T.ramp(0, 1, LANES)]
                        )
            for i in T.unroll(size):
                acc[core, i] = reg[i]

    return bf16_peak


def build_bf16_peak(target: Target):
    """Compile the bf16 peak kernel for ``target``, which must have AVX512-BF16."""
    if not has_bf16_dot(target):
        raise ConvGradError("bf16 peak", "target", str(target), "must be an x86-64 target with AVX512-BF16 (e.g. mcpu znver4, sapphirerapids)")
    cores = target_cores(target)
    return tvm.compile(tvm.IRModule({"bf16_peak": bf16_peak_func(ACCUMULATORS, cores)}), target=target), cores


@dataclass(frozen=True)
class Bf16Peak:
    """The measured bf16 dot-product peak: GFLOP/s per sample (the best is the peak)."""

    mcpu: str
    cores: int
    samples_gflops: tuple[float, ...]

    @property
    def gflops(self) -> float:
        return max(self.samples_gflops)

    def __str__(self) -> str:
        return f"bf16 dot-product peak {self.gflops:.0f} GFLOP/s (vdpbf16ps, mcpu {self.mcpu}, {self.cores} cores, {ACCUMULATORS} zmm accumulators per core)"


def measure_bf16_peak(target: Target, repeat: int = 5, min_repeat_ms: int = 100) -> Bf16Peak:
    """Run the bf16 peak kernel on this machine (it must have AVX512-BF16)."""
    executable, cores = build_bf16_peak(target)
    dev = tvm.cpu(0)
    pairs = np.full(2 * LANES, 0.5, dtype="float32").view(np.uint32) >> 16  # bf16 0.5: the upper half of fp32 0.5
    packed = (pairs[0::2] | (pairs[1::2] << 16)).astype(np.uint32).view(np.int32)
    args = (tvm.runtime.tensor(np.zeros((cores, ACCUMULATORS * LANES), "float32"), dev), tvm.runtime.tensor(packed, dev), tvm.runtime.tensor(packed, dev))
    evaluator = executable.mod.time_evaluator("bf16_peak", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    flops = FLOPS_PER_DOT * ACCUMULATORS * _ITERATIONS * cores
    return Bf16Peak(str(target.attrs.get("mcpu", "")), cores, tuple(flops / t / 1e9 for t in evaluator(*args).results))


def main() -> int:
    """``python -m tvm_convgrad.tools.bf16_peak``: this machine's bf16 dot-product peak (exit 2 where
    its CPU has no AVX512-BF16)."""
    import sys

    from ..compile import isa_target
    from ..isa import host_can_run

    target = isa_target("native")
    if not (has_bf16_dot(target) and host_can_run(target)):
        print(f"bf16 peak: this CPU ({target.attrs.get('mcpu', '')}) has no AVX512-BF16; nothing to measure", file=sys.stderr)
        return 2
    print(measure_bf16_peak(target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
