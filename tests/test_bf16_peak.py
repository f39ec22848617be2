"""The bf16 dot-product peak (issue 21, its roofline): a register-only ``vdpbf16ps`` loop, checked
in the assembly of targets with AVX512-BF16 cross-compiled on any host, run where the host has it."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm.target import Target

from tvm_convgrad import ConvGradError, resolve_target
from tvm_convgrad.isa import X86_TRIPLE, has_bf16_dot, host_can_run
from tvm_convgrad.tools.bf16_peak import ACCUMULATORS, build_bf16_peak, measure_bf16_peak


def _target(mcpu: str) -> Target:
    return Target({"kind": "llvm", "mcpu": mcpu, "mtriple": X86_TRIPLE, "num-cores": 2})


@pytest.mark.parametrize("mcpu", ["znver4", "sapphirerapids", "cooperlake"])
def test_the_loop_is_vdpbf16ps_on_zmm_and_nothing_else(mcpu):
    executable, cores = build_bf16_peak(_target(mcpu))
    asm = executable.mod.inspect_source("asm")
    dots = re.findall(r"vdpbf16ps\s+%zmm\d+, %zmm\d+, %zmm(\d+)", asm)
    assert len(dots) >= ACCUMULATORS and len(set(dots)) >= ACCUMULATORS  # every accumulator its own register
    assert not re.search(r"vfmadd|vcvt|vmovups\s+%zmm\d+, \(|call\s", asm.split("bf16_peak_compute_")[-1])


@pytest.mark.parametrize("mcpu", ["znver3", "skylake-avx512", "icelake-server"])
def test_a_target_without_avx512_bf16_is_refused(mcpu):
    assert not has_bf16_dot(_target(mcpu))
    with pytest.raises(ConvGradError, match="AVX512-BF16"):
        build_bf16_peak(_target(mcpu))
    assert not has_bf16_dot(Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))


def test_the_peak_runs_where_the_host_has_avx512_bf16():
    target = resolve_target("llvm")
    if not (has_bf16_dot(target) and host_can_run(target)):
        pytest.skip("this host has no AVX512-BF16 (the assembly tests above check the code for such targets)")
    peak = measure_bf16_peak(target, repeat=2, min_repeat_ms=10)
    assert peak.gflops > 0 and "vdpbf16ps" in str(peak)
    executable, cores = build_bf16_peak(target)
    packed = np.full(16, 0x3F003F00, dtype=np.uint32).view(np.int32)  # bf16 0.5 in both halves
    acc = tvm.runtime.tensor(np.zeros((cores, ACCUMULATORS * 16), "float32"))
    executable["bf16_peak"](acc, tvm.runtime.tensor(packed), tvm.runtime.tensor(packed))
    assert np.all(acc.numpy() == 0.5 * 100_000)  # each round adds 0.5*0.5 + 0.5*0.5, exactly


def test_the_peak_command_measures_or_says_why_not(capsys):
    from tvm_convgrad.compile import isa_target
    from tvm_convgrad.tools import bf16_peak

    has_it = has_bf16_dot(isa_target("native")) and host_can_run(isa_target("native"))
    assert bf16_peak.main() == (0 if has_it else 2)
    out = capsys.readouterr()
    assert ("vdpbf16ps" in out.out) if has_it else ("has no AVX512-BF16" in out.err)
