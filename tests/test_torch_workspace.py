"""The drop-in's kernels take their scratch buffers from malloc (``tvm_convgrad.torch.workspace``),
as PyTorch's own ops do: every CPU workspace a kernel built after the import asks for is served by
the registered helper (its count rises), one built before keeps TVM's pool, and the gradients stay
exact; under the ``"kept"`` policy a large workspace is mapped once and re-used by the next call. (Why: glibc's heap then behaves beside the drop-in as beside PyTorch's own convolutions;
``python -m tvm_convgrad.training.torch_beside`` measures it. Timing is not a test.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import torch

pytestmark = [
    pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc workspaces are registered on Linux only"),
]


def test_the_drop_ins_kernels_take_their_workspaces_from_malloc_and_stay_exact():
    """An NCHW 3x3 layer (its dX and dW pack dy, x and the weights into workspaces), its backward
    through the registered helper: more workspaces served, gradients equal to float64 PyTorch's."""
    import tvm_convgrad.torch as tt

    assert tt.using_pytorch_allocator()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 40, 13, 11, generator=generator, requires_grad=True)
    w = torch.randn(24, 40, 3, 3, generator=generator, requires_grad=True)
    g = torch.randn(4, 24, 13, 11, generator=generator)
    before = tt.workspace_allocations()
    tt.conv2d(x, w, padding=1).backward(g)
    assert tt.workspace_allocations() >= before + 2
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch.nn.functional.conv2d(x64, w64, padding=1).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-4, atol=1e-3)


CHILD = r"""
import json
import numpy as np
import tvm_convgrad
from tvm_convgrad.frontends.conv2d import Conv2dGradients

def kernel(name):
    built = tvm_convgrad.build(Conv2dGradients((2, 40, 13, 11), (24, 40, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32", "NCX").weight_grad(name))
    return built, [np.random.rand(*a.shape).astype(a.dtype) for a in built.inputs]

before, inputs = kernel("before")  # built and run before the drop-in's import: TVM's pool
before(*inputs)
import tvm_convgrad.torch as tt
counts = {"import": tt.workspace_allocations()}
before(*inputs)
counts["a kernel built before"] = tt.workspace_allocations()
after, inputs = kernel("after")
after(*inputs)
counts["a kernel built after"] = tt.workspace_allocations()
print(json.dumps(counts))
"""


def test_a_kernel_built_before_the_import_keeps_tvms_pool():
    """The helper serves the kernels loaded after its registration only (the loader fills a
    kernel's function pointers when it loads it; a JIT module on its first call): in a fresh
    process, a kernel built and run before the drop-in's import adds nothing to the count when it
    runs again, one built after does."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["import"] == counts["a kernel built before"] == 0, counts
    assert counts["a kernel built after"] > 0, counts


def _layer_backward(generator_seed: int = 5):
    """A channels-last 3x3 layer's backward whose dX and dW pack into workspaces of 256 KiB or
    more; returns its two gradients and float64 PyTorch's."""
    generator = torch.Generator().manual_seed(generator_seed)
    x = torch.randn(4, 48, 30, 30, generator=generator).to(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(64, 48, 3, 3, generator=generator, requires_grad=True)
    g = torch.randn(4, 64, 30, 30, generator=generator)
    import tvm_convgrad.torch as tt

    tt.conv2d(x, w, padding=1).backward(g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch.nn.functional.conv2d(x64, w64, padding=1).backward(g.double())
    return (x.grad, w.grad), (x64.grad, w64.grad)


def test_kept_workspaces_are_mapped_once_and_re_used_and_released_on_leaving():
    """``set_workspaces("kept")``: the first backward maps its large workspaces and keeps them
    after the call; the next two map none (re-used: same sizes) and stay exact; back to
    ``"malloc"`` the kept ones are unmapped, and a call maps nothing."""
    import tvm_convgrad.torch as tt

    assert tt.get_workspaces() == "malloc"
    try:
        tt.set_workspaces("kept")
        assert tt.get_workspaces() == "kept"
        _layer_backward()
        first = tt.kept_workspaces()
        assert first["held"] >= 1 and first["bytes"] >= first["held"] * (256 << 10), first
        for seed in (6, 7):
            (dx, dw), (dx64, dw64) = _layer_backward(seed)
            torch.testing.assert_close(dx.double(), dx64, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(dw.double(), dw64, rtol=1e-4, atol=1e-3)
            assert tt.kept_workspaces() == first, (first, tt.kept_workspaces())
    finally:
        tt.set_workspaces("malloc")
    assert tt.kept_workspaces() == {"maps": first["maps"], "held": 0, "bytes": 0}
    before = tt.workspace_allocations()
    (dx, dw), (dx64, dw64) = _layer_backward(8)
    torch.testing.assert_close(dw.double(), dw64, rtol=1e-4, atol=1e-3)
    assert tt.workspace_allocations() > before and tt.kept_workspaces()["maps"] == first["maps"]


def test_a_workspace_policy_not_offered_is_refused_by_name():
    import tvm_convgrad.torch as tt
    from tvm_convgrad import ConvGradError

    with pytest.raises(ConvGradError, match=r"policy.*'pool'.*\['malloc', 'kept'\]"):
        tt.set_workspaces("pool")
    assert tt.get_workspaces() == "malloc"


def test_the_environment_chooses_the_policy_at_import():
    """``TVM_CONVGRAD_WORKSPACES=kept`` at import: the ``"kept"`` policy from the first call;
    a value not offered: the import fails naming the variable."""
    code = "import tvm_convgrad.torch as tt; print(tt.get_workspaces())"
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**os.environ, "TVM_CONVGRAD_WORKSPACES": "kept"})
    assert kept.returncode == 0 and kept.stdout.split()[-1] == "kept", kept.stderr[-3000:]
    wrong = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**os.environ, "TVM_CONVGRAD_WORKSPACES": "pool"})
    assert wrong.returncode != 0 and "TVM_CONVGRAD_WORKSPACES" in wrong.stderr and "'pool'" in wrong.stderr, wrong.stderr[-3000:]


