"""CUDA kernels run on a GPU and compared with the float64 reference (``pytest -m gpu`` on a
machine with an NVIDIA GPU; skipped, with the reason, elsewhere).

Every CUDA design of the rule runs here on hardware: tensor-core WMMA GEMMs, split K, double-
buffered operand tiles (and the other double-buffering choice, the second design space), SIMT
(depthwise, the framework operators' f32 / bf16), a tuned record; both TBE operators and every
framework operator; and a ``bench --target cuda`` smoke run. The suite without a GPU checks the
same kernels' structure (``tests/test_cuda.py``: ptxas, GPU verification, the CPU emulation).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

import framework_cases
from runners import TimedByPosition
from random_cases import OPERATORS, valid_case, valid_result
from tbe_calls import dw_result, dx_result
from test_sweep import CASES
from tvm_convgrad import build, dsl, layout, pass_context, tune
from tvm_convgrad.tools import bench
from tvm_convgrad.schedule import CudaRule
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel

HAS_GPU = tvm.runtime.enabled("cuda") and tvm.cuda(0).exist
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU on this machine (TVM's tvm.cuda(0) does not exist)")]

CUDA = "cuda"  # this GPU's arch


def _run_checked(result):
    kernel = build(result, target=CUDA)
    assert kernel.has_device and kernel.target.kind.name == "cuda"
    check = check_kernel(kernel)
    assert check.ok, f"{kernel!r}: {check}"
    return kernel


RESNET = [(case, op) for case in bench.load_cases("resnet50", (1, 8)) for op in ("filter", "input")]


@pytest.mark.parametrize("case, op", RESNET, ids=[f"{c.name}-{op}" for c, op in RESNET])
def test_resnet50_on_the_gpu(case, op):
    kernel = _run_checked(bench.tbe_result(case, op))
    assert kernel.units == "tensor-core"


@pytest.mark.parametrize("case", bench.load_cases("all", (1, 8), "mobilenet|dilated|resnext"), ids=lambda c: c.name)
def test_depthwise_dilated_and_grouped_on_the_gpu(case):
    for op in ("filter", "input"):
        kernel = _run_checked(bench.tbe_result(case, op))
        assert kernel.units == ("simt" if case.kind == "depthwise" else "tensor-core")


@pytest.mark.parametrize("index", range(len(CASES)))
def test_sweep_on_the_gpu(index):
    """Both TBE operators over the randomized sweep (strides, dilations, asymmetric pads, groups)."""
    _run_checked(dw_result(CASES[index]))
    _run_checked(dx_result(CASES[index]))


@pytest.mark.parametrize("op", OPERATORS)
def test_random_calls_of_every_operator_on_the_gpu(op):
    """Random valid calls of every operator (framework operators: ranks 1-3, f32 / f16 / bf16)."""
    for i in range(12):
        case = valid_case(op, np.random.default_rng([7, OPERATORS.index(op), i]))
        _run_checked(valid_result(op, case))


def test_split_k_on_the_gpu():
    """res2a_branch2a's dW at N=8: a 64x64 output summed over 25088 positions, split over thread
    blocks (blockIdx.z) and summed by a second kernel."""
    case = next(c for c in bench.load_cases("resnet50", (8,)) if ".res2a_branch2a." in c.name)
    kernel = _run_checked(bench.tbe_result(case, "filter"))
    assert "blockIdx.z" in kernel.source and len(kernel.ptx_entries) == 2


def test_both_double_buffering_choices_on_the_gpu():
    """A GEMM the rule double-buffers, run, and the same GEMM with the other choice (the second
    design space tuning explores), compiled here and compared with the rule's result."""
    case = next(c for c in bench.load_cases("resnet50", (8,)) if ".res3b_branch2b." in c.name)
    result = bench.tbe_result(case, "filter")
    kernel = _run_checked(result)
    target = kernel.target
    _, inputs = dsl.result_info(result)
    func = te.create_prim_func([*inputs, result]).with_attr("global_symbol", kernel.name)
    sch = s_tir.Schedule(func)
    CudaRule().schedule(sch, target, double_buffer="switched")
    with pass_context(target):
        switched = tvm.compile(tvm.IRModule({kernel.name: sch.mod["main"]}), target=target)
    rng = np.random.default_rng(0)
    dev = tvm.cuda(0)
    arrays = [tvm.runtime.tensor(rng.uniform(-1, 1, a.shape).astype(a.dtype), dev) for a in kernel.inputs]
    ours = kernel(*arrays).numpy()
    out = tvm.runtime.empty(kernel.output.shape, kernel.output.dtype, dev)
    switched[kernel.name](*arrays, out)
    np.testing.assert_allclose(out.numpy(), ours, rtol=1e-5, atol=1e-3)


