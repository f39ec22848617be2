"""The bench command: case selection, summaries, and its table / JSON / PNG (timings are not checked)."""

from __future__ import annotations

import json
import math

import pytest

from tvm_convgrad import isa_target
from tvm_convgrad.tools import bench
from tvm_convgrad.tools.bench import cuda as bench_cuda
from tvm_convgrad.tools.bench import results as bench_results
from tvm_convgrad.tools.bench import run as bench_run
from tvm_convgrad.isa import host_can_run

from cli_runs import cli, cli_in_process
from conftest import needs_torch, slow


def test_case_selection():
    resnet = bench.load_cases("resnet50", (1, 8))
    assert len(resnet) == 46 and {c.kind for c in resnet} == {"resnet50"}
    everything = bench.load_cases("all", (1, 8))
    assert {c.kind for c in everything} == {"resnet50", "grouped", "depthwise", "dilated"} and len(everything) == 54
    assert [c.name for c in bench.load_cases("all", (8,), r"conv1\.")] == ["resnet_50_v1_5.conv1.n8"]
    conv1 = bench.load_cases("resnet50", (1,), "conv1")[0]
    assert conv1.flops == 2 * 1 * 64 * 3 * 7 * 7 * 112 * 112 and conv1.pads == [3, 3, 3, 3]
    conv3d = bench.load_cases("conv3d", (1, 8))
    assert len(conv3d) == 6 and {c.kind for c in conv3d} == {"conv3d"} and all(c.rank == 3 for c in conv3d)
    stem = conv3d[0]
    assert stem.spatial == ((16, 112, 112), (16, 56, 56), (3, 7, 7)) and stem.filter_sizes == [64, 3, 3, 7, 7]
    assert stem.flops == 2 * 64 * 3 * 3 * 7 * 7 * 16 * 56 * 56


def test_summary_is_a_geometric_mean():
    results = [bench.BenchResult(f"c{i}", "resnet50", 1, "wgrad", 10**9, "3x3/s1", 0.1, ours, 2.0) for i, ours in enumerate((1.0, 4.0))]
    (key, summary), = bench.summarize(results).items()
    assert key == "resnet50 wgrad N=1"
    assert math.isclose(summary["geomean_ratio"], 1.0) and summary["min_ratio"] == 0.5 and summary["min_case"] == "c1"


@slow
@needs_torch
def test_bench_command_writes_table_json_and_chart(tmp_path):
    args = ["bench", "--filter", r"res5b_branch2a\.n1", "--op", "both", "--rounds", "1", "--out", str(tmp_path), "--no-progress"]
    run = cli(*args, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "torch/ours" in run.stdout and "FMA peak" in run.stdout and "geomean" in run.stdout
    record = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["case"], r["op"]) for r in record["results"]] == [("resnet_50_v1_5.res5b_branch2a.n1", "wgrad"), ("resnet_50_v1_5.res5b_branch2a.n1", "dgrad")]
    assert all(r["ours_ms"] > 0 and r["torch_ms"] > 0 and r["compile_s"] > 0 for r in record["results"])
    assert len(record["fma_peak"]) == 2 and all(p["gflops"] > 0 for p in record["fma_peak"]) and record["environment"]["cores"] >= 1
    assert all(0 < r["ours_peak_fraction"] and 0 < r["torch_peak_fraction"] for r in record["results"])
    assert record["isa"]["name"] == "native" and all(r["torch_impl"] for r in record["results"])
    assert all(0 <= r["max_rel_err"] < 1e-2 and 0 <= r["bound_ratio"] <= 1 for r in record["results"]) and record["failed"] == []
    assert "max rel err" in (tmp_path / "README.md").read_text()
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@slow
@needs_torch
def test_bench_rejects_an_empty_selection(tmp_path):
    run = cli_in_process("bench", "--filter", "no-such-layer", "--out", str(tmp_path))
    assert run.returncode == 2 and "no benchmark case matches" in run.stderr and "Traceback" not in run.stderr


@slow
@needs_torch
@pytest.mark.skipif(not host_can_run(isa_target("avx2")), reason="this machine cannot run AVX2 code")
def test_bench_isa_caps_both_sides(tmp_path):
    """--isa avx2: ours built for AVX2, PyTorch capped to AVX2 before it loads (oneDNN says so)."""
    args = ["bench", "--isa", "avx2", "--filter", r"res5b_branch2a\.n1", "--op", "input", "--rounds", "1", "--out", str(tmp_path), "--no-progress"]
    run = cli(*args, timeout=600)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["isa"]["name"] == "avx2" and record["isa"]["ours"].startswith("avx2")
    assert record["environment"]["torch_cpu_capability"] == "AVX2"
    assert all("avx2" in r["torch_impl"] for r in record["results"]), [r["torch_impl"] for r in record["results"]]
    assert record["fma_peak"][0]["isa"] == "avx2" and record["fma_peak"][0]["lanes"] == 8


