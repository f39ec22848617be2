"""The forward convolution: TBE's ``dsl.conv`` and oneDNN's ``Convolution`` against the float64
reference written from the formula and against PyTorch, their rules, and the kernel's shape of work.

The random property sweeps (``tests/test_properties.py``: operators ``fwd`` and ``tbe_conv``) and
the guard-page runs (``tests/test_memory_bounds.py``) cover the whole parameter space; here are the
named cases a reader can check by hand."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from tvm import te

from conftest import torch
from framework_cases import Case, arrays, check, expected, oracles, placeholders, stages_named
from framework_cases import call as framework_call
from tvm_convgrad import ConvGradError, PostOp, build, dsl, layout, reference
from tvm_convgrad.frontends import onednn
from tvm_convgrad.dsl.compute.stages import CONV_CC, CONV_RES, CONV_TAG
from tvm_convgrad.tools.verify import check_kernel, post_op_bound

_TBE = {"pad_h": 1, "pad_w": 1, "stride_h": 1, "stride_w": 1, "filter_h": 3, "filter_w": 3}


def _tbe_conv(n=2, cin=32, h=9, w=11, cout=48, para=None, groups=1, bias=False, optim=None, ori=False):
    para = dict(_TBE if para is None else para)
    kh, kw = para.get("filter_h", para.get("filterh")), para.get("filter_w", para.get("filterw"))
    if groups > 1 or ori:
        para.update(group=groups, weight_ori_shape_nchw=[cout, cin // groups, kh, kw])
    data = te.placeholder(layout.shape_5hd(n, cin, h, w), "float16", name="data")
    weight = te.placeholder(layout.shape_fracz([cout, cin // groups, kh, kw], groups), "float16", name="weight")
    if bias:
        para["bias_tensor"] = te.placeholder((cout,), "float16", name="bias")
    return dsl.conv(data, weight, para, optim)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"para": {**_TBE, "stride_h": 2, "pad_h": [1, 0], "dilate_w": 2}},
        {"para": {"padh": 0, "padw": [0, 2], "strideh": 2, "stridew": 1, "filterh": 1, "filterw": 3, "dilateh": 1}},  # TBE's older spellings
        {"cin": 3, "cout": 20, "h": 17, "w": 17, "para": {**_TBE, "filter_h": 7, "filter_w": 7, "stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3}},
        {"cin": 24, "cout": 36, "groups": 3, "bias": True},
        {"cin": 32, "cout": 32, "groups": 32},  # depthwise
        {"cin": 100, "cout": 100, "h": 8, "w": 8, "groups": 10},  # two extended groups
    ],
    ids=["3x3", "strided-dilated-asymmetric", "old-spellings", "stem", "grouped-bias", "depthwise", "extended-groups"],
)
def test_tbe_conv_matches_the_reference(kwargs):
    y = _tbe_conv(**kwargs)
    assert y.op.name == CONV_RES and y.op.tag == CONV_TAG and y.dtype == "float16"
    assert int(y.op.attrs["width_out"]) * 0 == 0 and len(y.shape) == 4 and int(y.shape[3]) == 16
    result = check_kernel(build(y))
    assert result.ok, str(result)


def test_tbe_conv_result_is_tbe_shape_and_pytorch_agrees():
    """``(N, ceil(Cout,16), Ho*Wo, 16)`` float16; and the same numbers as the float64 reference
    and (where installed) PyTorch's conv2d in float64."""
    n, cin, h, w, cout = 2, 20, 10, 9, 24
    para = {"pad_h": [2, 1], "pad_w": 1, "stride_h": 2, "stride_w": 1, "dilate_h": 1, "dilate_w": 2, "filter_h": 3, "filter_w": 2,
            "weight_ori_shape_nchw": [cout, cin, 3, 2]}  # fmt: skip
    data = te.placeholder(layout.shape_5hd(n, cin, h, w), "float16", name="data")
    weight = te.placeholder(layout.shape_fracz([cout, cin, 3, 2]), "float16", name="weight")
    y = dsl.conv(data, weight, para)
    ho, wo = (h + 3 - 3) // 2 + 1, (w + 2 - 3) // 1 + 1
    assert tuple(int(d) for d in y.shape) == (n, 2, ho * wo, 16) and int(y.op.attrs["width_out"]) == wo
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, cin, h, w)).astype(np.float16)
    wt = rng.uniform(-1, 1, (cout, cin, 3, 2)).astype(np.float16)
    got = layout.dx_result_to_nchw(build(y)(layout.nchw_to_5hd(x), layout.oihw_to_fracz(wt)), (n, cout, ho, wo))
    wants = [reference.conv_forward_nd(x.astype(np.float64), wt.astype(np.float64), (2, 1), (2, 1), (1, 2), 1, (1, 1))]
    if torch is not None:
        xt = torch.nn.functional.pad(torch.from_numpy(x.astype(np.float64)), (1, 1, 2, 1))
        wants.append(torch.nn.functional.conv2d(xt, torch.from_numpy(wt.astype(np.float64)), stride=(2, 1), dilation=(1, 2)).numpy())
    for want in wants:
        assert want.shape == got.shape and np.abs(got - want).max() <= 2e-3 * np.abs(want).max()


