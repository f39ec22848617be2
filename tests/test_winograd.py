"""Issue 27: the forward and the stride-1 dX of a 3x3 layer by Winograd's F(2x2, 3x3) (16
multiplies per 2x2 outputs where the direct convolution takes 36): ``algorithm="winograd"`` (where it
applies) or ``"auto"`` (where it also pays: what the training clients run). Every case against the
float64 reference written from the convolution's formula (``tests/framework_cases.py``) under the
bound the direct kernels are held to, and the schedule's shape on AVX-512 and AVX2 on any host.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tvm import te
from tvm.tirx import ForKind

from framework_cases import Case, arrays, check, expected, placeholders
from framework_cases import call as case_call
from tvm_convgrad import ConvGradError, build, isa_target, lower
from tvm_convgrad.compile import Workload, resolve_target
from tvm_convgrad.dsl.compute.winograd import winograd_applies
from tvm_convgrad.dsl.compute.winograd_rules import WINOGRAD_MIN_TILES, WINOGRAD_TILES_PER_WEIGHTS
from tvm_convgrad.frontends import onednn
from tvm_convgrad.isa import PLANS, host_can_run, isa_plan
from tvm_convgrad.params.geometry import ConvGeometry
from tvm_convgrad.schedule import rule_for
from tvm_convgrad.schedule.cpu.tiles import winograd_dw_tile, winograd_tile
from tvm_convgrad.schedule.cpu.winograd import FUSED_ROWS_BELOW


def _case(op: str, batch: int, cin: int, cout: int, size, pads=((1, 1), (1, 1)), data_format="NXC", weights_format="OXI", bias=False,
          algorithm="winograd") -> Case:  # fmt: skip
    """A 3x3 stride-1 call: ``op`` ``fwd`` (x = src, cin -> cout), ``data`` (diff_src of cin
    channels from diff_dst of cout) or ``conv_v2`` (the weight gradient), ``pads`` ``(begin, end)``
    per axis."""
    (pt, pl), (pb, pr) = pads
    out = (size[0] + pt + pb - 2, size[1] + pl + pr - 2)
    return Case(op, batch, cin, cout, 1, tuple(size), out, (3, 3), (1, 1), (pt, pl), (pb, pr), (1, 1), data_format=data_format,
                weights_format=weights_format, bias=bias, effective_pads=(pt, pl), algorithm=algorithm)  # fmt: skip


def _run(case: Case, target="llvm"):
    kernel = build(case_call(case, *placeholders(case)), target=target)
    if host_can_run(resolve_target(target)):
        inputs = arrays(case, seed=3)
        check(kernel(*inputs), expected(case, *inputs), kernel, case.name())
    return kernel


_CASES = [
    # (op, batch, cin, cout, size, pads, data_format, weights_format, bias)
    ("fwd", 2, 64, 64, (8, 8), ((1, 1), (1, 1)), "NXC", "OXI", False),  # ResNet's 3x3, tasks of whole images
    ("fwd", 1, 32, 48, (14, 10), ((1, 1), (1, 1)), "NCX", "OIX", True),  # NCX, a bias, 5 tiles a row (a narrower last tile)
    ("fwd", 3, 16, 32, (8, 11), ((0, 1), (2, 0)), "NXC", "XIO", False),  # pads 0..2, uneven: 8 x 10 outputs
    ("fwd", 2, 48, 16, (6, 6), ((0, 0), (0, 0)), "NCX", "OXI", True),  # no padding: 4 x 4
    ("fwd", 1, 16, 16, (2, 2), ((1, 1), (1, 1)), "NXC", "OXI", False),  # one tile
    ("fwd", 2, 32, 32, (7, 7), ((1, 1), (1, 1)), "NCX", "OIX", True),  # odd: 4 x 4 tiles, the result a pass of its own
    ("data", 2, 64, 64, (8, 8), ((1, 1), (1, 1)), "NXC", "OXI", False),  # dX: dy through the rotated, transposed weight
    ("data", 1, 48, 32, (14, 10), ((1, 1), (1, 1)), "NCX", "OIX", False),
    ("data", 3, 32, 16, (8, 10), ((2, 0), (0, 2)), "NXC", "XIO", False),  # the dX's own pads 0..2: 8 x 10 from dy 8 x 10
    ("data", 2, 16, 48, (4, 6), ((1, 0), (1, 0)), "NCX", "OXI", False),  # dy 4 x 4 onto 4 x 6
    ("data", 1, 16, 32, (7, 9), ((1, 1), (1, 1)), "NXC", "OXI", False),  # odd both ways
    ("conv_v2", 3, 32, 48, (8, 10), ((1, 1), (1, 1)), "NXC", "OXI", False),  # dW: three images in parts of whole images
    ("conv_v2", 1, 48, 16, (14, 10), ((1, 1), (1, 1)), "NCX", "OIX", False),  # one image: its tile rows in parts
    ("conv_v2", 2, 16, 32, (7, 9), ((0, 2), (2, 0)), "NXC", "XIO", False),  # an odd dy (its tiles' last row and column 0), pads 0..2
    ("conv_v2", 2, 256, 256, (14, 14), ((1, 1), (1, 1)), "NCX", "OIX", False),  # 256 x 256 weights a tap (AVX-512's "auto" takes it on 384 tiles)
    ("conv_v2", 1, 256, 128, (6, 10), ((0, 2), (1, 1)), "NXC", "XIO", False),  # 2 MB of sums: the positions in parts (2 or 4 cores), one image
    ("fwd", 2, 512, 512, (8, 8), ((1, 1), (1, 1)), "NXC", "OXI", False),  # 512 x 512 on few whole tiles (AVX-512's "auto" from 128 of them)
    ("data", 8, 512, 512, (4, 4), ((1, 1), (1, 1)), "NCX", "OIX", False),  # ResNet-18's last 3x3 on 112x112 images (N=32 there)
]


@pytest.mark.parametrize("op, batch, cin, cout, size, pads, data_format, weights_format, bias", _CASES)
def test_winograd_matches_the_reference(op, batch, cin, cout, size, pads, data_format, weights_format, bias):
    """Forward, dX and dW by F(2x2, 3x3) in every layout, padded 0-2 on each side, with a bias, a
    row of tiles the register tile does not divide, tasks of tile rows and of whole images, odd
    outputs: within the fp32 bound of the direct kernels (``framework_cases.check``)."""
    kernel = _run(_case(op, batch, cin, cout, size, pads, data_format, weights_format, bias))
    assert kernel.formulation == "winograd"


def _check_schedule(isa: str, case: Case, tile: tuple[int, int], folded: tuple[str, ...], in_tasks: tuple[str, ...]):
    """``case`` built for ``isa`` (run where the host can): its register tile ``(R, V)`` unrolled
    over 16 vectorized lanes and within the registers, no ``folded`` result stage left, the
    ``in_tasks`` stages under a parallel loop."""
    target = resolve_target(isa_target(isa))
    tir = _run(case, target).inspect_source("tir")
    plan = isa_plan(target)
    r, v = tile
    assert r * v * plan.registers_per_row <= plan.accumulators and (r + 1) * v * plan.registers_per_row + 1 <= plan.registers
    assert re.search(rf"for \w+ in T.unroll\(T.int64\({r}\)\):\n\s+for \w+ in T.unroll\(T.int64\({v}\)\):\n\s+for \w+ in T.vectorized\(T.int64\(16\)\)", tir)
    assert not any(f'T.sblock("{stage}")' in tir for stage in folded)
    sch = rule_for(target).apply(Workload.of(case_call(case, *placeholders(case))).prim_func(target), target)
    for stage in in_tasks:
        assert sch.get(sch.get_loops(sch.get_sblock(stage))[0]).kind == ForKind.PARALLEL, stage


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("op, data_format", [("fwd", "NXC"), ("data", "NCX")])
def test_the_winograd_schedule_keeps_its_tiles_in_the_registers_and_its_transforms_in_its_tasks(isa, op, data_format):
    """On either ISA (scheduled on any host, run where it can): the GEMM's register tile is
    :func:`winograd_tile`'s (``R`` tiles x ``V`` Cout rows unrolled, 16 lanes vectorized), within
    the registers; the input transform and the result (its layout stage folded in: no ``dst`` /
    ``diff_src`` block) run inside the mad's parallel tasks; the transformed weights each position's
    run of input channels (``wino_u[co1, xi, ci, co0]``: a GEMM reads one contiguous run, not lines
    1 KB apart in 4 of L1's sets)."""
    case = _case(op, 2, 64, 64, (16, 16), data_format=data_format, weights_format="OIX" if data_format == "NCX" else "OXI")
    tile = winograd_tile(8, 4, isa_plan(resolve_target(isa_target(isa))))
    _check_schedule(isa, case, tile, ("dst", "diff_src"), ("wino_v", "wino_m_update", "wino_y"))
    tir = _run(case, resolve_target(isa_target(isa))).inspect_source("tir")
    assert "wino_u = T.sblock_alloc_buffer((T.int64(4), T.int64(16), T.int64(64), T.int64(16)))" in tir
    assert "wino_u[v_co1, v_xi, v_ci1 * T.int64(16) + v_ci0, v_co0]" in tir  # (the mad's read)
    # the output transform's 2 x 2 unrolled: TVM resolves each copy's choice of sum before LLVM sees it
    assert re.search(r"for pr in T.unroll\(T.int64\(2\)\):\n\s+for pc in T.unroll\(T.int64\(2\)\):\n\s+for co0 in T.vectorized", tir)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("op, data_format", [("fwd", "NXC"), ("data", "NCX")])
def test_a_register_tile_spans_the_tasks_rows_where_a_row_has_few_tiles(isa, op, data_format):
    """512 -> 512 on 4x4 maps (2 tiles a row, below ``FUSED_ROWS_BELOW``): on AVX-512 the register
    tile takes more tiles than a row holds (across the task's rows and images) and no partial
    tile; AVX2 keeps a row's; the result is the reference's on either (where the host runs it)."""
    case = _case(op, 8, 512, 512, (4, 4), data_format=data_format, weights_format="OIX" if data_format == "NCX" else "OXI")
    target = resolve_target(isa_target(isa))
    tir = _run(case, target).inspect_source("tir")
    plan = isa_plan(target)
    above_mad, below_mad = tir.split('T.sblock("wino_m_update")')  # (the GEMM's loops: the last register tile above its block)
    *_, (r, v) = re.findall(r"for \w+ in T.unroll\(T.int64\((\d+)\)\):\n\s+for \w+ in T.unroll\(T.int64\((\d+)\)\):\n\s+for \w+ in T.vectorized\(T.int64\(16\)\)", above_mad)
    r, v = int(r), int(v)
    assert FUSED_ROWS_BELOW > 2 and (r > 2 if isa == "avx512" else r <= 2) and r * v * plan.registers_per_row <= plan.accumulators
    assert "wino_m_edge" not in tir and "T.where" not in below_mad.split("T.sblock(")[0]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_the_winograd_dw_sums_parts_of_the_tiles_in_registers_and_transforms_each_chunk_in_its_task(isa, data_format):
    """dW on either ISA (scheduled on any host, run where it can): :func:`winograd_dw_tile`'s
    register tile (``R`` input channels x ``V`` Cout rows unrolled, 16 lanes vectorized), a part of
    the tiles per core (``wino_dw_rf``) with its chunks' ``wino_v`` and ``wino_d`` made in the task,
    the parts summed after, the result folded into ``wino_w``."""
    case = _case("conv_v2", 4, 32, 32, (16, 16), data_format=data_format, weights_format="OIX" if data_format == "NCX" else "OXI")
    tile = winograd_dw_tile(32, 2, isa_plan(resolve_target(isa_target(isa))))  # (sums of 64 KB: within half of AVX2's 256 KB L2)
    _check_schedule(isa, case, tile, ("diff_weights",), ("wino_v", "wino_d", "wino_dw_rf_update", "wino_w"))


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_a_winograd_dw_whose_sums_outgrow_the_l2_shares_out_the_positions(data_format):
    """A dW of 256 x 256 weights a tap (4 MB of sums) on 2 cores: each core sums every tile at 8 of
    the 16 positions (no ``wino_dw_rf``: one parallel loop of 2 over the mad, its chunks'
    ``wino_v`` and ``wino_d`` made in it at its 8 positions); on 3 cores (16 positions do not
    share out) the tiles in parts, as for small weights."""
    from tvm.target import Target

    from tvm_convgrad.isa import X86_TRIPLE
    from tvm_convgrad.schedule.cpu.winograd import positions_in_parts

    case = _case("conv_v2", 2, 256, 256, (14, 14), data_format=data_format, weights_format="OIX" if data_format == "NCX" else "OXI")
    for cores, by_position in ((2, True), (3, False)):
        target = Target({"kind": "llvm", "mcpu": "skylake-avx512", "mtriple": X86_TRIPLE, "num-cores": cores})
        sch = rule_for(target).apply(Workload.of(case_call(case, *placeholders(case))).prim_func(target), target)
        names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
        assert ("wino_dw_rf_update" in names) != by_position, names
        if by_position:
            (part, *_) = sch.get_loops(sch.get_sblock("wino_dw_update"))
            assert sch.get(part).kind == ForKind.PARALLEL and int(sch.get(part).extent) == cores
            for stage in ("wino_v", "wino_d"):
                assert sch.get(sch.get_loops(sch.get_sblock(stage))[0]).same_as(sch.get(part)), stage
    assert positions_in_parts(16 * 256 * 256 * 4, 2 << 20, 2) and not positions_in_parts(16 * 128 * 128 * 4, 2 << 20, 2)
    assert positions_in_parts(16 * 128 * 128 * 4, 1 << 20, 4) and not positions_in_parts(16 * 256 * 256 * 4, 2 << 20, 1)


def test_winograd_tiles_fit_the_registers():
    """Every tile of a range of tile rows and Cout rows keeps its accumulators, loads and a
    broadcast within each ISA's registers and divides the Cout rows."""
    for plan in PLANS.values():
        for tiles in (1, 2, 4, 5, 7, 9, 14, 28, 56):
            for rows in (1, 2, 3, 4, 8, 16, 32):
                r, v = winograd_tile(tiles, rows, plan)
                registers = v * plan.registers_per_row
                assert rows % v == 0 and r <= tiles and r * registers <= plan.accumulators and (r + 1) * registers + 1 <= plan.registers
        for channels in (16, 32, 48, 64, 96, 256):
            for rows in (1, 2, 3, 4, 8, 16):
                r, v = winograd_dw_tile(channels, rows, plan)
                registers = v * plan.registers_per_row
                assert channels % r == 0 and rows % v == 0 and r * registers <= plan.accumulators and (r + 1) * registers + 1 <= plan.registers


def _geometry(cin=64, cout=64, h=56, w=56, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1, batch=8):
    ho = (h + pads[0] + pads[1] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    wo = (w + pads[2] + pads[3] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    return ConvGeometry(batch, cin, h, w, cout, kernel[0], kernel[1], ho, wo, strides, pads, dilations, groups)


def test_winograd_applies_to_float32_and_bfloat16_3x3_stride_1_layers():
    assert winograd_applies(_geometry(), "float32") and winograd_applies(_geometry(), "float32", input_grad=True)
    assert winograd_applies(_geometry(), "bfloat16")  # read widened to fp32
    for geom, dtype in [
        (_geometry(), "float16"), (_geometry(strides=(2, 2)), "bfloat16"), (_geometry(kernel=(5, 5), pads=(2, 2, 2, 2)), "float32"), (_geometry(strides=(2, 2)), "float32"),
        (_geometry(dilations=(2, 2), pads=(2, 2, 2, 2)), "float32"), (_geometry(groups=2), "float32"), (_geometry(cin=24), "float32"),
        (_geometry(h=1, w=7, pads=(0, 0, 1, 1)), "float32"), (_geometry(pads=(3, 3, 3, 3)), "float32"),
    ]:  # fmt: skip
        assert not winograd_applies(geom, dtype), (geom, dtype)
    assert winograd_applies(_geometry(h=7, w=7), "float32", input_grad=True)  # odd: the tiles' last row and column left out


def _onednn_forward(shape, wshape, algorithm, **extra):
    src = te.placeholder(shape, "float32", name="src")
    w = te.placeholder(wshape, "float32", name="weights")
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NCX", weights_format="OIX") | extra
    return onednn.convolution(src, w, algorithm=algorithm, **kw)


def test_auto_takes_winograd_where_it_pays_and_the_cube_elsewhere():
    """``"auto"`` for an AVX-512 target: a 64-channel layer of enough tiles runs F(2x2, 3x3); too
    few tiles (:data:`WINOGRAD_MIN_TILES`, or per block of weights: :data:`WINOGRAD_TILES_PER_WEIGHTS`),
    too few channels, or a layer it does not apply to, the cube."""
    with isa_target("avx512"):  # (the choice follows the target in scope: see the next test)
        assert build(_onednn_forward((1, 64, 16, 16), (64, 64, 3, 3), "auto")).formulation == "winograd"  # 64 tiles
        assert WINOGRAD_MIN_TILES > 16 and WINOGRAD_TILES_PER_WEIGHTS * 16 > 98 and build(_onednn_forward((1, 64, 8, 8), (64, 64, 3, 3), "auto")).formulation == "cube"
        assert build(_onednn_forward((2, 32, 16, 16), (64, 32, 3, 3), "auto")).formulation == "cube"
        assert build(_onednn_forward((2, 256, 14, 14), (256, 256, 3, 3), "auto")).formulation == "cube"  # 98 tiles: < 8 per 64 x 64 weights
        assert build(_onednn_forward((4, 128, 14, 14), (128, 128, 3, 3), "auto")).formulation == "winograd"  # 196 tiles, 4 blocks
        assert build(_onednn_forward((2, 64, 16, 16), (64, 64, 3, 3), "auto", strides=[2, 2])).formulation == "cube"
        assert build(_onednn_forward((2, 64, 16, 16), (64, 64, 3, 3), "direct")).formulation == "cube"


@pytest.mark.parametrize("size, batch, winograd", [(8, 4, False), (7, 8, False), (8, 8, True), (10, 8, True), (7, 32, True), (12, 8, True), (14, 4, True),
                                                    (16, 1, True), (28, 2, True)])  # fmt: skip
def test_auto_on_avx2_takes_winograd_on_six_tiles_a_side_or_many_tiles(size, batch, winograd):
    """``"auto"`` for an AVX2 target (16-lane rows of two registers): the forward and the dX take
    F(2x2, 3x3) with at least :data:`WINOGRAD_NARROW_MIN_TILES` 2x2 tiles a side (Zen 3: 12x12
    1.4-1.5x the direct kernel), or with fewer on :data:`WINOGRAD_WHOLE_MIN_TILES` whole tiles
    (8x8 N=8: 1.03-1.41x; 8x8 N=4 has 64) or :data:`WINOGRAD_NARROW_ODD_MIN_TILES` tiles of an odd
    output (7x7 N=32: 1.01-1.31x; N=8, 128 of them, 0.66-1.06x); the same layers for AVX-512
    (:data:`WINOGRAD_TILES_PER_WEIGHTS` decides) and the dW keep their rules."""
    from tvm_convgrad.dsl.compute.winograd_rules import WINOGRAD_NARROW_MIN_TILES, WINOGRAD_NARROW_ODD_MIN_TILES, WINOGRAD_WHOLE_MIN_TILES

    assert (WINOGRAD_NARROW_MIN_TILES, WINOGRAD_WHOLE_MIN_TILES, WINOGRAD_NARROW_ODD_MIN_TILES) == (6, 128, 512)
    shape, wshape = (batch, 128, size, size), (128, 128, 3, 3)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NCX", weights_format="OIX")
    with isa_target("avx2"):
        forward = _onednn_forward(shape, wshape, "auto")
        dy, w = te.placeholder(shape, "float32", name="diff_dst"), te.placeholder(wshape, "float32", name="weights")
        dx = onednn.convolution_backward_data(dy, w, list(shape), algorithm="auto", **kw)
        x = te.placeholder(shape, "float32", name="src")
        dw = onednn.convolution_backward_weights(x, dy, list(wshape), algorithm="auto", **kw)
    with _cpu("znver4"):  # (an AVX-512 core of 256-bit FMA pipes: an AMX core's rule needs more tiles, see below)
        wide = _onednn_forward(shape, wshape, "auto")
    for result in (forward, dx):
        assert build(result, target=isa_target("avx2")).formulation == ("winograd" if winograd else "cube")
    assert build(wide, target=isa_target("avx512")).formulation == "winograd"  # (64 tiles or more, 16 per 64 x 64 weights)
    assert build(dw, target=isa_target("avx2")).formulation == "cube"  # (128 x 128 weights: the dW's own rule)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_auto_on_avx2_keeps_the_cube_for_a_planar_dw(data_format):
    """``"auto"`` for the dW of 64 x 64 weights on 16x16 maps: F(2x2, 3x3) for AVX-512 in either
    layout and for AVX2 over NXC activations; for AVX2 over NCX (its transforms gather each
    vector from 16 channel planes: 0.86-0.91x the direct kernel on Zen 3) the cube."""
    shape, wshape = (8, 64, 16, 16), (64, 64, 3, 3)
    act = shape if data_format == "NCX" else (8, 16, 16, 64)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format=data_format,
              weights_format="OIX" if data_format == "NCX" else "OXI")
    for isa in ("avx2", "avx512"):
        with isa_target(isa):
            x, dy = te.placeholder(act, "float32", name="src"), te.placeholder(act, "float32", name="diff_dst")
            dw = onednn.convolution_backward_weights(x, dy, list(wshape if data_format == "NCX" else (64, 3, 3, 64)), algorithm="auto", **kw)
        planar_avx2 = isa == "avx2" and data_format == "NCX"
        assert build(dw, target=isa_target(isa)).formulation == ("cube" if planar_avx2 else "winograd"), isa


@pytest.mark.parametrize("algorithm, extra, message", [
    ("fast", {}, "must be one of ['direct', 'winograd', 'auto']"),
    ("winograd", {"strides": [2, 2]}, "applies to float32 or bfloat16 3x3 convolutions at stride 1"),
    ("winograd", {"post_ops": [onednn.PostOp("relu")]}, "no post-ops"),
])  # fmt: skip
def test_an_algorithm_that_cannot_run_is_a_clear_error(algorithm, extra, message):
    with pytest.raises(ConvGradError, match="algorithm") as error:
        _onednn_forward((2, 64, 16, 16), (64, 64, 3, 3), algorithm, **extra)
    assert message in str(error.value)


def test_winograd_error_stays_within_the_direct_bound_on_a_deep_layer():
    """512 input channels (a long reduction of transformed values, each a sum of four inputs times
    a sum of up to nine weights): still within the bound; and within 1e-5 of the direct kernel's
    result relative to the largest output."""
    case = _case("fwd", 1, 512, 32, (8, 8), data_format="NXC", weights_format="OXI")
    kernel = _run(case)
    direct = build(case_call(_case_direct(case), *placeholders(case)))
    inputs = arrays(case, seed=5)
    ours, theirs = kernel(*inputs), direct(*inputs)
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()


def _case_direct(case: Case) -> Case:
    from dataclasses import replace

    return replace(case, algorithm="direct")


def test_a_tunable_winograd_schedule_is_the_default_one_and_cuda_is_a_clear_error():
    """MetaSchedule's design space of a Winograd layer is its one schedule (no samples); the CUDA
    rule has no Winograd schedule and says so."""
    case = _case("fwd", 2, 64, 64, (16, 16))
    result = case_call(case, *placeholders(case))
    target = resolve_target("llvm")
    tunable = rule_for(target).apply(Workload.of(result).prim_func(target), target, tunable=True)
    assert tunable.mod.script() == rule_for(target).apply(Workload.of(result).prim_func(target), target).mod.script()
    with pytest.raises(ConvGradError, match="CPU"):
        build(result, target="cuda")


def _random_case(rng: np.random.Generator) -> Case:
    """A random call F(2x2, 3x3) applies to: forward, dX or dW; 1-3 images; 16-48 channels each
    side; 2-12 rows and columns; pads 0-2 on each side (each axis's output at least 2); any layout."""
    op = ("fwd", "data", "conv_v2")[int(rng.integers(3))]
    data_format = ("NCX", "NXC")[int(rng.integers(2))]
    while True:
        size = tuple(int(v) for v in rng.integers(2, 13, 2))
        pads = tuple(tuple(int(v) for v in rng.integers(0, 3, 2)) for _ in range(2))  # ((top, left), (bottom, right))
        (pt, pl), (pb, pr) = pads
        out = (size[0] + pt + pb - 2, size[1] + pl + pr - 2)
        if min(out) >= 2:
            break
    cin, cout = (int(16 * v) for v in rng.integers(1, 4, 2))
    weights_format = ("OIX", "OXI", "XIO")[int(rng.integers(3))]
    bias = op == "fwd" and bool(rng.integers(2))
    return _case(op, int(rng.integers(1, 4)), cin, cout, size, pads, data_format, weights_format, bias)


@pytest.mark.parametrize("seed", range(12))
def test_random_winograd_calls_match_the_reference(seed):
    """Twelve random calls F(2x2, 3x3) applies to (:func:`_random_case`): within the bound."""
    case = _random_case(np.random.default_rng([20261127, seed]))
    assert _run(case).formulation == "winograd", case


def _cpu(mcpu: str):
    """An x86 LLVM target of the CPU model ``mcpu`` (whatever the host)."""
    from tvm.target import Target

    from tvm_convgrad.isa import X86_TRIPLE

    return Target({"kind": "llvm", "mcpu": mcpu, "mtriple": X86_TRIPLE})


def _stage_names(result) -> set[str]:
    """The names of the stages a result tensor is computed through (placeholders included)."""
    seen, stack = set(), [result]
    while stack:
        tensor = stack.pop()
        if tensor.op.name not in seen:
            seen.add(tensor.op.name)
            stack.extend(getattr(tensor.op, "input_tensors", []))
    return seen


def _runs_winograd(result) -> bool:
    """Whether a frontend's result tensor is computed through F(2x2, 3x3)'s stages."""
    return any(name.startswith("wino_") for name in _stage_names(result))


@pytest.mark.parametrize("batch, size, channels, choice", [(8, 14, 256, True), (4, 14, 256, True), (8, 7, 256, True), (32, 7, 256, True), (8, 28, 128, True),
                                                          (8, 7, 512, False), (1, 14, 256, False), (8, 8, 512, True), (32, 4, 512, True),
                                                          (16, 4, 512, False), (2, 14, 512, False), (4, 8, 512, False)])  # fmt: skip
def test_auto_takes_the_same_layers_on_amx_and_zen4_cores(batch, size, channels, choice):
    """``"auto"`` for an AMX core (two full-width FMA pipes) chooses F(2x2, 3x3) for the forward and
    the dX where a Zen 4 does: from :data:`WINOGRAD_TILES_PER_WEIGHTS` tiles per 64 x 64 block of
    weights (an Emerald Rapids measured 12-32 tiles per block at 1.2-1.6x the direct kernel once the
    weights' transform ran in registers); 512 -> 512 on 7x7 N=8 (2 tiles per block, the last of each
    row and column cut) and one 14x14 image of 256 (3) keep the cube; an output of at least
    ``WINOGRAD_WHOLE_MIN_TILES`` = 128 whole tiles takes it from 2 per block (512 -> 512 on 8x8 N=8
    and 4x4 N=32; 64 or 98 tiles keep the cube); the dW keeps its own rule on both."""
    from tvm_convgrad.dsl.compute.winograd_rules import WINOGRAD_WHOLE_MIN_TILES, WINOGRAD_WHOLE_TILES_PER_WEIGHTS

    assert (WINOGRAD_WHOLE_MIN_TILES, WINOGRAD_WHOLE_TILES_PER_WEIGHTS) == (128, 2)
    shape, wshape = (batch, channels, size, size), (channels, channels, 3, 3)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NCX", weights_format="OIX")

    def choices(target):
        with target:
            dy, w = te.placeholder(shape, "float32", name="diff_dst"), te.placeholder(wshape, "float32", name="weights")
            x = te.placeholder(shape, "float32", name="src")
            return (_runs_winograd(_onednn_forward(shape, wshape, "auto")),
                    _runs_winograd(onednn.convolution_backward_data(dy, w, list(shape), algorithm="auto", **kw)),
                    _runs_winograd(onednn.convolution_backward_weights(x, dy, list(wshape), algorithm="auto", **kw)))  # fmt: skip

    amx, zen4 = choices(_cpu("sapphirerapids")), choices(_cpu("znver4"))
    assert amx == zen4 and amx[:2] == (choice, choice)
    if channels == 512:  # (an AVX2 core alike: 128 whole tiles or 512 in all; the dW of 512 x 512: the cube everywhere)
        assert choices(_cpu("znver3"))[:2] == (choice, choice) and amx[2] is False


@pytest.mark.parametrize("mcpu, mattr, channels, budget", [
    ("emeraldrapids", [], 256, 2 << 20), ("emeraldrapids", [], 512, 2 << 20), ("emeraldrapids", [], 128, 512 << 10),
    ("emeraldrapids", [], 64, 512 << 10), ("sapphirerapids", [], 256, 2 << 20),
    ("rocketlake", ["+avx512bf16", "+amx-tile", "+amx-bf16"], 256, 2 << 20), ("rocketlake", [], 256, 512 << 10),
    ("znver4", [], 256, 1 << 20), ("znver4", [], 128, 512 << 10), ("znver3", [], 512, 512 << 10), ("haswell", [], 256, 512 << 10),
    ("x86-64", [], 256, 1 << 20), ("x86-64", [], 64, 512 << 10)])  # fmt: skip
def test_a_winograd_tasks_input_is_half_the_transformed_weights_within_the_cores_l2(mcpu, mattr, channels, budget):
    """A Winograd task's ``wino_v`` is at most half the transformed weights' bytes (every task
    reads them all: 4 MB at 256 x 256), within its core's L2 (``IsaPlan.l2_bytes``; 2 MB on any
    target with AMX, a Sapphire Rapids guest that LLVM calls rocketlake too) and at least
    ``WINOGRAD_TASK_BYTES``: a 2 MB L2 takes two whole 14x14 images of 256 channels (1.6 MB) a
    task, not one tile row."""
    from tvm.target import Target

    from tvm_convgrad.isa import X86_TRIPLE
    from tvm_convgrad.schedule.cpu.winograd import WINOGRAD_TASK_BYTES, task_bytes

    weight_bytes = 16 * channels * channels * 4  # wino_u: 16 positions of Cin x Cout fp32
    plan = isa_plan(Target({"kind": "llvm", "mcpu": mcpu, "mattr": mattr, "mtriple": X86_TRIPLE}))
    assert WINOGRAD_TASK_BYTES == 512 << 10 and task_bytes(plan, weight_bytes) == budget


@pytest.mark.parametrize("n, images_a_task", [(8, 2), (4, 1)])
def test_a_task_of_wide_weights_takes_whole_images(n, images_a_task):
    """On a 2 MB L2 a 256 -> 256 dX on 14x14 runs whole images a task (two where at least two
    tasks a core remain), not one tile row: the parallel task loop's extent is the images over
    the images a task."""
    from tvm.target import Target

    from tvm_convgrad.isa import X86_TRIPLE

    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NCX", weights_format="OIX")
    dy = te.placeholder((n, 256, 14, 14), "float32", name="diff_dst")
    dx = onednn.convolution_backward_data(dy, te.placeholder((256, 256, 3, 3), "float32", name="weights"), (n, 256, 14, 14),
                                          algorithm="winograd", **kw)  # fmt: skip
    amx = ["+avx512bf16", "+amx-tile", "+amx-bf16"]
    target = Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": amx, "mtriple": X86_TRIPLE, "num-cores": 2})
    script = lower(dx, target).script()
    assert f"T.parallel(T.int64({n // images_a_task}))" in script, script[:2000]


@pytest.mark.parametrize("rows, images, cols, channels, l2, chunk", [
    (14, 4, 14, 128, 2 << 20, 2),  # 128 on 28x28: 2 tile rows (448 KB) beside 1 MB of sums, not 7 (1.5 MB)
    (7, 16, 7, 128, 2 << 20, 7),  # 128 on 14x14: one image (784 KB), not two
    (28, 4, 28, 64, 2 << 20, 4),  # 64 on 56x56: 4 tile rows (896 KB) within half the L2
    (7, 4, 7, 256, 2 << 20, 7),  # 256 on 14x14: 4 MB of sums stream anyway: one image (49 tiles, nearest 64), not two nor a row
    (7, 4, 7, 256, 512 << 10, 7),
    (14, 4, 14, 256, 2 << 20, 7),  # 256 on 28x28: 7 tile rows (98 tiles), not 2 (28)
    (4, 16, 4, 256, 2 << 20, 16),  # 256 on 7x7: 4 images (64 tiles)
    (14, 4, 14, 128, 512 << 10, 7)])  # (no chunk fits a 512 KB L2 beside 1 MB of sums: the nearest 64 tiles, 98)
def test_a_dw_chunk_is_the_largest_that_fits_the_l2_beside_its_sums(rows, images, cols, channels, l2, chunk):
    """A Winograd dW chunk's transforms fit half the L2 and, with its part's sums (16 x Cin x Cout
    fp32), the whole of it, as many tile rows as do; where none fits, the chunk nearest
    ``WINOGRAD_DW_CHUNK_TILES`` tiles (each chunk reads and writes the sums)."""
    from tvm_convgrad.schedule.cpu.winograd import dw_chunk_rows

    tile_bytes, sums_bytes = 16 * 2 * channels * 4, 16 * channels * channels * 4
    assert dw_chunk_rows(rows, images, cols, tile_bytes, sums_bytes, l2) == chunk


def test_the_weights_transform_keeps_its_sums_in_registers():
    """``wino_u`` is each position's constant combination of the nine taps, no sum over the taps
    (a tap-by-tap sum read and wrote each of the 16 rows nine times: at 256 channels and more the
    rows of one weight are 16 KB apart, one L1 set, and the pass took 1.5-5 ms of a 7x7 layer)."""
    from tvm_convgrad.dsl.compute.winograd import WinogradShape, weight_tiles

    w = te.placeholder((256, 256, 3, 3), "float32", name="w")
    u = weight_tiles(lambda co, ci, kh, kw: w[co, ci, kh, kw], WinogradShape(8, 256, 256, 7, 7, (1, 1, 1, 1)))
    assert u.op.name == "wino_u" and tuple(u.shape) == (16, 16, 256, 16) and not u.op.reduce_axis


@pytest.mark.parametrize("op, weights_format, staged", [("fwd", "OXI", True), ("fwd", "OIX", False), ("fwd", "XIO", False),
                                                        ("data", "XIO", True), ("data", "OIX", False), ("data", "OXI", False)])  # fmt: skip
def test_weights_whose_contiguous_axis_is_the_other_channel_are_copied_lanes_last(op, weights_format, staged):
    """``wino_u`` puts the forward's Cout (the dX's Cin) on its lanes; where the weights' contiguous
    axis is the other channel (an OXI forward, an XIO dX) they are first copied with the lane
    channel last (``wino_wt``), tap by tap, so ``wino_u`` loads its vectors instead of gathering
    9 x 16 rows whose lines share 2-4 L1 sets; the result is the same (the cases above run both)."""
    shape, wshape = (2, 64, 8, 8), {"OIX": (64, 64, 3, 3), "OXI": (64, 3, 3, 64), "XIO": (3, 3, 64, 64)}[weights_format]
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NCX", weights_format=weights_format)
    w = te.placeholder(wshape, "float32", name="weights")
    if op == "fwd":
        result = onednn.convolution(te.placeholder(shape, "float32", name="src"), w, algorithm="winograd", **kw)
    else:
        result = onednn.convolution_backward_data(te.placeholder(shape, "float32", name="diff_dst"), w, list(shape), algorithm="winograd", **kw)
    names = _stage_names(result)
    assert "wino_u" in names and ("wino_wt" in names) == staged


def _check_rows_in_task(sch, tiles_a_row: int):
    """An NCX input's channel vectors (``wino_x``) in ``sch``: under the task's parallel loop, whole
    padded rows (``2 TW + 2`` columns, not a window's 4), 16 vectorized lanes."""
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("wino_x"))]
    assert loops[0].kind == ForKind.PARALLEL and loops[-1].kind == ForKind.VECTORIZED and int(loops[-1].extent) == 16
    assert int(loops[-2].extent) == 2 * tiles_a_row + 2