def test_framework_operators_in_every_type_on_the_gpu():
    from tvm_convgrad.frontends import onednn

    for dtype, units in (("float16", "tensor-core"), ("float32", "simt"), ("bfloat16", "simt")):
        x = te.placeholder((2, 14, 14, 32), dtype, name="src")
        dy = te.placeholder((2, 14, 14, 48), dtype, name="diff_dst")
        result = onednn.convolution_backward_weights(x, dy, [3, 3, 32, 48], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
        assert _run_checked(result).units == units


def test_a_tuned_record_on_the_gpu(tmp_path):
    """tune(target=cuda) on this GPU, its kept record built and run here."""
    x = placeholder(layout.shape_5hd(1, 64, 28, 28), name="input_x", dtype="float16")
    dy = placeholder(layout.shape_5hd(1, 64, 28, 28), name="out_backprop", dtype="float16")
    dw = dsl.conv2d_backprop_filter(x, dy, [64, 64, 3, 3], {"strides": [1, 1], "padding": [1, 1, 1, 1], "kernel_name": "gpu_tuned_dw"})
    report = tune(dw, target=CUDA, trials=8, work_dir=tmp_path / "local", runner="local", seed=3, progress=False)
    assert report.trials >= 1 and not report.failures, report.failures
    kept = tune(dw, target=CUDA, trials=8, work_dir=tmp_path / "kept", runner=TimedByPosition(), seed=3, progress=False)
    if not kept.kept:
        pytest.skip("the search's best candidate was the default schedule: nothing kept to run")
    kernel = build(dw, target=CUDA, schedules=kept.database)
    assert kernel.schedule == "tuned:best"
    assert check_kernel(kernel).ok


def test_cuda_bench_smoke(tmp_path):
    from tvm_convgrad.cli import main

    assert main(["bench", "--target", "cuda", "--filter", r"res5b_branch2a\.n1|dw144_s2\.n1", "--rounds", "1", "--suite", "all",
                 "--out", str(tmp_path), "--no-progress"]) == 0  # fmt: skip
    record = json.loads((tmp_path / "bench.json").read_text())
    assert len(record["results"]) == 4 and not record["failed"]
    for r in record["results"]:
        assert r["ours_ms"] > 0 and r["torch_ms"] > 0 and r["max_rel_err"] < 1e-2 and r["bound_ratio"] <= 1


def test_framework_cases_match_pytorch_on_the_gpu():
    """One framework sweep case per operator and type, GPU result against PyTorch autograd."""
    from conftest import torch

    if torch is None:
        pytest.skip("PyTorch is not installed")
    from test_frontends import SWEEP

    from test_backward_data import SWEEP as DATA_SWEEP

    for case in SWEEP[::4] + DATA_SWEEP[::4]:
        inputs = framework_cases.placeholders(case)
        kernel = build(framework_cases.call(case, *inputs), target=CUDA)
        arrays = framework_cases.arrays(case, seed=1)
        framework_cases.check(kernel(*arrays), framework_cases.torch_result(case, *arrays), kernel, "GPU vs PyTorch")
