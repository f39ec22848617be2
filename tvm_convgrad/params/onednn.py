"""The rules of oneDNN Graph's gradient operators (``framework_ops/ConvolutionBackpropFilters.md``,
``ConvTransposeBackwardWeights.md``, their error sections; ``ConvolutionBackwardData`` as oneDNN's
``op_def.hpp`` / ``shape_infer.cpp`` define it): each call validated into its
:class:`~.framework.ConvView`."""

from __future__ import annotations

from typing import Any

from .framework import (
    CODES, DATA_FORMATS, DTYPES, WEIGHTS_FORMATS, ConvView, activations, auto_pad_mode, auto_pads, check_channels_and_batch, check_spatial, format_choice, groups_attr,
    one_dtype, per_axis, shape_given, split_format, split_weights, weights_shape, window_attrs, with_pads,
)  # fmt: skip
from .post_ops import PostOp, post_op_rules
from .rules import Rules

__all__ = ["ALGORITHMS", "algorithm_choice", "backward_data_view", "deconv_view", "diff_weights_choice", "forward_view", "onednn_view"]

ALGORITHMS = ("direct", "winograd", "auto")
"""The forward's and dX's ``algorithm`` (oneDNN's ``convolution_direct`` / ``_winograd`` / ``_auto``):
the cube, Winograd's F(2x2, 3x3), or Winograd where it applies and pays (:mod:`tvm_convgrad.frontends.winograd`)."""


def algorithm_choice(op: str, value: Any) -> str:
    """``algorithm`` checked: one of :data:`ALGORITHMS`."""
    return format_choice(Rules(op, CODES), "algorithm", value, ALGORITHMS)


def diff_weights_choice(op: str, dtype: str, value: Any) -> str:
    """``diff_weights_dtype`` checked for inputs of ``dtype``: the inputs' type (None: that), or
    float32 (the unrounded fp32 sums of bf16 / f16 inputs)."""
    if value is None:
        return dtype
    return Rules(op, CODES).choice("diff_weights_dtype", value, sorted({dtype, "float32"}), CODES["type"])


def onednn_view(
    op: str,
    names: dict[str, str],
    x: Any,
    dy: Any,
    shape_input: Any,
    shape_attr: Any,
    strides: Any,
    pads_begin: Any,
    pads_end: Any,
    dilations: Any,
    auto_pad: Any,
    groups: Any,
    data_format: Any,
    weights_format: Any,
) -> tuple[ConvView, str, str, tuple[int, ...]]:
    """ConvolutionBackpropFilters / ConvolutionBackwardWeights (spec §6): ``(view, data_format,
    weights_format, weights shape)``. ``names`` spells the operator's own names: ``x``, ``dy``,
    ``shape`` (the input), ``shape_attr``, ``format``."""
    r = Rules(op, CODES)
    x_shape, dy_shape, dtype = activations(r, (names["x"], x), (names["dy"], dy))
    rank, nd = len(x_shape), len(x_shape) - 2
    data_format = format_choice(r, "data_format", data_format, DATA_FORMATS)
    weights_format = format_choice(r, names["format"], weights_format, WEIGHTS_FORMATS)
    mode = auto_pad_mode(r, auto_pad)
    strides, dilations, pads_begin, pads_end = window_attrs(r, nd, strides, dilations, pads_begin, pads_end)
    shape = weights_shape(r, (names["shape"], names["shape_attr"]), shape_input, shape_attr, rank)
    groups = groups_attr(r, groups)
    batch, cin, s_in = split_format(x_shape, data_format)
    dy_batch, cout, s_out = split_format(dy_shape, data_format)
    o, i, kernel = split_weights(shape, weights_format)
    named = {"cin": f"{names['x']} channels", "cout": f"{names['dy']} channels", "in": names["x"], "out": names["dy"]}
    view = ConvView(batch, cin, cout, groups, s_in, s_out, tuple(kernel), strides, pads_begin, pads_end, dilations, dtype)
    check_channels_and_batch(r, view, named)
    if o != cout:
        r.fail(names["shape"], shape, f"its O ({weights_format}) must equal the {names['dy']} channels {cout}")
    if i * groups != cin:
        r.fail(names["shape"], shape, f"its I ({weights_format}) x groups must equal the {names['x']} channels {cin}")
    if dy_batch != batch:
        r.fail(f"{names['dy']}.shape", dy_shape, f"batch must equal the {names['x']} batch {batch}")
    if mode != "none":
        pads = [auto_pads(s_in[a], kernel[a], strides[a], dilations[a], mode) for a in range(nd)]
        view = with_pads(view, pads)
    check_spatial(r, view, named)
    return view, data_format, weights_format, shape