@pytest.mark.parametrize("op, data_format", [("fwd", "NCX"), ("fwd", "NXC"), ("data", "NCX"), ("data", "NXC"), ("dw", "NCX"), ("dw", "NXC")])
def test_a_planar_input_is_copied_to_channel_vectors_in_each_task(op, data_format):
    """Over NCX activations a vector's 16 channels lie in 16 planes: each task (a dW chunk) first
    copies the rows its windows read into channel vectors (``wino_x``, under the parallel loop, its
    lanes vectorized), so each value is gathered once, not once for each of the four windows that
    hold it; the dW's 2x2 tiles of dy do not overlap and are gathered per tile in registers
    (``wino_dyw``); over NXC the positions load their vectors in place."""
    shape = (2, 64, 8, 8) if data_format == "NCX" else (2, 8, 8, 64)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format=data_format, weights_format="OIX")
    w = te.placeholder((64, 64, 3, 3), "float32", name="weights")
    if op == "fwd":
        result = onednn.convolution(te.placeholder(shape, "float32", name="src"), w, algorithm="winograd", **kw)
    elif op == "data":
        result = onednn.convolution_backward_data(te.placeholder(shape, "float32", name="diff_dst"), w, list(shape), algorithm="winograd", **kw)
    else:
        x, dy = te.placeholder(shape, "float32", name="src"), te.placeholder(shape, "float32", name="diff_dst")
        result = onednn.convolution_backward_weights(x, dy, [64, 64, 3, 3], algorithm="winograd", **kw)
    names = _stage_names(result)
    assert "wino_v" in names and ("wino_x" in names) == (data_format == "NCX")
    assert ("wino_dyw" in names) == (op == "dw" and data_format == "NCX")
    if data_format == "NCX":
        target = resolve_target("llvm")
        sch = rule_for(target).apply(Workload.of(result).prim_func(target), target)
        _check_rows_in_task(sch, tiles_a_row=4)
    script = build(result).mod.script()
    assert ("wino_dyw" in script and 'scope="local"' in script) == (op == "dw" and data_format == "NCX")


