"""The framework operators (``tvm_convgrad.frontends.onednn`` / ``.dsp``) against the float64
references of ``reference.py`` (written from framework_ops/*.md) and against PyTorch autograd.

The sweep covers spatial ranks 1-3, groups (depthwise too) with channel counts that are not
multiples of 16, strides, dilations, asymmetric pads, every auto_pad mode, output_padding, every
data / weights format and every type (f32, f16, bf16); then the public examples of the specs and
seeds, and every error rule.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from tvm import te

from conftest import needs_torch, torch
from framework_cases import Case, arrays, call, check, dsp_params, expected, placeholders, torch_result
from tvm_convgrad import ConvGradError, build, reference
from tvm_convgrad.compile import Workload, numpy_dtype
from tvm_convgrad.frontends import dsp, onednn
from tvm_convgrad.params.framework import auto_pads
from tvm_convgrad.schedule import rule_for
from tvm_convgrad.tools.verify import check_kernel

# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


_CHANNELS = [(3, 5), (20, 24), (16, 33), (6, 9)]  # per group: not multiples of 16, and more than 16


def _conv_case(rng, op: str, rank: int, groups: int, auto_pad: str, data_format: str, weights_format: str, dtype: str) -> Case:
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
    return Case(op, int(rng.integers(1, 3)), cin_g * groups, cout_g * groups, groups, size, out, kernel, strides, pb, pe,
                dilations, auto_pad, None, data_format, weights_format, dtype, tuple(b for b, _ in used))  # fmt: skip


def _deconv_case(rng, rank: int, groups, auto_pad: str, data_format: str, weights_format: str, dtype: str, with_op: bool) -> Case:
    ic_g, oc_g = _CHANNELS[rng.integers(len(_CHANNELS))] if groups != "dw" else (1, int(rng.integers(1, 3)))
    groups = int(rng.integers(4, 20)) if groups == "dw" else groups
    kernel = tuple(int(rng.integers(1, 4)) for _ in range(rank))
    strides = tuple(int(rng.integers(1, 4)) for _ in range(rank))
    dilations = tuple(int(rng.integers(1, 3)) for _ in range(rank))
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad != "none":  # the conv view's rule on diff_dst: S_src = ceil(S_dst / s)
        dst = tuple(int(rng.integers(2, 9 if rank < 3 else 6)) for _ in range(rank))
        used = [reference.auto_pad(s, k, st, d, auto_pad) for s, k, st, d in zip(dst, kernel, strides, dilations)]
        if any(s + b + e < f for s, (b, e), f in zip(dst, used, eff)):  # valid: the window must fit
            return _deconv_case(rng, rank, groups, auto_pad, data_format, weights_format, dtype, with_op)
        src = tuple(-(-s // st) for s, st in zip(dst, strides))
        pb = pe = tuple(1 for _ in range(rank))  # ignored
        padding = None
    else:
        src = tuple(int(rng.integers(2, 7 if rank < 3 else 4)) for _ in range(rank))
        pb = tuple(int(rng.integers(0, 3)) for _ in range(rank))
        pe = tuple(int(rng.integers(0, 3)) for _ in range(rank))
        padding = tuple(int(rng.integers(0, s)) for s in strides) if with_op else None
        op_ = padding or (0,) * rank
        dst = tuple(s * (a - 1) + f - b - e + o for s, a, f, b, e, o in zip(strides, src, eff, pb, pe, op_))
        if min(dst) < 1:
            return _deconv_case(rng, rank, groups, auto_pad, data_format, weights_format, dtype, with_op)
        used = list(zip(pb, pe))
    return Case("deconv", int(rng.integers(1, 3)), ic_g * groups, oc_g * groups, groups, src, dst, kernel, strides, pb, pe,
                dilations, auto_pad, padding, data_format, weights_format, dtype, tuple(b for b, _ in used))  # fmt: skip


def _sweep() -> list[Case]:
    rng = np.random.default_rng(2026)
    cases = []
    dtypes = itertools.cycle(["float32", "float16", "bfloat16"])
    pads = itertools.cycle(["none", "same_upper", "none", "same_lower", "valid", "none"])
    groups = itertools.cycle([1, 2, "dw", 3, 1])
    for rank, data_format, weights_format, op in itertools.product((1, 2, 3), ("NXC", "NCX"), ("XIO", "OIX"), ("conv", "conv_v2")):
        cases.append(_conv_case(rng, op, rank, next(groups), next(pads), data_format, weights_format, next(dtypes)))
    for rank, data_format, weights_format in itertools.product((1, 2, 3), ("NXC", "NCX"), ("XOI", "IOX")):
        cases.append(_deconv_case(rng, rank, next(groups), next(pads), data_format, weights_format, next(dtypes), rng.random() < 0.6))
    # odd spellings and the defaults
    cases.append(_conv_case(rng, "conv", 2, 1, "SAME_UPPER", "NXC", "XIO", "float32"))
    cases.append(_deconv_case(rng, 2, 2, "none", "NXC", "XOI", "float32", True))
    for rank, data_format in itertools.product((1, 2, 3), ("NXC", "NCX")):  # the package's OXI (PyTorch's channels-last weights)
        cases.append(_conv_case(rng, "conv_v2", rank, next(groups), next(pads), data_format, "OXI", next(dtypes)))
    return cases


SWEEP = _sweep()

# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------


def test_sweep_covers_the_parameter_space():
    assert {c.rank for c in SWEEP} == {1, 2, 3}
    assert {c.dtype for c in SWEEP} == {"float32", "float16", "bfloat16"}
    assert {c.auto_pad.lower() for c in SWEEP} == {"none", "same_upper", "same_lower", "valid"}
    assert {(c.op, c.data_format, c.weights_format) for c in SWEEP} >= {
        (op, df, wf) for op in ("conv", "conv_v2") for df in ("NXC", "NCX") for wf in ("XIO", "OIX")
    } | {("deconv", df, wf) for df in ("NXC", "NCX") for wf in ("XOI", "IOX")} | {("conv_v2", df, "OXI") for df in ("NXC", "NCX")}
    assert any(c.groups > 1 and c.x_channels == c.groups for c in SWEEP if c.op != "deconv")  # depthwise
    assert any(c.x_channels == c.groups > 1 for c in SWEEP if c.op == "deconv")  # one src channel per group
    assert any(c.output_padding and any(c.output_padding) for c in SWEEP)
    assert any(max(c.strides) > 1 and max(c.dilations) > 1 for c in SWEEP)
    assert any(c.pads_begin != c.pads_end and c.auto_pad == "none" for c in SWEEP)
    assert any(c.x_channels % 16 and c.dy_channels % 16 for c in SWEEP) and any(c.x_channels > 16 for c in SWEEP)


@pytest.mark.parametrize("case", SWEEP, ids=[c.name() for c in SWEEP])
def test_operator_matches_reference(case):
    x, dy = placeholders(case)
    kernel = build(call(case, x, dy))
    assert kernel.output.shape == case.weights_shape() and kernel.output.dtype == case.dtype
    assert [a.name for a in kernel.inputs] == [x.op.name, dy.op.name]
    xa, dya = arrays(case)
    check(kernel(xa, dya), expected(case, xa, dya), kernel, "vs reference")


@needs_torch
@pytest.mark.parametrize("case", SWEEP, ids=[c.name() for c in SWEEP])
def test_operator_matches_torch(case):
    x, dy = placeholders(case)
    kernel = build(call(case, x, dy))
    xa, dya = arrays(case, seed=1)
    check(kernel(xa, dya), torch_result(case, xa, dya), kernel, "vs PyTorch")


def test_rank_3_runs_on_the_cube_with_a_depth_axis():
    """A 3-D gradient is the cube compute with the depth folded into the reduction (no naive
    loop): its mad is ``dw_cc`` and the 5HD layout stage has a depth axis (NDC1HWC0)."""
    case = next(c for c in SWEEP if c.rank == 3 and c.op == "conv" and c.x_channels // c.groups > 8)
    x, dy = placeholders(case)
    kernel = build(call(case, x, dy))
    assert kernel.formulation == "cube" and kernel.params.geom.depth is not None
    assert "dw_cc" in kernel.inspect_source("tir") and "fmap_l1" in kernel.inspect_source("tir")


def test_rank_3_stem_puts_cout_on_the_lanes():
    """A 3-D first layer (3 input channels) takes the Cout-on-lanes formulation, depth folded the
    same way, instead of padding 3 channels to 16."""
    x = te.placeholder((1, 3, 6, 9, 9), "float32", name="src")
    dy = te.placeholder((1, 20, 6, 5, 5), "float32", name="diff_dst")
    attrs = dict(strides=[1, 2, 2], pads_begin=[1, 1, 1], pads_end=[1, 1, 1], dilations=[1, 1, 1], data_format="NCX", weights_format="OIX")
    kernel = build(onednn.convolution_backward_weights(x, dy, [20, 3, 3, 3, 3], **attrs))
    assert kernel.formulation == "cout-lanes"
    rng = np.random.default_rng(0)
    xa, dya = rng.uniform(-1, 1, (1, 3, 6, 9, 9)).astype("float32"), rng.uniform(-1, 1, (1, 20, 6, 5, 5)).astype("float32")
    expected = reference.conv_backprop_filter_nd(xa, dya, (3, 3, 3), (1, 2, 2), (1, 1, 1), (1, 1, 1))
    check(kernel(xa, dya), expected, kernel, "3-D stem")


@pytest.mark.parametrize("batch", [1, 2])
def test_a_stem_whose_dy_outgrows_the_band_reads_it_in_bands(batch):
    """A 2-D stem (3 channels, 7x7 / 2) whose dy rows outgrow one band of the Cout-on-lanes dW
    (``schedule.cpu.lanes.DY_BAND_BYTES``): the tiles' sums carried from band to band are exact.
    Where each core runs its own images (two images, two cores), x and dy are packed band by band
    inside the image's task (a band of dy, x's rows under it), not whole before."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.schedule.cpu.lanes import DY_BAND_BYTES

    x = te.placeholder((batch, 3, 90, 90), "float32", name="src")
    dy = te.placeholder((batch, 64, 45, 45), "float32", name="diff_dst")
    assert 45 * 45 * 64 * 4 > DY_BAND_BYTES  # 9 bands of 5 rows
    attrs = dict(strides=[2, 2], pads_begin=[3, 3], pads_end=[3, 3], dilations=[1, 1], data_format="NCX", weights_format="OIX")
    target = isa_target("native", cores=2)
    dw = onednn.convolution_backward_weights(x, dy, [64, 3, 7, 7], **attrs)
    kernel = build(dw, target=target)
    assert kernel.formulation == "cout-lanes"
    sch = rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    task = sch.get(sch.get_loops(sch.get_sblock("dw_cc_t_rf_update" if batch > 1 else "dw_cc_t_update"))[0])
    for pack in ("grads_2_matrix", "fmap_l1"):  # under the images' task (batch 2), or a pass of its own
        assert sch.get(sch.get_loops(sch.get_sblock(pack))[0]).same_as(task) == (batch > 1), pack
    rng = np.random.default_rng(1)
    xa, dya = rng.uniform(-1, 1, (batch, 3, 90, 90)).astype("float32"), rng.uniform(-1, 1, (batch, 64, 45, 45)).astype("float32")
    expected = reference.conv_backprop_filter_nd(xa, dya, (7, 7), (2, 2), (3, 3), (1, 1))
    check(kernel(xa, dya), expected, kernel, "banded stem")


