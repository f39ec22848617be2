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
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from tvm_convgrad import Workload, build, dsl, emulate_cuda, layout
from tvm_convgrad.compile.ptxas import MAX_REGISTERS, kernel_report, parse_report, ptx_of, ptxas_report, spilled
from tvm_convgrad.schedule.cuda import with_limits
from tvm_convgrad.schedule.cuda import SHARED_BYTES, CudaRule, GemmConfig, GemmExtents, gemm_config, sm_count
from tvm_convgrad.tools import bench
from tvm_convgrad.tools.verify import check_kernel

import framework_cases
from conftest import slow, tiered
import test_backward_data as backward_data
import test_frontends as frontends
from runners import TimedByPosition
from tbe_calls import case_id, dw_result, dx_result
from test_sweep import CASES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None, reason="the CUDA toolkit is not installed")

TENSOR_CORE_PTX = re.compile(r"wmma\.mma\.sync\.aligned\.(row|col)\.(row|col)\.m16n16k16\.f32\.f32")


def _verify_gpu_code(kernel) -> bool:
    """TVM's own GPU checks (MetaSchedule's ``VerifyGPUCode``) with the limits of an H100 and
    the package's shared-memory budget."""
    postproc = ms.postproc.VerifyGPUCode()
    postproc._initialize_with_tune_context(ms.TuneContext(mod=kernel.mod, target=with_limits(kernel.target)))
    return postproc.apply(s_tir.Schedule(kernel.mod))


def _check_cuda_kernel(kernel, tensor_cores: bool | None = None):
    arch = str(kernel.target.attrs["arch"])
    on_tensor_cores = kernel.units == "tensor-core"
    if tensor_cores is not None:
        assert on_tensor_cores == tensor_cores, kernel
    assert bool(TENSOR_CORE_PTX.search(kernel.ptx)) == on_tensor_cores, "mma instructions exactly where the rule says"
    entries = kernel_report(kernel)
    assert {e.name for e in entries} == set(kernel.ptx_entries) and all(e.arch == arch for e in entries)
    for entry in entries:
        assert entry.spill_stores == entry.spill_loads == 0, str(entry)
        assert entry.registers <= MAX_REGISTERS, str(entry)
        assert entry.total_shared_bytes <= SHARED_BYTES, str(entry)  # static + the launch's dynamic part
    assert _verify_gpu_code(kernel), f"{kernel.name}: TVM's GPU verification failed"


RESNET = [(case, op, arch) for i, case in enumerate(bench.load_cases("resnet50", (1, 8))) for op in ("filter", "input")
          for arch in ("sm_80", "sm_90") if (arch == "sm_90" and (case.N == 8 or i % 2 == 0)) or (case.N == 8 and i % 3 == 0)]  # fmt: skip
"""ResNet-50 for sm_90 (H100): every case at N=8, every second at N=1; every third at N=8 for sm_80 (A100)."""


@needs_nvcc
@pytest.mark.parametrize("case, op, arch", tiered(RESNET, lambda i, r: ".res3b_branch2b.n8" in r[0].name and r[2] == "sm_90",
                                                  lambda r: f"{r[0].name}-{r[1]}-{r[2]}", unpack=True))
def test_resnet50_runs_on_tensor_cores(case, op, arch):
    kernel = build(bench.tbe_result(case, op), target={"kind": "cuda", "arch": arch}, schedules=None)
    _check_cuda_kernel(kernel, tensor_cores=True)


@needs_nvcc
@pytest.mark.parametrize("case", tiered(CASES[::2], lambda i, c: i in (1, 3), case_id))  # every second case; the fast tier: 2
def test_sweep_builds_within_the_limits(case):
    for result in (dw_result(case), dx_result(case)):
        kernel = build(result, target={"kind": "cuda", "arch": "sm_80"}, schedules=None)
        _check_cuda_kernel(kernel)


@pytest.mark.parametrize("case", tiered(CASES, lambda i, c: i < 7, case_id))  # every group kind once
def test_emulated_cuda_schedule_matches_the_reference(case):
    """The CUDA schedule's index math, run: tiling, padding to whole tiles, shared-memory staging
    (the packs' gathers), fragments and the result's copy back, against the float64 reference."""
    for result, seed in ((dw_result(case), 1), (dx_result(case), 2)):
        kernel = emulate_cuda(result, {"kind": "cuda", "arch": "sm_80"})
        assert kernel.schedule == "emulated:cuda-sm_80" and kernel.target.kind.name == "llvm"
        check = check_kernel(kernel, seed=seed)
        assert check.ok, f"{kernel.units}: {check}"