@pytest.mark.parametrize("batch, size, channels, mcpu, choice", [(8, 28, 128, "emeraldrapids", True), (32, 14, 128, "znver4", True), (8, 16, 128, "znver4", True),
                                                                 (8, 8, 128, "emeraldrapids", False), (8, 14, 256, "emeraldrapids", True),
                                                                 (2, 28, 256, "znver4", True), (4, 14, 256, "emeraldrapids", False),
                                                                 (32, 7, 256, "emeraldrapids", False), (8, 14, 512, "emeraldrapids", False),
                                                                 (8, 28, 128, "znver3", False), (8, 56, 64, "znver3", True)])  # fmt: skip
def test_auto_dw_takes_winograd_up_to_256_channels_on_avx512(batch, size, channels, mcpu, choice):
    """``"auto"``'s dW (NXC): on AVX-512 F(2x2, 3x3) up to 128 x 128 weights per tap, past 96 x 96 with
    :data:`WINOGRAD_DW_TILES_PER_WEIGHTS` tiles per 64 x 64 block (128 on 8x8 N=8 has 32: the
    cube); up to 256 x 256 on :data:`WINOGRAD_DW_WIDEST_MIN_TILES` whole 2x2 tiles (256 on 14x14
    N=8 has 392; N=4 196 and 7x7 N=32, a partial row of tiles, the cube; 512 the cube); on AVX2 up
    to 96 x 96 (:data:`WINOGRAD_DW_MAX_WEIGHTS`)."""
    from tvm_convgrad.dsl.compute import winograd_rules as winograd

    assert (winograd.WINOGRAD_DW_MAX_WEIGHTS, winograd.WINOGRAD_DW_WIDE_MAX_WEIGHTS, winograd.WINOGRAD_DW_TILES_PER_WEIGHTS) == (96 * 96, 128 * 128, 96)
    assert (winograd.WINOGRAD_DW_WIDEST_MAX_WEIGHTS, winograd.WINOGRAD_DW_WIDEST_MIN_TILES) == (256 * 256, 384)
    shape = (batch, size, size, channels)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NXC", weights_format="OIX")
    with _cpu(mcpu):
        x, dy = te.placeholder(shape, "float32", name="src"), te.placeholder(shape, "float32", name="diff_dst")
        result = onednn.convolution_backward_weights(x, dy, [channels, channels, 3, 3], algorithm="auto", **kw)
    assert _runs_winograd(result) == choice