@needs_torch
def test_bench_checks_every_kernel_before_timing_it(tmp_path, monkeypatch, capsys):
    """A kernel that does not match the float64 reference is not timed: the others are, the
    report names it, and the command exits with status 1 naming it."""
    import dataclasses

    from tvm_convgrad.cli import main

    real = bench_results.check_kernel
    checked = []

    def wrong_dgrad(kernel, seed=0):  # the dgrad kernel computes "the wrong thing"
        checked.append(kernel.name)
        check = real(kernel, seed)
        return dataclasses.replace(check, worst_ratio=7.0) if "dgrad" in kernel.name else check

    monkeypatch.setattr(bench_results, "check_kernel", wrong_dgrad)
    args = ["bench", "--filter", r"res5b_branch2a\.n1", "--op", "both", "--rounds", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 1
    assert "resnet_50_v1_5.res5b_branch2a.n1 dgrad" in capsys.readouterr().err and len(checked) == 2
    record = json.loads((tmp_path / "bench.json").read_text())
    assert [r["op"] for r in record["results"]] == ["wgrad"] and [f["op"] for f in record["failed"]] == ["dgrad"]
    assert "does not match the reference" in (tmp_path / "README.md").read_text()


def test_bench_rejects_an_isa_the_machine_cannot_run(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_run, "host_can_run", lambda target: False)
    with pytest.raises(ValueError, match="cannot run"):
        bench.main("resnet50", (1,), ("filter",), r"conv1\.", 1, tmp_path, progress=False, isa="avx2")
    with pytest.raises(ValueError, match="--isa"):
        bench.main("resnet50", (1,), ("filter",), None, 1, tmp_path, progress=False, isa="avx3")


@slow
@needs_torch
def test_bench_times_the_onednn_frontend(tmp_path):
    """--api onednn: ours through ConvolutionBackwardWeights and ConvolutionBackwardData (float32
    NXC), PyTorch channels-last, both checked before they are timed."""
    args = ["bench", "--api", "onednn", "--filter", r"res5b_branch2a\.n1", "--op", "both", "--rounds", "1", "--out", str(tmp_path), "--no-progress"]
    run = cli(*args, timeout=600)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["settings"]["api"] == "onednn" and [r["op"] for r in record["results"]] == ["wgrad", "dgrad"]
    assert all(r["bound_ratio"] <= 1 for r in record["results"])
    assert "float32 NXC" in (tmp_path / "README.md").read_text()


def test_onednn_result_gives_both_gradients():
    case = bench.load_cases("resnet50", (1,), r"res3a_branch2b")[0]
    dx = bench.onednn_result(case, "input")
    assert dx.convgrad_call.op == "ConvolutionBackwardData" and [int(d) for d in dx.shape] == [1, case.H, case.W, case.Cin]
    assert bench.onednn_result(case).convgrad_call.op == "ConvolutionBackwardWeights"


def test_bench_rejects_unknown_apis_and_tbe_in_3d(tmp_path):
    with pytest.raises(ValueError, match="--api"):
        bench.main("resnet50", (1,), ("filter",), r"conv1\.", 1, tmp_path, progress=False, api="mkl")
    with pytest.raises(ValueError, match="conv3d"):
        bench.main("conv3d", (1,), ("filter",), None, 1, tmp_path, progress=False)


def test_onednn_result_of_a_3d_case_is_the_cube_with_a_depth_axis():
    case = bench.load_cases("conv3d", (1,), "layer4")[0]
    result = bench.onednn_result(case)
    assert [int(d) for d in result.shape] == [3, 3, 3, 512, 512]
    assert result.convgrad_params.geom.depth.kernel == 3 and result.convgrad_params.flops == case.flops


@slow
@needs_torch
def test_bench_times_default_and_tuned_side_by_side(tmp_path):
    """--schedule tuned with a database that holds no record for the case: both kernels timed,
    the tuned one reports the default schedule and the summary its speed ratio."""
    from tvm_convgrad.compile import open_database

    open_database(tmp_path / "empty", create=True)
    args = ["bench", "--schedule", "tuned", "--schedules", str(tmp_path / "empty"), "--filter", r"res5b_branch2a\.n1", "--op", "filter",
            "--rounds", "1", "--out", str(tmp_path / "out"), "--no-progress"]  # fmt: skip
    run = cli(*args, timeout=600)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "out" / "bench.json").read_text())
    (result,) = record["results"]
    assert result["tuned_ms"] > 0 and result["tuned_schedule"] == "default"
    assert "geomean_tuned_speedup" in next(iter(record["summary"].values()))
    assert "Tuned schedules" in (tmp_path / "out" / "README.md").read_text()


def _has_gpu() -> bool:
    import tvm

    return tvm.runtime.enabled("cuda") and tvm.cuda(0).exist


@slow
@needs_torch
@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU: the CUDA bench runs")
def test_cuda_bench_says_it_needs_a_gpu(tmp_path):
    for args, message in (
        (["--target", "cuda"], "--target cuda needs a CUDA GPU: TVM finds no CUDA GPU"),
        (["--target", "cuda", "--isa", "avx2"], "--isa, --api and --schedule are for the CPU"),
        (["--target", "cuda", "--suite", "conv3d"], "the TBE DSL is 2-D"),
    ):
        run = cli_in_process("bench", *args, "--out", str(tmp_path), "--no-progress")
        assert run.returncode == 2 and message in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    assert not (tmp_path / "bench.json").exists()