def test_layout_stages_are_folded_into_the_compute():
    """The framework tensors are read by the compute's packs (the layout stages are inlined),
    and the result stage is written straight in the framework layout: no extra full-size pass."""
    case = SWEEP[0]
    x, dy = placeholders(case)
    tir = build(call(case, x, dy)).inspect_source("tir")
    assert 'T.sblock("fmap")' not in tir and 'T.sblock("dy")' not in tir and 'T.sblock("dw_ddr")' not in tir
    assert 'T.sblock("diff_weights")' in tir


def test_avx2_plan_runs_the_frontends():
    from tvm_convgrad import isa_target
    from tvm_convgrad.isa import host_can_run

    target = isa_target("avx2") if host_can_run(isa_target("avx2")) else pytest.skip("no AVX2 on this host")
    case = next(c for c in SWEEP if c.rank == 2 and c.op == "deconv")
    x, dy = placeholders(case)
    kernel = build(call(case, x, dy), target=target)
    xa, dya = arrays(case)
    assert kernel.isa.name == "avx2"
    check(kernel(xa, dya), expected(case, xa, dya), kernel, "avx2")


def test_frontend_builds_for_cuda():
    case = next(c for c in SWEEP if c.rank == 2 and c.op == "conv")
    x, dy = placeholders(case)
    kernel = build(call(case, x, dy), target={"kind": "cuda", "arch": "sm_80"})
    assert kernel.target.kind.name == "cuda"
    assert 'T.sblock("fmap")' not in kernel.inspect_source("tir")  # the layout stages are inlined on CUDA too


