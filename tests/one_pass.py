"""What the tests of the one-pass kernels share (a layer's dX and dW on one read of dy:
``tests/test_depthwise_backward.py``, ``tests/test_pointwise_backward.py``): the bound their results
are checked within, the guarded child process, and the drop-in's profiled backward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tvm_convgrad import reference


def assert_within_summation_bound(x, dy, w, dx, dw, size, kernel, conv: dict, counts: tuple[int, int]):
    """dX and dW (NCHW / OIHW) within fp32's summation bound of the float64 references written from
    the formulas: ``n u sum|terms|`` for an element of ``n`` terms (any order of sums), ``u = 2^-24``;
    ``size`` x's (H, W), ``kernel`` (KH, KW), ``conv`` the strides, pads, dilations and groups,
    ``counts`` the terms of a dX and of a dW element."""
    expected_dx = reference.conv2d_backprop_input(w, dy, size, **conv)
    expected_dw = reference.conv2d_backprop_filter(x, dy, kernel, **conv)
    terms_dx = reference.conv2d_backprop_input(np.abs(w), np.abs(dy), size, **conv)
    terms_dw = reference.conv2d_backprop_filter(np.abs(x), np.abs(dy), kernel, **conv)
    u = 2.0**-24
    for name, got, expected, terms, count in (("dx", dx, expected_dx, terms_dx, counts[0]),
                                              ("dw", dw, expected_dw, terms_dw, counts[1])):  # fmt: skip
        assert got.shape == expected.shape and not np.isnan(got).any(), (name, got.shape, np.isnan(got).sum())
        error = np.abs(got.astype(np.float64) - expected)
        bound = count * u * terms + 1e-30
        assert (error <= bound).all(), f"{name}: worst {float((error / bound).max()):.3g} x the bound"


GUARDED_PREAMBLE = r"""
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, tvm
from guard_pages import GuardedMemory
from tvm_convgrad import isa_target
from tvm_convgrad.compile import build_func
from tvm_convgrad.isa import isa_plan
memory, side, target = GuardedMemory(), sys.argv[2], isa_target("native")
plan = isa_plan(target)
"""
"""What every guarded child script starts with: ``memory`` (:class:`guard_pages.GuardedMemory`), the
``side`` of its arrays the guard page lies on, this host's ``target`` and its ISA ``plan``."""


def assert_runs_guarded(script: str, side: str, cases: list):
    """``script`` (after :data:`GUARDED_PREAMBLE`) in a child process (``python -c script TESTS_DIR
    SIDE CASES``) that runs a kernel on arrays flush against a ``PROT_NONE`` page (:mod:`guard_pages`)
    and prints ``done``: a read or write past an edge faults the child, and this fails."""
    command = [sys.executable, "-c", GUARDED_PREAMBLE + script, str(Path(__file__).parent), side, repr(cases)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    finished = done.returncode == 0 and done.stdout.rstrip().endswith("done")
    assert finished, (done.returncode, done.stdout[-800:], done.stderr[-1500:])


def kernels_run(layer, x, grad) -> tuple[set, tuple]:
    """The package's kernels a training step of ``layer`` runs (their profiler ranges) and its gradients."""
    from torch.profiler import profile

    x = x.detach().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with profile() as prof:
        layer(x).backward(grad)
    names = {e.name for e in prof.events() if e.name.startswith("tvm_convgrad::")}
    return names, (x.grad, layer.weight.grad, layer.bias.grad)


def unaligned(shape, channels_last: bool):
    """A float32 tensor of ``shape`` (channels-last: NHWC memory) whose data starts one element past
    an aligned allocation."""
    import torch

    memory = (shape[0], *shape[2:], shape[1]) if channels_last else shape
    t = torch.rand(1 + int(np.prod(memory)))[1:].view(memory)
    return t.permute(0, 3, 1, 2) if channels_last else t
