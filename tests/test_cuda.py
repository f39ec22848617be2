"""CUDA: the tensor-core schedules, checked on a machine without a GPU.

* **Built**: every ResNet-50 case of the bench (both gradients; sm_90 at N=1 and N=8, sm_80 at N=8)
  and the randomized sweep compile through nvcc; ptxas accepts every kernel with no spills, at most
  255 registers and its static shared memory within the budget; TVM's GPU verification passes
  (threads per block, shared memory); the PTX holds tensor-core instructions wherever the rule
  says it used them.
* **Run**: the same schedules emulated on the CPU (thread bindings as serial loops, each
  tensor-core intrinsic as the TIR TVM registers as its description) match the float64 reference
  over the randomized sweep of both gradients and the framework operators.

Left untested without a GPU: TVM's WMMA intrinsics themselves and races between threads.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from tvm_convgrad import bench, build, emulate_cuda
from tvm_convgrad.ptxas import MAX_REGISTERS, ptxas_report
from tvm_convgrad.schedule.tensor_core import SHARED_BYTES, Config, GemmExtents, get_config
from tvm_convgrad.verify import check_kernel

import test_frontends as frontends
from test_sweep import CASES, _case_id, dw_result, dx_result

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None, reason="the CUDA toolkit is not installed")

TENSOR_CORE_PTX = re.compile(r"wmma\.mma\.sync\.aligned\.(row|col)\.(row|col)\.m16n16k16\.f32\.f32")


def _verify_gpu_code(kernel) -> bool:
    """TVM's own GPU checks (MetaSchedule's ``VerifyGPUCode``) with the limits of an H100 and
    the package's shared-memory budget."""
    target = Target(
        {"kind": "cuda", "arch": str(kernel.target.attrs["arch"]), "max_threads_per_block": 1024, "thread_warp_size": 32,
         "max_shared_memory_per_block": SHARED_BYTES, "registers_per_block": 65536}
    )  # fmt: skip
    postproc = ms.postproc.VerifyGPUCode()
    postproc._initialize_with_tune_context(ms.TuneContext(mod=kernel.mod, target=target))
    return postproc.apply(s_tir.Schedule(kernel.mod))


def _check_cuda_kernel(kernel, tensor_cores: bool | None = None):
    arch = str(kernel.target.attrs["arch"])
    on_tensor_cores = kernel.units == "tensor-core"
    if tensor_cores is not None:
        assert on_tensor_cores == tensor_cores, kernel
    assert bool(TENSOR_CORE_PTX.search(kernel.ptx)) == on_tensor_cores, "mma instructions exactly where the rule says"
    entries = ptxas_report(kernel.ptx, arch)
    assert {e.name for e in entries} == set(kernel.ptx_entries)
    for entry in entries:
        assert entry.spill_stores == entry.spill_loads == 0, str(entry)
        assert entry.registers <= MAX_REGISTERS, str(entry)
        assert entry.shared_bytes <= SHARED_BYTES, str(entry)
    assert _verify_gpu_code(kernel), f"{kernel.name}: TVM's GPU verification failed"


RESNET = [(case, op, arch) for case in bench.load_cases("resnet50", (1, 8)) for op in ("filter", "input") for arch in ("sm_80", "sm_90")
          if arch == "sm_90" or case.N == 8]  # fmt: skip


@needs_nvcc
@pytest.mark.parametrize("case, op, arch", RESNET, ids=[f"{c.name}-{op}-{arch}" for c, op, arch in RESNET])
def test_resnet50_runs_on_tensor_cores(case, op, arch):
    kernel = build(bench.tbe_result(case, op), target={"kind": "cuda", "arch": arch}, schedules=None)
    _check_cuda_kernel(kernel, tensor_cores=True)


