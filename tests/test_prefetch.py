"""Software prefetch of the streams the CPU kernels read in place (:mod:`tvm_convgrad.schedule.cpu.prefetch`):
where the rule marks them, what :func:`lower_prefetches` emits (addresses ahead of the iteration,
clamped into the tensor), the instructions each x86 ISA gets, and the kernels still exact; the
prefetches of the kernels whose loops are written out (:func:`prefetch_run`)."""

from __future__ import annotations

import math
import re

import pytest
import tvm
from tvm import s_tir, te, tirx

from tvm_convgrad import build, isa_target, lower, pass_context
from tvm_convgrad.frontends import onednn
from tvm_convgrad.isa import host_can_run, isa_plan
from tvm_convgrad.schedule.cpu.depthwise_backward import ROWS_AHEAD, DepthwiseBackward, depthwise_backward_func, rows_ahead
from tvm_convgrad.schedule.cpu.pointwise_backward import PointwiseBackward, chunk_pixels, pointwise_backward_func
from tvm_convgrad.schedule.cpu.pointwise_forward import gemm_layer, pointwise_forward_func
from tvm_convgrad.schedule.cpu.prefetch import (CACHE_LINE, PREFETCH, PREFETCH_AHEAD_BYTES, PREFETCH_WRITE_HELPER, lower_prefetches,
                                               prefetch_stream, prefetched_buffers)
from tvm_convgrad.tools.verify import check_kernel

from conftest import NEON

ISAS = ("avx2", "avx512", "neon")
X86_PREFETCH = (r"prefetcht1\s", r"prefetcht0\s")
INTO_L2 = {"avx2": X86_PREFETCH, "avx512": X86_PREFETCH, "neon": (r"prfm\s+pldl2keep", r"prfm\s+pldl1keep")}
"""Each ISA's prefetch into L2 (:data:`~tvm_convgrad.schedule.cpu.prefetch.PREFETCH_LOCALITY`),
and into L1, which it must not be."""


TO_WRITE = {"avx2": r"prefetcht1\s", "avx512": r"prefetchw\s", "neon": r"prfm\s+pstl2keep"}
"""Each ISA's prefetch of a line to be written (:data:`~tvm_convgrad.schedule.cpu.prefetch.PREFETCH_WRITE_LLVM`):
``prefetchw`` where the target has PRFCHW (Broadwell on, every Zen; LLVM's ``haswell`` has not, and
asks for the line to read instead), AArch64's ``prfm pstl2keep``."""


def _target(isa: str):
    return tvm.target.Target(NEON) if isa == "neon" else isa_target(isa, cores=2)


def _input_grad(data_format: str, cin: int = 16, cout: int = 96, size: int = 28, images: int = 32):
    """A 1x1 stride-1 dX (MobileNetV2's 16 -> 96 expansion, smaller): the flat pixel tiles."""
    shape = (images, size, size, cout) if data_format == "NXC" else (images, cout, size, size)
    dy = te.placeholder(shape, "float32", name="diff_dst")
    w = te.placeholder((1, 1, cin, cout), "float32", name="weights")
    return onednn.convolution_backward_data(dy, w, (images, size, size, cin) if data_format == "NXC" else (images, cin, size, size),
                                            strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                                            data_format=data_format)  # fmt: skip