@pytest.mark.parametrize("op, data_format", [("fwd", "NXC"), ("data", "NCX"), ("conv_v2", "NXC"), ("conv_v2", "NCX")])
def test_bf16_winograd_matches_the_reference(op, data_format):
    """bf16 tensors through F(2x2, 3x3): read widened to fp32, the transforms and sums in fp32, the
    result rounded once to bf16, within the bf16 bound of the direct kernels."""
    from dataclasses import replace

    kernel = _run(replace(_case(op, 2, 32, 48, (8, 10), data_format=data_format, weights_format="OIX"), dtype="bfloat16"))
    assert kernel.formulation == "winograd"


@pytest.mark.parametrize("mcpu, forward, gradients", [("cooperlake", True, True), ("icelake-server", True, True), ("sapphirerapids", True, False),
                                                      ("znver4", False, False)])  # fmt: skip
def test_auto_takes_winograd_for_bf16_where_the_target_runs_the_exact_path(mcpu, forward, gradients):
    """``"auto"`` on bf16 tensors: F(2x2, 3x3) where the target runs bf16 on the exact path (fp32
    FMAs: Cooper Lake, whose ``vdpbf16ps`` runs at half the FMA's rate, and AVX-512 without
    AVX512-BF16); on Sapphire Rapids the forward only (its dX and dW on AMX tiles); on Zen 4 none
    (its bf16 pairs on ``vdpbf16ps``)."""
    shape, wshape = (8, 28, 28, 64), (64, 64, 3, 3)
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NXC", weights_format="OIX")
    with _cpu(mcpu):
        x, dy = te.placeholder(shape, "bfloat16", name="src"), te.placeholder(shape, "bfloat16", name="diff_dst")
        w = te.placeholder(wshape, "bfloat16", name="weights")
        choices = (_runs_winograd(onednn.convolution(x, w, algorithm="auto", **kw)),
                   _runs_winograd(onednn.convolution_backward_data(dy, w, list(shape), algorithm="auto", **kw)),
                   _runs_winograd(onednn.convolution_backward_weights(x, dy, list(wshape), algorithm="auto", **kw)))  # fmt: skip
    assert choices == (forward, gradients, gradients)