# ---------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------


def test_bf16_kernel_takes_and_returns_ml_dtypes_arrays():
    x = te.placeholder((1, 6, 6, 8), "bfloat16", name="src")
    dy = te.placeholder((1, 4, 4, 16), "bfloat16", name="diff_dst")
    kernel = build(onednn.convolution_backward_weights(x, dy, [3, 3, 8, 16], strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1]))
    xa = np.full((1, 6, 6, 8), 0.5, dtype=ml_dtypes.bfloat16)
    dya = np.full((1, 4, 4, 16), 0.25, dtype=ml_dtypes.bfloat16)
    result = kernel(xa, dya)
    assert result.dtype == ml_dtypes.bfloat16 and result.shape == (3, 3, 8, 16)
    assert np.all(result.astype(np.float32) == 16 * 0.125)
    assert kernel.time(repeat=1, min_repeat_ms=1).median > 0  # random bf16 inputs too


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_padded_one_wide_axis_whose_window_reads_only_padding(dtype):
    """Issue 18's example: W = 1 padded on the left by 1, kernel width 1, stride 2: the one output
    column's window reads the left pad only. The packed x holds nothing of the image on that axis;
    the layout stage in front of it was once left unread and failed to inline (ScheduleError). The
    gradient is exactly 0 and the kernel builds, for every type and both weight formats."""
    x = te.placeholder((1, 2, 4, 1), dtype, name="x")
    dy = te.placeholder((1, 4, 3, 1), dtype, name="dy")
    attrs = {"strides": [1, 2], "dilations": [2, 1], "pads_begin": [2, 1], "pads_end": [1, 0], "data_format": "NCX"}
    kernel = build(onednn.convolution_backprop_filters(x, dy, [4, 2, 3, 1], filter_format="OIX", **attrs))
    rng = np.random.default_rng(0)
    xa = rng.uniform(-1, 1, (1, 2, 4, 1)).astype(numpy_dtype(dtype))
    dya = rng.uniform(-1, 1, (1, 4, 3, 1)).astype(numpy_dtype(dtype))
    expected = reference.conv_backprop_filter_nd(xa.astype(np.float64), dya.astype(np.float64), (3, 1), (1, 2), (2, 1), (2, 1))
    assert not expected.any()
    assert kernel(xa, dya).shape == (4, 2, 3, 1) and not kernel(xa, dya).astype(np.float32).any()
    deconv = onednn.conv_transpose_backward_weights(dy, x, [4, 2, 3, 1], weights_format="IOX", **attrs)  # the same view, roles swapped
    assert check_kernel(build(deconv)).ok