def test_kept_workspaces_stay_exact_and_balanced_under_concurrent_calls():
    """Four Python threads (a kernel call releases the GIL; each thread runs its own OpenMP team)
    call three layers' dX and dW five times each under ``"kept"``, taking and returning mappings
    of several sizes at once: every result equals the one computed on one thread, and the slots'
    accounting balances (back to ``"malloc"``, nothing held and 0 bytes)."""
    import threading

    import tvm_convgrad.torch as tt
    from tvm_convgrad.torch import grads, kernels

    generator = torch.Generator().manual_seed(11)
    cases = []
    for x_shape, w_shape, stride, pad in (((4, 48, 30, 30), (64, 48, 3, 3), 1, 1), ((2, 64, 28, 28), (32, 64, 1, 1), 1, 0),
                                          ((2, 32, 40, 40), (64, 32, 3, 3), 2, 1)):  # fmt: skip
        x, w = torch.randn(x_shape, generator=generator), torch.randn(w_shape, generator=generator)
        dy = torch.randn(torch.nn.functional.conv2d(x, w, stride=stride, padding=pad).shape, generator=generator)
        plan = kernels.plan_for(x.shape, w.shape, [stride] * 2, [pad] * 4, [1, 1], 1, torch.float32, False)
        cases.append((plan, x, w, dy, grads.input_grad_of(plan, dy, w), grads.weight_grad_of(plan, dy, x)))
    failures = []

    def calls():
        try:
            for _ in range(5):
                for plan, x, w, dy, dx_once, dw_once in cases:
                    torch.testing.assert_close(grads.input_grad_of(plan, dy, w), dx_once, rtol=1e-5, atol=1e-5)
                    torch.testing.assert_close(grads.weight_grad_of(plan, dy, x), dw_once, rtol=1e-5, atol=1e-4)
        except Exception as failure:  # noqa: BLE001 - reported by the main thread
            failures.append(failure)

    try:
        tt.set_workspaces("kept")
        threads = [threading.Thread(target=calls) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        held = tt.kept_workspaces()
    finally:
        tt.set_workspaces("malloc")
    assert not failures, failures[0]
    assert 1 <= held["held"] and held["bytes"] >= held["held"] * (256 << 10), held
    assert tt.kept_workspaces()["held"] == 0 and tt.kept_workspaces()["bytes"] == 0, tt.kept_workspaces()
