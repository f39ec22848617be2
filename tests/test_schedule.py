"""The CPU schedules are really applied (not silently bypassed), reach their structures, and stay exact.

Timing is never asserted here; the bench command measures it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import slow

from tvm_convgrad import build, dsl, isa_target, layout, schedule
from tvm_convgrad.compile import Workload, resolve_target
from tvm_convgrad.dsl.compute import cube_util
from tvm_convgrad.isa import host_can_run
from tvm_convgrad.schedule.common import stage_blocks
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel



def _dw(n, cin, h, w, cout, k, s=1, p=0, groups=1, name="sched_dw"):
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    x = placeholder(layout.shape_5hd(n, cin, h, w), name="x", dtype="float16")
    dy = placeholder(layout.shape_5hd(n, cout, ho, wo), name="dy", dtype="float16")
    return dsl.conv2d_backprop_filter(x, dy, [cout, cin // groups, k, k], {"strides": [s, s], "padding": [p] * 4, "groups": groups, "kernel_name": name})


def _dx(n, cin, h, w, cout, k, s=1, p=0, groups=1, name="sched_dx"):
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    sizes = [cout, cin // groups, k, k]
    fz = placeholder(layout.shape_fracz(sizes, groups), name="w", dtype="float16")
    dy = placeholder(layout.shape_5hd(n, cout, ho, wo), name="dy", dtype="float16")
    para = {"strides": [s, s], "padding": [p] * 4, "dilations": [1, 1, 1, 1], "group_dict": cube_util.calculate_group(sizes, groups), "kernel_name": name}
    return dsl.conv2d_backprop_input(fz, dy, sizes, [n, cin, h, w], para)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("make", [_dw, _dx], ids=["dw", "dx"])
def test_cube_tiles_are_parallel_unrolled_vectorized(make, isa):
    """The scheduled TIR has the cube's structure on every ISA (cross-compiled; runs where it can)."""
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": {"avx512": "skylake-avx512", "avx2": "haswell"}[isa], "num-cores": 2}
    kernel = build(make(2, 64, 14, 14, 64, 3, 1, 1, name=f"sched_{make.__name__[1:]}_{isa}"), target=target)
    tir = kernel.inspect_source("tir")
    mad = "dw_cc" if make is _dw else "dx_cc_0_0"
    assert re.search(rf'T.sblock\("{mad}(_\w+\d)?_update"\)', tir), "the mad, whole (or split into whole tiles and an edge)"
    assert "T.parallel(" in tir and "T.unroll(" in tir and "T.vectorized(" in tir
    assert "vpsraq" not in kernel.source, "no vectorized sign extension of 32-bit addresses"
    if host_can_run(kernel.target):
        assert check_kernel(kernel).ok


def test_stride_two_dx_is_four_phases_without_zeros():
    """(On 28x28: a 14x14 map's phases would run as live-tap regions, 95% of the pairs live.)"""
    kernel = build(_dx(1, 32, 28, 28, 32, 3, 2, 1))
    tir = kernel.inspect_source("tir")
    assert sorted(set(re.findall(r'T.sblock\("(dx_cc_\d_\d)(?:_i\d)?_update"\)', tir))) == ["dx_cc_0_0", "dx_cc_0_1", "dx_cc_1_0", "dx_cc_1_1"]
    assert "dy_filling" not in tir
    # Each phase multiplies only its own taps: 2x2, 2x1, 1x2, 1x1 of the 3x3 kernel (9 in all).
    grids = re.findall(r"for co1, mh, mw, co0 in T.grid\(T.int64\(\d+\), T.int64\((\d)\), T.int64\((\d)\)[\s\S]*?T.sblock\(\"(dx_cc_\d_\d)", tir)
    taps = {phase: int(a) * int(b) for a, b, phase in grids}  # (a phase split into tiles and an edge: two loops, same taps)
    assert len(grids) >= 4 and sorted(taps.values()) == [1, 2, 2, 4]
    assert all(taps[phase] == int(a) * int(b) for a, b, phase in grids)
    assert check_kernel(kernel).ok


@pytest.mark.parametrize(
    "args, mad",
    [
        ((3, 32, 15, 13, 48, 3, 2, 1), "dx_cc_"),  # the cube; phase (1, 1) has one tap: unit loops restored
        ((2, 3, 21, 19, 32, 7, 2, 3), "dx_px_"),  # pixel lanes, a channel-planar dy pack
        ((2, 40, 17, 15, 40, 3, 2, 1, 40), "dx_dw_"),  # depthwise, 40 channels
        ((2, 24, 16, 16, 24, 5, 3, 2), "dx_cc_"),  # stride 3: nine phases
    ],
    ids=["cube", "pixel-lanes", "depthwise", "stride-3"],
)
def test_strided_dx_of_a_batch_runs_image_by_image(monkeypatch, args, mad):
    """Every phase (and the dy pack) under the result's batch loop, each image's phase buffers
    allocated for one image; exact. The real threshold (2 MB of dy) is lowered to reach it."""
    from tvm_convgrad.schedule.cpu import loops

    name = f"per_image_{mad}{args[0]}_{args[6]}"
    monkeypatch.setattr(loops, "PER_IMAGE_ABOVE", 0)
    kernel = build(_dx(*args[:8], groups=args[8] if len(args) > 8 else 1, name=name), schedules=None)
    tir = kernel.inspect_source("tir")
    batch = re.search(r"\n( *)for n in range\(T.int64\(" + str(args[0]) + r"\)\):\n", tir)
    assert batch, "a serial batch loop"
    body = tir[batch.end():]
    indent = len(batch.group(1))
    inside = body[: next((m.start() for m in re.finditer(r"^ {0,%d}\S" % indent, body, re.M)), len(body))]
    phases = set(re.findall(rf'T.sblock\("({mad}\d_\d)\w*_update"\)', inside))
    assert len(phases) == args[6] ** 2 and 'T.sblock("c_ddr")' in inside
    assert check_kernel(kernel).ok
    monkeypatch.undo()
    assert "for n in range" not in build(_dx(*args[:8], groups=args[8] if len(args) > 8 else 1, name=name + "_small")).inspect_source("tir")


def test_few_tiles_split_the_reduction_across_cores():
    """One 16x16 dW tile (Cin = Cout = 16, 1x1) and two cores: rfactor into per-core parts."""
    kernel = build(_dw(1, 16, 9, 9, 16, 1, name="split_k_dw"), target=isa_target("native", cores=2))
    tir = kernel.inspect_source("tir")
    assert "dw_cc_rf" in tir
    assert check_kernel(kernel).ok


