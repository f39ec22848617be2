"""The ``tvm-convgrad`` command: demo, run, and clean errors (status 2, no traceback)."""

from __future__ import annotations

import shutil

import pytest

from cli_runs import cli, cli_in_process
from conftest import slow, tiered


def test_demo_runs_both_seed_examples():
    run = cli("demo", "--repeat", "2")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count(": OK") == 2
    assert "conv2d_backprop_filter_dx_1_1_7_7_16" in run.stdout and "conv2d_backprop_input_dx_1_1_7_7_16" in run.stdout
    assert run.stdout.count("GFLOP/s") == 2 and "max |error|" in run.stdout


@pytest.mark.parametrize("op", tiered(["filter", "input", "forward"], lambda i, op: op != "input"))
def test_run_any_shape(op):
    """The filter's run as a process (the entry point, with the demo), the others in this one."""
    run = (cli if op == "filter" else cli_in_process)("run", "--op", op, "--input", "2,20,9,11", "--filter", "24,5,3,3", "--strides", "2,1",
                                                      "--pads", "1,0,2,1", "--dilations", "1,2", "--groups", "4", "--repeat", "2",
                                                      *(["--bias"] if op == "forward" else []))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert ": OK" in run.stdout and "GFLOP/s" in run.stdout
    assert ("[conv]" if op == "forward" else f"conv2d_backprop_{op}") in run.stdout


@slow
def test_run_same_padding_and_float16_result():
    run = cli_in_process("run", "--op", "filter", "--input", "1,16,7,7", "--filter", "16,16,3,3", "--pads", "SAME", "--res-dtype", "float16",
                         "--repeat", "1")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "pads (1, 1, 1, 1)" in run.stdout and "float16[1, 9, 16, 16]" in run.stdout


FRAMEWORK_RUNS = {
    "convolution_backprop_filters": ["--input-forward", "2,9,9,8", "--output-delta", "2,5,9,12", "--filter-shape", "3,3,8,12",
                                     "--strides", "2,1", "--pads-begin", "1", "--pads-end", "1", "--dilations", "1,1"],
    "convolution_backward_weights": ["--src", "1,4,10", "--diff-dst", "1,6,3", "--weights-shape", "6,2,3", "--strides", "3",
                                     "--pads-begin", "1", "--pads-end", "0", "--groups", "2", "--data-format", "NCX",
                                     "--weights-format", "OIX", "--dtype", "float16"],
    "conv_transpose_backward_weights": ["--src", "1,8,5,5,5", "--diff-dst", "1,4,9,9,9", "--weights-shape", "8,4,3,3,3",
                                        "--strides", "2", "--pads-begin", "1", "--pads-end", "1", "--data-format", "NCX",
                                        "--weights-format", "IOX", "--dtype", "bfloat16"],
    "deconv_grad_filter": ["--params", "2,4,4,4,2,6,6,6,3,3,1,1,0,0,1,1,2,0", "--dtype", "float16"],
    "convolution_backward_data": ["--diff-dst", "2,5,9,12", "--weights", "3,3,8,12", "--dst-shape", "2,9,9,8", "--strides", "2,1",
                                  "--pads-begin", "1", "--pads-end", "1"],
    "convolution_backprop_data": ["--output-delta", "1,12,4,4,4", "--filter", "12,4,3,3,3", "--strides", "2", "--pads-begin", "1",
                                  "--pads-end", "1", "--output-padding", "1", "--groups", "2", "--data-format", "NCX",
                                  "--filter-format", "OIX", "--dtype", "bfloat16"],
    "convolution": ["--src", "2,9,9,8", "--weights", "3,3,4,12", "--strides", "2,1", "--pads-begin", "1", "--pads-end", "1", "--groups", "2",
                    "--bias", "--dtype", "bfloat16"],
}  # fmt: skip


@pytest.mark.parametrize("op", tiered(list(FRAMEWORK_RUNS), lambda i, op: i == 0))
def test_run_a_framework_operator(op):
    """``run --op`` takes the framework operators with their own argument names, checks every
    element against the operator's float64 reference and times it."""
    run = cli_in_process("run", "--op", op, *FRAMEWORK_RUNS[op], "--repeat", "1")
    assert run.returncode == 0, run.stderr
    assert f"[{op}]" in run.stdout and ": OK" in run.stdout and "GFLOP/s" in run.stdout


