"""oneDNN Graph's input gradient (``frontends.onednn.convolution_backward_data`` and its older name
``convolution_backprop_data``) against the float64 reference written from the formula
(``reference.conv_backward_data_nd``) and against PyTorch autograd.

The sweep covers spatial ranks 1-3, groups (depthwise too) with channel counts that are not
multiples of 16, strides, dilations, asymmetric pads, every auto_pad mode, the diff_src shape as the
input, as the attribute and inferred (with output_padding), both data and weights formats and every
type (f32, f16, bf16); then the structure (the dX cube, the depth folded into the batch, the layout
stages inlined) and every error rule.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from tvm import te

from conftest import needs_torch, slow, tiered
from framework_cases import Case, arrays, call, check, expected, placeholders, stages_named, torch_result
from tvm_convgrad import ConvGradError, build, isa_target, reference
from tvm_convgrad.compile import resolve_target
from tvm_convgrad.frontends import onednn
from tvm_convgrad.isa import host_can_run, isa_plan
from tvm_convgrad.tools.verify import check_kernel

_CHANNELS = [(3, 5), (20, 24), (16, 33), (6, 9), (32, 16)]  # (in, out) per group


def _case(rng, op: str, rank: int, groups, auto_pad: str, data_format: str, weights_format: str, dtype: str, given: str) -> Case:
    cin_g, cout_g = _CHANNELS[rng.integers(len(_CHANNELS))] if groups != "dw" else (1, int(rng.integers(1, 3)))
    groups = int(rng.integers(4, 20)) if groups == "dw" else groups
    while True:
        size = tuple(int(rng.integers(3, 10 if rank < 3 else 6)) for _ in range(rank))
        kernel = tuple(int(rng.integers(1, 4)) for _ in range(rank))
        strides = tuple(int(rng.integers(1, 4)) for _ in range(rank))
        dilations = tuple(int(rng.integers(1, 3)) for _ in range(rank))
        pb = tuple(int(rng.integers(0, 3)) for _ in range(rank))
        pe = tuple(int(rng.integers(0, 3)) for _ in range(rank))
        used = [reference.auto_pad(s, k, st, d, auto_pad) for s, k, st, d in zip(size, kernel, strides, dilations)] if auto_pad != "none" else list(zip(pb, pe))
        eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if all(s + b + e >= f for s, (b, e), f in zip(size, used, eff)):
            break
    out = tuple((s + b + e - f) // st + 1 for s, (b, e), f, st in zip(size, used, eff, strides))
    padding = tuple((s + b + e - f) % st for s, (b, e), f, st in zip(size, used, eff, strides)) if given == "none" else None
    return Case(op, int(rng.integers(1, 3)), cin_g * groups, cout_g * groups, groups, size, out, kernel, strides, pb, pe, dilations,
                auto_pad, padding, data_format, weights_format, dtype, tuple(b for b, _ in used), given)  # fmt: skip


def _sweep() -> list[Case]:
    rng = np.random.default_rng(2027)
    dtypes = itertools.cycle(["float32", "float16", "bfloat16"])
    groups = itertools.cycle([1, 2, "dw", 3, 1])
    givens = itertools.cycle(["input", "none", "attr"])
    pads = itertools.cycle(["same_upper", "none", "same_lower", "valid", "none"])
    cases = []
    for rank, data_format, weights_format in itertools.product((1, 2, 3), ("NXC", "NCX"), ("XIO", "OIX")):
        for op in ("data", "data_v1"):
            given, mode = next(givens), next(pads)
            mode = "none" if given == "none" else mode  # auto_pad needs the diff_src size
            cases.append(_case(rng, op, rank, next(groups), mode, data_format, weights_format, next(dtypes), given))
    cases.append(_case(rng, "data", 2, 1, "SAME_LOWER", "NXC", "XIO", "float32", "input"))  # the odd spelling
    for rank, data_format in itertools.product((1, 2, 3), ("NXC", "NCX")):  # the package's OXI (PyTorch's channels-last weights)
        given = next(givens)
        cases.append(_case(rng, "data", rank, next(groups), "none" if given == "none" else next(pads), data_format, "OXI", next(dtypes), given))
    return cases


SWEEP = _sweep()


def test_sweep_covers_the_parameter_space():
    assert {c.rank for c in SWEEP} == {1, 2, 3}
    assert {c.dtype for c in SWEEP} == {"float32", "float16", "bfloat16"}
    assert {c.auto_pad.lower() for c in SWEEP} == {"none", "same_upper", "same_lower", "valid"}
    assert {c.shape_given for c in SWEEP} == {"input", "attr", "none"}
    assert {(c.op, c.data_format, c.weights_format) for c in SWEEP} == set(itertools.product(("data", "data_v1"), ("NXC", "NCX"), ("XIO", "OIX"))) | {
        ("data", df, "OXI") for df in ("NXC", "NCX")
    }
    assert any(c.groups > 1 and c.x_channels == c.groups for c in SWEEP)  # depthwise
    assert any(c.output_padding and any(c.output_padding) for c in SWEEP)
    assert any(max(c.strides) > 1 and max(c.dilations) > 1 for c in SWEEP)
    assert any(c.pads_begin != c.pads_end and c.auto_pad == "none" for c in SWEEP)


@pytest.mark.parametrize("case", tiered(SWEEP, lambda i, c: i % 3 == 0, lambda c: c.name()))
def test_backward_data_matches_the_reference(case):
    inputs = placeholders(case)
    kernel = build(call(case, *inputs))
    assert kernel.output.shape == case.layout_shape(case.x_channels, case.x_size) and kernel.output.dtype == case.dtype
    assert [a.name for a in kernel.inputs] == [t.op.name for t in inputs]
    arrays_ = arrays(case)
    check(kernel(*arrays_), expected(case, *arrays_), kernel, "vs reference")


@needs_torch
@pytest.mark.parametrize("case", tiered(SWEEP[::2], lambda i, c: i % 4 == 1, lambda c: c.name()))
def test_backward_data_matches_torch(case):
    kernel = build(call(case, *placeholders(case)))
    arrays_ = arrays(case, seed=1)
    check(kernel(*arrays_), torch_result(case, *arrays_), kernel, "vs PyTorch")


def _resnet_layer(n=2, c=64, k=64, hw=14, kernel=3, stride=1, dtype="float32", data_format="NXC"):
    out = (hw + 2 * (kernel // 2) - kernel) // stride + 1
    dy = te.placeholder((n, out, out, k) if data_format == "NXC" else (n, k, out, out), dtype, name="diff_dst")
    w = te.placeholder((kernel, kernel, c, k), dtype, name="weights")
    shape = [n, hw, hw, c] if data_format == "NXC" else [n, c, hw, hw]
    pad = [kernel // 2] * 2
    return onednn.convolution_backward_data(dy, w, shape, strides=[stride] * 2, pads_begin=pad, pads_end=pad, dilations=[1, 1], data_format=data_format)


def test_backward_data_runs_on_the_dx_cube_with_layout_stages_inlined():
    """The dX compute's stride phases (``dx_cc_*``) on 16-channel blocks; the framework tensors are
    read by its packs and the result is written straight in the framework layout."""
    kernel = build(_resnet_layer(stride=2))
    tir = kernel.inspect_source("tir")
    assert kernel.formulation == "cube" and kernel.params.op == "conv2d_backprop_input"
    assert "dx_cc_0_0" in tir and "dx_cc_1_1" in tir  # four stride phases
    for stage in ("weights_fracz", "dy", "c_ddr"):
        assert f'T.sblock("{stage}")' not in tir
    assert 'T.sblock("diff_src")' in tir
    assert check_kernel(kernel).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, stride, dtype, plane, packed", [
    ("NXC", 1, "float32", 7, False), ("NCX", 1, "float32", 17, False), ("NCX", 2, "float32", 17, False), ("NCX", 1, "float32", 7, True),
    ("NCX", 2, "float32", 7, True), ("NCX", 1, "float32", 14, True), ("NXC", 1, "bfloat16", 7, True),
])  # fmt: skip
def test_a_dx_whose_taps_read_no_padding_reads_dy_in_place(isa, data_format, stride, dtype, plane, packed):
    """A 1x1 without padding (stride 1, or stride 2's one phase with taps): no tap reaches past dy,
    so an fp32 dX's mad reads diff_dst where it lies, as the forward reads an unpadded src, with
    no ``dy_pad`` pass (ResNet-50's 128 -> 512 1x1 on 28x28, N=8, Zen 4: 6.9 -> 5.1 ms); 40 dy
    channels (a partial block read in place). An NCX dy whose planes are under
    ``PLANAR_IN_PLACE_BYTES`` (7x7 fp32: 196 B, 14x14 784 B; 17x17 is 1156 B) is packed
    (``packed``) where the tiles are narrow (AVX2: every 6-pixel tile would walk all of an image's
    small planes again) and read in place where a channel block is one register (AVX-512:
    ``WIDE_TILES_IN_PLACE``; 256 -> 1024 on 14x14, N=8, Zen 4: 4.98 -> 4.27 ms). bf16 keeps its
    pack (the conversion to fp32, or the pair form, or an AMX host's flat pixels). Scheduled for
    each ISA on any host; exact where the host runs it."""
    from tvm_convgrad.dsl.compute.backprop_input import PLANAR_IN_PLACE_BYTES

    target = resolve_target(isa_target(isa))
    wide = isa_plan(target).registers_per_row == 1
    out = (plane, plane)
    size = out if stride == 1 else (2 * plane - 1, 2 * plane)
    assert (data_format == "NCX" and plane * plane * 4 < PLANAR_IN_PLACE_BYTES) == (packed and dtype == "float32")
    packed = packed and not (wide and dtype == "float32")
    case = Case("data", 2, 24, 40, 1, size, out, (1, 1), (stride, stride), (0, 0), (0, 0), (1, 1), data_format=data_format,
                weights_format="OIX" if data_format == "NCX" else "XIO", dtype=dtype, effective_pads=(0, 0))  # fmt: skip
    kernel = build(call(case, *placeholders(case)), target=target)
    tir = kernel.inspect_source("tir")
    tiles = kernel.formulation == "cube-amx"  # bf16 on an AMX target: its flat-pixel pack (dx_amx)
    assert kernel.formulation.startswith("cube") and ("dx_amx_0_0" if tiles else "dx_cc_0_0") in tir
    assert (f'T.sblock("{"dy_amx" if tiles else "dy_pad"}")' in tir) == packed
    if host_can_run(target):
        inputs = arrays(case, seed=4)
        check(kernel(*inputs), expected(case, *inputs), kernel, case.name())


@pytest.mark.parametrize("data_format, cout, kernel, runs", [
    ("NXC", 24, 1, (3, 8)), ("NCX", 40, 1, (5, 8)), ("NXC", 3, 1, (3, 1)), ("NXC", 20, 3, (5, 4)), ("NXC", 32, 1, (2, 16)),
])  # fmt: skip
def test_a_dx_of_a_cout_not_whole_blocks_sums_its_real_channels_only(data_format, cout, kernel, runs):
    """An fp32 dX whose Cout is not whole 16-channel blocks reduces over Cout channels, in runs of
    gcd(Cout, 16) (``co1 x co0``), never over the last block's lanes past Cout: read in place, those
    were a masked read a lane at a time with a branch a step, and their FMAs multiplied zeros
    (MobileNetV2's 144 -> 24 1x1, channels-last, N=32, Zen 3: 71 -> 88 GFLOP/s). Whole blocks keep
    ``(blocks, 16)``. Exact."""
    pad = kernel // 2
    case = Case("data", 2, 24, cout, 1, (9, 9), (9, 9), (kernel, kernel), (1, 1), (pad, pad), (pad, pad), (1, 1), data_format=data_format,
                weights_format="OIX" if data_format == "NCX" else "XIO", dtype="float32", effective_pads=(pad, pad))  # fmt: skip
    result = call(case, *placeholders(case))
    mads = stages_named(result, "dx_cc_")
    assert mads and all((int(mad.op.reduce_axis[0].dom.extent), int(mad.op.reduce_axis[-1].dom.extent)) == runs for mad in mads)  # (co1, co0)
    built = build(result)
    inputs = arrays(case, seed=5)
    check(built(*inputs), expected(case, *inputs), built, case.name())


@pytest.mark.parametrize("data_format, size, stride", [("NCX", (28, 28), 2), ("NXC", (28, 28), 2), ("NCX", (14, 14), 1),
                                                       ("NXC", (7, 7), 1)])
def test_a_3x3_dx_tile_takes_several_result_blocks_on_avx512(monkeypatch, data_format, size, stride):
    """A 3x3 dX on AVX-512 (64 -> 64 channels: 4 result blocks, 4 of reduction): the tiles of its
    phases with taps take several result blocks, as a 1x1's do, each broadcast dy value feeding
    them all (:meth:`~tvm_convgrad.schedule.cpu.cube.CubeInputGrad._block_tiles_apply`; a
    stride-2 phase's rows of 14 pixels x 2 blocks: 16 loads a step for 28 FMAs, not 15 for 14).
    Exact where the host runs AVX-512."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule.cpu import cube

    target = isa_target("avx512")
    taken = []
    rule = cube.CubeInputGrad._block_tiles_apply
    monkeypatch.setattr(cube.CubeInputGrad, "_block_tiles_apply", lambda self, reduction: taken.append((reduction[1:3], rule(self, reduction))) or taken[-1][1])  # fmt: skip
    out = tuple((extent + 2 - 3) // stride + 1 for extent in size)
    case = Case("data", 2, 64, 64, 1, size, out, (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="OIX" if data_format == "NCX" else "XIO", dtype="float32", effective_pads=(1, 1))  # fmt: skip
    kernel = build(call(case, *placeholders(case)), target=target, schedules=None)
    assert kernel.formulation == "cube" and any(several for taps, several in taken if taps != [1, 1])
    if not host_can_run(target):
        pytest.skip("this host cannot run AVX-512 code")
    inputs = arrays(case, seed=6)
    check(kernel(*inputs), expected(case, *inputs), kernel, case.name())


@pytest.mark.parametrize("mcpu, mattr, taps, budget", [
    ("sapphirerapids", [], 9, 1 << 20), ("sapphirerapids", [], 1, 512 << 10),
    ("rocketlake", ["+avx512bf16", "+amx-tile", "+amx-bf16"], 4, 1 << 20), ("znver4", [], 9, 512 << 10), ("haswell", [], 9, 512 << 10)])  # fmt: skip
def test_a_dx_group_of_a_mad_with_taps_keeps_half_the_l2_of_weights(mcpu, mattr, taps, budget):
    """The w_col a dX (or forward) group of result blocks keeps in cache: half the core's L2 for a
    mad with taps (2 MB on a core with AMX), at least 512 KB; a 1x1's 512 KB."""
    from tvm.target import Target

    from tvm_convgrad.isa import X86_TRIPLE, isa_plan
    from tvm_convgrad.schedule.cpu.cube import WEIGHTS_IN_CACHE, weights_in_cache

    plan = isa_plan(Target({"kind": "llvm", "mcpu": mcpu, "mattr": mattr, "mtriple": X86_TRIPLE}))
    assert WEIGHTS_IN_CACHE == 512 << 10 and weights_in_cache(plan, taps) == budget


def test_a_512_channel_3x3_dx_tile_takes_two_result_blocks_on_a_2mb_l2(monkeypatch):
    """ResNet-50's 512 -> 512 3x3 dX at stride 2 on a 2 MB L2 (a Sapphire Rapids guest): a result
    block's weights are 295 KB, so a group of two fits half the L2 and its phases' 7-pixel tiles
    take both blocks (one a tile where a group held 512 KB). Exact where the host runs it."""
    from tvm.target import Target

    from tvm_convgrad.isa import X86_TRIPLE, host_can_run
    from tvm_convgrad.schedule.cpu import cube

    target = Target({"kind": "llvm", "mcpu": "sapphirerapids", "mtriple": X86_TRIPLE, "num-cores": 2})
    taken = []
    chosen = cube.block_tile
    monkeypatch.setattr(cube, "block_tile", lambda *a: taken.append(chosen(*a)) or taken[-1])
    case = Case("data", 2, 512, 512, 1, (14, 14), (7, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), data_format="NCX",
                weights_format="OIX", dtype="float32", effective_pads=(1, 1))  # fmt: skip
    kernel = build(call(case, *placeholders(case)), target=target, schedules=None)
    assert kernel.formulation == "cube" and 2 in taken
    if not host_can_run(target):
        pytest.skip("this host cannot run the target's code")
    inputs = arrays(case, seed=7)
    check(kernel(*inputs), expected(case, *inputs), kernel, case.name())


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_a_tile_across_the_images_takes_several_result_blocks_on_avx512(monkeypatch, data_format):
    """A 3x3 dX on 7x7 maps, N=8 (64 -> 64 channels): its live-tap regions run across the images
    (:func:`~tvm_convgrad.dsl.compute.phases.across_images`), and on AVX-512 a border row's tiles
    (8 images x 7 pixels, tiles dividing them) take several result blocks
    (:meth:`~tvm_convgrad.schedule.cpu.cube.CubeInputGrad._image_tiles`). Exact where the host
    runs AVX-512."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule.cpu import cube

    target = isa_target("avx512")
    taken = []
    chosen = cube.flat_block_tile
    monkeypatch.setattr(cube, "flat_block_tile", lambda pixels, *a, whole=False: taken.append((pixels, whole, chosen(pixels, *a, whole=whole))) or taken[-1][2])  # fmt: skip
    case = Case("data", 8, 64, 64, 1, (7, 7), (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="OIX" if data_format == "NCX" else "XIO", dtype="float32", effective_pads=(1, 1))  # fmt: skip
    kernel = build(call(case, *placeholders(case)), target=target, schedules=None)
    across = [(pixels, tile) for pixels, whole, tile in taken if whole]
    assert kernel.formulation == "cube" and (56, (14, 2)) in across
    assert all(pixels % tw == 0 and blocks > 1 for pixels, (tw, blocks) in across)
    if not host_can_run(target):
        pytest.skip("this host cannot run AVX-512 code")
    inputs = arrays(case, seed=8)
    check(kernel(*inputs), expected(case, *inputs), kernel, case.name())


def test_rank_3_folds_the_depth_into_the_batch():
    """A 3-D dX is the 2-D cube with one mad per depth x row x column phase (``dx_cc_<rd>_<rh>_<rw>``)
    over ``N*D_rd`` rows, its depth taps in the Cout-block reduction."""
    dy = te.placeholder((2, 3, 4, 4, 32), "float32", name="diff_dst")
    w = te.placeholder((3, 3, 3, 16, 32), "float32", name="weights")
    result = onednn.convolution_backward_data(dy, w, [2, 6, 7, 7, 16], strides=[2, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1], dilations=[1, 1, 1])
    kernel = build(result)
    assert kernel.params.geom.depth is not None and kernel.formulation == "cube"
    assert "dx_cc_1_1_1" in kernel.inspect_source("tir")
    assert check_kernel(kernel).ok


def test_a_strided_3d_batch_runs_its_phases_image_by_image():
    """Issue 26.1: a strided 3-D batch whose diff_dst is above ``PER_IMAGE_ABOVE`` runs every
    stride phase under the result's image loop, each phase keeping its depth loop under it (the
    issue's call, with the packed diff_dst padded for the taps, raised ``ValueError`` in the schedule); NCX and NXC, f32 and bf16 (the pair form too)."""
    from tvm_convgrad import emulate_bf16_dot

    for data_format, dtype in (("NXC", "float32"), ("NCX", "float32"), ("NXC", "bfloat16")):
        case = Case("data", 2, 1, 1, 1, (52, 52, 52), (25, 25, 25), (3, 3, 3), (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1),
                    data_format=data_format, weights_format="XIO", dtype=dtype, effective_pads=(0, 0, 0))  # fmt: skip
        result = call(case, *placeholders(case))
        kernel = build(result)
        assert kernel.formulation == ("cube-bf16" if dtype == "bfloat16" and kernel.isa.bf16_dot_pays else "cube")  # (the pair form where it pays)
        assert "dx_cc_1_1_1" in kernel.inspect_source("tir")
        inputs = arrays(case, seed=3)
        check(kernel(*inputs), expected(case, *inputs), kernel, case.name())
        if dtype == "bfloat16":
            paired = emulate_bf16_dot(result)
            check(paired(*inputs), expected(case, *inputs), paired, case.name() + "-pairs")


def test_the_diff_src_shape_follows_from_output_padding():
    """Without a shape, ``S_in = s*(S_out-1) + (K-1)*d+1 - pb - pe + output_padding``."""
    dy = te.placeholder((1, 4, 4, 8), "float32", name="diff_dst")
    w = te.placeholder((3, 3, 8, 8), "float32", name="weights")
    attrs = dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    assert tuple(onednn.convolution_backward_data(dy, w, **attrs).shape) == (1, 7, 7, 8)
    assert tuple(onednn.convolution_backward_data(dy, w, output_padding=[1, 0], **attrs).shape) == (1, 8, 7, 8)
    attr = onednn.convolution_backward_data(dy, w, dst_shape_attr=[1, 8, 8, 8], **attrs)
    assert tuple(attr.shape) == (1, 8, 8, 8)
    assert tuple(onednn.convolution_backward_data(dy, w, [1, 7, 7, 8], dst_shape_attr=[1, 8, 8, 8], **attrs).shape) == (1, 7, 7, 8)  # the input wins
    assert tuple(onednn.convolution_backward_data(dy, w, dst_shape_attr=[0, 0, 0, 0], **attrs).shape) == (1, 7, 7, 8)  # zeros: unset


def test_a_dx_no_tap_reaches_is_zero_in_every_type():
    """A 1-wide axis padded past every window: no stride phase has a tap, dX is all zeros (the
    constant result stage builds for bf16 too)."""
    for dtype in ("float32", "float16", "bfloat16"):
        dy = te.placeholder((1, 13, 4, 4), dtype, name="diff_dst")
        w = te.placeholder((13, 1, 4, 2), dtype, name="weights")
        result = onednn.convolution_backward_data(dy, w, [1, 13, 1, 6], strides=[2, 2], pads_begin=[5, 2], pads_end=[8, 3],
                                                  dilations=[2, 3], groups=13, data_format="NCX", weights_format="OIX")  # fmt: skip
        kernel = build(result)
        assert kernel.formulation == "zero"  # named, though no mad computes it
        out = kernel(np.ones((1, 13, 4, 4), ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype), np.ones((13, 1, 4, 2), ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype))
        assert out.shape == (1, 13, 1, 6) and not out.astype(np.float32).any()


@slow
def test_backward_data_builds_for_cuda_and_emulates_exactly():
    from tvm_convgrad.compile import emulate_cuda

    result = _resnet_layer(n=1, c=32, k=48, hw=9, stride=2, dtype="float16")
    kernel = build(result, target={"kind": "cuda", "arch": "sm_80"})
    assert kernel.target.kind.name == "cuda" and kernel.units == "tensor-core"
    assert check_kernel(emulate_cuda(result, {"kind": "cuda", "arch": "sm_80"})).ok


# ---------------------------------------------------------------------------------------------
# Errors: every rule a ConvGradError naming the parameter, the value and what is allowed
# ---------------------------------------------------------------------------------------------


def _call(**changes):
    args = dict(dy=((1, 4, 4, 8), "float32"), w=((3, 3, 8, 8), "float32"), shape=[1, 7, 7, 8],
                attrs=dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1]))  # fmt: skip
    for key, value in changes.items():
        if key in args:
            args[key] = value
        else:
            args["attrs"][key] = value
    dy = te.placeholder(args["dy"][0], args["dy"][1], name="diff_dst")
    w = te.placeholder(args["w"][0], args["w"][1], name="weights")
    return onednn.convolution_backward_data(dy, w, args["shape"], **args["attrs"])


ERRORS = [
    ({"dy": ((1, 4, 4, 8), "int8"), "w": ((3, 3, 8, 8), "int8")}, "diff_dst.dtype", "int8"),
    ({"w": ((3, 3, 8, 8), "float16")}, "weights.dtype", "must equal diff_dst.dtype"),
    ({"shape": [1, 7, 8]}, "dst_shape", "must have 4 elements"),
    ({"w": ((3, 3, 3, 8, 8), "float32")}, "weights.shape", "rank of diff_dst"),
    ({"data_format": "NHWC"}, "data_format", "['NXC', 'NCX']"),
    ({"weights_format": "HWIO"}, "weights_format", "['XIO', 'OIX', 'OXI']"),
    ({"auto_pad": "same"}, "auto_pad", "same_upper"),
    ({"strides": [2]}, "strides", "list of 2 ints"),
    ({"strides": [0, 2]}, "strides", ">= 1"),
    ({"dilations": [1, 0]}, "dilations", ">= 1"),
    ({"pads_begin": [-1, 1]}, "pads_begin", ">= 0"),
    ({"output_padding": [2, 0]}, "output_padding", "< the stride 2"),
    ({"output_padding": [1, 0]}, "dst_shape spatial axis 0", "+ output_padding = 8"),
    ({"groups": 0}, "groups", ">= 1"),
    ({"groups": 3}, "dst_shape channels", "multiple of groups = 3"),
    ({"w": ((3, 3, 8, 9), "float32")}, "weights.shape", "must equal the diff_dst channels 8"),
    ({"w": ((3, 3, 4, 8), "float32")}, "weights.shape", "x groups must equal the diff_src channels 8"),
    ({"shape": [2, 7, 7, 8]}, "dst_shape", "batch must equal the diff_dst batch 1"),
    ({"shape": [1, 7, 7, 0]}, "dst_shape", ">= 1"),
    ({"shape": [1, 9, 7, 8]}, "diff_dst spatial axis 0", "must be floor((9 + 1 + 1 - 3) / 2) + 1 = 5"),
    ({"w": ((10, 3, 8, 8), "float32")}, "dst_shape spatial axis 0", "must cover the dilated kernel"),
    ({"shape": None, "auto_pad": "same_upper"}, "dst_shape", "is required with auto_pad 'same_upper'"),
    ({"shape": None, "pads_begin": [9, 1], "pads_end": [9, 1]}, "pads_begin", "crop the whole diff_src"),
    ({"shape": np.array([1.0, 7, 7, 8])}, "dst_shape", "integer"),
]


@pytest.mark.parametrize("changes, param, says", ERRORS, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(ERRORS)])
def test_every_rule_is_a_conv_grad_error(changes, param, says):
    with pytest.raises(ConvGradError) as err:
        _call(**changes)
    assert err.value.param.startswith(param) and says in str(err.value), str(err.value)
    assert "ConvolutionBackwardData" in str(err.value)


def test_the_older_name_says_its_own_names():
    dy = te.placeholder((1, 4, 4, 8), "float32", name="output_delta")
    w = te.placeholder((3, 3, 8, 9), "float32", name="filter")
    with pytest.raises(ConvGradError) as err:
        onednn.convolution_backprop_data(dy, w, [1, 7, 7, 8], strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    assert err.value.param == "filter.shape" and "ConvolutionBackpropData" in str(err.value)
    with pytest.raises(ConvGradError) as err:
        w_oix = te.placeholder((8, 8, 3, 3), "float32", name="filter")
        onednn.convolution_backprop_data(dy, w_oix, None, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                                         auto_pad="valid", filter_format="OIX")  # fmt: skip
    assert err.value.param == "output_shape"