@needs_nvcc
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sweep_builds_within_the_limits(case):
    for result in (dw_result(case), dx_result(case)):
        kernel = build(result, target={"kind": "cuda", "arch": "sm_80"}, schedules=None)
        _check_cuda_kernel(kernel)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_emulated_cuda_schedule_matches_the_reference(case):
    """The CUDA schedule's index math, run: tiling, padding to whole tiles, shared-memory staging
    (the packs' gathers), fragments and the result's copy back, against the float64 reference."""
    for result, seed in ((dw_result(case), 1), (dx_result(case), 2)):
        kernel = emulate_cuda(result, {"kind": "cuda", "arch": "sm_80"})
        assert kernel.schedule == "emulated:cuda-sm_80" and kernel.target.kind.name == "llvm"
        check = check_kernel(kernel, seed=seed)
        assert check.ok, f"{kernel.units}: {check}"


@pytest.mark.parametrize("case", frontends.SWEEP, ids=[c.name() for c in frontends.SWEEP])
def test_emulated_frontends_match_the_reference(case):
    """The framework operators' CUDA schedules (tensor cores for fp16 inputs, SIMT for fp32 and
    bf16 ones), emulated, against the reference."""
    x, dy = frontends._placeholders(case)
    kernel = emulate_cuda(frontends._call(case, x, dy), {"kind": "cuda", "arch": "sm_80"})
    assert kernel.units == ("tensor-core" if case.dtype == "float16" and kernel.formulation != "depthwise" else "simt")
    xa, dya = frontends._arrays(case)
    frontends._check(kernel(xa, dya), frontends._expected(case, xa, dya), kernel, "emulated CUDA")


def test_emulation_keeps_the_tensor_core_structure():
    """An emulated kernel is the CUDA schedule (same blocks and fragments), not the CPU one."""
    case = next(c for c in CASES if c["groups"] == 1 and c["cin"] >= 16)
    kernel = emulate_cuda(dw_result(case), "cuda")
    tir = kernel.inspect_source("tir")
    assert kernel.units == "tensor-core"
    assert "_wmma_matrix_a" in tir and "_wmma_accumulator" in tir and 'scope="shared.dyn"' in tir
    assert "T.tvm_mma_sync" not in tir, "the intrinsics are emulated by their description"


@needs_nvcc
def test_exported_library_holds_the_host_function_and_the_kernels(tmp_path):
    """What can be checked of a CUDA export without a GPU: the host launcher is exported, the CUDA
    module (source of every kernel) is embedded; loading needs a CUDA runtime, and says so."""
    kernel = build(dw_result(CASES[0]), target={"kind": "cuda", "arch": "sm_80"})
    path = kernel.export_library(tmp_path / "dw_cuda.so")
    library = Path(path).read_bytes()
    assert f"__tvm_ffi_{kernel.name}".encode() in library
    assert all(entry.encode() in library for entry in kernel.ptx_entries)
    if kernel.has_device:
        assert tvm.runtime.load_module(path)[kernel.name] is not None
    else:
        with pytest.raises(RuntimeError, match="cuda"):
            tvm.runtime.load_module(path)


@pytest.mark.parametrize(
    "gemm, expected",
    [
        (GemmExtents(1, 64, 64, 25088), "small output, long K: 2x2 fragments per warp, 64-deep K steps"),
        (GemmExtents(1, 25088, 576, 576), "large output: 64-wide tiles"),
        (GemmExtents(1, 3, 16, 49), "tiny: one fragment"),
    ],
)
def test_config_fits_the_budget(gemm, expected):
    config = get_config(gemm, Target({"kind": "cuda", "arch": "sm_90"}))
    assert isinstance(config, Config)
    assert config.shared_bytes() <= SHARED_BYTES and config.threads <= 1024
    assert config.block_m * config.block_n <= 64 * 64
    if gemm.i >= 1024 and gemm.j >= 256:
        assert config.block_m == config.block_n == 64, expected
    if gemm.i < 16:
        assert config.block_m == 16, expected
