"""bf16 gradients on ``vdpbf16ps`` (issue 21): the bf16-pair form a target with AVX512-BF16 builds,
checked in its assembly cross-compiled on any host; its arithmetic (the instruction's, emulated
exactly where the host lacks it: ``emulate_bf16_dot``) against the float64 reference, denormals
included; the exact path everywhere else."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from random_cases import valid_case, valid_result
from tvm import te
from tvm.target import Target

from tvm_convgrad import ConvGradError, build, emulate_bf16_dot, resolve_target
from tvm_convgrad.dsl.compute.dw_pairs import amx_images
from tvm_convgrad.frontends import onednn
from tvm_convgrad.isa import X86_TRIPLE, has_amx_bf16, has_bf16_dot, host_features, isa_plan
from tvm_convgrad.schedule.cpu.amx import request_amx
from tvm_convgrad.schedule.cpu.amx_dx import images_inside
from tvm_convgrad.tools.asm import fma_instructions, hot_loops
from tvm_convgrad.tools.verify import check_kernel, framework_expected

BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_MIN_NORMAL = 2.0**-126


def _target(mcpu: str) -> Target:
    return Target({"kind": "llvm", "mcpu": mcpu, "mtriple": X86_TRIPLE, "num-cores": 2})


def _call(op: str, rank: int = 2, dtype: str = "bfloat16", batch: int = 2, size: int = 9, cin: int = 32, cout: int = 48, kernel: int = 3,
          stride: int = 1, groups: int = 1, dilation: int = 1, pads: tuple[int, int] = (1, 1)):  # fmt: skip
    """A call of ``op`` (``filters`` / ``transpose`` / ``data`` / ``forward``), NXC, XIO weights."""
    spatial = (size,) * rank
    out = tuple((s + sum(pads) - dilation * (kernel - 1) - 1) // stride + 1 for s in spatial)
    attrs = {"strides": [stride] * rank, "pads_begin": [pads[0]] * rank, "pads_end": [pads[1]] * rank, "dilations": [dilation] * rank, "groups": groups}
    x = te.placeholder((batch, *spatial, cin), dtype, name="x")
    dy = te.placeholder((batch, *out, cout), dtype, name="dy")
    if op == "filters":
        return onednn.convolution_backprop_filters(x, dy, [*([kernel] * rank), cin // groups, cout], **attrs)
    if op == "transpose":  # ConvTranspose's src is the conv's dy: its output is x
        return onednn.conv_transpose_backward_weights(dy, x, [*([kernel] * rank), cin // groups, cout], **attrs)
    w = te.placeholder((*([kernel] * rank), cin // groups, cout), dtype, name="w")
    if op == "forward":
        return onednn.convolution(x, w, **attrs)
    return onednn.convolution_backward_data(dy, w, [batch, *spatial, cin], **attrs)


@pytest.mark.parametrize("mcpu, op, rank", [("znver4", op, rank) for op in ("filters", "transpose", "data", "forward") for rank in (1, 2, 3)])
def test_bf16_mads_run_on_vdpbf16ps_and_no_fp32_fma(mcpu, op, rank):
    """Every bf16 gradient and the bf16 forward on a target whose vdpbf16ps pays (Zen 4)."""
    kernel = build(_call(op, rank, size=7 if rank == 3 else 9), _target(mcpu))
    assert kernel.formulation == "cube-bf16" and kernel.isa.bf16_dot
    loops = [loop for loop in hot_loops(kernel.source) if loop.dot_lines]
    assert loops, "no loop of vdpbf16ps"
    for loop in loops:  # the register tile: every dot reads its broadcast pair from memory, nothing spills
        assert loop.fmas == 0 and not loop.stack_accesses
        assert all("{1to16}" in line and "%zmm" in line for line in loop.dot_lines)
        assert len(loop.dot_lines) >= 14  # 14-16 accumulator rows per tile
    assert fma_instructions(kernel.source) == []  # no fp32 FMA anywhere on this path


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_few_input_channels_run_cout_lanes_on_vdpbf16ps(rank):
    """A first layer (Cin = 3, 7x7 stride 2 in 2-D): Cout on the lanes, dy pairs x broadcast x pairs."""
    kernel = build(_call("filters", rank, size=7 if rank == 3 else 15, cin=3, cout=64, kernel=3 if rank == 3 else 7, stride=2), _target("znver4"))
    assert kernel.formulation == "cout-lanes-bf16"
    loops = [loop for loop in hot_loops(kernel.source) if loop.dot_lines]
    assert loops and all(loop.fmas == 0 and not loop.stack_accesses for loop in loops)
    assert all("%zmm" in line for loop in loops for line in loop.dot_lines)  # (a broadcast x pair feeds each Cout vector)
    assert max(len(loop.dot_lines) for loop in loops) >= 8  # taps x Cout vectors per tile
    assert fma_instructions(kernel.source) == []


@pytest.mark.parametrize(
    "shape",
    [dict(rank=2, batch=1, size=15, cin=3, cout=64, kernel=7, stride=2), dict(rank=2, batch=3, size=10, cin=5, cout=20, kernel=3, stride=1),
     dict(rank=1, batch=2, size=13, cin=1, cout=16, kernel=5, stride=3), dict(rank=3, batch=2, size=6, cin=3, cout=8, kernel=3, stride=2)],
)  # fmt: skip
def test_cout_lanes_pairs_match_the_reference(shape):
    """Odd output widths (a last pair half empty), strides, Cout not a multiple of 16, a batch."""
    kernel = emulate_bf16_dot(_call("filters", **shape))
    assert kernel.formulation == "cout-lanes-bf16"
    check = check_kernel(kernel, seed=1)
    assert check.ok, f"{shape}: {check}"


@pytest.mark.parametrize("op", ["filters", "transpose"])
@pytest.mark.parametrize(
    "shape",
    [dict(batch=2, size=9, cin=32, cout=48), dict(batch=4, size=13, cin=20, cout=40, stride=2), dict(batch=6, size=7, cin=48, cout=32, groups=2),
     dict(batch=2, size=8, cin=16, cout=16, kernel=1), dict(batch=3, size=9, cin=16, cout=32), dict(batch=2, size=10, cin=16, cout=16)],
)  # fmt: skip
def test_pairs_of_images_or_of_columns_match_the_reference(op, shape):
    """An even batch pairs images (2m, 2m+1) where column pairs would cost (an odd output width,
    or a 3x3 kernel's odd tap offsets); a 1x1 kernel of even width, or an odd batch, pairs
    columns: both within the fp32 bound, grouped and strided too."""
    kernel = emulate_bf16_dot(_call(op, **shape))
    check = check_kernel(kernel, seed=3)
    assert check.ok, f"{shape}: {check}"


@pytest.mark.parametrize("op", ["data", "forward"])
@pytest.mark.parametrize("batch, size, regions", [(4, 4, 5), (2, 4, 1), (4, 5, 1), (2, 3, 3)])
def test_the_pair_form_runs_small_maps_by_live_tap_regions(op, batch, size, regions):
    """A 3x3 dX or forward at pad 1 in the pair form splits into live-tap regions where fewer than
    80% of an axis's (output, tap) pairs are live (a 3x3 map: 78%; three row bands of one row, each
    whole), and below 85% where the regions run across the images (a 4x4 map, 83%, of 4 images:
    first and last rows whole, the rows between by their columns' regions); 2 images of 4x4 maps
    and 5x5 maps (87%) keep one mad. Within the fp32 bound either way (512 -> 512 on 4x4, N=32,
    Zen 4: dX 5.8 -> 4.4 ms, forward 5.6-6.0 -> 4.3, PyTorch 4.4 and 4.2)."""
    import re

    kernel = emulate_bf16_dot(_call(op, batch=batch, size=size, cin=32, cout=32))
    mads = set(re.findall(r'T.sblock\("((?:dx|conv)_cc\w*)_init"\)', kernel.inspect_source("tir")))
    assert len(mads) == regions, sorted(mads)
    check = check_kernel(kernel, seed=4)
    assert check.ok, check


def test_lower_keeps_the_exact_path_unless_asked():
    """lower()'s module is compiled by the user for a target of their own (plain "llvm" is LLVM's
    baseline x86-64, where a vdpbf16ps kernel aborts LLVM): pairs only when asked."""
    from tvm_convgrad import lower

    result = _call("filters")
    assert "tvm_convgrad_dpbf16" not in lower(result, _target("znver4")).script()
    assert "tvm_convgrad_dpbf16" in lower(result, _target("znver4"), bf16_dot=True).script()


@pytest.mark.parametrize("mcpu", ["znver3", "haswell", "skylake-avx512", "icelake-server"])
def test_a_target_without_avx512_bf16_keeps_the_exact_path(mcpu):
    target = _target(mcpu)
    assert not has_bf16_dot(target) and not isa_plan(target).bf16_dot
    for op in ("filters", "data"):
        kernel = build(_call(op), target)
        assert kernel.formulation == "cube" and "vdpbf16ps" not in kernel.source


@pytest.mark.parametrize("target", [{"mcpu": "cooperlake"}, {"mcpu": "sapphirerapids", "mattr": ["-amx-tile", "-amx-bf16"]},
                                    {"mcpu": "emeraldrapids", "mattr": ["-amx-tile", "-amx-bf16"]}, {"mcpu": "rocketlake", "mattr": ["+avx512bf16"]},
                                    {"mcpu": "sapphirerapids"}])  # fmt: skip
def test_an_intel_core_runs_bf16_on_the_exact_path_or_on_amx_tiles(target):
    """Intel's vdpbf16ps does half the products of its two fp32 FMA pipes a cycle (Zen 4's twice):
    there AVX512-BF16 is known (the bf16 peak tool measures it) but a bf16 gradient or forward
    builds on the exact path (bf16 widened, fp32 FMAs, no vdpbf16ps), unless AMX tiles take it (a
    2-D dW or dX, :func:`test_amx_gradients_run_on_tiles`)."""
    target = Target({"kind": "llvm", "mtriple": X86_TRIPLE, "num-cores": 2, **target})
    plan = isa_plan(target)
    assert has_bf16_dot(target) and plan.bf16_dot and not plan.bf16_dot_pays and isa_plan(_target("znver4")).bf16_dot_pays
    calls = [("filters", 3), ("data", 3), ("forward", 2), ("forward", 1)] if plan.amx_bf16 else [("filters", 2), ("data", 2), ("forward", 2)]
    for op, rank in calls:
        kernel = build(_call(op, rank, size=7 if rank == 3 else 9), target)
        assert kernel.formulation == "cube" and "vdpbf16ps" not in kernel.source and fma_instructions(kernel.source), (op, rank)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_f32_and_f16_keep_the_exact_path_on_a_bf16_target(dtype):
    for op in ("filters", "data"):
        kernel = build(_call(op, dtype=dtype), _target("znver4"))
        assert kernel.formulation == "cube" and "vdpbf16ps" not in kernel.source
    with pytest.raises(ConvGradError, match="bf16 result"):
        emulate_bf16_dot(_call("filters", dtype=dtype))


@pytest.mark.parametrize("op", ["conv", "conv_v2", "deconv", "data", "data_v1", "fwd"])
@pytest.mark.parametrize("seed", range(6))
def test_random_bf16_calls_on_pairs_match_the_reference(op, seed):
    """Ranks 1-3, both layouts, groups and depthwise, odd sizes (a last pair half empty), strides,
    dilations, auto_pad: the pair kernel (the instruction's arithmetic) within the fp32 bound."""
    case = dataclasses.replace(valid_case(op, np.random.default_rng(2000 + seed)), dtype="bfloat16")
    kernel = emulate_bf16_dot(valid_result(op, case))
    check = check_kernel(kernel, seed=seed)
    assert check.ok, f"{case!r}: {check}"


@pytest.mark.parametrize("op", ["conv", "deconv", "data", "data_v1"])
@pytest.mark.parametrize("seed", range(4))
def test_random_bf16_calls_on_amx_tiles_match_the_reference(op, seed):
    """The AMX tile plan (its arithmetic emulated where the host lacks AMX) over random valid calls:
    a 2-D gradient on tiles, any other on vdpbf16ps pairs, within the fp32 bound."""
    case = dataclasses.replace(valid_case(op, np.random.default_rng(3000 + seed)), dtype="bfloat16")
    kernel = emulate_bf16_dot(valid_result(op, case), amx=True)
    check = check_kernel(kernel, seed=seed)
    assert check.ok, f"{case!r}: {check}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seed", range(4))
