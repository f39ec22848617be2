"""Issue 27: a 1x1 at stride 1 over channel-planar (NCX) tensors is one GEMM per image whose pixels
lie contiguous in every activation. The fp32 dX and forward run it with the pixels on the lanes
(``dx_px`` / ``conv_px``, ``Formulation.PIXEL_LANES``): the activation read where it lies (no pack),
result rows written from the task's sums (no transpose of 16-channel rows), tiles of channels x
vectors of consecutive pixels (:func:`~tvm_convgrad.schedule.cpu.tiles.planar_tile`). NXC, a plane
that is not whole vectors and bf16 keep the cube. Each kernel is scheduled for AVX-512 and AVX2 on
any host and run (exact against the float64 reference) where the host can.
"""

from __future__ import annotations

import re

import pytest
from tvm import te
from tvm.tirx import ForKind

from tvm_convgrad import build, isa_target
from tvm_convgrad.compile import Workload, resolve_target
from tvm_convgrad.frontends import onednn
from tvm_convgrad.isa import host_can_run, isa_plan
from tvm_convgrad.schedule import rule_for
from tvm_convgrad.schedule.cpu.tiles import planar_tile
from tvm_convgrad.tools.verify import check_kernel

from conftest import NEON

_UNROLLED = re.compile(r"T.unroll\(T.int64\((\d+)\)\)")


def _activation(data_format: str, batch: int, channels: int, size, name: str, dtype: str = "float32") -> te.Tensor:
    return te.placeholder((batch, channels, *size) if data_format == "NCX" else (batch, *size, channels), dtype, name=name)


def _check_planar(result: te.Tensor, target, planar: bool, channels: int, pixels: int, packs: tuple[str, ...], written: str):
    """The kernel's formulation; no ``packs`` stage; where ``planar``: its tile (``channels`` of the
    result's, ``pixels`` a plane) unrolled as :func:`planar_tile` says, within the registers, its
    weights packed a tile's ``R`` channels innermost (``w_t[channel // R, step, .., channel % R]``), the
    result stage ``written`` inside the mad's parallel tasks, a tunable schedule with the same
    tiles; exact where the host runs it."""
    kernel = build(result, target=target)
    tir = kernel.inspect_source("tir")
    assert (kernel.formulation == "pixel-lanes") == planar and (kernel.formulation == "cube") != planar
    assert not any(f'T.sblock("{pack}")' in tir for pack in packs)
    if planar:
        plan = isa_plan(target)
        r, v = planar_tile(channels, pixels, plan)
        assert channels % r == 0 and r * v <= plan.accumulators and r * v + v + 1 <= plan.registers
        assert re.search(rf"w_t = T.sblock_alloc_buffer\(\(T.int64\({channels // r}\), T.int64\(24\), (T.int64\(1\), )*T.int64\({r}\)\)\)", tir)
        assert re.search(rf"for \w+ in T.unroll\(T.int64\({r}\)\):\n\s+for \w+ in T.unroll\(T.int64\({v}\)\):\n\s+for \w+ in T.vectorized\(T.int64\({plan.lanes}\)\)", tir)
        sch = rule_for(target).apply(Workload.of(result).prim_func(target), target)
        assert sch.get(sch.get_loops(sch.get_sblock(written))[0]).kind == ForKind.PARALLEL  # (written back in the mad's tasks)
        tunable = rule_for(target).apply(Workload.of(result).prim_func(target), target, tunable=True).mod.script()  # (the same tiles)
        assert max(int(e) for e in _UNROLLED.findall(tunable)) <= max(r, v)
    if host_can_run(target):
        assert check_kernel(kernel).ok


_CASES = [("NCX", 2, 40, (8, 6)), ("NCX", 1, 64, (7, 16)), ("NCX", 3, 48, (4, 28)), ("NCX", 2, 24, (4, 4)), ("NXC", 2, 40, (8, 6)), ("NCX", 2, 40, (7, 7))]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, batch, cin, size", _CASES)
def test_an_ncx_1x1_dx_runs_with_the_pixels_on_the_lanes(isa, data_format, batch, cin, size):
    """dX of a 1x1 at stride 1, 24 dy channels: diff_dst read where it lies (no ``dy_rows`` /
    ``dy_pad`` pass), diff_src rows written from the task's sums (ResNet-50's 256 -> 64 on 56x56,
    N=8, Zen 4: 7.6 -> 5.8 ms). The tiles keep accumulators, loads and a broadcast within the
    registers (the AVX-512 inner loop spilled with 4 x 7), with 16 channels or more (24: fewer than
    AVX-512's accumulators, MobileNetV2's); a tunable schedule gets the same tiles (it unrolled
    every channel); 7x7 and NXC keep the cube (a 7x7's small planes packed on AVX2, ``PLANAR_IN_PLACE_BYTES``)."""
    from tvm_convgrad.dsl.compute.backprop_input import PLANAR_IN_PLACE_BYTES

    target = resolve_target(isa_target(isa))
    dy = _activation(data_format, batch, 24, size, "diff_dst")
    weights = te.placeholder((24, cin, 1, 1) if data_format == "NCX" else (1, 1, cin, 24), "float32", name="weights")
    shape = [batch, cin, *size] if data_format == "NCX" else [batch, *size, cin]
    dx = onednn.convolution_backward_data(dy, weights, shape, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                                          data_format=data_format, weights_format="OIX" if data_format == "NCX" else "XIO")  # fmt: skip
    planar = data_format == "NCX" and size[0] * size[1] % 16 == 0
    narrow = isa_plan(target).registers_per_row > 1  # (the cube packs small planes for narrow tiles: WIDE_TILES_IN_PLACE)
    small_planes = data_format == "NCX" and size[0] * size[1] * 4 < PLANAR_IN_PLACE_BYTES and not planar and narrow
    _check_planar(dx, target, planar, cin, size[0] * size[1], ("dy_rows",) if small_planes else ("dy_rows", "dy_pad"), "diff_src")


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, batch, cout, size", _CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_an_ncx_1x1_forward_runs_with_the_pixels_on_the_lanes(isa, data_format, batch, cout, size, bias):
    """The forward of a 1x1 at stride 1 from 24 channels: src read where it lies (no ``x_rows`` /
    ``fmap_pad``), dst rows written from the task's sums with the bias (40 output channels: a
    partial block, its lanes masked). ResNet-50's 64 -> 256 on 56x56, N=8, Zen 4: 7.6 -> 6.2 ms;
    MobileNetV2's 24 -> 144 on 32x32 1.19 -> 0.63."""
    target = resolve_target(isa_target(isa))
    src = _activation(data_format, batch, 24, size, "src")
    weights = te.placeholder((cout, 24, 1, 1) if data_format == "NCX" else (1, 1, 24, cout), "float32", name="weights")
    b = te.placeholder((cout,), "float32", name="bias") if bias else None
    dst = onednn.convolution(src, weights, b, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], data_format=data_format,
                             weights_format="OIX" if data_format == "NCX" else "XIO")  # fmt: skip
    planar = data_format == "NCX" and size[0] * size[1] % 16 == 0
    _check_planar(dst, target, planar, cout, size[0] * size[1], ("x_rows", "fmap_pad"), "dst")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_planar_1x1_in_half_types_keeps_the_cube(dtype):
    """The planar GEMMs read fp32 in place; a bf16 or fp16 NCX 1x1 converts in its packs, on the cube."""
    src = _activation("NCX", 2, 24, (8, 6), "src", dtype)
    weights = te.placeholder((40, 24, 1, 1), dtype, name="weights")
    dst = onednn.convolution(src, weights, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], data_format="NCX", weights_format="OIX")
    assert build(dst).formulation.startswith("cube")


