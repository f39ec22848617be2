"""The drop-in's kernels run on PyTorch's OpenMP threads (``tvm_convgrad.torch.openmp``): no TVM
thread pool starts, results stay exact, from several Python threads too.

The thread counts are taken in a child process (a fresh one: TVM's pool, once started, stays),
with two OpenMP threads and two TVM threads asked for, so that a kernel on TVM's pool would add a
worker thread even on a one-core machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from conftest import torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")

CHILD = r"""
import json, os, sys
import torch
torch.set_num_threads(2)
def threads():
    return len(os.listdir("/proc/self/task"))
x = torch.rand(2, 16, 12, 12)
torch.nn.functional.conv2d(x, torch.rand(16, 16, 3, 3), padding=1)  # PyTorch's OpenMP team starts
counts = {"after torch": threads()}
if sys.argv[1] == "tvm-pool-first":  # a kernel built before the drop-in's import: TVM's own pool
    import numpy as np, tvm_convgrad
    from tvm_convgrad.frontends.conv2d import Conv2dGradients
    kernel = tvm_convgrad.build(Conv2dGradients((2, 16, 12, 12), (16, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32").weight_grad("k"))
    kernel(*[np.random.rand(*a.shape).astype(a.dtype) for a in kernel.inputs])
    counts["after a TVM-pool kernel"] = threads()
import tvm_convgrad.torch as tt
x.requires_grad_()
w = torch.rand(16, 16, 3, 3, requires_grad=True)
tt.conv2d(x, w, padding=1).sum().backward()
counts["after the drop-in's backward"] = threads()
counts["using_pytorch_threads"] = tt.using_pytorch_threads()
print(json.dumps(counts))
"""


def _child(mode: str) -> dict:
    env = {**os.environ, "TVM_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_tvm_thread_pool_starts_beside_pytorchs():
    counts = _child("drop-in")
    assert counts["using_pytorch_threads"] is True
    assert counts["after the drop-in's backward"] == counts["after torch"], counts


def test_a_kernel_on_tvms_pool_would_have_been_seen():
    """The control: TVM's pool adds its worker thread, so the check above can fail."""
    counts = _child("tvm-pool-first")
    assert counts["after a TVM-pool kernel"] > counts["after torch"], counts


def test_kernels_called_from_several_python_threads_at_once_are_exact():
    from tvm_convgrad.torch import conv2d

    torch.manual_seed(0)
    cases = [(torch.rand(2, 24, 10, 10), torch.rand(32, 24, 3, 3)) for _ in range(4)]
    expected = []
    for x, w in cases:
        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        torch.nn.functional.conv2d(x64, w64, padding=1).square().sum().backward()
        expected.append((x64.grad, w64.grad))
    failures: list = []

    def work(i: int):
        try:
            for _ in range(5):
                x, w = (t.clone().requires_grad_() for t in cases[i])
                conv2d(x, w, padding=1).square().sum().backward()
                torch.testing.assert_close(x.grad.double(), expected[i][0], rtol=1e-4, atol=1e-3)
                torch.testing.assert_close(w.grad.double(), expected[i][1], rtol=1e-4, atol=1e-3)
        except Exception as err:  # noqa: BLE001 - reported by the main thread
            failures.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