def test_float32_weight_gradients_of_narrow_calls_match_the_reference(dtype, seed):
    """``diff_weights_dtype="float32"`` (autocast's float32 weights): the fp32 sums unrounded, on
    the exact path, the bf16 pairs and the AMX tiles (emulated where the host lacks them), within
    float32's bound (a bf16 / f16 result is ~2**-8 / 2**-11 off it)."""
    case = dataclasses.replace(valid_case("conv_v2", np.random.default_rng(4000 + seed)), dtype=dtype)
    result = valid_result("conv_v2", case, diff_weights_dtype="float32")
    kernels = [build(result)]
    if dtype == "bfloat16":
        kernels += [emulate_bf16_dot(result), emulate_bf16_dot(result, amx=True)]
    for kernel in kernels:
        assert kernel.output.dtype == "float32"
        check = check_kernel(kernel, seed=seed)
        assert check.ok, f"{case!r} ({kernel.formulation}): {check}"


def test_a_float32_weight_gradient_still_runs_on_vdpbf16ps():
    """The pair form's tile with a float32 write-back: vdpbf16ps, no fp32 FMA, no rounding to bf16."""
    kernels = {dtype: build(onednn.convolution_backward_weights(
        te.placeholder((2, 9, 9, 32), "bfloat16", name="x"), te.placeholder((2, 9, 9, 48), "bfloat16", name="dy"), [3, 3, 32, 48],
        strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], diff_weights_dtype=dtype), _target("znver4")) for dtype in (None, "float32")}  # fmt: skip
    for dtype, kernel in kernels.items():
        assert kernel.formulation == "cube-bf16" and "vdpbf16ps" in kernel.source and fma_instructions(kernel.source) == []
    assert kernels[None].output.dtype == "bfloat16" and kernels["float32"].output.dtype == "float32"
    assert "vpsrld" in kernels[None].source and "vpsrld" not in kernels["float32"].source  # bf16's rounding: round-to-nearest-even by shifts