@pytest.mark.parametrize("isa", ISAS)
def test_a_1x1_dx_prefetches_the_dy_rows_it_reads_in_place(isa):
    """The NXC dX reads dy's rows where they lie, tile after tile: each tile asks for the rows of
    the tile about PREFETCH_AHEAD_BYTES ahead (one prefetch into L2 per cache line: x86's
    prefetcht1, AArch64's prfm pldl2keep; cross-compiled), the address clamped to dy's last
    element; NCX (dy packed: no stream) and a dy under STREAM_BYTES get none. Exact where the
    host runs it."""
    target = _target(isa)
    mod = lower(_input_grad("NXC"), target)
    (func,) = mod.functions.values()
    assert prefetched_buffers(func) == ["diff_dst"]
    script = func.script()
    lines = int(re.search(r"for line in range\(T\.int64\((\d+)\)\)", script).group(1))
    ahead, last = map(int, re.search(r"\+ T\.int64\((\d+)\) \+ line \* T\.int64\(16\), T\.int64\((\d+)\)\)", script).groups())
    tile = lines * CACHE_LINE // 4  # a tile's elements of dy: whole pixel rows of 96 channels
    assert tile % 96 == 0 and ahead % tile == 0 and (ahead - tile) * 4 < PREFETCH_AHEAD_BYTES <= ahead * 4
    assert last == 32 * 28 * 28 * 96 - 1, "every address clamped into dy"
    with pass_context(target):
        asm = tvm.compile(mod, target=target).mod.inspect_source("asm")
    into_l2, into_l1 = INTO_L2[isa]
    assert re.search(into_l2, asm) and not re.search(into_l1, asm)
    (planar,) = lower(_input_grad("NCX"), target).functions.values()
    (small,) = lower(_input_grad("NXC", images=4), target).functions.values()  # (1.2 MB of dy: left to the caches)
    assert prefetched_buffers(planar) == prefetched_buffers(small) == []
    if host_can_run(target):
        assert check_kernel(build(_input_grad("NXC"), target=target)).ok


def _weight_grad(cin: int, cout: int, size: int = 28, images: int = 32):
    """A 1x1 dW on NXC tensors (MobileNetV2's channels-last 1x1 layers, smaller)."""
    src = te.placeholder((images, size, size, cin), "float32", name="src")
    dy = te.placeholder((images, size, size, cout), "float32", name="diff_dst")
    return onednn.convolution_backward_weights(src, dy, (1, 1, cin, cout), strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                                               dilations=[1, 1])  # fmt: skip


def _loop_with(asm: str, instruction: str) -> str:
    """The instructions of the innermost loop holding ``instruction``: from the label its backward
    jump goes to, down to that jump."""
    lines = asm.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(instruction))
    end = next(i for i in range(at, len(lines)) if re.match(r"\s*j\w+\s+(\.LBB\w+)", lines[i]))
    label = re.match(r"\s*j\w+\s+(\.LBB\w+)", lines[end]).group(1)
    start = max(i for i in range(at + 1) if lines[i].startswith(label + ":"))
    return "\n".join(lines[start : end + 1])


def test_a_1x1_dw_prefetches_the_rows_it_reads_in_place_and_keeps_its_sums_in_registers():
    """A 1x1 NXC dW reads each pixel's run of 16 dy channels (a tile's Cout rows) where it lies,
    a row of Cout channels apart: each step asks for the run about PREFETCH_AHEAD_BYTES of runs
    ahead, and a prefetch in the steps leaves the tile's sums in registers (no store in the loop:
    LLVM's own declaration of the prefetch, which may write where it points, made it store and
    load the sums at every step). x (1.6 MB) is left to the caches; where x is the one read in
    place (144 -> 24: dy's 24 channels packed), x is the stream; where both are large, the loop
    prefetches both. Exact where the host runs it."""
    target = isa_target("avx512", cores=2)
    (func,) = lower(_weight_grad(16, 96), target).functions.values()
    assert prefetched_buffers(func) == ["diff_dst"]
    ahead = int(re.search(r"\+ T\.int64\((\d+)\) \+ line \* T\.int64\(16\)", func.script()).group(1))
    assert ahead == math.ceil(PREFETCH_AHEAD_BYTES / (16 * 4)) * 96, "runs of 16 channels, a row of 96 apart"
    with pass_context(target):
        asm = tvm.compile(lower(_weight_grad(16, 96), target), target=target).mod.inspect_source("asm")
    steps = _loop_with(asm, "prefetcht1")
    assert steps.count("vfmadd231ps") >= 16 and not re.search(r"vmov\w+\s+%zmm\d+, -?\d*\(", steps), steps
    (x_stream,) = lower(_weight_grad(144, 24), target).functions.values()
    assert prefetched_buffers(x_stream) == ["src"]
    (both,) = lower(_weight_grad(32, 96), target).functions.values()  # (x of 3.2 MB: a stream too, the same loop)
    assert sorted(prefetched_buffers(both)) == ["diff_dst", "src"]
    if host_can_run(target):
        assert check_kernel(build(_weight_grad(16, 96), target=target)).ok