def _check_units(kernel, case):
    """fp32 and bf16 inputs run SIMT (an f16 tensor core would round them); fp16 cube mads run on
    tensor cores; the other fp16 formulations (depthwise, pixel lanes) wherever their mads are
    GEMM-shaped (a channel multiplier of 2, say), checked by their results only."""
    if case.dtype != "float16":
        assert kernel.units == "simt"
    elif kernel.formulation == "cube":
        assert kernel.units == "tensor-core"


@pytest.mark.parametrize("case", tiered(frontends.SWEEP, lambda i, c: i % 12 == 0, lambda c: c.name()))
def test_emulated_frontends_match_the_reference(case):
    """The framework operators' CUDA schedules (tensor cores for fp16 inputs, SIMT for fp32 and
    bf16 ones), emulated, against the reference."""
    x, dy = framework_cases.placeholders(case)
    kernel = emulate_cuda(framework_cases.call(case, x, dy), {"kind": "cuda", "arch": "sm_80"})
    _check_units(kernel, case)
    xa, dya = framework_cases.arrays(case)
    framework_cases.check(kernel(xa, dya), framework_cases.expected(case, xa, dya), kernel, "emulated CUDA")


@pytest.mark.parametrize("case", tiered(backward_data.SWEEP, lambda i, c: i == 4, lambda c: c.name()))
def test_emulated_backward_data_matches_the_reference(case):
    """ConvolutionBackwardData's CUDA schedule (the dX phases on tensor cores for fp16 inputs,
    SIMT otherwise; rank 3 with the depth folded into the batch), emulated, against the reference."""
    inputs = framework_cases.placeholders(case)
    kernel = emulate_cuda(framework_cases.call(case, *inputs), {"kind": "cuda", "arch": "sm_80"})
    _check_units(kernel, case)
    arrays = framework_cases.arrays(case)
    framework_cases.check(kernel(*arrays), framework_cases.expected(case, *arrays), kernel, "emulated CUDA")


