"""The Kernel API: argument order, calling conventions, timing, generated code, export, cache, CUDA."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import slow
import tvm

import tvm_convgrad
from tvm_convgrad import Timing, build, dsl, layout, lower
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel, expected_result, kernel_arrays, random_inputs

PARA = {"strides": [2, 1], "padding": [1, 0, 1, 2], "dilations": [1, 1, 1, 2], "groups": 2}


def _dw(kernel_name="dw_test_kernel", x_shape=(2, 2, 9, 8, 16), dy_shape=(2, 2, 4, 9, 16), filter_sizes=(24, 10, 3, 2)):
    x = placeholder(x_shape, name="fmap", dtype="float16")
    dy = placeholder(dy_shape, name="dedy", dtype="float16")
    return dsl.conv2d_backprop_filter(x, dy, filter_sizes, {**PARA, "kernel_name": kernel_name})


def _dx(kernel_name="dx_test_kernel", bias=False):
    filters = placeholder(layout.shape_fracz((24, 10, 3, 2), 2), name="weight", dtype="float16")
    dy = placeholder((2, 2, 4, 9, 16), name="dedy", dtype="float16")
    para = {k: v for k, v in PARA.items() if k != "groups"} | {"kernel_name": kernel_name, "res_dtype": "float32"}
    if bias:
        para["tensor_bias"] = placeholder((20,), name="bias", dtype="float16")
    return dsl.conv2d_backprop_input(filters, dy, (24, 10, 3, 2), (2, 20, 9, 8), para)


def test_arguments_are_in_tbe_order():
    kernel = build(_dw())
    assert [a.name for a in kernel.args] == ["fmap", "dedy", "dw_ddr"]
    assert kernel.inputs[0].shape == (2, 2, 9, 8, 16) and kernel.output.shape == (1, 12, 32, 16)
    assert kernel.output.dtype == "float32"
    assert kernel.flops == 2 * 2 * 24 * 10 * 3 * 2 * 4 * 9
    dx_kernel = build(_dx(bias=True))
    assert [a.name for a in dx_kernel.args] == ["weight", "dedy", "bias", "c_ddr"]
    assert "dw_test_kernel(fmap: float16[2, 2, 9, 8, 16]" in repr(kernel)


def test_explicit_argument_list_and_inferred_inputs():
    result = _dw("dw_listed")
    fmap, dedy = result.convgrad_inputs
    listed = build([fmap, dedy, result])
    assert [a.name for a in listed.args] == ["fmap", "dedy", "dw_ddr"]
    rebuilt = result.op.output(0)  # a fresh handle without the DSL's bookkeeping: inputs found by walking the graph
    inferred = build(rebuilt)
    assert [a.name for a in inferred.args] == ["fmap", "dedy", "dw_ddr"]
    assert inferred is listed  # the same workload, found in the cache


def test_numpy_and_tvm_tensor_calls_agree_and_match_the_reference():
    kernel = build(_dx(bias=True))
    inputs = random_inputs(kernel.params, seed=5, bias=kernel.inputs[2])
    arrays = kernel_arrays(kernel.params, inputs)
    result = kernel(*arrays)
    assert isinstance(result, np.ndarray)
    np.testing.assert_allclose(result, expected_result(kernel.params, inputs), rtol=1e-5, atol=1e-4)
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    out = tvm.runtime.empty(kernel.output.shape, kernel.output.dtype, tvm.cpu())
    returned = kernel(*tensors, out=out)
    assert returned is out
    np.testing.assert_array_equal(out.numpy(), result)
    assert isinstance(kernel(*tensors), tvm.runtime.Tensor)


def test_time_reports_medians_and_gflops():
    kernel = build(_dw())
    timing = kernel.time(repeat=3, min_repeat_ms=5)
    assert isinstance(timing, Timing) and len(timing.results) == 3
    assert timing.min <= timing.median and timing.median > 0
    assert timing.gflops == pytest.approx(kernel.flops / timing.median / 1e9)
    assert "GFLOP/s" in str(timing)


def test_kernel_name_is_the_compiled_symbol_and_generated_code_is_visible():
    kernel = build(_dw("my_dw_symbol"))
    assert kernel.name == "my_dw_symbol"
    assert kernel.executable["my_dw_symbol"] is not None
    assert re.search(r"\.globl\s+__tvm_ffi_my_dw_symbol$", kernel.source, re.M), "the assembly exports the symbol"
    assert "define" in kernel.inspect_source("ll")
    assert "dw_cc" in kernel.inspect_source("tir")
    with pytest.raises(ValueError):
        kernel.ptx


def _stage_loops(stmt, parallel: bool = False, found: dict | None = None) -> dict[str, bool]:
    """Block name -> whether a parallel loop encloses it, walking the scheduled TIR."""
    found = {} if found is None else found
    if isinstance(stmt, tvm.tirx.For):
        parallel = parallel or stmt.kind == tvm.tirx.ForKind.PARALLEL
    if isinstance(stmt, tvm.s_tir.SBlock):
        found[stmt.name_hint] = found.get(stmt.name_hint, False) or parallel
    for field in ("body", "block", "then_case", "else_case", "init"):
        child = getattr(stmt, field, None)
        if isinstance(child, tvm.tirx.Stmt):
            _stage_loops(child, parallel, found)
    for child in getattr(stmt, "seq", None) or []:
        _stage_loops(child, parallel, found)
    return found


def test_default_cpu_schedule_is_applied():
    """Every stage runs under a parallel loop and is vectorized over C0 (not silently unscheduled)."""
    for result in (_dw(), _dx()):
        kernel = build(result)
        func = next(iter(kernel.mod.functions.values()))
        stages = _stage_loops(func.body)
        stages.pop("root")
        assert len(stages) >= 4 and all(stages.values()), stages
        assert kernel.inspect_source("tir").count("T.vectorized(") >= 4


@slow
def test_export_library_runs_with_the_runtime_alone(tmp_path):
    kernel = build(_dw("exported_dw"))
    path = kernel.export_library(tmp_path / "dw.so")
    inputs = random_inputs(kernel.params, seed=9)
    arrays = kernel_arrays(kernel.params, inputs)
    np.save(tmp_path / "x.npy", arrays[0])
    np.save(tmp_path / "dy.npy", arrays[1])
    np.save(tmp_path / "expected.npy", kernel(*arrays))
    script = textwrap.dedent(
        f"""
        import sys, numpy as np, tvm
        assert "tvm.s_tir" not in sys.modules  # the compiler is not loaded
        f = tvm.runtime.load_module({str(path)!r})["exported_dw"]
        dev = tvm.cpu()
        out = tvm.runtime.empty({kernel.output.shape}, "float32", dev)
        f(tvm.runtime.tensor(np.load({str(tmp_path / 'x.npy')!r}), dev), tvm.runtime.tensor(np.load({str(tmp_path / 'dy.npy')!r}), dev), out)
        np.testing.assert_array_equal(out.numpy(), np.load({str(tmp_path / 'expected.npy')!r}))
        print("runtime-only OK")
        """
    )
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "runtime-only OK" in run.stdout


def test_builds_are_cached_by_workload():
    first = build(_dw("cached_dw"))
    assert build(_dw("cached_dw")) is first  # new placeholders, same workload
    assert build(_dw("other_name")) is not first
    assert build(_dw("cached_dw", filter_sizes=(24, 10, 3, 2), x_shape=(2, 2, 9, 8, 16))) is first


def test_the_build_cache_keeps_the_most_recent_kernels(monkeypatch):
    """The cache is bounded (a long sweep does not keep every executable): the least recently
    built or reused kernel goes first."""

    from tvm_convgrad.compile import builder

    monkeypatch.setattr(builder, "CACHED_KERNELS", 2)
    a = build(_dw("lru_a"))
    b = build(_dw("lru_b"))
    assert build(_dw("lru_a")) is a  # reused: now the most recent
    build(_dw("lru_c"))  # drops b
    assert build(_dw("lru_a")) is a and build(_dw("lru_b")) is not b


def test_lower_feeds_tvm_compile():
    result = _dx("lowered_dx")
    mod = lower(result)
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["lowered_dx"]
    with tvm_convgrad.pass_context("llvm"):
        executable = tvm.compile(mod, target=tvm_convgrad.resolve_target("llvm"))
    kernel = build(result)
    inputs = random_inputs(kernel.params, seed=4)
    arrays = kernel_arrays(kernel.params, inputs)
    dev = tvm.cpu()
    out = tvm.runtime.empty(kernel.output.shape, kernel.output.dtype, dev)
    executable["lowered_dx"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    np.testing.assert_allclose(out.numpy(), kernel(*arrays), rtol=1e-6)


@slow
def test_index_width():
    """LLVM kernels keep 64-bit indices (no NarrowDataType); CUDA ones use 32-bit unless a tensor
    has 2**31 elements or more (built only: 4 GiB of data is not allocated)."""
    assert "T.int64(" in build(_dw("wide_dw")).inspect_source("tir")
    asm = build(_dx("wide_dx")).source
    assert "vpsraq" not in asm, "no vectorized sign extension of 32-bit addresses"
    assert "T.int64(" not in build(_dw("narrow_dw"), target="cuda").inspect_source("tir")
    x = placeholder((1, 1, 1, 2**27, 16), name="x", dtype="float16")
    dy = placeholder((1, 1, 1, 2**27, 16), name="dy", dtype="float16")
    huge = dsl.conv2d_backprop_filter(x, dy, (16, 16, 1, 1), {"kernel_name": "huge_dw"})
    assert "T.int64(134217728)" in build(huge, target="cuda").inspect_source("tir")


def test_small_kernels_check_against_the_reference():
    for result in (_dw("dw_small"), _dx("dx_small", bias=True)):
        check = check_kernel(build(result), seed=11)
        assert check.ok, str(check)


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
@pytest.mark.parametrize("make", [_dw, _dx], ids=["dw", "dx"])
def test_cuda_build_produces_ptx_through_nvcc(make, tmp_path):
    name = f"cuda_{make.__name__.strip('_')}"
    kernel = build(make(name), target="cuda")
    assert kernel.target.kind.name == "cuda"
    assert "__global__" in kernel.source and "threadIdx.x" in kernel.source and "blockIdx.x" in kernel.source
    assert kernel.ptx_entries and all(e.startswith(f"{name}_kernel") for e in kernel.ptx_entries)
    assert ".version" in kernel.ptx
    assert os.path.getsize(kernel.export_library(tmp_path / "cuda.so")) > 0
    if not kernel.has_device:
        with pytest.raises(RuntimeError, match="no CUDA device"):
            kernel(*[np.zeros(a.shape, a.dtype) for a in kernel.inputs])