def deconv_view(
    op: str,
    src: Any,
    diff_dst: Any,
    shape_input: Any,
    shape_attr: Any,
    strides: Any,
    pads_begin: Any,
    pads_end: Any,
    dilations: Any,
    auto_pad: Any,
    output_padding: Any,
    groups: Any,
    data_format: Any,
    weights_format: Any,
) -> tuple[ConvView, str, str, tuple[int, ...]]:
    """ConvTransposeBackwardWeights (spec §6): ``(conv view, data_format, weights_format, weights
    shape)``. The conv view's x is ``diff_dst`` and its dy ``src`` (spec §4); IOX is its OIX."""
    r = Rules(op, CODES)
    src_shape, dst_shape, dtype = activations(r, ("src", src), ("diff_dst", diff_dst))
    rank, nd = len(src_shape), len(src_shape) - 2
    data_format = format_choice(r, "data_format", data_format, DATA_FORMATS)
    weights_format = format_choice(r, "weights_format", weights_format, ("XOI", "IOX"))
    mode = auto_pad_mode(r, auto_pad)
    strides, dilations, pads_begin, pads_end = window_attrs(r, nd, strides, dilations, pads_begin, pads_end)
    padding = _output_padding(r, output_padding, strides, nd)
    shape = weights_shape(r, ("weights_shape", "weights_shape_attr"), shape_input, shape_attr, rank)
    groups = groups_attr(r, groups)
    batch, ic, s_src = split_format(src_shape, data_format)
    dst_batch, oc, s_dst = split_format(dst_shape, data_format)
    i, o, kernel = (shape[0], shape[1], shape[2:]) if weights_format == "IOX" else (shape[-1], shape[-2], shape[:-2])
    view = ConvView(batch, oc, ic, groups, s_dst, s_src, tuple(kernel), strides, pads_begin, pads_end, dilations, dtype)
    named = {"cin": "diff_dst channels", "cout": "src channels", "in": "diff_dst", "out": "src"}
    check_channels_and_batch(r, view, named)
    if i != ic:
        r.fail("weights_shape", shape, f"its I ({weights_format}) must equal the src channels {ic}")
    if o * groups != oc:
        r.fail("weights_shape", shape, f"its O ({weights_format}) x groups must equal the diff_dst channels {oc} "
               "(O holds out_channels / groups)")  # fmt: skip
    if dst_batch != batch:
        r.fail("diff_dst.shape", dst_shape, f"batch must equal the src batch {batch}")
    if mode != "none":  # the regular-conv rule on the diff_dst size (spec §5)
        view = with_pads(view, [auto_pads(s_dst[a], kernel[a], strides[a], dilations[a], mode) for a in range(nd)])
    check_spatial(r, view, named)
    _check_transposed_size(r, "diff_dst", view, padding, "S_src")
    return view, data_format, weights_format, shape