def test_few_input_channels_change_the_lanes():
    dw = build(_dw(2, 3, 20, 20, 32, 7, 2, 3, name="first_layer_dw"))
    dx = build(_dx(2, 3, 20, 20, 32, 7, 2, 3, name="first_layer_dx"))
    assert "dw_cc_t" in dw.inspect_source("tir") and "dw_cc_t_rf" in dw.inspect_source("tir")  # batch rfactor
    assert "dx_px_" in dx.inspect_source("tir")
    assert check_kernel(dw).ok and check_kernel(dx).ok


def test_packs_read_their_source_in_order_with_few_parallel_loops():
    """The forward's XIO -> FracZ weight pack (``w_conv[co1, ci1, kh, kw, ci0, co0]``) walks the
    weights as they lie (``kh, kw, ci1, ci0, co1`` above the ``co0`` lanes: each read a run of
    Cout), parallel over the fewest outer loops that make PARALLEL_TASKS tasks (``kh, kw, ci1``:
    72), the loops below serial; and the kernel is exact."""
    from tvm import te

    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu.elementwise import PARALLEL_TASKS

    src = te.placeholder((1, 14, 14, 128), "float32", name="src")
    weights = te.placeholder((3, 3, 128, 128), "float32", name="weights")
    kernel = build(onednn.convolution(src, weights, strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1]))
    tir = kernel.inspect_source("tir")
    pack = tir[: tir.index('T.sblock("w_conv")')].splitlines()[-4:-1]
    assert re.search(r"for kh_kw_ci1_fused in T.parallel\(T.int64\(72\)\)", pack[0]), pack
    assert re.search(r"for ci0, co1 in T.grid", pack[1]) and re.search(r"for co0 in T.vectorized\(T.int64\(16\)\)", pack[2]), pack
    assert 3 * 3 * 8 >= PARALLEL_TASKS > 3 * 3
    assert check_kernel(kernel).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("size, blocks_outside", [(28, True), (14, False)])
