"""The ``tvm-convgrad`` command: demo, run, and clean errors (status 2, no traceback)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("tvm-convgrad")
    command = [exe] if exe else [sys.executable, "-m", "tvm_convgrad.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def test_demo_runs_both_seed_examples():
    run = cli("demo", "--repeat", "2")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count(": OK") == 2
    assert "conv2d_backprop_filter_dx_1_1_7_7_16" in run.stdout and "conv2d_backprop_input_dx_1_1_7_7_16" in run.stdout
    assert run.stdout.count("GFLOP/s") == 2 and "max |error|" in run.stdout


@pytest.mark.parametrize("op", ["filter", "input"])
def test_run_any_shape(op):
    run = cli("run", "--op", op, "--input", "2,20,9,11", "--filter", "24,5,3,3", "--strides", "2,1",
              "--pads", "1,0,2,1", "--dilations", "1,2", "--groups", "4", "--repeat", "2")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert ": OK" in run.stdout and "GFLOP/s" in run.stdout
    assert f"conv2d_backprop_{op}" in run.stdout


def test_run_same_padding_and_float16_result():
    run = cli("run", "--op", "filter", "--input", "1,16,7,7", "--filter", "16,16,3,3", "--pads", "SAME", "--res-dtype", "float16", "--repeat", "1")
    assert run.returncode == 0, run.stderr
    assert "pads (1, 1, 1, 1)" in run.stdout and "float16[1, 9, 16, 16]" in run.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--op", "filter", "--input", "2,20,9", "--filter", "24,5,3,3"], "N,C,H,W"),
        (["run", "--op", "conv", "--input", "2,20,9,9", "--filter", "24,5,3,3"], "invalid choice"),
        (["run", "--op", "filter", "--input", "2,20,9,11", "--filter", "24,5,30,3", "--groups", "4"], "filter_sizes[2]"),
        (["run", "--op", "input", "--input", "2,20,9,11", "--filter", "24,5,3,3", "--groups", "3"], "input_sizes[1]"),
        (["run", "--op", "input", "--input", "2,20,9,11", "--filter", "24,5,3,3", "--groups", "5"], "groups"),
        (["run", "--op", "filter", "--input", "1,16,7,7", "--filter", "16,16,3,3", "--pads", "FULL"], "pads"),
        (["bench-nothing"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_without_traceback(args, message):
    run = cli(*args)
    assert run.returncode == 2
    assert message in run.stderr
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_run_cuda_target_without_gpu_reports_ptx():
    run = cli("run", "--op", "input", "--input", "1,16,6,6", "--filter", "16,16,3,3", "--target", "cuda")
    assert run.returncode == 0, run.stderr
    assert "PTX" in run.stdout and "conv2d_backprop_input_cce_kernel" in run.stdout
