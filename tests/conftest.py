"""Shared test helpers: the PyTorch oracle (when torch is installed) and closeness checks."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_convgrad import isa_target
from tvm_convgrad.isa import host_can_run, isa_plan
from tvm_convgrad.params import ConvGeometry, ConvGradParams
from tvm_convgrad.tools.verify import error_bound

try:
    import torch
except ImportError:  # the oracle tests skip without it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")


def _runnable_isas() -> list[str]:
    """``"native"`` (this CPU's plan) and every other x86 plan this host can execute: AVX2 and
    SSE code run on an AVX-512 machine, SSE code on an AVX2 one. Correctness tests run them all."""
    native = isa_plan(isa_target("native")).name
    others = [isa for isa in ("avx2", "sse") if isa != native and host_can_run(isa_target(isa))]
    return ["native", *others] if native in ("avx512", "avx2", "sse") else ["native"]


RUNNABLE_ISAS = _runnable_isas()

slow = pytest.mark.slow


def tiered(values, fast, ids=None, unpack: bool = False) -> list:
    """``values`` as pytest parameters, each marked ``slow`` unless ``fast(index, value)`` holds: the
    full suite runs them all, the fast tier (``-m "not slow"``) the chosen few. ``unpack``: each
    value is a tuple of several parameters."""
    return [pytest.param(*(v if unpack else (v,)), marks=() if fast(i, v) else (slow,), id=ids(v) if callable(ids) else None)
            for i, v in enumerate(values)]  # fmt: skip


def native_first(isas) -> list:
    """The ISA plans as parameters: this CPU's in the fast tier, the others (AVX2, SSE) in the full suite."""
    return tiered(isas, lambda i, isa: isa == "native")


def torch_filter_grad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    """dW OIHW in float64 from ``torch.nn.grad.conv2d_weight`` (asymmetric pads: pad x first)."""
    pt, pb, pl, pr = geom.pads
    xpad = torch.nn.functional.pad(torch.from_numpy(x.astype(np.float64)), (pl, pr, pt, pb))
    return torch.nn.grad.conv2d_weight(
        xpad, geom.filter_sizes, torch.from_numpy(dy.astype(np.float64)),
        stride=geom.strides, padding=0, dilation=geom.dilations, groups=geom.groups,
    ).numpy()  # fmt: skip


def torch_input_grad(w: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    """dX NCHW in float64 from ``torch.nn.grad.conv2d_input`` on the padded input, then cropped."""
    pt, pb, pl, pr = geom.pads
    padded = (geom.batch, geom.cin, geom.h + pt + pb, geom.w + pl + pr)
    dx = torch.nn.grad.conv2d_input(
        padded, torch.from_numpy(w.astype(np.float64)), torch.from_numpy(dy.astype(np.float64)),
        stride=geom.strides, padding=0, dilation=geom.dilations, groups=geom.groups,
    ).numpy()  # fmt: skip
    return dx[:, :, pt : pt + geom.h, pl : pl + geom.w]


def assert_within_bound(actual: np.ndarray, expected: np.ndarray, params: ConvGradParams, what: str = ""):
    """Every element within :func:`tvm_convgrad.tools.verify.error_bound` of ``expected``."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    error = np.abs(actual.astype(np.float64) - expected)
    ratio = error / error_bound(params, expected)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio.max() <= 1.0, (
        f"{what}: max error {error.max():.3g} is {ratio.max():.3g}x the bound, "
        f"worst at {worst}: {actual[worst]} vs {expected[worst]}"
    )