def backward_data_view(
    op: str,
    names: dict[str, str],
    diff_dst: Any,
    weights: Any,
    shape_input: Any,
    shape_attr: Any,
    strides: Any,
    pads_begin: Any,
    pads_end: Any,
    dilations: Any,
    auto_pad: Any,
    output_padding: Any,
    groups: Any,
    data_format: Any,
    weights_format: Any,
) -> tuple[ConvView, str, str, tuple[int, ...]]:
    """ConvolutionBackwardData / ConvolutionBackpropData: ``(view, data_format, weights_format,
    diff_src shape)``; ``names`` spells the operator's own names (``dy``, ``w``, ``shape``,
    ``shape_attr``, ``format``).

    The diff_src shape (in ``data_format``) is the shape input when given (it wins), else the
    attribute (all zeros = unset), else the transposed convolution's ``S_in = s*(S_out - 1) +
    (K-1)*d+1 - pb - pe + output_padding`` (explicit pads only: auto_pad derives the pads from
    S_in, oneDNN's forward rule). ``output_padding`` (each ``< s``) checks a given shape against
    that formula; the forward relation ``S_out = floor((S_in + pb + pe - eff)/s) + 1`` always
    holds."""
    r = Rules(op, CODES)
    dy_shape, w_shape, dtype = activations(r, (names["dy"], diff_dst), (names["w"], weights))
    rank, nd = len(dy_shape), len(dy_shape) - 2
    data_format = format_choice(r, "data_format", data_format, DATA_FORMATS)
    weights_format = format_choice(r, names["format"], weights_format, WEIGHTS_FORMATS)
    mode = auto_pad_mode(r, auto_pad)
    strides, dilations, pads_begin, pads_end = window_attrs(r, nd, strides, dilations, pads_begin, pads_end)
    padding = _output_padding(r, output_padding, strides, nd)
    groups = groups_attr(r, groups)
    batch, cout, s_out = split_format(dy_shape, data_format)
    o, i, kernel = split_weights(w_shape, weights_format)
    if any(k < 1 for k in kernel):
        r.fail(f"{names['w']}.shape", w_shape, "every kernel extent must be >= 1")
    if o != cout:
        r.fail(f"{names['w']}.shape", w_shape, f"its O ({weights_format}) must equal the {names['dy']} channels {cout}")
    shape = _diff_src_shape(r, names, shape_input, shape_attr, rank)
    if shape is None:
        if mode != "none":
            r.fail(names["shape"], None, f"is required with auto_pad {mode!r} (its pads follow from the diff_src size): give it "
                   f"as the input or as the attribute {names['shape_attr']}")  # fmt: skip
        extra = padding or (0,) * nd
        s_in = tuple(s * (out - 1) + (k - 1) * d + 1 - pb - pe + op_
                     for s, out, k, d, pb, pe, op_ in zip(strides, s_out, kernel, dilations, pads_begin, pads_end, extra))  # fmt: skip
        if any(size < 1 for size in s_in):
            r.fail("pads_begin", pads_begin, f"with pads_end {pads_end} they crop the whole diff_src (its spatial size would be "
                   f"{list(s_in)}): give {names['shape']} or smaller pads")  # fmt: skip
        shape = (batch, i * groups, *s_in) if data_format == "NCX" else (batch, *s_in, i * groups)
    src_batch, cin, s_in = split_format(shape, data_format)
    view = ConvView(batch, cin, cout, groups, tuple(s_in), tuple(s_out), tuple(kernel), strides, pads_begin, pads_end, dilations, dtype)
    named = {"cin": f"{names['shape']} channels", "cout": f"{names['dy']} channels", "in": names["shape"], "out": names["dy"]}
    check_channels_and_batch(r, view, named)
    if i * groups != cin:
        r.fail(f"{names['w']}.shape", w_shape, f"its I ({weights_format}) x groups must equal the diff_src channels {cin}")
    if src_batch != batch:
        r.fail(names["shape"], shape, f"batch must equal the {names['dy']} batch {batch}")
    if mode != "none":
        view = with_pads(view, [auto_pads(s_in[a], kernel[a], strides[a], dilations[a], mode) for a in range(nd)])
    check_spatial(r, view, named)
    _check_transposed_size(r, names["shape"], view, padding, "S_out")
    return view, data_format, weights_format, tuple(shape)