@pytest.mark.parametrize(
    "para, optim, param",
    [
        ({**_TBE, "mad_dtype": "int32"}, None, "para_dict['mad_dtype']"),
        ({**_TBE, "offset_x": 8}, None, "para_dict['offset_x']"),
        (_TBE, {"c0_optim_flg": True}, "optim_dict['c0_optim_flg']"),
        ({**_TBE, "fusion_para": {"l1_fusion_type": 1}}, None, "para_dict['fusion_para']"),
        ({**_TBE, "compress_index": object()}, None, "para_dict['compress_index']"),
        ({k: v for k, v in _TBE.items() if k != "stride_w"}, None, "para_dict['stride_w']"),
        ({**_TBE, "stride_h": 64}, None, "para_dict['stride_h']"),
        ({**_TBE, "dilate_w": 256}, None, "para_dict['dilate_w']"),
        ({**_TBE, "filter_h": 300, "pad_h": 150}, None, "para_dict['filter_h']"),
    ],
)
def test_tbe_conv_rejects_what_it_does_not_take(para, optim, param):
    with pytest.raises(ConvGradError) as err:
        _tbe_conv(para=para, optim=optim)
    assert err.value.param.startswith(param), str(err.value)


def test_tbe_conv_rejects_int8_naming_the_dtype():
    data = te.placeholder((1, 1, 4, 4, 16), "int8", name="data")
    weight = te.placeholder((9, 1, 16, 16), "int8", name="weight")
    with pytest.raises(ConvGradError, match="int8 .quantized. conv is not implemented"):
        dsl.conv(data, weight, _TBE)


def _fwd(rank, data_format="NXC", weights_format="XIO", dtype="float32", groups=1, bias=True, auto_pad="none"):
    size, out = {1: ((11,), (6,)), 2: ((9, 7), (5, 7)), 3: ((5, 6, 4), (3, 6, 4))}[rank]
    strides, kernel = {1: ((2,), (3,)), 2: ((2, 1), (3, 3)), 3: ((2, 1, 1), (3, 3, 1))}[rank]
    pads = tuple(1 if k == 3 else 0 for k in kernel)
    return Case("fwd", 2, 8 * groups, 12 * groups, groups, size, out, kernel, strides, pads, pads, (1,) * rank, auto_pad=auto_pad,
                data_format=data_format, weights_format=weights_format, dtype=dtype, effective_pads=pads, bias=bias)  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        _fwd(1), _fwd(2), _fwd(3), _fwd(2, "NCX", "OIX"), _fwd(3, "NCX", "OIX", groups=2), _fwd(2, dtype="float16", groups=3),
        _fwd(2, "NCX", "XIO", dtype="bfloat16"), _fwd(1, bias=False, auto_pad="same_upper"), _fwd(2, "NXC", "OXI", groups=2),
        _fwd(3, "NCX", "OXI", dtype="bfloat16"),
    ],
    ids=lambda c: c.name() + ("-bias" if c.bias else ""),
)
def test_onednn_convolution_matches_the_reference_and_pytorch(case):
    kernel = build(framework_call(case, *placeholders(case)))
    inputs = arrays(case, seed=3)
    result = kernel(*inputs)
    for what, want in oracles(case, *inputs):
        check(result, want, kernel, f"{case.name()} vs {what}")