@pytest.mark.parametrize("dtype, value", [("bfloat16", "float16"), ("float32", "bfloat16"), ("float16", "float64")])
def test_a_weight_gradient_type_other_than_the_inputs_or_float32_is_named(dtype, value):
    with pytest.raises(ConvGradError, match=r"diff_weights_dtype.*float32"):
        onednn.convolution_backward_weights(te.placeholder((1, 4, 4, 16), dtype, name="x"), te.placeholder((1, 4, 4, 16), dtype, name="dy"),
                                            [1, 1, 16, 16], strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                                            diff_weights_dtype=value)  # fmt: skip


def _pair_kernel_and_exact(op: str, **shape):
    result = _call(op, **shape)
    return emulate_bf16_dot(result), build(result)


def _arrays(kernel, values: dict) -> list[np.ndarray]:
    return [np.full(spec.shape, values[spec.name], dtype=BF16) for spec in kernel.inputs]


def test_bf16_denormal_inputs_are_read_as_zero():
    """vdpbf16ps reads bf16 denormals (|v| < 2**-126) as 0 (DAZ): a gradient of denormal x is 0,
    where the exact path gives the (representable) sum."""
    paired, exact = _pair_kernel_and_exact("filters", batch=1, size=8, cin=16, cout=16, kernel=1)
    tiny = 2.0**-130  # a bf16 denormal
    arrays = _arrays(paired, {"x": tiny, "dy": 1.0})
    assert np.all(paired(*arrays).astype(np.float64) == 0.0)
    # 1x1 kernel, pad 1: each weight sums the 8x8 real pixels of the 10x10 output
    assert np.allclose(exact(*arrays).astype(np.float64), 64 * tiny, rtol=2**-7)