def test_planar_tiles_fit_the_registers():
    """Every planar tile of a range of channels and planes keeps its accumulators, its loads and a
    broadcast within each ISA's registers and divides the channels; AVX-512 on ResNet-50's 56x56
    takes 4 channels x 6 vectors (24 accumulators), AVX2 4 x 3."""
    for target in (isa_target("avx512"), isa_target("avx2"), isa_target("sse"), NEON):
        plan = isa_plan(resolve_target(target))
        for channels in (16, 24, 40, 64, 96, 144, 256, 960):
            for pixels in (16, 48, 64, 112, 256, 784, 1024, 3136):
                r, v = planar_tile(channels, pixels, plan)
                assert channels % r == 0 and r * v <= plan.accumulators and r * v + v + 1 <= plan.registers, (plan.name, channels, pixels, r, v)
    assert planar_tile(64, 3136, isa_plan(resolve_target(isa_target("avx512")))) == (4, 6)
    assert planar_tile(64, 3136, isa_plan(resolve_target(isa_target("avx2")))) == (4, 3)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, batch, cin, cout, size, lanes", [("NCX", 2, 64, 32, (16, 16), True), ("NCX", 1, 48, 16, (32, 8), True),
                                                                       ("NCX", 3, 160, 128, (16, 17), True), ("NXC", 2, 64, 32, (16, 16), False),
                                                                       ("NCX", 2, 32, 64, (16, 16), False), ("NCX", 2, 64, 32, (7, 7), False),
                                                                       ("NCX", 2, 64, 24, (16, 16), False)])  # fmt: skip
def test_an_ncx_1x1_dw_with_fewer_outputs_runs_with_cout_on_the_lanes(isa, data_format, batch, cin, cout, size, lanes):
    """dW of a 1x1 at stride 1 whose dy is the smaller operand (fewer output channels, whole
    blocks, at most 128, on a map of 256 pixels or more): Cout on the lanes (``dw_cc_t``), x's
    planes read where they lie (no ``fmap_l1`` pass transposing them; dy alone is packed), a tile
    of input channels x Cout vectors within the registers (ResNet-50's 256 -> 64 on 56x56, N=8,
    Zen 4: 8.7 -> 7.1 ms). NXC, more outputs than inputs, a 7x7 map and a partial Cout block keep
    the cube."""
    from tvm_convgrad.schedule.cpu.tiles import channel_tile

    target = resolve_target(isa_target(isa))
    x = _activation(data_format, batch, cin, size, "src")
    dy = _activation(data_format, batch, cout, size, "diff_dst")
    shape = [cout, cin, 1, 1] if data_format == "NCX" else [1, 1, cin, cout]
    dw = onednn.convolution_backward_weights(x, dy, shape, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                                             data_format=data_format, weights_format="OIX" if data_format == "NCX" else "XIO")  # fmt: skip
    kernel = build(dw, target=target)
    tir = kernel.inspect_source("tir")
    assert (kernel.formulation == "cout-lanes") == lanes and (kernel.formulation == "cube") != lanes
    if lanes:
        plan = isa_plan(target)
        r, v = channel_tile(cin, cout // plan.lanes, plan)
        assert 'T.sblock("fmap_l1")' not in tir and cin % r == 0 and r * v <= plan.accumulators and r * v + v + 1 <= plan.registers
        assert re.search(rf"for \w+ in T.unroll\(T.int64\({r}\)\):\n\s+for \w+ in T.unroll\(T.int64\({v}\)\):\n\s+for \w+ in T.vectorized\(T.int64\({plan.lanes}\)\)", tir)
    if host_can_run(target):
        assert check_kernel(kernel).ok