def forward_view(
    op: str,
    src: Any,
    weights: Any,
    bias: Any,
    strides: Any,
    pads_begin: Any,
    pads_end: Any,
    dilations: Any,
    auto_pad: Any,
    groups: Any,
    data_format: Any,
    weights_format: Any,
    post_ops: Any = None,
) -> tuple[ConvView, str, str, tuple[int, ...], tuple[PostOp, ...]]:
    """Convolution (the forward): ``(view, data_format, weights_format, dst shape, post_ops)``. ``src`` is
    ``(N, *S_in, IC)`` (NXC) or ``(N, IC, *S_in)`` (NCX), the weights XIO ``(*K, IC/G, OC)``, OIX
    ``(OC, IC/G, *K)`` or OXI ``(OC, *K, IC/G)`` of the same rank and type, ``bias`` (optional) ``(OC,)`` of that type;
    ``S_out = floor((S_in + pb + pe - (K-1)*d - 1) / s) + 1`` (auto_pad: the pads from S_in);
    ``post_ops`` as :func:`~tvm_convgrad.params.post_ops.post_op_rules` admits them on that dst."""
    r = Rules(op, CODES)
    src_shape, w_shape, dtype = activations(r, ("src", src), ("weights", weights))
    nd = len(src_shape) - 2
    data_format = format_choice(r, "data_format", data_format, DATA_FORMATS)
    weights_format = format_choice(r, "weights_format", weights_format, WEIGHTS_FORMATS)
    mode = auto_pad_mode(r, auto_pad)
    strides, dilations, pads_begin, pads_end = window_attrs(r, nd, strides, dilations, pads_begin, pads_end)
    groups = groups_attr(r, groups)
    batch, cin, s_in = split_format(src_shape, data_format)
    o, i, kernel = split_weights(w_shape, weights_format)
    if any(k < 1 for k in kernel):
        r.fail("weights.shape", w_shape, "every kernel extent must be >= 1")
    if i * groups != cin:
        r.fail("weights.shape", w_shape, f"its I ({weights_format}) x groups = {i} x {groups} must equal the src channels {cin}")
    if o % groups:
        r.fail("weights.shape", w_shape, f"its O ({weights_format}) = {o} must be a multiple of groups = {groups}")
    if bias is not None:
        r.tensor("bias", bias)
        b_shape = r.static_shape("bias.shape", bias, 1, None)
        if b_shape != (o,):
            r.fail("bias.shape", b_shape, f"must be (OC,) = ({o},), the weights' output channels")
        one_dtype(r, [("src", dtype), ("bias", str(bias.dtype))], DTYPES)
    if mode != "none":
        pads = [auto_pads(s_in[a], kernel[a], strides[a], dilations[a], mode) for a in range(nd)]
        pads_begin, pads_end = tuple(p[0] for p in pads), tuple(p[1] for p in pads)
    s_out = []
    for axis in range(nd):
        eff = (kernel[axis] - 1) * dilations[axis] + 1
        if s_in[axis] + pads_begin[axis] + pads_end[axis] < eff:
            r.fail(f"src spatial axis {axis}", s_in[axis], f"with pads ({pads_begin[axis]}, {pads_end[axis]}) must cover the "
                   f"dilated kernel: size + pads >= (K-1)*d+1 = {eff}")  # fmt: skip
        s_out.append((s_in[axis] + pads_begin[axis] + pads_end[axis] - eff) // strides[axis] + 1)
    view = ConvView(batch, cin, o, groups, tuple(s_in), tuple(s_out), tuple(kernel), strides, pads_begin, pads_end, dilations, dtype)
    shape = (batch, o, *s_out) if data_format == "NCX" else (batch, *s_out, o)
    return view, data_format, weights_format, shape, post_op_rules(r, post_ops, shape)


def _diff_src_shape(r: Rules, names: dict[str, str], given: Any, attribute: Any, rank: int) -> tuple[int, ...] | None:
    """The diff_src shape when the call gives one: the input (it wins), else a non-zero attribute."""
    shape = shape_given(r, names["shape"], given, rank)
    if shape is None and attribute is not None:
        shape = shape_given(r, names["shape_attr"], attribute, rank)
        shape = None if shape is not None and not any(shape) else shape
    if shape is not None and any(d < 1 for d in shape):
        r.fail(names["shape"], shape, "every dimension must be >= 1")
    return shape


def _output_padding(r: Rules, output_padding: Any, strides: tuple[int, ...], nd: int) -> tuple[int, ...] | None:
    """``output_padding`` (optional): one int per spatial axis, each in ``[0, stride)``."""
    if output_padding is None:
        return None
    padding = per_axis(r, "output_padding", output_padding, nd, 0)
    for axis, (op_, s) in enumerate(zip(padding, strides)):
        if op_ >= s:
            r.fail("output_padding", padding, f"axis {axis}: must be < the stride {s}")
    return padding


def _check_transposed_size(r: Rules, name: str, view: ConvView, padding: tuple[int, ...] | None, small: str):
    """With ``output_padding`` given, the transposed convolution's size relation: the conv view's
    input (named ``name``) is ``s*(S-1) + (K-1)*d+1 - pads + output_padding``, S the conv view's
    output (the operator calls it ``small``)."""
    if padding is None:
        return
    for axis in range(view.rank):
        eff = (view.kernel[axis] - 1) * view.dilations[axis] + 1
        expect = view.strides[axis] * (view.spatial_out[axis] - 1) + eff - view.pads_begin[axis] - view.pads_end[axis] + padding[axis]
        if view.spatial_in[axis] != expect:
            r.fail(f"{name} spatial axis {axis}", view.spatial_in[axis],
                   f"must be s*({small}-1) + (K-1)*d+1 - pads + output_padding = {expect}")  # fmt: skip