def test_deconv_grad_filter_windows_may_reach_past_the_cropped_output():
    """Issue 18's example: a 1x1 input, 3x3 kernel, its 3x3 output cropped to 1x1 (out_h = out_w =
    1): valid (spec §2: the bottom / right crop is implied by out_h / out_w; only §5 rejects), the
    windows reach rows past ``out + pad_u``, which read 0."""
    params = [1, 1, 1, 2, 1, 1, 1, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0]
    kernel, dya, xa, result = _run_dsp(params)
    assert result.shape == (1, 27, 2)
    check(result, reference.deconv_grad_filter(dya, xa, params), kernel, "cropped deconvolution")
    assert check_kernel(kernel).ok  # the operator's own check (kernel.call) agrees


def test_f32_products_are_not_rounded_to_f16():
    """f32 inputs feed the fp32 reduction as they are: 1 + 2**-20 would be 1 in fp16."""
    x = te.placeholder((1, 1, 1), "float32", name="x")
    dy = te.placeholder((1, 1, 1), "float32", name="dy")
    kernel = build(onednn.convolution_backprop_filters(x, dy, [1, 1, 1], strides=[1], pads_begin=[0], pads_end=[0], dilations=[1], data_format="NCX", filter_format="OIX"))
    value = np.float32(1 + 2.0**-20)
    assert kernel(np.full((1, 1, 1), value, np.float32), np.ones((1, 1, 1), np.float32))[0, 0, 0] == value


# ---------------------------------------------------------------------------------------------
# Public examples of the specs and seeds
# ---------------------------------------------------------------------------------------------