@pytest.mark.parametrize("op, shapes", [
    ("convolution", ["--src", "2,8,10,32", "--weights", "3,3,32,16", "--bias"]),
    ("convolution_backward_data", ["--diff-dst", "2,8,10,16", "--weights", "3,3,32,16", "--dst-shape", "2,8,10,32"]),
    ("convolution_backward_weights", ["--src", "2,8,10,32", "--diff-dst", "2,8,10,16", "--weights-shape", "3,3,32,16"]),
])  # fmt: skip
def test_run_takes_the_winograd_algorithm(op, shapes):
    """``run --algorithm winograd``: the forward, dX and dW of a 3x3 by F(2x2, 3x3), checked against
    the float64 reference."""
    run = cli_in_process("run", "--op", op, *shapes, "--pads-begin", "1", "--pads-end", "1", "--algorithm", "winograd", "--repeat", "1")
    assert run.returncode == 0, run.stderr
    assert "winograd]" in run.stdout and ": OK" in run.stdout


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
        (["run", "--op", "convolution_backprop_filters", "--input-forward", "2,9,9,8", "--filter-shape", "3,3,8,12"], "--output-delta"),
        (["run", "--op", "convolution_backprop_filters", "--input-forward", "2,9,9,8", "--output-delta", "2,8,7,12", "--filter-shape",
          "3,3,8,12"], "output_delta spatial axis 0"),
        (["run", "--op", "conv_transpose_backward_weights", "--src", "1,8,5,5", "--diff-dst", "1,4,9,9", "--weights-shape", "8,4,3,3",
          "--strides", "2", "--data-format", "NCX", "--weights-format", "IOX", "--output-padding", "2"], "output_padding"),
        (["run", "--op", "deconv_grad_filter", "--params", "1,2,3"], "params"),
        (["run", "--op", "deconv_grad_filter", "--params", "2,4,4,4,2,6,6,6,3,3,1,1,0,0,1,1,2,0", "--dtype", "bfloat16"], "dtype"),
        (["run", "--op", "filter", "--filter", "24,5,3,3"], "--input"),
        (["run", "--op", "input", "--input", "1,16,8,8", "--filter", "16,16,3"], "Cout,Cin_g,KH,KW"),
        (["run", "--op", "convolution_backward_data", "--diff-dst", "1,4,4,8", "--weights", "3,3,8,8", "--auto-pad", "same_upper"],
         "dst_shape"),
        (["run", "--op", "convolution_backward_data", "--weights", "3,3,8,8"], "--diff-dst"),
        (["run", "--op", "convolution", "--src", "2,9,9,8", "--weights", "3,3,5,12"], "weights.shape"),
        (["run", "--op", "forward", "--input", "2,16,9,9", "--filter", "16,16,3,3", "--strides", "64"], "stride_h"),
        (["run", "--op", "convolution", "--src", "2,9,9,16", "--weights", "3,3,16,16", "--strides", "2", "--algorithm", "winograd"],
         "algorithm"),
        (["run", "--op", "convolution_backprop_filters", "--input-forward", "2,9,9,16", "--output-delta", "2,7,7,16", "--filter-shape",
          "3,3,16,16", "--algorithm", "winograd"], "only convolution_backward_data"),
    ],
)
def test_bad_arguments_exit_2_with_the_message(args, message, capsys):
    from tvm_convgrad.cli import main

    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_bad_argument_stops_the_process_without_traceback():
    run = cli("run", "--op", "filter", "--input", "2,20,9,11", "--filter", "24,5,30,3", "--groups", "4")
    assert run.returncode == 2 and "filter_sizes[2]" in run.stderr
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout


@slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_run_cuda_target_without_gpu_reports_ptx():
    run = cli_in_process("run", "--op", "input", "--input", "1,16,6,6", "--filter", "16,16,3,3", "--target", "cuda")
    assert run.returncode == 0, run.stderr
    assert "PTX" in run.stdout and "conv2d_backprop_input_cce_kernel" in run.stdout