def _stream(step: int, quadratic: bool = False, behind: int = 0) -> s_tir.Schedule:
    """``b[i] = sum_k a[i*step + k]`` (``a[i*i + k]``: no constant step; ``behind``: each row read
    ``behind`` elements back, 0 where that is before ``a``), its ``i`` loop marked."""
    rows = 64
    a = te.placeholder((rows * rows + step,), "float32", name="a")
    k = te.reduce_axis((0, step), name="k")

    def element(i):
        at = (i * i if quadratic else i * step) + k - behind
        return tirx.if_then_else(at >= 0, a[at], tirx.const(0, "float32")) if behind else a[at]

    b = te.compute((rows,), lambda i: te.sum(element(i), axis=k), name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    i, _ = sch.get_loops(sch.get_sblock("b"))
    prefetch_stream(sch, i, "a")
    return sch


def test_lower_prefetches_asks_for_the_iteration_ahead_and_never_past_the_tensor(monkeypatch):
    """One prefetch per cache line of iteration ``i + ahead``'s region (``ahead`` iterations are
    at least PREFETCH_AHEAD_BYTES), each clamped to the buffer's last element; the mark removed;
    a region without a constant step per iteration gets nothing; a module without marks is
    returned as it is; the result unchanged."""
    import numpy as np

    from tvm_convgrad.schedule.cpu import prefetch

    monkeypatch.setattr(prefetch, "STREAM_BYTES", 0)  # (a small stream, marked for the test)
    step = 48
    mod = lower_prefetches(_stream(step).mod)
    script = mod.script()
    ahead = math.ceil(PREFETCH_AHEAD_BYTES / (step * 4))
    assert PREFETCH not in script and prefetched_buffers(mod["main"]) == ["a"]
    assert f"for line in range({math.ceil(step * 4 / CACHE_LINE)})" in script
    assert f"T.min(i * {step} + {ahead * step} + line * 16, {64 * 64 + step - 1})" in script
    assert "T.max(" not in script, "i * step + ahead * step is never before the tensor"
    behind = lower_prefetches(_stream(step, behind=4000).mod).script()
    assert f"T.max(i * {step} - 4000 + {ahead * step} + line * 16, 0)" in behind, "nor ahead of a read that starts before it"
    quadratic = lower_prefetches(_stream(step, quadratic=True).mod)
    assert prefetched_buffers(quadratic["main"]) == [] and PREFETCH not in quadratic.script()
    plain = tvm.IRModule({"main": te.create_prim_func([te.placeholder((4,), name="x")])})
    assert lower_prefetches(plain)["main"].same_as(plain["main"])
    target = tvm.target.Target({"kind": "llvm"})
    with pass_context(target):
        run = tvm.compile(mod, target=target)
    a = np.random.default_rng(0).standard_normal(64 * 64 + step).astype("float32")
    b = tvm.runtime.tensor(np.zeros(64, "float32"))
    run["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_allclose(b.numpy(), [a[i * step : (i + 1) * step].astype("float64").sum() for i in range(64)], rtol=1e-5, atol=1e-5)


def _clamps(func, helper: str = "tvm_convgrad_prefetch") -> list[int]:
    """The last element each of ``helper``'s prefetches in a kernel written out (:func:`prefetch_run`)
    is clamped to, checked to be its tensor's last."""
    calls = re.findall(rf'"{helper}", T\.tvm_access_ptr\(T\.type_annotation\("float32"\), \w+\.data, '
                       r"T\.min\(.*, (\d+)\), (\d+) - T\.min\(", func.script())  # fmt: skip
    assert all(int(last) == int(size) - 1 for last, size in calls), "each address at most the last element"
    return [int(last) for last, _ in calls]


@pytest.mark.parametrize("isa", ISAS)
def test_the_written_out_1x1_kernels_ask_for_their_streams_a_chunk_ahead(isa):
    """The channels-last 1x1 kernels whose loops are written out read dy and x where they lie: the
    one-pass backward's dW steps ask for the runs of dy and of x of the pixel a chunk further on,
    the forward's tiles for the rows of x a chunk further on; every address clamped to its
    tensor's last element, into L2 on each ISA (cross-compiled); a layer whose tensors are under
    STREAM_BYTES asks for nothing (its rows stay in the caches)."""
    target = _target(isa)
    plan = isa_plan(target)
    layer = PointwiseBackward(32, 28, 28, 32, 96, False, plan.lanes, plan.registers, 2)  # (x of 3.2 MB, dy of 9.6)
    m = layer.m
    backward, forward = pointwise_backward_func(layer), pointwise_forward_func(layer, False)
    assert set(_clamps(backward)) == {m * 96 - 1, m * 32 - 1} and set(_clamps(forward)) == {m * 32 - 1}
    assert f"+ {chunk_pixels(layer)}) * 96" in backward.script() and f"+ {chunk_pixels(gemm_layer(layer))}) * 32" in forward.script()
    with pass_context(target):
        asm = tvm.compile(tvm.IRModule({"pointwise_backward": backward}), target=target).mod.inspect_source("asm")
    into_l2, into_l1 = INTO_L2[isa]
    assert re.search(into_l2, asm) and not re.search(into_l1, asm)
    small = PointwiseBackward(2, 12, 12, 16, 96, False, plan.lanes, plan.registers, 2)  # (dy of 110 KB)
    assert _clamps(pointwise_backward_func(small)) == _clamps(pointwise_forward_func(small, True)) == []


@pytest.mark.parametrize("isa", ISAS)
def test_the_one_pass_depthwise_kernel_asks_for_its_rows_ahead(isa):
    """The channels-last depthwise kernel written out: its dW loop asks for the lines of dy and of
    x it reads ROWS_AHEAD dy rows on, and, the layer strided, its dX loop for the lines of dX it
    writes as many dX rows on, to be written; each address clamped to its tensor's last element
    (and x's to its first: the window's rows may lie above the image), into L2 on each ISA
    (cross-compiled: TO_WRITE's instructions to write); at
    stride 1 no write is asked for; a layer whose x is under STREAM_BYTES asks for nothing."""
    target = _target(isa)
    lanes = isa_plan(target).lanes
    layer = DepthwiseBackward(32, 32, 28, 28, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), False, lanes, 2)  # (x of 3.2 MB)
    func = depthwise_backward_func(layer)
    x_last, dy_last = 32 * 28 * 28 * 32 - 1, 32 * 14 * 14 * 32 - 1
    assert rows_ahead(layer) == ROWS_AHEAD
    assert sorted(_clamps(func)) == [dy_last] + [x_last] * 4, "dy's pixel and x's stride x stride pixels"
    assert _clamps(func, PREFETCH_WRITE_HELPER) == [x_last] * 4, "dX's pixels: two row phases, two column phases each"
    with pass_context(target):
        asm = tvm.compile(tvm.IRModule({"depthwise_backward": func}), target=target).mod.inspect_source("asm")
    into_l2, into_l1 = INTO_L2[isa]
    assert re.search(into_l2, asm) and not re.search(into_l1, asm)
    assert re.search(TO_WRITE[isa], asm)
    unstrided = DepthwiseBackward(32, 32, 28, 28, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), False, lanes, 2)
    assert _clamps(depthwise_backward_func(unstrided)) and not _clamps(depthwise_backward_func(unstrided), PREFETCH_WRITE_HELPER)
    small = DepthwiseBackward(2, 32, 28, 28, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), False, lanes, 2)
    assert rows_ahead(small) == 0 and _clamps(depthwise_backward_func(small)) == _clamps(depthwise_backward_func(small), PREFETCH_WRITE_HELPER) == []