def test_onednn_gtest_conv_transpose_groups_example():
    """gtest ConvTransposeBackwardWeightsWithGroupsAndFiltersAnyLayout: src [2,4,2], diff_dst [2,4,2],
    groups 2, IOX diff_weights [4,2,3] (IC = 4, OC/G = 2, K = 3)."""
    src = te.placeholder((2, 4, 2), "float32", name="src")
    diff_dst = te.placeholder((2, 4, 2), "float32", name="diff_dst")
    out = onednn.conv_transpose_backward_weights(src, diff_dst, [4, 2, 3], strides=[1], pads_begin=[1], pads_end=[1], dilations=[1],
                                                 groups=2, data_format="NCX", weights_format="IOX")  # fmt: skip
    kernel = build(out)
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (2, 4, 2)).astype(np.float32), rng.uniform(-1, 1, (2, 4, 2)).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), reference.conv_transpose_backward_weights(a, b, (3,), (1,), (1,), (1,), 2), atol=1e-5)
    with pytest.raises(ConvGradError, match="weights_shape"):  # an IOX given as (IC/G, OC) for G > 1
        onednn.conv_transpose_backward_weights(src, diff_dst, [2, 4, 3], strides=[1], pads_begin=[1], pads_end=[1], dilations=[1],
                                               groups=2, data_format="NCX", weights_format="IOX")  # fmt: skip


def test_onednn_gtest_auto_pad_clamp():
    """Main's gtest: S_in 5, K 1, s 3 -> pads (0, 0), output 2 (the max(0, .) clamp)."""
    assert auto_pads(5, 1, 3, 1, "same_upper") == (0, 0) == reference.auto_pad(5, 1, 3, 1, "same_upper")
    x = te.placeholder((1, 5, 5, 4), "float32", name="x")
    dy = te.placeholder((1, 2, 2, 4), "float32", name="dy")
    onednn.convolution_backprop_filters(x, dy, [1, 1, 4, 4], strides=[3, 3], pads_begin=[9, 9], pads_end=[9, 9], dilations=[1, 1], auto_pad="same_upper")
    with pytest.raises(ConvGradError, match="output_delta spatial axis 0"):
        onednn.convolution_backprop_filters(x, te.placeholder((1, 3, 3, 4), "float32", name="dy"), [1, 1, 4, 4], strides=[3, 3],
                                            pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], auto_pad="same_upper")  # fmt: skip


def test_auto_pad_rule_matches_the_spec_s_ceil_form():
    """The package's rule (``eff - (s if r == 0 else r)``) and the reference's (``(ceil(S/s)-1)*s +
    eff - S``) are two spellings of the spec's formula: equal everywhere; the output is ceil(S/s)."""
    for size, k, s, d, mode in itertools.product(range(1, 12), range(1, 6), range(1, 5), range(1, 4), ("same_upper", "same_lower", "valid")):
        pads = auto_pads(size, k, s, d, mode)
        assert pads == reference.auto_pad(size, k, s, d, mode), (size, k, s, d, mode)
        if mode != "valid":
            assert (size + sum(pads) - (k - 1) * d - 1) // s + 1 == -(-size // s)
            assert pads[1] - pads[0] in ((0, 1) if mode == "same_upper" else (0, -1))


def _run_dsp(params, dtype="float32", seed=0):
    batch, in_h, in_w, in_c, _, out_h, out_w, out_c = params[:8]
    dy = te.placeholder((batch, out_h, out_w, out_c), dtype, name="dy")
    x = te.placeholder((batch, in_h, in_w, in_c), dtype, name="x")
    fn = dsp.fp_deconv_grad_filter if dtype == "float32" else dsp.hp_deconv_grad_filter
    kernel = build(fn(dy, x, params))
    rng = np.random.default_rng(seed)
    dya = rng.uniform(-1, 1, (batch, out_h, out_w, out_c)).astype(dtype)
    xa = rng.uniform(-1, 1, (batch, in_h, in_w, in_c)).astype(dtype)
    return kernel, dya, xa, kernel(dya, xa)


def test_dsp_seed_c_example():
    """Seed 003's C example: batch 16, x and dy 4x4x4, kernel 4x4, stride 1, pad 0, group 1 (the
    deconvolution output cropped to 4x4: the implied bottom / right crop is 3)."""
    params = dsp_params(16, (4, 4), 4, (4, 4), 4, (4, 4), (1, 1), (0, 0), (1, 1), 1, workspace=0x10050000)
    kernel, dya, xa, result = _run_dsp(params)
    assert result.shape == (1, 4 * 4 * 4, 4)
    np.testing.assert_allclose(result, reference.deconv_grad_filter(dya, xa, params), atol=1e-4)
    assert kernel.name == "fp_deconv_grad_filter"


