"""The two TBE documentation examples run with only ``tbe`` replaced by ``tvm_convgrad``."""

from __future__ import annotations

import importlib

import pytest
import tvm

from tvm_convgrad import build
from tvm_convgrad import tvm as tbe_tvm
from tvm_convgrad.examples import SEEDS
from tvm_convgrad.tools.verify import check_kernel


@pytest.mark.parametrize("op", sorted(SEEDS))
def test_seed_example_builds_runs_and_matches_the_reference(op):
    module_name, attr = SEEDS[op]
    module = importlib.import_module(module_name)
    result = getattr(module, attr)
    kernel = build(result)
    assert kernel.name == module.kernel_name  # the kernel_name is the compiled function's symbol
    assert kernel.executable[module.kernel_name] is not None
    assert [a.name for a in kernel.inputs] == (["fmap", "out_backprop"] if op.endswith("filter") else ["filters", "out_backprop"])
    assert kernel.output.shape == ((1, 1, 16, 16) if op.endswith("filter") else (1, 1, 49, 16))
    check = check_kernel(kernel)
    assert check.ok, str(check)


def test_tbe_tvm_shim():
    p = tbe_tvm.placeholder((1, 2, 3), name="p", dtype="float16")
    assert isinstance(p, tvm.te.Tensor) and p.op.name == "p" and str(p.dtype) == "float16"
    assert str(tbe_tvm.placeholder([4]).dtype) == "float32"
    q = tbe_tvm.compute((1, 2, 3), lambda i, j, k: tbe_tvm.select(j > 0, p[i, j, k], tbe_tvm.const(1, "float16")), name="q")
    r = tbe_tvm.compute((1, 2, 3), lambda i, j, k: tbe_tvm.select(j > 0, p[i, j, k]), name="r")
    assert "if_then_else" in str(q.op.body[0]) and "if_then_else" in str(r.op.body[0])
    assert tbe_tvm.cpu is tvm.cpu and tbe_tvm.runtime is tvm.runtime  # everything else is tvm's