def test_cuda_bench_table_reports_ratios_against_the_goal():
    results = [bench.BenchResult(f"c{i}", kind, 8, "wgrad", 10**12, "3x3/s1", 1.0, ours, 2.0, [ours], [2.0], "cuDNN 90100, tensor-core")
               for i, (kind, ours) in enumerate((("resnet50", 1.0), ("resnet50", 4.0), ("depthwise", 2.0)))]  # fmt: skip
    table = bench_cuda.format_table(results, bench.summarize(results), "NVIDIA H100")
    assert "GPU: NVIDIA H100" in table and "cuDNN 90100, tensor-core" in table
    lines = {line.split("  ")[0].strip(): line for line in table.splitlines() if "geomean" in line}
    assert "torch/ours  1.00  min  0.50 (c1)" in lines["resnet50 wgrad N=8"] and lines["resnet50 wgrad N=8"].endswith(f"(goal {bench_cuda.CUDA_GOAL})")
    assert "min  1.00 (c2)" in lines["depthwise wgrad N=8"] and "goal" not in lines["depthwise wgrad N=8"]


@slow
@needs_torch
def test_cuda_bench_checks_times_and_reports_each_kernel(tmp_path, monkeypatch):
    """The CUDA bench's own steps (build, check against the reference, interleaved timing, the
    report), run without a GPU: the CUDA kernel replaced by its CPU emulation, cuDNN by PyTorch on
    the CPU, CUDA events by wall-clock samples."""
    import torch

    from tvm_convgrad import emulate_cuda

    monkeypatch.setattr(bench_cuda, "cuda_available", lambda: None)
    monkeypatch.setattr(bench_cuda, "build", lambda result, target, schedules: emulate_cuda(result, target))
    monkeypatch.setattr(bench_cuda, "torch_call", lambda case, op, rng, device, dtype: bench.torch_call(case, op, rng))
    monkeypatch.setattr(bench_cuda, "sample_cuda", bench.sample)
    monkeypatch.setattr(bench_cuda, "gpu_name", lambda: "emulated GPU")
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, benchmark=False):  # (a bare setattr is refused
        # once torch.testing._internal, which the OpInfo tests import, has frozen the global flags)
        summary = bench_cuda.main("all", (1,), ("filter", "input"), r"res5b_branch2a\.|dw144_s2", 2, tmp_path, progress=False)
    assert set(summary) == {"resnet50 wgrad N=1", "resnet50 dgrad N=1", "depthwise wgrad N=1", "depthwise dgrad N=1"}
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["environment"]["gpu"] == "emulated GPU" and len(record["results"]) == 4
    assert record["failed"] == []
    for r in record["results"]:
        assert r["ours_ms"] > 0 and r["torch_ms"] > 0 and len(r["ours_samples_ms"]) == len(r["torch_samples_ms"]) == 2
        assert 0 <= r["max_rel_err"] < 1e-2 and r["bound_ratio"] <= 1
        assert r["torch_impl"].endswith("tensor-core" if r["kind"] == "resnet50" else "simt")


def test_a_bf16_bench_runs_through_the_onednn_api_only(tmp_path):
    with pytest.raises(ValueError, match="--dtype bfloat16: TBE's DSL takes float16"):
        bench.main("resnet50", (1,), ("filter",), r"conv1\.", 1, tmp_path, progress=False, dtype="bfloat16")
    with pytest.raises(ValueError, match="--dtype"):
        bench.main("resnet50", (1,), ("filter",), r"conv1\.", 1, tmp_path, progress=False, api="onednn", dtype="float16")
    case = bench.load_cases("resnet50", (1,), r"res3a_branch2b")[0]
    for op in ("filter", "input"):
        result = bench.onednn_result(case, op, "bfloat16")
        assert result.dtype == "bfloat16" and result.convgrad_bf16_pairs is not None


@slow
@needs_torch
def test_a_bf16_bench_checks_times_and_reports_against_the_right_roofline(tmp_path):
    """Both sides in bf16; where the CPU has AVX512-BF16 the record holds the measured bf16 peak and
    each case's share of it, elsewhere it says that ours ran on the fp32 FMAs."""
    from tvm_convgrad.isa import isa_plan

    bench.main("resnet50", (1,), ("filter", "input"), r"res5b_branch2a\.", 1, tmp_path, progress=False, api="onednn", dtype="bfloat16")
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["settings"]["dtype"] == "bfloat16" and record["failed"] == [] and len(record["results"]) == 2
    report = (tmp_path / "README.md").read_text()
    assert "bfloat16 channels-last `torch.nn.grad`" in report
    if isa_plan(isa_target("native")).bf16_dot_pays:
        assert record["bf16_peak"]["gflops"] > 0 and all(r["ours_bf16_peak_fraction"] > 0 for r in record["results"])
        assert "vdpbf16ps` dot-product peak" in report
    else:
        assert record["bf16_peak"] is None and "runs no bf16 on `vdpbf16ps`" in report