@pytest.mark.parametrize("in_c,out_c,group", [(4, 12, 2), (4, 6, 1), (6, 6, 3)])
@pytest.mark.parametrize("s,d,out", [(2, 1, 63), (2, 2, 65), (1, 2, 34)])
def test_dsp_mindspore_unit_test_shapes(in_c, out_c, group, s, d, out):
    """MindSpore's DeConv2DGradFilter UT shapes (batch 2, 32x32, k 3, pad 1: 32 -> 63 / 65 / 34)."""
    params = dsp_params(2, (32, 32), in_c, (out, out), out_c, (3, 3), (s, s), (1, 1), (d, d), group)
    kernel, dya, xa, result = _run_dsp(params)
    expected = reference.deconv_grad_filter(dya, xa, params)
    assert result.shape == (group, out_c // group * 9, in_c // group)
    check(result, expected, kernel, "dsp")
    if group == 1:  # MindSpore's own layout is the same memory for one group
        np.testing.assert_array_equal(reference.deconv_grad_filter(dya, xa, params, layout="mindspore"), expected[0])


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geometry", [
    dict(in_hw=(6, 7), in_c=6, out_c=9, k=(3, 2), s=(2, 2), pad=(1, 0), d=(2, 1), group=3, extra=(1, 1)),
    dict(in_hw=(5, 5), in_c=8, out_c=8, k=(3, 3), s=(1, 2), pad=(2, 1), d=(1, 1), group=8, extra=(0, 1)),
    dict(in_hw=(4, 6), in_c=3, out_c=20, k=(2, 3), s=(3, 1), pad=(0, 2), d=(1, 2), group=1, extra=(2, 0)),
])  # fmt: skip
def test_dsp_matches_torch_conv_transpose(geometry, dtype):
    """dw == PyTorch's ConvTranspose2d weight gradient reshaped to ``[G, OCg*kh*kw, m]`` (spec §4),
    output_padding included (rows no window reaches)."""
    g = geometry
    out_hw = [(i - 1) * s - 2 * p + d * (k - 1) + 1 + e for i, s, p, d, k, e in zip(g["in_hw"], g["s"], g["pad"], g["d"], g["k"], g["extra"])]
    # asymmetric crop: pad_u / pad_l only; PyTorch's padding is symmetric, so its output is cropped at the end
    params = dsp_params(2, g["in_hw"], g["in_c"], out_hw, g["out_c"], g["k"], g["s"], g["pad"], g["d"], g["group"])
    kernel, dya, xa, result = _run_dsp(params, dtype)
    module = torch.nn.ConvTranspose2d(g["in_c"], g["out_c"], g["k"], g["s"], padding=g["pad"], output_padding=g["extra"],
                                      groups=g["group"], dilation=g["d"], bias=False).double()  # fmt: skip
    y = module(torch.from_numpy(xa.astype(np.float64).transpose(0, 3, 1, 2)))
    (y * torch.from_numpy(dya.astype(np.float64).transpose(0, 3, 1, 2))).sum().backward()
    m = g["in_c"] // g["group"]
    expected = module.weight.grad.numpy().reshape(g["group"], m, -1, *g["k"]).transpose(0, 2, 3, 4, 1).reshape(g["group"], -1, m)
    check(result, expected, kernel, "dsp vs PyTorch")


# ---------------------------------------------------------------------------------------------
# Error rules (framework_ops/*.md, "Error conditions")
# ---------------------------------------------------------------------------------------------

_X = ((2, 9, 9, 8), "float32")
_DY = ((2, 7, 7, 16), "float32")
_GOOD = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])


def _conv(x=_X, dy=_DY, shape=(3, 3, 8, 16), **attrs):
    kwargs = {**_GOOD, **attrs}
    return onednn.convolution_backprop_filters(
        te.placeholder(x[0], x[1], name="input_forward"), te.placeholder(dy[0], dy[1], name="output_delta"), shape, **kwargs
    )