FORWARD_CASES = [
    framework_cases.Case("fwd", 2, 32, 48, 1, (9, 11), (5, 11), (3, 3), (2, 1), (1, 1), (1, 1), (1, 1), dtype="float16",
                         effective_pads=(1, 1), bias=True),
    framework_cases.Case("fwd", 1, 24, 36, 3, (6, 5, 7), (6, 5, 5), (3, 1, 3), (1, 1, 1), (1, 0, 1), (1, 0, 1), (1, 1, 2),
                         data_format="NCX", weights_format="OIX", dtype="float16", effective_pads=(1, 0, 1)),
    framework_cases.Case("fwd", 2, 20, 16, 1, (8, 8), (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
]  # fmt: skip


@pytest.mark.parametrize("case", tiered(FORWARD_CASES, lambda i, c: i == 0, lambda c: c.name()))
def test_emulated_forward_matches_the_reference(case):
    """oneDNN's Convolution on the CUDA rule: its mad is a cube GEMM like the gradients' (tensor
    cores for fp16 inputs, SIMT for fp32), emulated, against the reference."""
    inputs = framework_cases.placeholders(case)
    kernel = emulate_cuda(framework_cases.call(case, *inputs), {"kind": "cuda", "arch": "sm_80"})
    assert kernel.units == ("tensor-core" if case.dtype == "float16" else "simt")
    arrays = framework_cases.arrays(case)
    framework_cases.check(kernel(*arrays), framework_cases.expected(case, *arrays), kernel, "emulated CUDA")


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
    config = gemm_config(gemm, sm_count(Target({"kind": "cuda", "arch": "sm_90"})))
    assert isinstance(config, GemmConfig)
    assert config.shared_bytes() <= SHARED_BYTES and config.threads <= 1024
    assert config.block_m * config.block_n <= 64 * 64
    if gemm.i >= 1024 and gemm.j >= 256:
        assert config.block_m == config.block_n == 64, expected
    if gemm.i < 16:
        assert config.block_m == 16, expected
    blocks = gemm.s * -(-gemm.i // config.block_m) * -(-gemm.j // config.block_n)
    if gemm.k >= 16384 and blocks < 132:
        assert 1 < config.split_k and blocks * config.split_k <= 132, f"{expected}: K split over more thread blocks"
    else:
        assert config.split_k == 1, expected


@slow
@needs_nvcc
def test_split_k_runs_small_outputs_over_many_thread_blocks(monkeypatch):
    """A dW whose output is one thread block's tile (32x32) and whose K is long (N*Ho*Wo = 1568),
    and a dX of few pixels with a long K (Cout*KH*KW), sum K slices in separate thread blocks, then
    add the slices: built within the limits, and, emulated, against the reference. (The dX as one
    phase: its 7x7 map would otherwise run as live-tap regions, one GEMM each.)"""
    from tvm_convgrad.dsl.compute import phases
    from tvm_convgrad.tvm import placeholder

    monkeypatch.setattr(phases, "LIVE_TAPS_SPLIT_BELOW", 0.0)  # (read by phases.region_split_below)

    x = placeholder(layout.shape_5hd(2, 32, 28, 28), name="input_x", dtype="float16")
    dy = placeholder(layout.shape_5hd(2, 32, 28, 28), name="out_backprop", dtype="float16")
    dw = dsl.conv2d_backprop_filter(x, dy, [32, 32, 1, 1], {"strides": [1, 1], "padding": [0, 0, 0, 0], "kernel_name": "split_k_dw"})
    assert gemm_config(GemmExtents(1, 32, 32, 2 * 28 * 28), sm_count(Target({"kind": "cuda", "arch": "sm_80"}))).split_k > 1
    kernel = build(dw, target={"kind": "cuda", "arch": "sm_80"}, schedules=None)
    _check_cuda_kernel(kernel, tensor_cores=True)
    assert len(kernel.ptx_entries) == 2, "the slices' GEMM, then their sum"
    emulated = emulate_cuda(dw, {"kind": "cuda", "arch": "sm_80"})
    assert check_kernel(emulated).ok
    # dX of a late layer at N=1: 49 pixels x 64 channels, K = 256 * 3 * 3
    w = placeholder(layout.shape_fracz((256, 64, 3, 3)), name="filters", dtype="float16")
    dy = placeholder(layout.shape_5hd(1, 256, 7, 7), name="out_backprop", dtype="float16")
    para = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "kernel_name": "split_k_dx"}
    dx = dsl.conv2d_backprop_input(w, dy, [256, 64, 3, 3], [1, 64, 7, 7], para)
    kernel = build(dx, target={"kind": "cuda", "arch": "sm_80"}, schedules=None)
    _check_cuda_kernel(kernel, tensor_cores=True)
    assert len(kernel.ptx_entries) == 2
    assert check_kernel(emulate_cuda(dx, {"kind": "cuda", "arch": "sm_80"})).ok




@slow
@pytest.mark.parametrize("case", CASES[::4], ids=case_id)
def test_sampled_tiles_match_the_reference(case):
    """``tunable=True``: the tensor cores' tiles are MetaSchedule samples. Tiles drawn as a tuning
    run draws them (block and warp tiles within the padding tile, K step), emulated, against the
    reference: the search can only pick among correct kernels."""
    target = {"kind": "cuda", "arch": "sm_80"}
    for result, seed in ((dw_result(case), 11), (dx_result(case), 12)):
        default = emulate_cuda(result, target)
        sampled = emulate_cuda(result, target, seed=seed)
        check = check_kernel(sampled, seed=seed)
        assert check.ok, f"{sampled.units}, seed {seed}: {check}"
        assert sampled.units == default.units


def test_the_tunable_default_is_the_default_schedule():
    """The design space's own decisions are the rule's default schedule (the search starts there),
    and every sample's trace replays with any decisions (MetaSchedule's search does)."""
    import tvm_ffi


    target = Target({"kind": "cuda", "arch": "sm_90"})
    case = next(c for c in bench.load_cases("resnet50", (8,)) if ".res3a_branch2b." in c.name)
    for op in ("filter", "input"):
        func = Workload.of(bench.tbe_result(case, op)).prim_func(target, "main")
        default, tunable = CudaRule().apply(func, target), CudaRule().apply(func, target, tunable=True)
        assert "sample_perfect_tile" in str(tunable.trace) and "sample_perfect_tile" not in str(default.trace)
        assert tvm_ffi.structural_equal(default.mod, tunable.mod)
        free = s_tir.Trace(tunable.trace.insts, {})
        replays = []
        for seed in range(1, 5):
            replay = s_tir.Schedule(func, seed=seed)
            free.apply_to_schedule(replay, remove_postproc=False)
            replays.append(replay.mod)
        assert any(not tvm_ffi.structural_equal(default.mod, mod) for mod in replays), "the samples explore"


@slow
@needs_nvcc
def test_tune_for_cuda_keeps_a_sampled_kernel_that_builds_and_computes(tmp_path):
    """``tune(target=cuda)`` over a runner (a GPU machine's RPC server; here one that times by
    position): the candidates build for the GPU, and the kept record builds within the limits and,
    emulated with its tiles, matches the reference."""
    from tvm_convgrad import tune
    from tvm_convgrad.tvm import placeholder

    x = placeholder(layout.shape_5hd(1, 64, 28, 28), name="input_x", dtype="float16")
    dy = placeholder(layout.shape_5hd(1, 64, 28, 28), name="out_backprop", dtype="float16")
    dw = dsl.conv2d_backprop_filter(x, dy, [64, 64, 3, 3], {"strides": [1, 1], "padding": [1, 1, 1, 1], "kernel_name": "tune_cuda_dw"})
    target = {"kind": "cuda", "arch": "sm_80"}
    report = tune(dw, target=target, trials=4, work_dir=tmp_path, runner=TimedByPosition(), seed=2, progress=False)
    assert report.trials >= 1 and not report.failures, report.failures
    if not report.kept:
        pytest.skip("the search's best candidate was the default schedule: nothing kept to check")
    kernel = build(dw, target=target, schedules=report.database)
    assert kernel.schedule == "tuned:best"
    _check_cuda_kernel(kernel, tensor_cores=True)
    emulated = emulate_cuda(dw, target, schedules=report.database)
    assert emulated.schedule == "emulated:tuned:best"
    assert check_kernel(emulated).ok


def _spilling_module(lanes: int = 160, threads: int = 1024) -> tvm.IRModule:
    """A CUDA kernel that must spill: each of a block's 1024 threads (so at most 64 registers
    each) keeps ``lanes`` float sums live over a reduction."""
    a = te.placeholder((threads * 4, 64), name="a")
    k = te.reduce_axis((0, 64), name="k")
    b = te.compute((threads * 4, lanes), lambda i, j: te.sum(a[i, k] * (j + 1.0) * a[(i + j) % (threads * 4), k], axis=k), name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    block = sch.get_sblock("b")
    i, j, kk = sch.get_loops(block)
    bx, tx = sch.split(i, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), tx)
    sch.reorder(kk, j)
    sch.unroll(j)
    sch.decompose_reduction(block, kk)
    return sch.mod


@needs_nvcc
def test_a_tuning_candidate_that_spills_registers_is_not_built():
    """The search's builder refuses a candidate whose kernel spills (ptxas -v), so tuning never
    keeps one; the default and the best, compared after the search, build whatever they spill;
    the progress callback counts a refusal as rejected, not as a failed trial."""
    from tvm_convgrad.tuning.runners import SPILLS, compile_candidate, compile_schedule
    from tvm_convgrad.tuning.space import Progress

    target = Target({"kind": "cuda", "arch": "sm_80"})
    mod = _spilling_module()
    (entry,) = ptxas_report(ptx_of(compile_schedule(mod, target), target), "sm_80")
    assert entry.spill_stores > 0 and entry.spill_loads > 0, "the module must spill for the test to mean anything"
    with pytest.raises(RuntimeError, match=f"rejected: {SPILLS}: main_kernel"):
        compile_candidate(mod, target)
    assert not spilled(ptxas_report(ptx_of(compile_candidate(_spilling_module(lanes=8), target), target), "sm_80"))
    bar = Progress(2, progress=False)  # its Python object: MetaSchedule's FFI apply wants a task scheduler
    refused = f"Traceback ...\nRuntimeError: rejected: {SPILLS}: {entry}"
    bar._inst.apply(None, 0, [], [ms.builder.BuilderResult(None, refused), ms.builder.BuilderResult(None, "nvcc: error")],
              [ms.runner.RunnerResult(None, "build failed")] * 2)  # fmt: skip
    assert bar.rejected == [f"trial 1: {entry}"] and len(bar.failures) == 1 and bar.failures[0].startswith("trial 2: build")


@needs_nvcc
def test_depthwise_simt_gathers_into_shared_memory_and_splits_long_sums():
    """Depthwise (no GEMM) on SIMT: dX gathers the thread block's dy and filter taps into shared
    memory once and casts its result in the same kernel; dW, whose few outputs are long sums,
    splits each sum over 16 threads (a cross-thread reduction with barriers between its steps)."""
    case = next(c for c in bench.load_cases("all", (8,)) if c.name.startswith("mobilenet_v2.dw144_s1"))
    target = {"kind": "cuda", "arch": "sm_90"}
    dx = build(bench.tbe_result(case, "input"), target=target, schedules=None)
    _check_cuda_kernel(dx, tensor_cores=False)
    assert len(dx.ptx_entries) == 1, "the result stage runs in the mad's threads"
    assert "__shared__ alignas(64) half dy_dw_shared" in dx.source and "__shared__ alignas(64) half w_dw_shared" in dx.source
    assert "__syncthreads();" in dx.source
    dw = build(bench.tbe_result(case, "filter"), target=target, schedules=None)
    _check_cuda_kernel(dw, tensor_cores=False)
    assert "threadIdx.y" in dw.source and "red_buf0" in dw.source
    assert dw.source.count("__syncthreads();") >= 5, "a barrier between the reduction's steps (its 16 slices span warps)"


def test_double_buffering_is_the_rules_choice_and_its_alternative_a_design_space():
    """Operand tiles are double-buffered where a thread block runs several K steps (the copies of
    the next step beside the mma of this one: a software pipeline); tuning gets the other choice
    as a second design space, so that a GPU measures whether the pipeline pays. Both compute the
    same thing (emulated, against the reference)."""
    import tvm

    from tvm_convgrad.compile import EMULATION_TARGET, Kernel

    target = Target({"kind": "cuda", "arch": "sm_80"})
    assert gemm_config(GemmExtents(1, 256, 576, 6272), sm_count(target)).double_buffer
    assert not gemm_config(GemmExtents(1, 256, 576, 64), sm_count(target)).double_buffer, "one K step: nothing to overlap"
    case = next(c for c in CASES if c["groups"] == 1 and c["cin"] >= 16)
    for result in (dw_result(case), dx_result(case)):
        workload = Workload.of(result)
        func = workload.prim_func(target)
        spaces = CudaRule().design_spaces(s_tir.Schedule(func), target)
        assert len(spaces) == 2 and sum("software_pipeline_stage" in str(space.trace) for space in spaces) == 1
        rule = CudaRule(emulate=True)
        switched = rule.schedule(s_tir.Schedule(func), target, config=rule.switched(target))
        mod = tvm.IRModule({workload.name: switched.mod["main"]})
        kernel = Kernel(tvm.compile(mod, target=EMULATION_TARGET), mod, workload, EMULATION_TARGET, "emulated:switched")
        assert check_kernel(kernel).ok


def test_an_unreadable_ptxas_report_fails():
    """A ptxas log the parser cannot read raises: it never reads as 0 registers or 0 spills."""
    good = ("ptxas info    : Compiling entry function 'k_kernel' for 'sm_90'\n"
            "ptxas info    : Function properties for k_kernel\n"
            "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
            "ptxas info    : Used 40 registers, 1024 bytes smem, 380 bytes cmem[0]\n")  # fmt: skip
    (entry,) = parse_report(good, "sm_90")
    assert (entry.registers, entry.spill_stores, entry.spill_loads, entry.shared_bytes) == (40, 8, 4, 1024)
    for broken in (good.replace("Used 40 registers", "Uses forty registers"), good.replace("bytes spill stores", "spills"), "", "ptxas fatal"):
        with pytest.raises(ValueError, match="ptxas"):
            parse_report(broken, "sm_90")


@needs_nvcc
def test_dynamic_shared_memory_is_counted_per_kernel():
    """The budget counts the dynamic shared memory a launch requests (the tensor cores' operand
    tiles live in ``shared.dyn``), per GPU kernel: a split-K GEMM's first kernel has it, the
    kernel that sums the slices none."""
    case = next(c for c in bench.load_cases("resnet50", (8,)) if ".res2a_branch2a." in c.name)
    kernel = build(bench.tbe_result(case, "filter"), target={"kind": "cuda", "arch": "sm_90"})
    entries = {e.name: e for e in kernel_report(kernel)}
    gemm, total = entries[f"{kernel.name}_kernel"], entries[f"{kernel.name}_kernel_1"]
    assert gemm.dynamic_shared_bytes > 0 and total.dynamic_shared_bytes == 0
    assert gemm.total_shared_bytes == gemm.shared_bytes + gemm.dynamic_shared_bytes <= SHARED_BYTES
    assert "dynamic" in str(gemm)