_POST_OPS = [
    (("relu", 0.0, 0.0, None),), (("relu", 0.2, 0.0, None),), (("clip", 0.0, 6.0, None),), (("linear", -1.5, 0.25, None),),
    (("logistic", 0.0, 0.0, None),), (("swish", 1.0, 0.0, None),), (("tanh", 0.0, 0.0, None),),
    (("add", 0.0, 0.0, "full"), ("relu", 0.0, 0.0, None)),  # a residual block's end
    (("mul", 0.0, 0.0, "channel"), ("add", 0.0, 0.0, "channel")),  # an inference BatchNorm folded to a scale and a shift
    (("sub", 0.0, 0.0, "image"), ("div", 0.0, 0.0, "scalar")), (("max", 0.0, 0.0, "full"), ("min", 0.0, 0.0, "channel")),
]  # fmt: skip


@pytest.mark.parametrize("post_ops", _POST_OPS, ids=lambda ops: "-".join(op[0] + (f"_{op[3]}" if op[3] else "") for op in ops))
@pytest.mark.parametrize("data_format, dtype", [("NXC", "float32"), ("NCX", "bfloat16")])
def test_post_ops_apply_to_each_value_as_it_is_written(post_ops, data_format, dtype):
    """oneDNN's post-ops on the fp32 sums (after the bias), rounded once: against the float64
    reference written from their formulas and against PyTorch's own operators, within the sums'
    bound carried through them (:func:`~tvm_convgrad.tools.verify.post_op_bound`)."""
    case = Case("fwd", 2, 24, 40, 1, (9, 7), (9, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", dtype=dtype, effective_pads=(1, 1), bias=True, post_ops=post_ops)  # fmt: skip
    kernel = build(framework_call(case, *placeholders(case)))
    assert [a.name for a in kernel.inputs][3:] == [f"src1_{k}" for k, op in enumerate(post_ops) if op[3]]
    inputs = arrays(case, seed=5)
    result = kernel(*inputs).astype(np.float64)
    bound = post_op_bound(kernel.call, inputs, kernel.params, dtype)
    for what, want in oracles(case, *inputs):
        ratio = np.abs(result - want) / bound
        assert ratio.max() <= 1.0, f"{what}: {ratio.max():.3g} x the bound"
    plain = dataclasses.replace(case, post_ops=())
    sums = build(framework_call(plain, *placeholders(plain)))(*inputs[:3]).astype(np.float64)
    assert np.abs(sums - result).max() > 1e-2, "the post-ops changed nothing: the test could not fail"


@pytest.mark.parametrize(
    "post_ops, param",
    [
        ("relu", "post_ops"),
        ([("relu",)], "post_ops[0]"),
        ([PostOp("gelu")], "post_ops[0].alg"),
        ([PostOp.eltwise("clip", 6.0, 0.0)], "post_ops[0].alpha"),
        ([PostOp.eltwise("relu", float("inf"))], "post_ops[0].alpha"),
        ([PostOp.eltwise("relu"), PostOp.binary("add", None)], "post_ops[1].src1"),
        ([PostOp("relu", te.placeholder((1,), "float32"))], "post_ops[0].src1"),
        ([PostOp.binary("add", te.placeholder((3, 5), "float32"))], "post_ops[0].src1.shape"),
        ([PostOp.binary("add", te.placeholder((40,), "int32"))], "post_ops[0].src1.dtype"),
    ],
)
def test_post_ops_that_break_a_rule_name_it(post_ops, param):
    src = te.placeholder((2, 9, 7, 24), "float32", name="src")
    weights = te.placeholder((3, 3, 24, 40), "float32", name="weights")
    with pytest.raises(ConvGradError) as err:
        onednn.convolution(src, weights, strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], post_ops=post_ops)
    assert err.value.param == param, err.value


def test_a_stem_sums_its_real_input_channels_only():
    """Three input channels (stated in ``weight_ori_shape_nchw``): each mad's lane reduction has 3
    steps, not 16 (no FMA on padding lanes); without it TBE's Cin is the 16 of the block."""
    y = _tbe_conv(cin=3, cout=16, h=12, w=12, ori=True)
    mads = [t for t in y.op.input_tensors if t.op.name.startswith(CONV_CC)]  # (the live-tap regions of a 3x3 at pad 1 on 12x12)
    assert len(mads) == 5 and all(int(mad.op.reduce_axis[0].dom.extent) == 1 and int(mad.op.reduce_axis[-1].dom.extent) == 3 for mad in mads)


@pytest.mark.parametrize("data_format, cin, kernel, runs", [
    ("NXC", 24, 1, (3, 8)), ("NCX", 40, 3, (5, 8)), ("NXC", 20, 1, (5, 4)), ("NXC", 32, 1, (2, 16)),
])  # fmt: skip
def test_an_fp32_cin_not_whole_blocks_sums_its_real_channels_only(data_format, cin, kernel, runs):
    """An fp32 forward whose Cin is past 16 and not whole blocks sums its real channels, in ``ci1``
    runs of gcd(Cin, 16) (``ci1 x ci0``), never the last block's lanes past Cin (MobileNetV2's
    24 -> 144 1x1, channels-last, N=32 on 28x28, Zen 3: 58 -> 69 GFLOP/s). Whole blocks keep
    ``(blocks, 16)``. Exact."""
    pad = kernel // 2
    case = Case("fwd", 2, cin, 40, 1, (9, 9), (9, 9), (kernel, kernel), (1, 1), (pad, pad), (pad, pad), (1, 1), data_format=data_format,
                weights_format="OIX" if data_format == "NCX" else "XIO", dtype="float32", effective_pads=(pad, pad), bias=False)  # fmt: skip
    result = framework_call(case, *placeholders(case))
    mads = stages_named(result, CONV_CC)
    assert mads and all((int(mad.op.reduce_axis[0].dom.extent), int(mad.op.reduce_axis[-1].dom.extent)) == runs for mad in mads)  # (ci1, ci0)
    built = build(result)
    inputs = arrays(case, seed=6)
    check(built(*inputs), expected(case, *inputs), built, case.name())


def test_a_framework_forward_writes_its_output_inside_the_mads_tasks():
    """oneDNN's NXC dst (the mad's only consumer) is computed under the mad's parallel loop, so each
    task's sums are cast and laid out while in cache (no second pass over the whole output); TBE's
    flat ``Ho*Wo`` result, whose indices TVM cannot invert over AVX2's tasks, stays a pass of its own
    (AVX-512's tiles cover a whole row of it: there it goes inside too). Scheduled for AVX2 on any
    host; built for the host and checked."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.schedule import rule_for

    target = isa_target("avx2")
    src = te.placeholder((2, 30, 28, 32), "float32", name="src")  # (15 x 14 outputs, 97.8% and 97.6% of the taps live: one mad)
    weights = te.placeholder((3, 3, 32, 48), "float32", name="weights")
    dst = onednn.convolution(src, weights, strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    for result, inside in ((dst, True), (_tbe_conv(), False)):
        sch = rule_for(target).apply(Workload.of(result).prim_func(target), target)
        task = sch.get(sch.get_loops(sch.get_sblock(result.op.name))[0])  # the output's outermost loop
        assert (f'"{CONV_CC}_update"' in str(task)) == inside, result.op.name
        assert check_kernel(build(result)).ok


@pytest.mark.parametrize("isa", ["avx512", "avx2", "sse"])
def test_live_tap_regions_each_read_the_whole_x_pack(isa):
    """TBE's flat ``Ho*Wo`` result keeps a forward's live-tap regions as mads of their own, scheduled
    one after the other: x is packed once for all of them, never inside one region's tasks (a
    pack moved under the second region's task left the first reading an unwritten buffer; found
    by ``test_properties``' seeded sweep). Exact where the host runs it."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run

    para = {"pad_h": [2, 1], "pad_w": 0, "stride_h": 4, "stride_w": 1, "dilate_h": 1, "dilate_w": 3, "filter_h": 3, "filter_w": 2}
    y = _tbe_conv(n=1, cin=27, h=5, w=10, cout=54, para=para, groups=27)
    target = isa_target(isa)
    kernel = build(y, target=target)
    if host_can_run(target):
        result = check_kernel(kernel)
        assert result.ok, str(result)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, dtype, stride", [("NXC", "float32", 2), ("NCX", "float32", 1), ("NXC", "bfloat16", 2)])
def test_a_batch_packs_each_row_bands_x_inside_the_bands_task(isa, data_format, dtype, stride):
    """A padded (or strided) forward of a batch packs x (``fmap_pad``: zero padding, stride
    phases, fp32 or bf16 pairs) per band of output rows, inside the mad's parallel task of that
    band (every channel group in the task), into a buffer of one band: not the whole batch's x in
    a pass of its own, written to memory and read back (ResNet-50's res3a_branch2b, N=8, Zen 4:
    11.5 -> 10.2 ms). Scheduled for both ISAs on any host (the bf16 pair form's tiles where the
    ISA has none: the emulation's), the band's buffer and the results checked where the host
    runs it."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.compile.target import resolve_target
    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule import rule_for

    target = resolve_target(isa_target(isa))
    size = 30 if stride == 2 else 28  # (15 x 15 / 28 x 28 outputs: 97.8% of the taps live or more, one mad)
    out = (size + 2 - 3) // stride + 1
    case = Case("fwd", 4, 40, 48, 1, (size, size), (out, out), (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", dtype=dtype, effective_pads=(1, 1), bias=True)  # fmt: skip
    dst = framework_call(case, *placeholders(case))
    sch = rule_for(target).apply(Workload.of(dst).prim_func(target), target)
    tir = sch.mod.script()
    task = tir.rindex("T.parallel(")  # (the weight pack's loop, then the task's)
    assert tir.count("T.parallel(") == 2 and task < tir.index('T.sblock("fmap_pad")') < tir.index(f'T.sblock("{CONV_CC}')
    assert int(re.match(r"T.parallel\(T.int64\((\d+)\)", tir[task:]).group(1)) > 4  # (the images x their row bands)
    if host_can_run(target):
        kernel = build(dst, target=target)
        phase_rows = out + 2 // stride
        whole = 4 * 3 * stride * stride * phase_rows * -(-(size + 2) // stride) * 16 * (2 if dtype == "bfloat16" else 4)
        allocated = [int(b) for b in re.findall(r"%fmap_pad = .*call ptr %\d+\(i32 1, i32 %dev_id, i64 (\d+)", kernel.inspect_source("ll"))]
        assert allocated and max(allocated) < whole // 4, (allocated, whole)  # one band's rows of one image
        inputs = arrays(case, seed=6)
        check(kernel(*inputs), expected(case, *inputs), kernel, f"{data_format} {dtype} stride {stride}")


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("data_format, dtype, size, stride", [("NXC", "float32", 7, 1), ("NCX", "float32", 13, 2), ("NXC", "float16", 14, 1)])
def test_a_small_map_runs_by_live_tap_regions(isa, data_format, dtype, size, stride):
    """A 3x3 at pad 1 whose windows read padding in 10% of their (output, tap) pairs (7x7 outputs)
    runs one mad per live-tap region (a band of one row keeps its columns whole: five; f32 and
    f16; the bf16 pair form splits below 80% of the pairs, 85% across the images, and keeps one mad here), each
    under the dst's task of an image's channels, the dst's pixel loops partitioned at the
    regions' edges; bias and a residual add + ReLU through it, exact against the reference.
    Scheduled for both ISAs on any host, run where the host can (512 -> 512 on 7x7, N=8, Zen 4:
    10.4 -> 9.5 ms)."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.compile.target import resolve_target
    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule import rule_for

    target = resolve_target(isa_target(isa))
    out = (size + 2 - 3) // stride + 1
    post_ops = (("add", 0.0, 0.0, "full"), ("relu", 0.0, 0.0, None))
    case = Case("fwd", 2, 32, 48, 1, (size, size), (out, out), (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", dtype=dtype, effective_pads=(1, 1), bias=True, post_ops=post_ops)  # fmt: skip
    dst = framework_call(case, *placeholders(case))
    sch = rule_for(target).apply(Workload.of(dst).prim_func(target), target)
    tir = sch.mod.script()
    regions = sorted(set(re.findall(r'T.sblock\("({}_\d+_\d+)\w*_update"\)'.format(CONV_CC), tir)))  # (an edge tile's copy: a suffix)
    assert len(regions) == 5 and "_partition" in tir, regions
    task = tir.rindex("T.parallel(")  # the dst's: the packs' loops come first
    assert tir.count("T.parallel(") == 3 and tir.index(f'T.sblock("{CONV_CC}_') > task  # every region's mad under it
    if host_can_run(target):
        kernel = build(dst, target=target)
        inputs = arrays(case, seed=4)
        bound = post_op_bound(kernel.call, inputs, kernel.params, dtype)
        assert (np.abs(kernel(*inputs).astype(np.float64) - expected(case, *inputs)) / bound).max() <= 1.0


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("op, data_format", [("fwd", "NXC"), ("fwd", "NCX"), ("data", "NXC"), ("data", "NCX")])
@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_tiny_map_reads_its_live_taps_in_tiles_across_the_images(isa, op, data_format, size, dtype):
    """ResNet-18's last layers on 32x32 images: a 3x3 at pad 1 on a 1x1 map reads its centre tap
    only, on a 2x2 map 4 of its 9 taps per pixel. The 1x1 map is one mad over the centre tap (the
    forward's weight pack holds that tap alone, :func:`.phases.tap_hull`); the 2x2 map one mad
    per pixel (a region each, :data:`.phases.TINY_MAP`), each its own parallel loop, the result
    a pass of its own; every mad's tile runs across the images (AVX-512: 16, AVX2: 4 x 2 ymm; a
    one-pixel tile would be one accumulator waiting on its FMA chain: 512 -> 512 on 1x1, N=32,
    Zen 4: 1.69 -> 0.15 ms). Forward and dX, f32 (structure and results) and bf16 (results: its
    result pass of selects legalizes on AVX2's uint16 bf16), exact against the reference;
    scheduled for both ISAs on any host, run where the host can."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.compile.target import resolve_target
    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule import rule_for

    target = resolve_target(isa_target(isa))
    case = Case(op, 32, 32, 48, 1, (size, size), (size, size), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", dtype=dtype, effective_pads=(1, 1))  # fmt: skip
    result = framework_call(case, *placeholders(case))
    if dtype == "float32":
        sch = rule_for(target).apply(Workload.of(result).prim_func(target), target)
        tir = sch.mod.script()
        mads = sorted(set(re.findall(r'T.sblock\("((?:conv|dx)_cc\w*)_update"\)', tir)))
        assert len(mads) == size * size, mads
        tiles = [int(k) for k in re.findall(r"in T.unroll\(T.int64\((\d+)\)\):\s+for \w+ in T.vectorized", tir)]
        assert len(tiles) >= 2 * len(mads) and min(tiles) >= 4, tiles  # (each mad's init and update: a tile of 4 or more images)
        if op == "fwd" and size == 1:
            assert re.search(r"w_conv = T.sblock_alloc_buffer\(\(T.int64\(\d+\), T.int64\(\d+\), T.int64\(1\), T.int64\(1\),", tir)
    if host_can_run(target):
        kernel = build(result, target=target)
        inputs = arrays(case, seed=5)
        check(kernel(*inputs), expected(case, *inputs), kernel, f"{op} {size}x{size} {dtype}")


@pytest.mark.parametrize("mcpu", ["sapphirerapids", "haswell"])
@pytest.mark.parametrize("op, data_format", [("data", "NCX"), ("data", "NXC"), ("fwd", "NCX"), ("fwd", "NXC")])
def test_a_batch_of_small_maps_runs_its_regions_in_tasks_of_channel_blocks(mcpu, op, data_format):
    """A 3x3 at pad 1 on 7x7 maps, N=8, 256 -> 256 channels, 2 cores: its live-tap regions run
    across the images (:func:`~tvm_convgrad.dsl.compute.phases.across_images`), in one parallel
    loop of 8 tasks of two channel blocks each (:func:`~tvm_convgrad.schedule.cpu.regions.batch_task_blocks`):
    each task packs its blocks' weights and runs every region's mad over the whole batch, so the
    weights come from memory once, not once per region. Exact against the reference; scheduled
    for AVX-512 and AVX2 on any host, run where the host can."""
    from tvm.target import Target

    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.isa import X86_TRIPLE, host_can_run
    from tvm_convgrad.schedule import rule_for

    target = Target({"kind": "llvm", "mcpu": mcpu, "mtriple": X86_TRIPLE, "num-cores": 2})
    case = Case(op, 8, 256, 256, 1, (7, 7), (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", dtype="float32", effective_pads=(1, 1))  # fmt: skip
    result = framework_call(case, *placeholders(case))
    tir = rule_for(target).apply(Workload.of(result).prim_func(target), target).mod.script()
    loops = re.split(r"for \w+ in T.parallel", tir)
    (task,) = [loop for loop in loops if loop.startswith("(T.int64(8))")]
    assert len(re.findall(r'T.sblock\("(?:conv|dx)_cc_\w+_update"\)', task)) == 5  # (the 7x7 map's five regions)
    assert re.search(r'T.sblock\("w_(?:col|conv)"\)', task)
    if host_can_run(target):
        kernel = build(result, target=target)
        inputs = arrays(case, seed=6)
        check(kernel(*inputs), expected(case, *inputs), kernel, f"{op} {data_format} {mcpu}")


def test_a_batch_task_takes_the_channel_blocks_whose_weights_fit_the_cache():
    """The channel blocks of a task over the batch: the most whose packed weights fit the budget,
    two (a tile's on AVX-512) even where one block's would not, while each core keeps four tasks;
    one where fewer blocks than that (the regions then run on their own, across the images)."""
    from tvm_convgrad.schedule.cpu.regions import batch_task_blocks

    kb = 1 << 10
    assert batch_task_blocks(32, 295 * kb, 1024 * kb, 2) == 2 and batch_task_blocks(32, 295 * kb, 512 * kb, 2) == 2
    assert batch_task_blocks(32, 37 * kb, 1024 * kb, 2) == 4 and batch_task_blocks(16, 147 * kb, 1024 * kb, 2) == 2
    assert batch_task_blocks(8, 37 * kb, 1024 * kb, 2) == 1 and batch_task_blocks(32, 295 * kb, 1024 * kb, 16) == 1


@pytest.mark.parametrize("dims", [1, 2])
def test_a_forward_whose_windows_read_only_padding_is_its_bias(dims):
    """Every window on padding (x of one pixel, stride 4, pads 2 / 8, dilation 3): no output reads
    x, the result is the bias. No live-tap region at all keeps one mad (of zeros): a result of
    bias and constants alone, vectorized in bf16, did not legalize on AVX2 (``dtype mismatch on
    BufferStore``, found by the property sweep with one-pixel regions). bf16 on an AVX2 target,
    exact; run where the host can."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run

    target = isa_target("avx2")
    one = (1,) * dims
    case = Case("fwd", 1, 2, 16, 1, one, (2,) * dims, (3,) * dims, (4,) * dims, (2,) * dims, (8,) * dims, (3,) * dims, data_format="NCX",
                weights_format="XIO", dtype="bfloat16", effective_pads=(2,) * dims, bias=True)  # fmt: skip
    result = framework_call(case, *placeholders(case))
    kernel = build(result, target=target)
    if host_can_run(target):
        inputs = arrays(case, seed=1)
        check(kernel(*inputs), expected(case, *inputs), kernel, f"{dims}-D, padding only")


@pytest.mark.parametrize("channels, aliased", [(1024, True), (768, False)])
def test_a_tile_reading_pixels_one_l1_set_apart_takes_few_pixels(channels, aliased):
    """A 1x1 forward reads its NXC src in place: with 1024 fp32 channels each pixel's row is 4 KB
    after the last, every pixel of a tile in one L1 set, so the tile takes at most
    ``ALIASED_TILE_PIXELS`` (the set's ways less the weights' line; 1 x 14 pixels ran at half
    the speed of 1 x 7 on Zen 4); with 768 channels (3 KB apart) the pixels spread over the sets
    and the tile is the usual one. Scheduled for AVX-512 on any host, run where the host can."""
    from tvm import tirx

    from tvm_convgrad import isa_target
    from tvm_convgrad.compile.target import resolve_target
    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule import rule_for
    from tvm_convgrad.schedule.cpu.tiles import ALIASED_TILE_PIXELS

    target = resolve_target(isa_target("avx512"))
    src = te.placeholder((2, 14, 14, channels), "float32", name="src")
    weights = te.placeholder((1, 1, channels, 32), "float32", name="weights")
    dst = onednn.convolution(src, weights, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    sch = rule_for(target).apply(Workload.of(dst).prim_func(target), target)
    unrolled = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock(f"{CONV_CC}_update"))]
    pixels = np.prod([int(lp.extent) for lp in unrolled if lp.kind == tirx.ForKind.UNROLLED and not lp.loop_var.name.startswith("co1")])  # (not the tile's channel blocks)
    assert (pixels <= 7) == aliased and ALIASED_TILE_PIXELS <= 7, pixels  # (the 8 ways of a set, one for the weights)
    if host_can_run(target):
        assert check_kernel(build(dst, target=target)).ok


@pytest.mark.parametrize("op, data_format, size, tile", [("data", "NCX", (7, 7), (13, 2)), ("data", "NXC", (4, 11), (11, 2)),
                                                          ("fwd", "NCX", (7, 7), (13, 2)), ("fwd", "NXC", (4, 11), (11, 2))])  # fmt: skip
def test_short_rows_of_a_1x1_take_several_result_blocks_a_tile(monkeypatch, op, data_format, size, tile):
    """A 1x1 over a short-rowed map on AVX-512 (a 7x7 one: row tiles of 13 would leave an edge of 7
    or 6): each image's pixels one axis, each tile ``TW`` pixels x 2 result blocks
    (:func:`~tvm_convgrad.schedule.cpu.tiles.flat_block_tile`; one broadcast feeds both blocks),
    with an edge tile of the image's last pixels (49 = 3 x 13 + 10) or none where the tiles divide
    the image (44 = 4 x 11); the dX and the forward, exact."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule.cpu import cube

    target = isa_target("avx512")
    taken = []
    monkeypatch.setattr(cube, "FLAT_TASKS_PER_CORE", 0)  # whatever the cores
    chosen = cube.flat_block_tile
    monkeypatch.setattr(cube, "flat_block_tile", lambda *a: taken.append(chosen(*a)) or taken[-1])
    cin, cout = (64, 64)  # (4 result blocks, 4 of reduction)
    case = Case(op, 2, cin, cout, 1, size, size, (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", effective_pads=(0, 0))  # fmt: skip
    kernel = build(framework_call(case, *placeholders(case)), target=target, schedules=None)
    assert taken == [tile]
    if not host_can_run(target):
        pytest.skip("this host cannot run AVX-512 code")
    inputs = arrays(case, seed=5)
    check(kernel(*inputs).astype(np.float64), expected(case, *inputs), kernel, case.name())


@pytest.mark.parametrize("op, data_format, dtype, post_ops", [("fwd", "NXC", "float32", (("add", 0.0, 0.0, "full"), ("relu", 0.0, 0.0, None))),
                                                              ("fwd", "NCX", "bfloat16", ()), ("data", "NXC", "float32", ())])  # fmt: skip
def test_short_rows_run_in_pixel_tiles_across_the_rows(monkeypatch, op, data_format, dtype, post_ops):
    """A 7-column output on AVX2 (row tiles of 5 and an edge of 2) runs each image's 49 pixels as
    one axis in tiles of 5 that cross the rows (:meth:`~tvm_convgrad.schedule.cpu.cube.CubeInputGrad._flat_pixel_tiles`):
    the forward (strided, its reduction in chunks of one input-channel block, or fp32's run of
    real channels, over all the tiles, a partial block, bias and post-ops, its dst written inside
    the tasks) and the data gradient of a 1x1 on a 7x7 map, exact."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run
    from tvm_convgrad.schedule.cpu import cube

    target = isa_target("avx2")
    taken = []
    monkeypatch.setattr(cube, "FLAT_TASKS_PER_CORE", 0)  # whatever the cores
    monkeypatch.setattr(cube, "X_CHUNK_IN_CACHE", 1)  # a strided forward's reduction in chunks of one block
    flat, chunks = cube.CubeInputGrad._flat_pixel_tiles, cube.CubeForward._reduction_chunks
    monkeypatch.setattr(cube.CubeInputGrad, "_flat_pixel_tiles", lambda self, *a: taken.append("flat") or flat(self, *a))
    monkeypatch.setattr(cube.CubeForward, "_reduction_chunks", lambda self, *a: taken.append(("chunks", chunks(self, *a))) or taken[-1][1])
    size, strides, extra = ((15, 15), (2, 2), {"bias": True, "post_ops": post_ops}) if op == "fwd" else ((7, 7), (1, 1), {})
    taps, pads = ((3, 3), (0, 0)) if op == "fwd" else ((1, 1), (0, 0))  # (unpadded: a 3x3 at pad 1 on 7 outputs runs as live-tap regions)
    case = Case(op, 3, 40, 24, 1, size, (7, 7), taps, strides, pads, pads, (1, 1), data_format=data_format,
                weights_format="XIO" if data_format == "NXC" else "OIX", dtype=dtype, effective_pads=pads, **extra)  # fmt: skip
    kernel = build(framework_call(case, *placeholders(case)), target=target, schedules=None)
    runs = 5 if dtype == "float32" else 3  # (the forward's 40 input channels: fp32's five runs of 8, bf16's three blocks)
    assert taken == (["flat", ("chunks", runs)] if op == "fwd" else ["flat"])
    if not host_can_run(target):
        pytest.skip("this host cannot run AVX2 code")
    inputs = arrays(case, seed=9)
    result = kernel(*inputs).astype(np.float64)
    if op == "fwd":
        bound = post_op_bound(kernel.call, inputs, kernel.params, dtype)
        assert (np.abs(result - expected(case, *inputs)) / bound).max() <= 1.0
    else:
        check(result, expected(case, *inputs), kernel, case.name())