CONV_ERRORS = [
    (lambda: _conv(x=((2, 8), "float32")), "input_forward.shape", "rank 3, 4 or 5"),
    (lambda: _conv(x=((2, 3, 3, 3, 3, 3), "float32")), "input_forward.shape", "rank 3, 4 or 5"),
    (lambda: _conv(dy=((2, 7, 16), "float32")), "output_delta.shape", "rank of input_forward"),
    (lambda: _conv(shape=(3, 8, 16)), "filter_shape", "4 elements"),
    (lambda: _conv(x=((2, 9, 9, 8), "int8"), dy=((2, 7, 7, 16), "int8")), "input_forward.dtype", "float32"),
    (lambda: _conv(dy=((2, 7, 7, 16), "float16")), "output_delta.dtype", "must equal"),
    (lambda: _conv(shape=np.array([3.0, 3.0, 8.0, 16.0])), "filter_shape", "integer"),
    (lambda: _conv(shape=te.placeholder((4,), "int32")), "filter_shape", "known values"),
    (lambda: _conv(data_format="NHWC"), "data_format", "NXC"),
    (lambda: _conv(filter_format="HWIO"), "filter_format", "XIO"),
    (lambda: _conv(auto_pad="same"), "auto_pad", "same_upper"),
    (lambda: _conv(strides=[1]), "strides", "2 ints"),
    (lambda: _conv(dilations=[1, 1, 1]), "dilations", "2 ints"),
    (lambda: _conv(pads_begin=[0]), "pads_begin", "2 ints"),
    (lambda: _conv(pads_end=[0, 0, 0]), "pads_end", "2 ints"),
    (lambda: _conv(strides=[0, 1]), "strides", ">= 1"),
    (lambda: _conv(dilations=[1, 0]), "dilations", ">= 1"),
    (lambda: _conv(pads_begin=[-1, 0]), "pads_begin", ">= 0"),
    (lambda: _conv(pads_end=[0, -1]), "pads_end", ">= 0"),
    (lambda: _conv(shape=None), "filter_shape", "is required"),
    (lambda: _conv(shape=None, filter_shape_attr=[0, 0, 0, 0]), "filter_shape", "is required"),
    (lambda: _conv(groups=0), "groups", ">= 1"),
    (lambda: _conv(groups=3, shape=(3, 3, 8, 16)), "input_forward channels", "multiple of groups"),
    (lambda: _conv(x=((2, 9, 9, 9), "float32"), groups=3, dy=((2, 7, 7, 16), "float32"), shape=(3, 3, 3, 16)), "output_delta channels", "multiple"),
    (lambda: _conv(shape=(3, 3, 8, 15)), "filter_shape", "O (XIO) must equal"),
    (lambda: _conv(shape=(3, 3, 4, 16)), "filter_shape", "I (XIO) x groups"),
    (lambda: _conv(shape=(3, 0, 8, 16)), "filter_shape", ">= 1"),
    (lambda: _conv(dy=((3, 7, 7, 16), "float32")), "output_delta.shape", "batch"),
    (lambda: _conv(shape=(11, 3, 8, 16)), "input_forward spatial axis 0", "cover the dilated kernel"),
    (lambda: _conv(dy=((2, 8, 7, 16), "float32")), "output_delta spatial axis 0", "floor"),
    (lambda: _conv(dy=((2, 7, 7, 16), "float32"), auto_pad="same_lower"), "output_delta spatial axis 0", "floor"),
]


def _deconv(src=((2, 4, 4, 8), "float32"), dst=((2, 6, 6, 12), "float32"), shape=(3, 3, 12, 8), **attrs):
    kwargs = {**_GOOD, **attrs}
    return onednn.conv_transpose_backward_weights(
        te.placeholder(src[0], src[1], name="src"), te.placeholder(dst[0], dst[1], name="diff_dst"), shape, **kwargs
    )


DECONV_ERRORS = [
    (lambda: _deconv(src=((2, 4), "float32")), "src.shape", "rank 3, 4 or 5"),
    (lambda: _deconv(dst=((2, 6, 12), "float32")), "diff_dst.shape", "rank of src"),
    (lambda: _deconv(dst=((2, 6, 6, 12), "bfloat16")), "diff_dst.dtype", "must equal"),
    (lambda: _deconv(weights_format="XIO"), "weights_format", "XOI"),
    (lambda: _deconv(output_padding=[-1, 0]), "output_padding", ">= 0"),
    (lambda: _deconv(output_padding=[1, 0]), "output_padding", "< the stride"),
    (lambda: _deconv(shape=None, weights_shape_attr=[0, 0, 0, 0]), "weights_shape", "is required"),
    (lambda: _deconv(groups=2, shape=(3, 3, 12, 8)), "weights_shape", "x groups must equal the diff_dst channels"),
    (lambda: _deconv(shape=(3, 3, 12, 4)), "weights_shape", "I (XOI) must equal the src channels"),
    (lambda: _deconv(groups=5), "diff_dst channels", "multiple of groups"),
    (lambda: _deconv(groups=3, shape=(3, 3, 4, 8)), "src channels", "multiple of groups"),
    (lambda: _deconv(shape=(3, 3, 12)), "weights_shape", "4 elements"),
    (lambda: _deconv(shape=(0, 3, 12, 8)), "weights_shape", ">= 1"),
    (lambda: _deconv(src=((2, 4, 4, 8), "float16"), dst=((2, 6, 6, 12), "float16"), data_format="NCHW"), "data_format", "NXC"),
    (lambda: _deconv(strides=[2, 2], dst=((2, 8, 8, 12), "float32"), auto_pad="same_upper", output_padding=[1, 1]),
     "diff_dst spatial axis 0", "output_padding"),  # SAME and an output_padding that contradicts it
    (lambda: _deconv(dst=((1, 6, 6, 12), "float32")), "diff_dst.shape", "batch"),
    (lambda: _deconv(dst=((2, 7, 6, 12), "float32")), "src spatial axis 0", "floor"),
    (lambda: _deconv(strides=[2, 2], dst=((2, 9, 9, 12), "float32"), output_padding=[0, 1]), "diff_dst spatial axis 1", "output_padding"),
    (lambda: _deconv(src=((2, 3, 4, 8), "float32"), dst=((2, 6, 6, 12), "float32"), auto_pad="same_upper"), "src spatial axis 0", "floor"),
]