def test_denormal_products_and_sums_are_flushed_to_zero():
    """Normal inputs whose products fall below 2**-126 are flushed (FTZ): the sum stays 0."""
    paired, exact = _pair_kernel_and_exact("filters", batch=1, size=8, cin=16, cout=16, kernel=1)
    arrays = _arrays(paired, {"x": 2.0**-70, "dy": 2.0**-70})  # normal bf16; products 2**-140
    assert np.all(paired(*arrays).astype(np.float64) == 0.0)
    assert np.allclose(exact(*arrays).astype(np.float64), 64 * 2.0**-140, rtol=2**-7)


def test_a_few_denormals_cost_only_their_own_products():
    """Mixed data: the pair kernel equals the float64 reference of the inputs with their bf16
    denormals set to 0, within the fp32 bound; the flushed products are the whole difference."""
    result = _call("data", batch=2, size=7, cin=32, cout=32)
    kernel = emulate_bf16_dot(result)
    rng = np.random.default_rng(7)
    arrays = [rng.uniform(-1, 1, spec.shape).astype(BF16) for spec in kernel.inputs]
    dy = arrays[0].astype(np.float64)
    mask = rng.random(dy.shape) < 0.2
    dy[mask] *= 2.0**-128  # a fifth of dy becomes bf16 denormals
    arrays[0] = dy.astype(BF16)
    assert 0 < np.count_nonzero(np.abs(arrays[0].astype(np.float64)) < BF16_MIN_NORMAL) < dy.size
    flushed = [np.where(np.abs(a.astype(np.float64)) < BF16_MIN_NORMAL, 0.0, a.astype(np.float64)) for a in arrays]
    expected = framework_expected(kernel.call, flushed)
    got = kernel(*arrays).astype(np.float64)
    reduction = 32 * 9  # Cout x taps
    assert np.all(np.abs(got - expected) <= 4 * reduction * 2.0**-24 + 2.0**-8 * np.abs(expected))


