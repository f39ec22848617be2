"""The CUDA bench split in two (``tools.bench.cuda_export`` here, ``cuda_remote`` on a GPU machine
with TVM's runtime alone), and what its first run on a GPU found.

Without a GPU the runner runs a folder exported for this CPU (``--device cpu``): the same packing,
PyTorch float64 reference, bound and report as on the GPU. Its check fails on a kernel that computes
another convolution. The GPU run (an H200, 2026-12-04) found two kinds of kernel that left elements
of their result unwritten; the emulation had passed them because a fresh result array is zeroed.
``check_kernel`` now writes over NaNs, and those cases are tested here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tvm_convgrad import emulate_cuda
from tvm_convgrad.tools import bench
from tvm_convgrad.tools.bench import cuda_export, cuda_remote
from tvm_convgrad.tools.verify import check_kernel

from conftest import needs_torch

SM90 = {"kind": "cuda", "arch": "sm_90"}


@pytest.mark.parametrize("name, op", [("conv1", "filter"), ("res3a_branch1", "input")])
def test_every_element_of_the_result_is_written(name, op):
    """conv1's dW (3 input channels: 13 of 16 ``c0`` are pads) and a 1x1 stride-2 dX (3 of 4 stride
    phases have no tap): TVM fused the zeroing result stage into the GEMM's (or the split-K sum's)
    threads, which have no point for the zeros, and dropped those writes. Run on an H200 they read
    4.8e4 and 8.2e3 times the error bound; here they failed against a result array of NaNs."""
    case = bench.load_cases("resnet50", (1,), rf"\.{name}\.")[0]
    kernel = emulate_cuda(bench.tbe_result(case, op), SM90)
    check = check_kernel(kernel)
    assert check.ok, f"{kernel.units}: {check}"


@needs_torch
def test_the_runner_checks_an_exported_folder(tmp_path):
    """Every kernel of a folder matches PyTorch's float64 gradient within the bound; a manifest
    that says another dilation (so another reference) fails the check and the run."""
    kernels = cuda_export.export(tmp_path, "all", (1,), r"res3b_branch2b|dw144_s2|conv18", ("filter", "input", "forward"), arch="llvm")
    assert {k["op"] for k in kernels} == {"filter", "input", "forward"} and len(kernels) == 9
    assert not any(k["whole"] for k in kernels if k["kind"] == "grouped" and k["op"] == "filter")
    record = cuda_remote.run(tmp_path, device="cpu", timing=False)
    assert [r["ok"] for r in record["results"]] == [True] * 9, record["results"]
    assert all(0 < r["worst_ratio"] <= 1 for r in record["results"])

    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (dw_3x3,) = [k for k in manifest["kernels"] if k["case"].startswith("resnet") and k["op"] == "filter"]
    wrong = dw_3x3 | {"pad": [2, 2], "dilation": [2, 2]}  # the same shapes, another convolution
    (tmp_path / "manifest.json").write_text(json.dumps(manifest | {"kernels": [wrong]}))
    assert cuda_remote.main([str(tmp_path), "--device", "cpu", "--no-time"]) == 1


@needs_torch
def test_the_runner_needs_only_the_runtime(tmp_path):
    """The exported runner, run as the GPU machine runs it (TVM's runtime library alone, no
    tvm_convgrad on the path), checks and times a kernel."""
    cuda_export.export(tmp_path, "resnet50", (1,), r"res5b_branch2a", ("input",), arch="llvm")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TVM_USE_RUNTIME_LIB": "1"}
    out = tmp_path / "record.json"
    run = subprocess.run([sys.executable, str(tmp_path / "cuda_remote.py"), str(tmp_path), "--device", "cpu", "--rounds", "1",
                          "--sample-s", "0.01", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["ok"] and row["ours_ms"] > 0 and row["torch_ms"] > 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_the_export_compiles_each_kernel_for_the_gpu(tmp_path):
    """A CUDA export holds the library and its source compiled into a fatbin for the arch, keyed by
    the source's hash, which is what TVM's runtime hands the compile callback when it loads it."""
    (kernel,) = cuda_export.export(tmp_path, "resnet50", (1,), r"res4b_branch2b", ("filter",), arch="sm_90")
    assert kernel["units"] == "tensor-core"
    fatbin = (tmp_path / f"{kernel['name']}.fatbin").read_bytes()
    assert fatbin[:4] == bytes.fromhex("50ed55ba")  # a fatbin's magic number, little-endian
    library = (tmp_path / f"{kernel['name']}.so").read_bytes()
    assert b"wmma" in library  # the CUDA source, compiled again only where no fatbin answers
    assert (tmp_path / "layout.py").read_text() == open(cuda_export.layout.__file__).read()