def _dsp(params=None, dy=None, x=None, dtype="float32"):
    params = params or dsp_params(2, (4, 4), 4, (6, 6), 6, (3, 3), (1, 1), (0, 0), (1, 1), 2)
    dy = dy or ((params[4], params[5], params[6], params[7]), dtype)
    x = x or ((params[0], params[1], params[2], params[3]), dtype)
    return dsp.deconv_grad_filter(te.placeholder(dy[0], dy[1], name="dy"), te.placeholder(x[0], x[1], name="x"), params, dtype)


def _dsp_with(index, value):
    params = dsp_params(2, (4, 4), 4, (6, 6), 6, (3, 3), (1, 1), (0, 0), (1, 1), 2)
    params[index] = value
    return params


DSP_ERRORS = [
    (lambda: _dsp(dtype="bfloat16"), "dtype", "float32"),
    (lambda: _dsp(params=[1] * 17), "params", "18 ints"),
    (lambda: _dsp(params=_dsp_with(0, 0)[:]), "params[0] (input_batch)", ">= 1"),
    *[(lambda i=i: _dsp(params=_dsp_with(i, 0)), f"params[{i}]", ">= 1") for i in (1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16)],
    (lambda: _dsp(params=_dsp_with(12, -1)), "params[12] (pad_u)", ">= 0"),
    (lambda: _dsp(params=_dsp_with(13, -1)), "params[13] (pad_l)", ">= 0"),
    (lambda: _dsp(params=_dsp_with(0, 3)), "params[0] (input_batch)", "params[4]"),
    (lambda: _dsp(params=_dsp_with(3, 5)), "params[3] (in_c)", "multiple of group"),
    (lambda: _dsp(params=_dsp_with(7, 5)), "params[7] (out_c)", "multiple of group"),
    (lambda: _dsp(dy=((2, 6, 5, 6), "float32")), "dy.shape", "NHWC"),
    (lambda: _dsp(x=((2, 4, 4, 6), "float32")), "x.shape", "NHWC"),
    (lambda: _dsp(x=((2, 4, 4, 4), "float16")), "x.dtype", "float32"),
    (lambda: _dsp(params=_dsp_with(5, 8)), "params[5] (out_h)", "output padding"),
    (lambda: _dsp(params=_dsp_with(6, 9)), "params[6] (out_w)", "output padding"),
]


@pytest.mark.parametrize("make,param,allowed", CONV_ERRORS + DECONV_ERRORS + DSP_ERRORS, ids=[f"{p}-{a}" for _, p, a in CONV_ERRORS + DECONV_ERRORS + DSP_ERRORS])
def test_error_rule(make, param, allowed):
    with pytest.raises(ConvGradError) as err:
        make()
    assert err.value.param.startswith(param), f"{err.value.param!r} is not {param!r}: {err.value}"
    assert allowed in err.value.allowed, str(err.value)


def test_the_error_cases_are_otherwise_valid():
    """Each error case changes one thing of a call that succeeds."""
    _conv(), _deconv(), _dsp()


def test_weights_shape_input_wins_over_the_attribute():
    out = _conv(shape=(3, 3, 8, 16), filter_shape_attr=[1, 1, 8, 16])
    assert [int(d) for d in out.shape] == [3, 3, 8, 16]
    out = _conv(shape=None, filter_shape_attr=[3, 3, 8, 16])  # the attribute alone
    assert [int(d) for d in out.shape] == [3, 3, 8, 16]
    out = _conv(shape=np.array([3, 3, 8, 16], dtype=np.int32))  # a 1-D s32 array
    assert [int(d) for d in out.shape] == [3, 3, 8, 16]