def test_a_strided_ncx_data_gradient_writes_its_result_channel_block_by_block(isa, size, blocks_outside):
    """A stride-2 NCX dX's result reads its four phases' 16-lane sums: where a 16-channel block's rows
    of an image outgrow ``BLOCK_ROWS_IN_L1`` (28x28: four phases of 14x14 x 16 lanes, 50 KB), its
    channel loop is split into blocks, in its place, and lanes inside all the rows (``(n, c1, h)``
    parallel, then ``(c0, w)``), so each block's rows are read by its 16 channels while in cache
    (ResNet-50's 128 -> 128 on 56x56, N=8, Zen 4: 11.0 -> 10.6 ms); on 14x14 (12.5 KB) the rows
    stay in L1 either way and the loops stay ``(n, c)`` parallel, ``h``, vectorized ``w``. Scheduled
    for each ISA on any host; exact where the host runs it."""
    from tvm import te

    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu.elementwise import BLOCK_ROWS_IN_L1

    assert (4 * (size // 2) ** 2 * 16 * 4 > BLOCK_ROWS_IN_L1) == blocks_outside
    target = resolve_target(isa_target(isa, cores=2))
    dy = te.placeholder((2, 32, size // 2, size // 2), "float32", name="diff_dst")
    weights = te.placeholder((32, 32, 3, 3), "float32", name="weights")
    dx = onednn.convolution_backward_data(dy, weights, [2, 32, size, size], strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1],
                                          dilations=[1, 1], data_format="NCX", weights_format="OIX")  # fmt: skip
    kernel = build(dx, target=target)
    tir = kernel.inspect_source("tir")
    nest = "\n".join(tir[: tir.index('T.sblock("diff_src")')].splitlines()[-4:-1])
    if blocks_outside:
        rows = rf"for \w+, \w+ in T.grid\(T.int64\(16\), T.int64\({size}\)\)"  # (n, c1, h) tasks, then (c0, w)
        assert re.search(rf"in T.parallel\(T.int64\({2 * 2 * size}\)\):\n\s+{rows}", nest), nest
    else:
        assert re.search(r"in T.parallel\(T.int64\(64\)\):\n\s+for \w+ in range", nest), nest
    if host_can_run(target):
        assert check_kernel(kernel).ok


@pytest.mark.parametrize("stride, inside", [(1, True), (2, False)])
def test_a_data_gradient_writes_its_output_inside_the_mads_tasks(stride, inside):
    """A stride-1 dX's NXC diff_src (its one phase's only consumer) is laid out under the phase's
    parallel loop while each task's sums are in cache; a strided dX's result, which its phases
    produce together, stays a pass of its own. (On 28x28: a 14x14 map's runs as live-tap regions,
    under the result's tasks instead.)"""
    from tvm import te

    from tvm_convgrad.dsl.compute.stages import DX_CC
    from tvm_convgrad.frontends import onednn

    target = resolve_target("llvm")
    dy = te.placeholder((2, 28 // stride, 28 // stride, 32), "float32", name="diff_dst")
    weights = te.placeholder((3, 3, 32, 32), "float32", name="weights")
    dx = onednn.convolution_backward_data(dy, weights, [2, 28, 28, 32], strides=[stride, stride], pads_begin=[1, 1], pads_end=[1, 1],
                                          dilations=[1, 1])  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dx).prim_func(target), target)
    task = sch.get(sch.get_loops(sch.get_sblock(dx.op.name))[0])  # the output's outermost loop
    assert (f'"{DX_CC}' in str(task)) == inside
    assert check_kernel(build(dx)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, weights_format, cin, batch, inside", [
    ("NCX", "OIX", 64, 1, True), ("NXC", "XIO", 48, 2, True), ("NXC", "OXI", 48, 1, True), ("NCX", "OIX", 40, 1, False), ("NCX", "OIX", 64, 64, False),
])  # fmt: skip
def test_a_weight_gradient_of_one_chunk_writes_its_result_per_cin_block(isa, data_format, weights_format, cin, batch, inside):
    """A dW whose reduction is one chunk (a late layer: 7x7 maps, few images) writes its result
    (cast and laid out in the framework's weight layout) for each task's Cout blocks x one Cin
    block right after their taps' sums are done, from cache, instead of a second pass over the
    whole fp32 FracZ sums (N=1 512 -> 512 3x3 on 7x7, bf16 on Zen 4: 4.4 -> 1.7 ms); OIX, XIO (the
    turned tile) and OXI. A partial last Cin block (40 channels: TVM cannot bound its region per
    task) and a batch whose reduction runs in chunks keep the pass. The write-back is placed before
    AVX2's rows are split (6 + 6 + 4, predicated: TVM would bound the region by 18 rows, past the
    block, and a first version wrote a neighbour block's rows early, a race that AVX2's run here
    caught). Scheduled for both ISAs on any host, run where the host can."""
    from tvm import te

    from tvm_convgrad.dsl.compute.stages import DW_CC
    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target(isa))
    size = 7 if batch < 8 else 28
    x_shape = (batch, cin, size, size) if data_format == "NCX" else (batch, size, size, cin)
    y_shape = (batch, 32, size, size) if data_format == "NCX" else (batch, size, size, 32)
    src, dy = te.placeholder(x_shape, "float32", name="src"), te.placeholder(y_shape, "float32", name="diff_dst")
    shape = {"OIX": [32, cin, 3, 3], "XIO": [3, 3, cin, 32], "OXI": [32, 3, 3, cin]}[weights_format]
    dw = onednn.convolution_backward_weights(src, dy, shape, strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                                             data_format=data_format, weights_format=weights_format)  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    task = _outermost_loop(sch, f"{DW_CC}_update")
    assert _outermost_loop(sch, dw.op.name).same_as(task) == inside
    if host_can_run(target):
        assert check_kernel(build(dw, target=target)).ok


def _outermost_loop(sch, block_name: str):
    return sch.get(sch.get_loops(sch.get_sblock(block_name))[0])


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, dtype, cin, size, rate, pad", [
    ("NCX", "float32", 48, (14, 14), 6, 6), ("NXC", "bfloat16", 48, (14, 14), 12, 12), ("NXC", "float32", 40, (10, 12), 4, 0),
])  # fmt: skip
def test_an_atrous_data_gradient_runs_by_live_tap_regions(isa, data_format, dtype, cin, size, rate, pad):
    """Issue 27.4: a 3x3 dX at a dilation whose taps mostly read dy's zero padding (DeepLab's
    ASPP, rates 6 and 12 on 14x14; a map some of whose rows and columns no window reads) runs one
    mad per live-tap region (interior, borders), each under the result's task of an image's
    channels, and the result's pixel loops partitioned at the regions' edges (no select per
    pixel); exact against the reference. Scheduled for both ISAs on any host, run where the host
    can (ASPP r6, N=4 NCHW on Zen 4: 38.7 -> 20.7 ms, PyTorch 20.9)."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target(isa))
    out = tuple(s + 2 * pad - 2 * rate for s in size)
    dy_shape = (2, 24, *out) if data_format == "NCX" else (2, *out, 24)
    dy, weights = te.placeholder(dy_shape, dtype, name="diff_dst"), te.placeholder((3, 3, cin, 24), dtype, name="weights")
    dx = onednn.convolution_backward_data(dy, weights, [2, cin, *size] if data_format == "NCX" else [2, *size, cin], strides=[1, 1],
                                          pads_begin=[pad] * 2, pads_end=[pad] * 2, dilations=[rate] * 2, data_format=data_format)  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dx).prim_func(target), target)
    tir = sch.mod.script()
    regions = sorted(set(re.findall(r'T.sblock\("(dx_cc_\d+_\d+)_update"\)', tir)))
    assert len(regions) == 9 and "_partition" in tir
    task = _outermost_loop(sch, f"{regions[0]}_update")
    assert task.kind == ForKind.PARALLEL and all(_outermost_loop(sch, f"{name}_update").same_as(task) for name in regions)
    if host_can_run(target):
        assert check_kernel(build(dx, target=target)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("cin, rate", [(40, 6), (32, 12)])
def test_an_atrous_oix_weight_gradient_is_written_tap_by_tap(isa, cin, rate):
    """A 3x3 dW at a dilation whose taps mostly read padding sums each live-tap region in a mad of
    its own (``dw_cc_<kh>_<kw>``); its OIX result reads them with its taps unrolled under each
    input channel (``elementwise.region_sums_result``), so every copy reads one region's sums where
    they lie: no gathers in the code (LLVM gathered over every region through the chain of
    conditions before: a third of ASPP r6's dW). A partial last run of 16 channels (40) is guarded.
    Exact where the host can run it."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target(isa))
    x, dy = te.placeholder((2, cin, 14, 14), "float32", name="src"), te.placeholder((2, 24, 14, 14), "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(x, dy, [24, cin, 3, 3], strides=[1, 1], pads_begin=[rate] * 2, pads_end=[rate] * 2,
                                             dilations=[rate] * 2, data_format="NCX", weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    assert len(set(re.findall(r'T.sblock\("(dw_cc_\d+_\d+)_update"\)', sch.mod.script()))) > 1, "a mad per live-tap region"
    co, ci_runs, ci, kh, kw = (sch.get(lp) for lp in sch.get_loops(sch.get_sblock("diff_weights")))
    assert co.kind == ForKind.PARALLEL and int(ci.extent) == 16 and kh.kind == kw.kind == ForKind.UNROLLED
    kernel = build(dw, target=target)
    assert "vgather" not in kernel.source, "the regions' sums read one region at a time"
    if host_can_run(target):
        assert check_kernel(kernel).ok


@pytest.mark.parametrize("images, across", [(8, True), (1, False)])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_regions_of_small_maps_in_a_batch_run_across_the_images(images, across, data_format):
    """A 3x3 dX on 4x4 maps splits into live-tap regions; with 8 images (128 pixels in all, at
    most ``ACROSS_IMAGES_PIXELS``) each region is a mad of its own, its own parallel tasks tiled
    across the images (an image's corner region is one pixel: a tile of it a lone FMA chain); one
    image keeps the regions under the result's task of its channels. Exact either way."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu.regions import ACROSS_IMAGES_MIN, ACROSS_IMAGES_PIXELS

    assert (images >= ACROSS_IMAGES_MIN and images * 16 <= ACROSS_IMAGES_PIXELS) == across
    target = resolve_target(isa_target("avx512"))
    dy_shape = (images, 64, 4, 4) if data_format == "NCX" else (images, 4, 4, 64)
    dy, weights = te.placeholder(dy_shape, "float32", name="diff_dst"), te.placeholder((3, 3, 64, 64), "float32", name="weights")
    dx = onednn.convolution_backward_data(dy, weights, [images, 64, 4, 4] if data_format == "NCX" else [images, 4, 4, 64], strides=[1, 1],
                                          pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format=data_format)  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dx).prim_func(target), target)
    regions = sorted(set(re.findall(r'T.sblock\("(dx_cc_\d+_\d+)_update"\)', sch.mod.script())))
    tasks = {name: _outermost_loop(sch, f"{name}_update") for name in regions}
    assert len(regions) > 1 and all(task.kind == ForKind.PARALLEL for task in tasks.values())
    shared = all(task.same_as(tasks[regions[0]]) for task in tasks.values())
    assert shared != across, {name: str(task.loop_var) for name, task in tasks.items()}
    if host_can_run(target):
        assert check_kernel(build(dx, target=target)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, cin, size, rate, groups, regions", [
    ("NCX", 48, (14, 14), 6, 1, 9), ("NXC", 40, (14, 14), 18, 1, 1), ("NCX", 48, (10, 12), 4, 2, 9), ("NXC", 32, (1, 1), 1, 1, 1),
    ("NCX", 32, (2, 2), 1, 1, 0),
])  # fmt: skip
def test_an_atrous_filter_gradient_runs_by_live_tap_regions(isa, data_format, cin, size, rate, groups, regions):
    """Issue 27.4: a 3x3 dW at a dilation whose taps mostly read x's zero padding (ASPP rates 6
    and 18 on 14x14; a grouped one on a map that is not square; a 1x1 map's centre tap) runs one
    mad per live-tap region, each tap summed over the outputs whose windows read real x only (at
    rate 18 and on the 1x1 map only the centre tap: the others' dW is 0, no mad); a 2x2 map of 4
    images keeps one mad (its regions would leave out 7 products per weight, fewer than
    ``FILTER_MIN_SAVED``); exact against the reference (40 channels: a partial block). Scheduled for both ISAs on any host, run where
    the host can (ASPP r6, N=4 NCHW on Zen 4: 54.5 -> 35.7 ms, r12 74.5 -> 28.7, PyTorch 51.3
    and 87.0)."""
    from tvm import te

    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target(isa))
    pad = rate
    out = tuple(s + 2 * pad - 2 * rate for s in size)
    src_shape, dy_shape = ((4, cin, *size), (4, 24, *out)) if data_format == "NCX" else ((4, *size, cin), (4, *out, 24))
    src, dy = te.placeholder(src_shape, "float32", name="src"), te.placeholder(dy_shape, "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [3, 3, cin // groups, 24], strides=[1, 1], pads_begin=[pad] * 2, pads_end=[pad] * 2,
                                             dilations=[rate] * 2, groups=groups, data_format=data_format)  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    mads = sorted(set(re.findall(r'T.sblock\("(dw_cc_\d+_\d+)_update"\)', sch.mod.script())))
    assert len(mads) == regions, mads
    if host_can_run(target):
        assert check_kernel(build(dw, target=target)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("kernel, size", [((3, 3), (2, 2)), ((5, 3), (6, 7)), ((3,), (9,))])
def test_an_oix_weight_gradient_is_written_tap_run_by_tap_run(isa, kernel, size):
    """Issue 27: a weight gradient in OIX keeps each ``(o, i)``'s taps contiguous (9 floats for a
    3x3). Its write-back from the cube's 16-lane rows vectorizes that run of taps (stores
    contiguous, loads strided in cache) instead of leaving LLVM to vectorize the channel loop into
    scatters at the taps' stride (512 -> 512 on 2x2, N=8, NCHW on Zen 4: 3.0 -> 1.55 ms; AVX-512
    asm cross-compiled on any host: no ``vscatter``); exact where the host runs it."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target(isa))
    rank = len(kernel)
    out = tuple(s + 2 * (k // 2) - k + 1 for s, k in zip(size, kernel))
    src, dy = te.placeholder((8, 48, *size), "float32", name="src"), te.placeholder((8, 32, *out), "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [32, 48, *kernel], strides=[1] * rank, pads_begin=[k // 2 for k in kernel],
                                             pads_end=[k // 2 for k in kernel], dilations=[1] * rank, data_format="NCX", weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    taps = 1
    for k in kernel:
        taps *= k
    *_, lanes = sch.get_loops(sch.get_sblock("diff_weights"))
    assert sch.get(lanes).kind == ForKind.VECTORIZED and int(sch.get(lanes).extent) == taps
    kernel_built = build(dw, target=target)
    if isa == "avx512":
        assert "scatter" not in kernel_built.inspect_source("asm")
    if host_can_run(target):
        assert check_kernel(kernel_built).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("channels, stride, x_size, inside", [(32, 1, 21, True), (24, 1, 21, False), (32, 1, 14, False), (32, 2, 14, True),
                                                             (24, 2, 14, True)])  # fmt: skip
def test_a_depthwise_data_gradient_runs_plane_by_plane(isa, channels, stride, x_size, inside):
    """A depthwise dX (NCX) packs each (image, channel block) plane of dy, runs its tiles (every
    stride phase's) and writes its plane of diff_src inside one parallel task; exact. A stride-1
    dX with a partial last block (whose channels TVM cannot bound per task as a write-back of
    the one phase), or whose planes are small (14x14: under ``PLANE_MIN_PIXELS``), keeps its
    passes, its tasks the tiles' rows; the strided one (its phases under the result's task) not.
    On AVX-512 the small planes' result is written tile by tile all the same, under the tiles'
    rows' task (``DepthwiseInputGrad._write_back_per_tile``), their pack a pass of its own."""
    from tvm import te

    from tvm_convgrad.dsl.compute.stages import DX_DW, DY_DW
    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu.depthwise import PLANE_MIN_PIXELS

    target = isa_target(isa, cores=2)
    size = x_size // stride
    assert stride > 1 or (size * size >= PLANE_MIN_PIXELS) == (x_size == 21)
    dy = te.placeholder((8, channels, size, size), "float32", name="diff_dst")
    weights = te.placeholder((channels, 1, 3, 3), "float32", name="weights")
    dx = onednn.convolution_backward_data(dy, weights, [8, channels, x_size, x_size], strides=[stride, stride], pads_begin=[1, 1],
                                          pads_end=[1, 1], dilations=[1, 1], groups=channels, data_format="NCX", weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dx).prim_func(target), target)
    task = _outermost_loop(sch, f"{DX_DW}_0_0_update")
    tiles_write = isa == "avx512" and stride == 1 and channels % 16 == 0
    assert _outermost_loop(sch, dx.op.name).same_as(task) == (inside or tiles_write)
    assert _outermost_loop(sch, DY_DW).same_as(task) == inside
    if host_can_run(target):
        assert check_kernel(build(dx, target=target)).ok


@pytest.mark.parametrize("op", ["forward", "dx"])
@pytest.mark.parametrize("batch, channels, x_size, banded", [(8, 32, 21, True), (8, 24, 14, True), (2, 48, 7, True), (1, 32, 7, False)])
def test_an_nxc_depthwise_forward_or_data_gradient_runs_by_bands_of_image_rows(op, batch, channels, x_size, banded):
    """An NXC stride-1 depthwise forward (``conv_dw``) or dX (``dx_dw``): each parallel task is a
    band of one image's rows, every channel block of it inside: the pack reads each pixel's
    channels as one run (its channel-block loop inside its pixel loops, the lanes innermost), the
    tiles sum, the result writes whole pixels; the forward's partial last block (24 channels)
    too. The dX's result with a partial last block reads its sums at a flat ``H*W`` index TVM cannot
    bound per task, and one 7x7 image makes too few bands for the cores' tasks: planes or tiles'
    rows then. Exact."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.dsl.compute.stages import CONV_DW, DX_DW, DY_DW, FMAP_PAD
    from tvm_convgrad.frontends import onednn

    target = resolve_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    x_shape = [batch, x_size, x_size, channels]
    weights = te.placeholder((3, 3, 1, channels), "float32", name="weights")
    if op == "forward":
        src = te.placeholder(x_shape, "float32", name="src")
        out = onednn.convolution(src, weights, None, strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], groups=channels)
        mad, pack = f"{CONV_DW}_update", FMAP_PAD
    else:
        dy = te.placeholder(x_shape, "float32", name="diff_dst")
        out = onednn.convolution_backward_data(dy, weights, x_shape, strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                                               groups=channels, data_format="NXC")  # fmt: skip
        mad, pack = f"{DX_DW}_0_0_update", DY_DW
    sch = schedule.rule_for(target).apply(Workload.of(out).prim_func(target), target)
    task = _outermost_loop(sch, mad)
    banded = banded and not (op == "dx" and channels % 16)
    assert task.kind == ForKind.PARALLEL
    assert (_outermost_loop(sch, out.op.name).same_as(task) and _outermost_loop(sch, pack).same_as(task)) == banded
    if banded:
        *_, blocks, lanes = (sch.get(lp) for lp in sch.get_loops(sch.get_sblock(pack)))
        assert int(blocks.extent) == -(-channels // 16) and lanes.kind == ForKind.VECTORIZED
    if host_can_run(target):
        assert check_kernel(build(out, target=target)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2", "sse"])
@pytest.mark.parametrize("op, data_format, x_size", [("forward", "NXC", 21), ("dx", "NXC", 21), ("dx", "NCX", 21), ("dx", "NCX", 14)])
def test_a_one_phase_depthwise_result_is_written_tile_by_tile(isa, op, data_format, x_size):
    """A stride-1 depthwise forward or dX writes each register tile's sums to the result as the tile
    ends: the result stage sits under the mad's tile loop (the loop above its reductions), its
    loops there unrolled but the innermost, vectorized (NXC: the tile's channels, one run a pixel;
    NCX: a tile row of one plane); in a band or plane task (21x21) and where the tasks are the
    tiles' rows (NCX 14x14). On AVX-512 only: AVX2's and SSE's tiles need their registers; exact."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.dsl.compute.stages import CONV_DW, DX_DW
    from tvm_convgrad.frontends import onednn

    target = isa_target(isa, cores=2)
    nxc = data_format == "NXC"
    x_shape = [8, x_size, x_size, 32] if nxc else [8, 32, x_size, x_size]
    weights = te.placeholder((3, 3, 1, 32) if nxc else (32, 1, 3, 3), "float32", name="weights")
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], groups=32, data_format=data_format,
              weights_format="XIO" if nxc else "OIX")  # fmt: skip
    if op == "forward":
        out, mad = onednn.convolution(te.placeholder(x_shape, "float32", name="src"), weights, None, **kw), f"{CONV_DW}_update"
    else:
        out, mad = onednn.convolution_backward_data(te.placeholder(x_shape, "float32", name="diff_dst"), weights, x_shape, **kw), f"{DX_DW}_0_0_update"
    sch = schedule.rule_for(target).apply(Workload.of(out).prim_func(target), target)
    mad_loops = sch.get_loops(sch.get_sblock(mad))
    result_loops = sch.get_loops(sch.get_sblock(out.op.name))
    tile = len(mad_loops) - 7  # (above the reductions (q, kh, kw) and the tile's rows, columns, lanes)
    tiled = len(result_loops) > tile + 1 and all(sch.get(a).same_as(sch.get(b)) for a, b in zip(result_loops[: tile + 1], mad_loops))
    assert tiled == (isa == "avx512")
    if tiled:
        *rows, lanes = (sch.get(lp) for lp in result_loops[tile + 1 :])
        assert all(lp.kind == ForKind.UNROLLED for lp in rows) and lanes.kind == ForKind.VECTORIZED
        assert int(lanes.extent) == (16 if nxc else int(sch.get(mad_loops[-2]).extent))  # (a pixel's channels; a tile row)
    if host_can_run(target):
        assert check_kernel(build(out, target=target)).ok


@pytest.mark.parametrize("data_format, channels, size, blocks_a_task",
                         [("NXC", 48, 14, 3), ("NCX", 48, 14, 1), ("NXC", 96, 56, 6)])  # fmt: skip
def test_a_strided_nxc_depthwise_data_gradient_runs_several_channel_blocks_a_task(data_format, channels, size, blocks_a_task):
    """A stride-2 depthwise dX runs its phases under the result's tasks (``phases_plane_by_plane``);
    on NXC each task takes every channel block of an image where the images make enough tasks (all 3
    of 48 channels on 14x14; all 6 of 96 on 56x56, whose dy pack and result outgrow ``BAND_BYTES``),
    its dy pack reading each pixel's channels as one run (the channel-block loop inside the pixel
    loops); NCX keeps one block a task. Exact."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.dsl.compute.stages import DY_DW
    from tvm_convgrad.frontends import onednn

    target = resolve_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    half, nxc = size // 2, data_format == "NXC"
    x_shape = [8, size, size, channels] if nxc else [8, channels, size, size]
    y_shape = [8, half, half, channels] if nxc else [8, channels, half, half]
    dy = te.placeholder(y_shape, "float32", name="diff_dst")
    weights = te.placeholder((3, 3, 1, channels) if nxc else (channels, 1, 3, 3), "float32", name="weights")
    dx = onednn.convolution_backward_data(dy, weights, x_shape, strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                                          groups=channels, data_format=data_format, weights_format="XIO" if nxc else "OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dx).prim_func(target), target)
    task = _outermost_loop(sch, dx.op.name)
    assert task.kind == ForKind.PARALLEL and int(task.extent) == 8 * (channels // 16) // blocks_a_task
    assert _outermost_loop(sch, DY_DW).same_as(task)
    if nxc:
        *_, blocks, lanes = (sch.get(lp) for lp in sch.get_loops(sch.get_sblock(DY_DW)))
        assert int(blocks.extent) == blocks_a_task and lanes.kind == ForKind.VECTORIZED
    if host_can_run(target):
        assert check_kernel(build(dx, target=target)).ok


@pytest.mark.parametrize("kernel, stride", [((3, 3), 1), ((3, 1), 2)])
def test_a_depthwise_weight_gradient_packs_image_by_image(kernel, stride):
    """A depthwise dW (NCX) packs x and dy for one image of its channel lanes inside its tasks,
    under the image loop (a 3x1 kernel of 40 channels on AVX2: three tasks, the rows in rfactor
    parts); exact."""
    from tvm import te

    from tvm_convgrad.dsl.compute.stages import DW_DW, FMAP_DW, GRADS_DW
    from tvm_convgrad.frontends import onednn

    avx2 = isa_target("avx2")
    target = resolve_target(avx2)
    src = te.placeholder((3, 40, 13, 11), "float32", name="src")
    ho = (13 + 2 - kernel[0]) // stride + 1
    wo = (11 + 2 * (kernel[1] // 2) - kernel[1]) + 1
    dy = te.placeholder((3, 40, ho, wo), "float32", name="diff_dst")
    pads = [1, kernel[1] // 2]
    dw = onednn.convolution_backward_weights(src, dy, [40, 1, *kernel], strides=[stride, 1], pads_begin=pads, pads_end=pads,
                                             dilations=[1, 1], groups=40, data_format="NCX", weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    rfactor = f'"{DW_DW}_rf' in str(sch.mod)
    mad = sch.get_loops(sch.get_sblock(f"{DW_DW}_rf_update" if rfactor else f"{DW_DW}_update"))
    for pack in (FMAP_DW, GRADS_DW):  # under the mad's loops down to its image loop
        loops = sch.get_loops(sch.get_sblock(pack))
        shared = next(k for k, (a, b) in enumerate(zip([*loops, None], mad)) if a is None or not sch.get(a).same_as(sch.get(b)))
        assert shared >= 2 and sch.get(mad[shared - 1]).extent == 3, (pack, shared)
    assert rfactor == (kernel == (3, 1))
    if host_can_run(avx2):
        assert check_kernel(build(dw, target=avx2)).ok


@pytest.mark.parametrize("batch, parallel", [(4, "images"), (3, "tasks")])
def test_a_stems_weight_gradient_runs_each_cores_images_where_they_split_evenly(batch, parallel):
    """The Cout-on-lanes dW of a stem (3 -> 32, 3x3 / 2, nine (channel, kernel row) tasks): with
    a batch the cores split evenly (4 on 2), each core runs every task of its images (the image
    loop parallel), a tile taking the kernel's three rows (:func:`.tiles.tap_rows`); else (3) the
    tasks of each image are the parallel loop, a tile one row; exact."""
    from tvm import te, tirx

    from tvm_convgrad.dsl.compute.stages import DW_CC_T
    from tvm_convgrad.frontends import onednn

    avx512 = isa_target("avx512", cores=2)
    target = resolve_target(avx512)
    src = te.placeholder((batch, 3, 18, 18), "float32", name="src")
    dy = te.placeholder((batch, 32, 9, 9), "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [32, 3, 3, 3], strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                                             data_format="NCX", weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(f"{DW_CC_T}_rf_update"))]
    (at,) = [k for k, loop in enumerate(loops) if loop.kind == tirx.ForKind.PARALLEL]
    assert (at == 0 and loops[0].extent == batch) if parallel == "images" else (at > 0 and loops[0].extent == batch)
    unrolled = [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.UNROLLED]
    assert unrolled == ([3, 3, 2] if parallel == "images" else [3, 2]), "the kernel's 3 rows x 3 taps x 2 Cout vectors where the images are the tasks"
    if host_can_run(avx512):
        assert check_kernel(build(dw, target=avx512)).ok


def test_a_depthwise_weight_gradient_of_an_even_batch_sums_each_cores_images():
    """An NXC depthwise dW whose images split evenly over the cores (4 on 2): each core sums its
    own images (the rfactor part is the parallel loop), every channel block of an image before the
    next (the images loop above the blocks), its x pack made per image and block, its dy (fp32,
    whole channel blocks) read where it lies, no pack of it; exact."""
    from tvm import te, tirx

    from tvm_convgrad.dsl.compute.stages import DW_DW, FMAP_DW, GRADS_DW
    from tvm_convgrad.frontends import onednn

    avx512 = isa_target("avx512", cores=2)
    target = resolve_target(avx512)
    src = te.placeholder((4, 9, 11, 48), "float32", name="src")
    dy = te.placeholder((4, 9, 11, 48), "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [48, 1, 3, 3], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                                             groups=48, weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    mad = sch.get_loops(sch.get_sblock(f"{DW_DW}_rf_update"))  # part, images, the channel tasks (q, c1, lanes), ...
    part, images, blocks = (sch.get(loop) for loop in (mad[0], mad[1], mad[3]))
    assert part.kind == tirx.ForKind.PARALLEL and part.extent == 2 and images.extent == 2
    assert blocks.extent == 3, "the channel blocks inside each image"
    loops = sch.get_loops(sch.get_sblock(FMAP_DW))
    assert all(sch.get(a).same_as(sch.get(b)) for a, b in zip(loops[:5], mad[:5]))
    assert GRADS_DW not in {sch.get(b).name_hint for b in stage_blocks(sch)}
    if host_can_run(avx512):
        assert check_kernel(build(dw, target=avx512)).ok


@pytest.mark.parametrize("data_format, banded", [("NXC", True), ("NCX", False)])
def test_a_depthwise_weight_gradient_of_large_nxc_maps_packs_bands_of_rows(data_format, banded):
    """An NXC depthwise dW on maps of ``PLANE_MIN_PIXELS`` or more (21x21, 48 channels, 4 images on
    2 cores): each core's images, each image by bands of dy's rows, x and dy packed for every
    channel block of a band (their channel-block loop inside their pixel loops: each pixel's
    channels read as one run) before its blocks' tiles run, dy (fp32, whole blocks) read where it
    lies; NCX inputs keep their per-block planes of both. Exact."""
    from tvm import te, tirx

    from tvm_convgrad.dsl.compute.stages import DW_DW, FMAP_DW, GRADS_DW
    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu.depthwise import PLANE_MIN_PIXELS

    avx512 = isa_target("avx512", cores=2)
    target = resolve_target(avx512)
    shape = (4, 21, 21, 48) if data_format == "NXC" else (4, 48, 21, 21)
    assert 21 * 21 >= PLANE_MIN_PIXELS
    src, dy = te.placeholder(shape, "float32", name="src"), te.placeholder(shape, "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [48, 1, 3, 3], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                                             groups=48, data_format=data_format, weights_format="OIX")  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    mad = sch.get_loops(sch.get_sblock(f"{DW_DW}_rf_update"))
    assert sch.get(mad[0]).kind == tirx.ForKind.PARALLEL
    names = {sch.get(b).name_hint for b in stage_blocks(sch)}
    assert (GRADS_DW in names) == (data_format == "NCX")
    for pack in (FMAP_DW, GRADS_DW) if data_format == "NCX" else (FMAP_DW,):
        loops = sch.get_loops(sch.get_sblock(pack))
        shared = sum(1 for a, b in zip(loops, mad) if sch.get(a).same_as(sch.get(b)))
        assert (shared == 3 and int(sch.get(loops[-2]).extent) == 3) if banded else shared == 5, pack
    if host_can_run(avx512):
        assert check_kernel(build(dw, target=avx512)).ok


def test_tunable_rule_samples_tiles():
    workload = Workload.of(_dx(1, 32, 14, 14, 32, 3, 1, 1, name="tunable_dx"))
    target = resolve_target("llvm")
    sch = schedule.CpuRule().apply(workload.prim_func(target), target, tunable=True)
    assert "sample_perfect_tile" in str(sch.trace)
    assert "sample_perfect_tile" not in str(schedule.CpuRule().apply(workload.prim_func(target), target, tunable=False).trace)


def _threads(env: dict) -> int:
    code = "import tvm_convgrad, tvm; print(tvm.get_global_func('runtime.NumThreads')())"
    base = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env}, timeout=120)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.strip())


@slow
def test_threads_default_to_every_usable_core_and_respect_the_user():
    cores = len(os.sched_getaffinity(0))
    assert _threads({}) == cores  # TVM alone would start cores // 2 on x86
    assert _threads({"TVM_NUM_THREADS": "1"}) == 1
    assert _threads({"OMP_NUM_THREADS": "1"}) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize(
    "make, args",
    [
        (_dw, (2, 3, 20, 20, 32, 7, 2, 3)), (_dx, (2, 3, 20, 20, 32, 7, 2, 3)), (_dx, (1, 32, 14, 14, 32, 3, 2, 1)),
        (_dw, (1, 16, 9, 9, 16, 1)), (_dw, (1, 48, 14, 14, 96, 3, 2, 1, 48)), (_dx, (1, 48, 14, 14, 96, 3, 2, 1, 48)),
    ],
    ids=["first-layer-dw", "first-layer-dx", "stride-2-dx", "one-tile-dw", "depthwise-dw", "depthwise-dx"],
)
def test_every_formulation_lowers_to_cuda(make, args):
    """The CUDA rule binds every stage of every formulation (PTX through nvcc; no GPU needed)."""
    kernel = build(make(*args, name=f"cuda_{make.__name__[1:]}_{args[1]}_{args[-2]}"), target="cuda")
    assert kernel.ptx_entries and all(e.startswith(kernel.name) for e in kernel.ptx_entries)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, batch, cin, cout, size, stride, images", [
    ("NXC", 4, 24, 144, 12, 1, True), ("NXC", 2, 96, 24, 14, 1, True), ("NCX", 2, 24, 144, 24, 1, True), ("NXC", 2, 32, 64, 48, 1, True),
    ("NXC", 4, 64, 32, 24, 2, True), ("NXC", 3, 24, 144, 12, 1, False), ("NXC", 2, 32, 64, 6, 1, False), ("NXC", 2, 64, 16, 24, 1, False),
])  # fmt: skip
def test_a_1x1_weight_gradient_that_cores_cannot_share_by_blocks_sums_each_cores_images(isa, data_format, batch, cin, cout, size, stride,
                                                                                       images):  # fmt: skip
    """A 1x1 dW whose channel blocks the two cores can only share by each reading a whole operand
    (24 -> 144: 9 Cout blocks, so each core owned a Cin block and read all of dy; 96 -> 24 or
    32 -> 64: each owned Cout blocks and read all of x) sums each core's half of the images
    instead (an ``rfactor`` over the batch, the parts added in a fixed order), dy and x packed per
    chunk inside the core's task (MobileNetV2's 24 -> 144 on 28x28, N=32, Zen 4: 3.1 -> 2.3 ms);
    NCX, 48x48 maps in chunks of row bands, a strided 1x1. An odd batch, a map too small for the
    parts' extra sums to pay and a split that saves too little (64 -> 16: a whole dy of one block
    against half of it and half of x) keep the blocks. Both ISAs scheduled on any host, run (exact
    against the float64 reference) where the host can."""
    from tvm import te
    from tvm.tirx import ForKind

    from tvm_convgrad.dsl.compute.stages import DW_CC, FMAP_L1, GRADS_2_MATRIX
    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target(isa, cores=2))
    out = (size - 1) // stride + 1
    x_shape = (batch, cin, size, size) if data_format == "NCX" else (batch, size, size, cin)
    y_shape = (batch, cout, out, out) if data_format == "NCX" else (batch, out, out, cout)
    src, dy = te.placeholder(x_shape, "float32", name="src"), te.placeholder(y_shape, "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [1, 1, cin, cout], strides=[stride, stride], pads_begin=[0, 0], pads_end=[0, 0],
                                             dilations=[1, 1], data_format=data_format)  # fmt: skip
    sch = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    assert (f'T.sblock("{DW_CC}_rf_update")' in sch.mod.script()) == images
    if images:
        part = _outermost_loop(sch, f"{DW_CC}_rf_update")
        assert part.kind == ForKind.PARALLEL and int(part.extent) == 2  # a part per core
        packs = [pack for pack in (GRADS_2_MATRIX, FMAP_L1) if f'T.sblock("{pack}")' in sch.mod.script()]  # (rows read in place: none)
        assert all(_outermost_loop(sch, pack).same_as(part) for pack in packs)  # made in the core's task, not passes of their own
        assert packs or data_format == "NXC"
    if host_can_run(target):
        assert check_kernel(build(dw, target=target)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_a_weight_gradient_chunk_is_cut_to_what_the_cache_holds(isa, monkeypatch):
    """A dW chunk whose dy and x (all of both, a step's share) would outgrow ``CHUNK_IN_CACHE`` runs
    fewer steps, down to what the sums take (ResNet-18's channels-last 128 -> 128 3x3 on 14x14 at
    N=32, Zen 3: chunks of 8 images 18.5 ms, of 2 12.1). Scaled down: 4 images of 32 -> 32 channels
    on 14x14, NXC: 295 bytes a step (dy 128 read in place, x's padded pack 167), 37 KB of sums; a
    64 KB budget cuts the 4-image chunk to one image, a budget below the sums' bytes only to them.
    Exact where the host runs the ISA."""
    from tvm import te

    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu import cube_dw

    target = resolve_target(isa_target(isa, cores=2))
    chunks, real = [], cube_dw.chunk
    monkeypatch.setattr(cube_dw, "chunk", lambda *args: chunks.append(real(*args)) or chunks[-1])
    src, dy = te.placeholder((4, 14, 14, 32), "float32", name="src"), te.placeholder((4, 14, 14, 32), "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [3, 3, 32, 32], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
                                             dilations=[1, 1], data_format="NXC")  # fmt: skip
    for budget, chunk in ((1 << 40, (4, 14)), (64 << 10, (1, 14)), (8 << 10, (1, 7))):  # (8 KB: 36,864 bytes of sums / 295 = 124 steps)
        monkeypatch.setattr(cube_dw, "CHUNK_IN_CACHE", budget)
        chunks.clear()
        schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
        assert chunks == [chunk], budget
    if host_can_run(target):  # (the last budget's chunks: bands of 7 rows)
        assert check_kernel(build(dw, target=target)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_a_weight_gradient_whose_sums_outgrow_its_operands_runs_as_one_chunk(isa, monkeypatch):
    """A dW chunk is not cut below the steps that read as many bytes as the sums, which every chunk
    loads and stores again, by the packs' budget either (``PACK_IN_CACHE``; the packs are then
    passes of their own): DeepLab's 512 -> 512 3x3 at dilation 2 on 14x14, N=4 (9.4 MB of sums),
    Zen 4, cold: 18.7 -> 17.1 ms as one chunk. Scaled down, NCX: 4 images of 64 -> 64 channels, 3x3
    at dilation 2 on 6x6 (147 KB of sums, ~960 bytes a step: 153 steps of 144) stays one chunk
    under a 4 KB pack budget; a 1x1 on 14x14 (16 KB of sums) is cut to bands of 2 rows by it.
    Exact where the host runs the ISA."""
    from tvm import te

    from tvm_convgrad.frontends import onednn
    from tvm_convgrad.schedule.cpu import cube_dw

    target = resolve_target(isa_target(isa, cores=2))
    chunks, real = [], cube_dw.chunk
    monkeypatch.setattr(cube_dw, "chunk", lambda *args: chunks.append(real(*args)) or chunks[-1])
    monkeypatch.setattr(cube_dw, "PACK_IN_CACHE", 4 << 10)
    kernels = []
    for kernel, size, dilation, chunk in ((3, 6, 2, (4, 6)), (1, 14, 1, (1, 2))):
        pad = dilation * (kernel - 1) // 2
        src = te.placeholder((4, 64, size, size), "float32", name="src")
        dy = te.placeholder((4, 64, size, size), "float32", name="diff_dst")
        dw = onednn.convolution_backward_weights(src, dy, [64, 64, kernel, kernel], strides=[1, 1], pads_begin=[pad, pad],
                                                 pads_end=[pad, pad], dilations=[dilation, dilation], data_format="NCX",
                                                 weights_format="OIX")  # fmt: skip
        chunks.clear()
        schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target)
        assert chunks == [chunk], kernel
        kernels.append(dw)
    if host_can_run(target):
        for dw in kernels:
            assert check_kernel(build(dw, target=target)).ok


@pytest.mark.parametrize("data_format, cin, cout, kernel, stride, dy_packed, x_packed", [
    ("NXC", 32, 64, 1, 1, False, False), ("NXC", 144, 32, 1, 1, False, False), ("NXC", 64, 16, 1, 2, False, False),
    ("NXC", 24, 48, 1, 1, False, True), ("NXC", 256, 64, 1, 1, False, True), ("NXC", 64, 256, 1, 1, True, False),
    ("NXC", 32, 48, 3, 1, False, True), ("NCX", 32, 64, 1, 1, True, True),
])  # fmt: skip
def test_a_weight_gradient_reads_fp32_channel_rows_where_they_lie(data_format, cin, cout, kernel, stride, dy_packed, x_packed):
    """The fp32 cube dW reads dy's and x's 16-channel rows where they lie (NXC) when its packs would
    only copy them: whole blocks, rows at most ``ROWS_IN_PLACE_BYTES`` apart, for x a window
    without padding (MobileNetV2's 32 -> 16 1x1 on 56x56, N=32, Zen 4: 1.71 -> 1.16 ms). A partial
    block (24 channels), rows 1 KB apart (256 fp32 channels: the pack keeps a chunk's rows
    contiguous), a padded 3x3 window and NCX keep their packs. Exact against the float64
    reference where the host runs it."""
    from tvm import te

    from tvm_convgrad.dsl.compute.stages import FMAP_L1, GRADS_2_MATRIX
    from tvm_convgrad.frontends import onednn

    target = resolve_target(isa_target("avx2", cores=2))
    size, pad = 8, kernel // 2
    out = (size + 2 * pad - kernel) // stride + 1
    x_shape = (2, cin, size, size) if data_format == "NCX" else (2, size, size, cin)
    y_shape = (2, cout, out, out) if data_format == "NCX" else (2, out, out, cout)
    src, dy = te.placeholder(x_shape, "float32", name="src"), te.placeholder(y_shape, "float32", name="diff_dst")
    dw = onednn.convolution_backward_weights(src, dy, [kernel, kernel, cin, cout], strides=[stride, stride], pads_begin=[pad, pad],
                                             pads_end=[pad, pad], dilations=[1, 1], data_format=data_format)  # fmt: skip
    script = schedule.rule_for(target).apply(Workload.of(dw).prim_func(target), target).mod.script()
    assert (f'T.sblock("{GRADS_2_MATRIX}")' in script, f'T.sblock("{FMAP_L1}")' in script) == (dy_packed, x_packed)
    if host_can_run(target):
        assert check_kernel(build(dw, target=target)).ok