def test_emulation_needs_an_llvm_target_this_machine_runs():
    with pytest.raises(ConvGradError, match="llvm target"):
        emulate_bf16_dot(_call("filters"), "cuda")


AMX_SHAPES = [
    dict(batch=2, size=9, cin=32, cout=48), dict(batch=3, size=13, cin=20, cout=40, stride=2), dict(batch=1, size=8, cin=16, cout=16, kernel=1),
    dict(batch=2, size=40, cin=16, cout=16), dict(batch=2, size=9, cin=32, cout=32, groups=2), dict(rank=1, batch=2, size=37, cin=16, cout=24),
]  # fmt: skip
"""2-D dW and dX (and 1-D, as 2-D with one row): odd widths, strides, a 1x1 kernel (x's even starts only),
rows of 20 pairs (two 10-pair tiles), groups, Cout not a multiple of 16."""
AMX_DW_SHAPES = [dict(batch=2, size=15, cin=3, cout=64, kernel=7, stride=2, pads=(3, 3))]
"""dW only: a 3-channel 7x7 stem (its channels padded to a tile's 16; its dX puts pixels on the lanes)."""
AMX_IMAGE_SHAPES = [
    dict(batch=8, size=4, cin=32, cout=32), dict(batch=6, size=5, cin=16, cout=48),
    dict(batch=8, size=7, cin=48, cout=32, stride=2, pads=(1, 0)), dict(batch=12, size=3, cin=32, cout=32, kernel=1, pads=(0, 0)),
    dict(batch=16, size=6, cin=32, cout=32, dilation=2, pads=(2, 2)), dict(batch=10, size=5, cin=40, cout=24, groups=2),
    dict(batch=36, size=2, cin=16, cout=16, pads=(1, 1)),
]  # fmt: skip
"""dW with its pairs along the images (small maps, an even batch): 4x4 at N=8, an odd number of image
pairs, a strided 3x3 with uneven pads, a 1x1, dilation, groups with Cout not a multiple of 16, and 18
image pairs (a 9-pair tile twice)."""
AMX_DX_SHAPES = [
    dict(batch=2, size=14, cin=32, cout=32, dilation=2, pads=(2, 2)), dict(batch=1, size=17, cin=16, cout=48, kernel=5, stride=3, pads=(2, 0)),
    dict(batch=2, size=9, cin=48, cout=16, kernel=1, stride=2, pads=(0, 0)), dict(batch=1, size=4, cin=32, cout=32, pads=(0, 2)),
    dict(batch=3, size=7, cin=40, cout=24, groups=2, stride=2, dilation=3, pads=(3, 1)),
]  # fmt: skip
"""dX's phases on flat pixel rows: dilation (taps a dy row apart), a 5x5 at stride 3 (phases of 1 and
2 taps), a strided 1x1 (phases no tap reaches), a map smaller than a tile, groups with dilation."""
AMX_DX_IMAGES_INSIDE = [dict(batch=4, size=2, cin=64, cout=64), dict(batch=6, size=4, cin=64, cout=96, stride=2),
                        dict(batch=4, size=2, cin=512, cout=32)]  # fmt: skip
"""dX whose tasks walk the images inside the channel blocks (weights read per image 4x dy or more):
a 2x2 map, a strided one (four phases), one with 16 tasks of channel blocks (built for 2 cores: two
tasks a core or more, each packs its own weights)."""


@pytest.mark.parametrize("op", ["filters", "transpose", "data"])
@pytest.mark.parametrize("rank", [1, 2])
def test_amx_gradients_run_on_tiles(op, rank):
    """A 2-D bf16 dW or dX for sapphirerapids (any host): each 16 x 16 block of the result a tile
    accumulator over its reduction, two blocks (32 channels) sharing tiles: fewer than two
    tileloadd per tdpbf16ps; no zeroing pass before the helper, no FMA, no vdpbf16ps."""
    target = _target("sapphirerapids")
    assert has_amx_bf16(target) and not has_amx_bf16(_target("znver4"))
    kernel = build(_call(op, rank, batch=2, size=30, cin=32, cout=32, stride=1 + (op == "data")), target)
    source = kernel.source
    assert kernel.formulation == "cube-amx"
    assert source.count("ldtilecfg") >= 1 and source.count("tilestored") >= 1 and source.count("tilerelease") >= 1
    assert source.count("tdpbf16ps") >= 1 and source.count("tdpbf16ps") <= source.count("tileloadd") < 2 * source.count("tdpbf16ps")
    assert "vdpbf16ps" not in source and fma_instructions(source) == []
    script = kernel.mod.script().splitlines()
    assert "T.init()" not in "\n".join(script)  # the helper writes every tile (one chunk: nothing to add to)
    if op != "data":  # the result written in the mad's tasks, from cache: no parallel pass of its own after the mad
        mad = next(k for k, line in enumerate(script) if 'T.sblock("dw_cc_o")' in line)
        assert all("T.parallel" not in line for line in script[mad:])


@pytest.mark.parametrize("shape", AMX_DX_IMAGES_INSIDE)
def test_amx_dx_walks_the_images_inside_the_channel_blocks_where_weights_outweigh_dy(shape):
    """Each core's run of dX tasks reads its channel blocks' weights once for all images where the
    images' weight reads are 4x dy's or more (ResNet-18's layer4 at N=8), within the fp32 bound;
    the images outside where the weights are read from cache again (a 30x30 map)."""
    kernel = emulate_bf16_dot(_call("data", **shape), {"kind": "llvm", "num-cores": 2}, amx=True)  # (any host's core count)
    script = kernel.mod.script().splitlines()
    tasks = [k for k, line in enumerate(script) if "pragma_import_llvm" in line]
    packed = next(k for k, line in enumerate(script) if 'T.sblock("w_amx")' in line)
    if shape["cin"] == 512:  # a task a pair of channel blocks, every image inside it, its weights packed there
        assert len(tasks) == 1 and "for c1_0 in T.parallel" in script[tasks[0]] and packed > tasks[0]
    else:
        assert tasks and all("for c1_0_n_fused in T.parallel" in script[k] for k in tasks) and packed < tasks[0]
    check = check_kernel(kernel, seed=9)
    assert check.ok, f"{shape}: {check}"
    other = build(_call("data", batch=2, size=30, cin=32, cout=32), _target("sapphirerapids")).mod.script()
    assert "for n_c1_0_fused in T.parallel" in other


def test_amx_dx_images_inside_rule():
    """The rule on ResNet's bf16 layers (weight and dy bytes of the tile packs)."""
    layer4_n8 = 512 * 512 * 9 * 2, 8 * 512 * 16 * 2  # 3x3 on 2x2 maps: 4.7 MB of weights, dy's 4x4 flat rows
    assert images_inside(8, 16, *layer4_n8)
    assert not images_inside(1, 16, *layer4_n8) and not images_inside(8, 1, *layer4_n8)
    assert not images_inside(32, 8, 256 * 256 * 9 * 2, 32 * 256 * 96 * 2)  # 7x7 at N=32: 1.2 MB of weights, 3x dy


@pytest.mark.parametrize("op, shape", [(op, shape) for op in ("filters", "transpose", "data") for shape in AMX_SHAPES]
                         + [("data", shape) for shape in AMX_DX_SHAPES] + [(op, shape) for op in ("filters", "transpose") for shape in AMX_DW_SHAPES])  # fmt: skip
def test_amx_tiles_match_the_reference(op, shape):
    """The AMX tile plan's kernel (tdpbf16ps's arithmetic, emulated where the host lacks AMX)
    within the fp32 bound."""
    kernel = emulate_bf16_dot(_call(op, **shape), amx=True)
    assert kernel.formulation == "cube-amx"
    check = check_kernel(kernel, seed=5)
    assert check.ok, f"{shape}: {check}"


@pytest.mark.parametrize("op, shape", [(op, shape) for op in ("filters", "transpose") for shape in AMX_IMAGE_SHAPES])
def test_amx_dw_of_small_maps_pairs_the_images(op, shape):
    """A small map's dW takes its tile rows along image pairs (dy packed ``(Ho, C1, Wo, 16, N/2)``:
    one ``tdpbf16ps`` per output pixel of up to 16 pairs, where a row of a 4x4 map gives 2), within
    the fp32 bound, as column pairs are."""
    batch, size = shape["batch"], shape["size"]
    reach = shape.get("dilation", 1) * (shape.get("kernel", 3) - 1)
    out = (size + sum(shape.get("pads", (1, 1))) - reach - 1) // shape.get("stride", 1) + 1
    kernel = emulate_bf16_dot(_call(op, **shape), amx=True)
    (pack,) = [line for line in kernel.mod.script().splitlines() if "grads_2_matrix = T.sblock_alloc_buffer" in line]
    assert pack.split("(", 2)[2].startswith(f"T.int64({out}),") and pack.endswith(f"T.int64({batch // 2})), \"uint32\")")
    check = check_kernel(kernel, seed=7)
    assert check.ok, f"{shape}: {check}"


def test_amx_dw_pairs_images_where_they_take_fewer_tile_multiplies():
    """Image pairs where they take fewer ``tdpbf16ps`` than column pairs (half as many where column
    pairs store x once: every tap offset even); never for an odd batch."""
    assert amx_images(32, 4, 4) and amx_images(32, 7, 7) and amx_images(32, 28, 28) and amx_images(8, 2, 2)
    assert not amx_images(8, 16, 16) and not amx_images(8, 8, 8) and not amx_images(31, 4, 4) and not amx_images(2, 9, 9)
    assert amx_images(32, 7, 7, even=True) and amx_images(32, 14, 14, even=True)
    assert not amx_images(32, 28, 28, even=True) and not amx_images(32, 56, 56, even=True)


@pytest.mark.parametrize("op, batch", [("filters", 3), ("transpose", 3), ("filters", 8), ("transpose", 8)])
def test_amx_dw_in_chunks_adds_each_chunk_to_the_sums(op, batch, monkeypatch):
    """A dW whose reduction does not fit one chunk: the first chunk writes the sums (the init before
    it), every later one adds to them (the helper starts from C, ``tileloadd``); exact either way.
    Chunks of images on column pairs (N=3), of output rows on image pairs (N=8 on a 7x7 map)."""
    from tvm_convgrad.schedule.cpu import amx

    monkeypatch.setattr(amx, "CHUNK_BYTES", 1)  # one image (or output row) per chunk
    kernel = emulate_bf16_dot(_call(op, batch=batch, size=9 if batch == 3 else 7, cin=32, cout=32), amx=True)
    script = kernel.mod.script()
    assert "tvm_convgrad_amx_2x1_acc" in script and "T.init()" in script
    check = check_kernel(kernel, seed=8)
    assert check.ok, check


@pytest.mark.skipif(not ({"amx-tile", "amx-bf16"} <= host_features() and has_amx_bf16(resolve_target("llvm"))),
                    reason="this CPU has no AMX-BF16 (Sapphire Rapids and later), or TVM_CONVGRAD_MCPU names a model without it")  # fmt: skip
def test_amx_tiles_on_this_cpu_match_the_reference():
    assert request_amx(), "Linux refused the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)"
    for op, shape in [("filters", {}), ("transpose", {}), ("data", {}), ("filters", dict(batch=32, size=4, cin=64))]:
        kernel = build(_call(op, **{**dict(batch=2, size=30, cin=32, cout=48), **shape}))
        assert kernel.formulation == "cube-amx" and kernel.schedule == "default"
        check = check_kernel(kernel, seed=6)
        assert check.ok, check


def test_request_amx_says_whether_linux_granted_the_tiles():
    granted = request_amx()
    assert isinstance(granted, bool)
    if not {"amx-tile", "amx-bf16"} <= host_features():
        assert not granted  # the kernel refuses a feature the CPU lacks
