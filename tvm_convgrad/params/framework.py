"""The rules of the framework operators (``framework_ops/*.md``, their error sections).

oneDNN Graph's ``ConvolutionBackpropFilters`` / ``ConvolutionBackwardWeights`` and
``ConvTransposeBackwardWeights``, and the DSP library's ``DeconvGradFilter``, all compute the
weight gradient of one forward convolution. Each is validated here and described by one
:class:`ConvView`: that convolution in NCX / OIX terms (x, dy, w), whichever tensor of the
operator plays which role. :meth:`ConvView.params` gives the :class:`ConvGradParams` of the
package's dW compute (spatial rank 1 as 2 with H = 1, rank 3 with a depth axis).

Roles (spec §4 of ConvTransposeBackwardWeights, §4 of DeconvGradFilter):

=============================  ======================  ======================  ==================
operator                       conv x (``fmap``)       conv dy                 conv OIX weight
=============================  ======================  ======================  ==================
ConvolutionBackpropFilters     input_forward / src     output_delta / diff_dst filter (O, I/G, K)
ConvTransposeBackwardWeights   diff_dst                src                     IOX (IC, OC/G, K)
DeconvGradFilter               dy                      x                       ``[G, n, m]`` rows
=============================  ======================  ======================  ==================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .geometry import FILTER_OP, ConvGeometry, ConvGradParams, DepthAxis
from .rules import Rules, is_int

__all__ = [
    "AUTO_PADS",
    "DATA_FORMATS",
    "DTYPES",
    "ConvView",
    "FrameworkCall",
    "auto_pads",
    "deconv_view",
    "dsp_view",
    "onednn_view",
]

DTYPES = ("float32", "float16", "bfloat16")
DSP_DTYPES = ("float32", "float16")
DATA_FORMATS = ("NXC", "NCX")
AUTO_PADS = ("none", "same_upper", "same_lower", "valid")
DSP_PARAMS = (
    "input_batch", "in_h", "in_w", "in_c", "batch", "out_h", "out_w", "out_c", "kernel_h", "kernel_w",
    "stride_h", "stride_w", "pad_u", "pad_l", "dilation_h", "dilation_w", "group", "workspace",
)  # fmt: skip
_CODES = {"type": None, "length": None, "value": None}


@dataclass(frozen=True)
class ConvView:
    """The forward convolution whose weight gradient an operator computes, in NCX / OIX terms.

    ``x: (batch, cin, *spatial_in)``, ``dy: (batch, cout, *spatial_out)``, weight
    ``(cout, cin // groups, *kernel)``; per spatial axis ``pads_begin`` / ``pads_end``,
    ``strides``, ``dilations``; ``dtype`` of every tensor (the sums run in float32).
    """

    batch: int
    cin: int
    cout: int
    groups: int
    spatial_in: tuple[int, ...]
    spatial_out: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    dilations: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        """Spatial rank: 1, 2 or 3."""
        return len(self.kernel)

    def geometry(self) -> ConvGeometry:
        """The 2-D geometry of the compute: rank 1 as H = 1, rank 3 with :class:`DepthAxis`."""
        lift = (lambda v, one: (one, *v)) if self.rank == 1 else (lambda v, one: tuple(v))
        s_in, s_out, k = lift(self.spatial_in, 1), lift(self.spatial_out, 1), lift(self.kernel, 1)
        st, pb, pe, dl = lift(self.strides, 1), lift(self.pads_begin, 0), lift(self.pads_end, 0), lift(self.dilations, 1)
        depth = None
        if self.rank == 3:
            depth = DepthAxis(s_in[0], k[0], s_out[0], st[0], pb[0], pe[0], dl[0])
            s_in, s_out, k, st, pb, pe, dl = (v[1:] for v in (s_in, s_out, k, st, pb, pe, dl))
        return ConvGeometry(
            batch=self.batch, cin=self.cin, h=s_in[0], w=s_in[1], cout=self.cout, kh=k[0], kw=k[1],
            ho=s_out[0], wo=s_out[1], strides=tuple(st), pads=(pb[0], pe[0], pb[1], pe[1]),
            dilations=tuple(dl), groups=self.groups, depth=depth,
        )  # fmt: skip

    def params(self, kernel_name: str) -> ConvGradParams:
        """The dW compute's parameters: inputs in ``dtype``, the result in float32 (the
        frontend's layout stage rounds it once to ``dtype``)."""
        return ConvGradParams(FILTER_OP, self.geometry(), self.dtype, "float32", kernel_name)


@dataclass(frozen=True)
class FrameworkCall:
    """A framework operator's call in its own terms, kept on its result for whoever checks or
    describes the kernel (:func:`tvm_convgrad.verify.check_kernel`, the command line).

    ``op`` is the operator's name (``ConvolutionBackpropFilters``, ``ConvolutionBackwardWeights``,
    ``ConvTransposeBackwardWeights``, ``DeconvGradFilter``); the kernel's inputs are in
    ``data_format`` (DeconvGradFilter: NHWC, ``"NXC"``) and its result in ``weights_format``
    (DeconvGradFilter: ``"dsp"``, ``[G, OCg*kh*kw, m]``). ``view`` holds the attributes (kernel,
    strides, pads as used, dilations, groups) and ``dsp_params`` DeconvGradFilter's ``params``."""

    op: str
    view: ConvView
    data_format: str
    weights_format: str
    dsp_params: tuple[int, ...] | None = None


def auto_pads(size: int, kernel: int, stride: int, dilation: int, mode: str) -> tuple[int, int]:
    """``(pad_begin, pad_end)`` of oneDNN's forward-convolution auto_pad rule on an input of
    ``size`` (spec §4): ``valid`` none; ``same_*`` pads ``max(0, eff - (s if size % s == 0 else
    size % s))`` in all, the odd one at the end (``same_upper``) or the beginning
    (``same_lower``)."""
    if mode == "valid":
        return 0, 0
    eff = (kernel - 1) * dilation + 1
    rest = size % stride
    total = max(0, eff - (stride if rest == 0 else rest))
    begin = total // 2 if mode == "same_upper" else total - total // 2
    return begin, total - begin


# ---------------------------------------------------------------------------------------------
# Shared checks
# ---------------------------------------------------------------------------------------------


def _activation(r: Rules, name: str, tensor: Any) -> tuple[tuple[int, ...], str]:
    """Static shape (rank 3-5) and dtype of an activation placeholder."""
    r.tensor(name, tensor)
    rank = len(tensor.shape)
    if rank not in (3, 4, 5):
        r.fail(f"{name}.shape", tuple(tensor.shape), f"must have rank 3, 4 or 5 (N, C and 1-3 spatial axes), got rank {rank}")
    return r.static_shape(f"{name}.shape", tensor, rank, None), str(tensor.dtype)


def _activations(r: Rules, first: tuple[str, Any], second: tuple[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """The two activation placeholders of an operator: their shapes (same rank) and shared dtype."""
    (a_name, a), (b_name, b) = first, second
    a_shape, a_dtype = _activation(r, a_name, a)
    b_shape, b_dtype = _activation(r, b_name, b)
    if len(b_shape) != len(a_shape):
        r.fail(f"{b_name}.shape", b_shape, f"must have the rank of {a_name} ({len(a_shape)})")
    return a_shape, b_shape, _dtypes(r, [(a_name, a_dtype), (b_name, b_dtype)], DTYPES)


def _window(r: Rules, nd: int, strides: Any, dilations: Any, pads_begin: Any, pads_end: Any) -> tuple[tuple[int, ...], ...]:
    """strides, dilations (>= 1) and pads_begin, pads_end (>= 0): one int per spatial axis each."""
    return (_attr(r, "strides", strides, nd, 1), _attr(r, "dilations", dilations, nd, 1),
            _attr(r, "pads_begin", pads_begin, nd, 0), _attr(r, "pads_end", pads_end, nd, 0))  # fmt: skip


def _split_format(shape: tuple[int, ...], data_format: str) -> tuple[int, int, tuple[int, ...]]:
    """``(batch, channels, spatial)`` of an activation in NCX or NXC."""
    if data_format == "NCX":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[-1], tuple(shape[1:-1])


def _format(r: Rules, name: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        r.fail(name, value, f"must be one of {list(allowed)}")
    return value


def _auto_pad(r: Rules, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in AUTO_PADS:
        r.fail("auto_pad", value, f"must be one of {list(AUTO_PADS)} (any case)")
    return value.lower()


def _attr(r: Rules, name: str, value: Any, nd: int, lo: int) -> tuple[int, ...]:
    """An attribute vector of one int per spatial axis, each ``>= lo``."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) != nd or not all(is_int(v) for v in value):
        r.fail(name, value, f"must be a list of {nd} ints (one per spatial axis)")
    if any(v < lo for v in value):
        r.fail(name, value, f"every element must be >= {lo}")
    return tuple(int(v) for v in value)


def _shape_given(r: Rules, name: str, value: Any, rank: int) -> tuple[int, ...] | None:
    """A weight shape passed as the operator's optional input (a list or a 1-D int array)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple, np.ndarray)):
        r.fail(name, type(value).__name__, "must be a list or a 1-D int numpy array of known values (a te.Tensor's "
               "values are not known when the kernel is built)")  # fmt: skip
    array = np.asarray(value)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        r.fail(name, value, "must be 1-D and integer")
    if array.size != rank:
        r.fail(name, array.tolist(), f"must have {rank} elements (the rank of the inputs), got {array.size}")
    return tuple(int(v) for v in array)


def _weights_shape(r: Rules, names: tuple[str, str], given: Any, attribute: Any, rank: int) -> tuple[int, ...]:
    """The weight shape: the input when given (it wins), else the attribute (all zeros = unset)."""
    shape = _shape_given(r, names[0], given, rank)
    if shape is None and attribute is not None:
        shape = _shape_given(r, names[1], attribute, rank)
        shape = None if shape is not None and not any(shape) else shape
    if shape is None:
        r.fail(names[0], None, f"is required: give it as the input or as the attribute {names[1]} (all zeros means unset)")
    if any(d < 1 for d in shape):
        r.fail(names[0], shape, "every dimension must be >= 1")
    return shape


def _dtypes(r: Rules, pairs: Sequence[tuple[str, str]], allowed: Sequence[str]) -> str:
    """One dtype shared by every tensor, from ``allowed``."""
    name, dtype = pairs[0]
    if dtype not in allowed:
        r.fail(f"{name}.dtype", dtype, f"must be one of {list(allowed)}")
    for other, other_dtype in pairs[1:]:
        if other_dtype != dtype:
            r.fail(f"{other}.dtype", other_dtype, f"must equal {name}.dtype = {dtype!r} (the operator has one type T)")
    return dtype


def _check_channels_and_batch(r: Rules, view: ConvView, names: dict[str, str]):
    if view.groups < 1:
        r.fail("groups", view.groups, "must be an int >= 1")
    for role in ("cin", "cout"):
        if getattr(view, role) % view.groups:
            r.fail(names[role], getattr(view, role), f"must be a multiple of groups = {view.groups}")


def _check_spatial(r: Rules, view: ConvView, names: dict[str, str]):
    """The conv view's shape relation per axis: ``S_out = floor((S_in + pb + pe - eff)/s) + 1``."""
    for axis in range(view.rank):
        size, out, k = view.spatial_in[axis], view.spatial_out[axis], view.kernel[axis]
        s, d, pb, pe = view.strides[axis], view.dilations[axis], view.pads_begin[axis], view.pads_end[axis]
        eff = (k - 1) * d + 1
        if size + pb + pe < eff:
            r.fail(f"{names['in']} spatial axis {axis}", size,
                   f"with pads ({pb}, {pe}) must cover the dilated kernel: size + pads >= (K-1)*d+1 = {eff}")  # fmt: skip
        expect = (size + pb + pe - eff) // s + 1
        if out != expect:
            r.fail(f"{names['out']} spatial axis {axis}", out,
                   f"must be floor(({size} + {pb} + {pe} - {eff}) / {s}) + 1 = {expect} (from {names['in']}, "
                   f"kernel {k}, stride {s}, dilation {d}, pads ({pb}, {pe}))")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# oneDNN Graph
# ---------------------------------------------------------------------------------------------


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
    r = Rules(op, _CODES)
    x_shape, dy_shape, dtype = _activations(r, (names["x"], x), (names["dy"], dy))
    rank, nd = len(x_shape), len(x_shape) - 2
    data_format = _format(r, "data_format", data_format, DATA_FORMATS)
    weights_format = _format(r, names["format"], weights_format, ("XIO", "OIX"))
    mode = _auto_pad(r, auto_pad)
    strides, dilations, pads_begin, pads_end = _window(r, nd, strides, dilations, pads_begin, pads_end)
    shape = _weights_shape(r, (names["shape"], names["shape_attr"]), shape_input, shape_attr, rank)
    groups = _groups(r, groups)
    batch, cin, s_in = _split_format(x_shape, data_format)
    dy_batch, cout, s_out = _split_format(dy_shape, data_format)
    o, i, kernel = (shape[-1], shape[-2], shape[:-2]) if weights_format == "XIO" else (shape[0], shape[1], shape[2:])
    named = {"cin": f"{names['x']} channels", "cout": f"{names['dy']} channels", "in": names["x"], "out": names["dy"]}
    view = ConvView(batch, cin, cout, groups, s_in, s_out, tuple(kernel), strides, pads_begin, pads_end, dilations, dtype)
    _check_channels_and_batch(r, view, named)
    if o != cout:
        r.fail(names["shape"], shape, f"its O ({weights_format}) must equal the {names['dy']} channels {cout}")
    if i * groups != cin:
        r.fail(names["shape"], shape, f"its I ({weights_format}) x groups must equal the {names['x']} channels {cin}")
    if dy_batch != batch:
        r.fail(f"{names['dy']}.shape", dy_shape, f"batch must equal the {names['x']} batch {batch}")
    if mode != "none":
        pads = [auto_pads(s_in[a], kernel[a], strides[a], dilations[a], mode) for a in range(nd)]
        view = _with_pads(view, pads)
    _check_spatial(r, view, named)
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
    r = Rules(op, _CODES)
    src_shape, dst_shape, dtype = _activations(r, ("src", src), ("diff_dst", diff_dst))
    rank, nd = len(src_shape), len(src_shape) - 2
    data_format = _format(r, "data_format", data_format, DATA_FORMATS)
    weights_format = _format(r, "weights_format", weights_format, ("XOI", "IOX"))
    mode = _auto_pad(r, auto_pad)
    strides, dilations, pads_begin, pads_end = _window(r, nd, strides, dilations, pads_begin, pads_end)
    padding = None if output_padding is None else _attr(r, "output_padding", output_padding, nd, 0)
    shape = _weights_shape(r, ("weights_shape", "weights_shape_attr"), shape_input, shape_attr, rank)
    groups = _groups(r, groups)
    batch, ic, s_src = _split_format(src_shape, data_format)
    dst_batch, oc, s_dst = _split_format(dst_shape, data_format)
    i, o, kernel = (shape[0], shape[1], shape[2:]) if weights_format == "IOX" else (shape[-1], shape[-2], shape[:-2])
    view = ConvView(batch, oc, ic, groups, s_dst, s_src, tuple(kernel), strides, pads_begin, pads_end, dilations, dtype)
    named = {"cin": "diff_dst channels", "cout": "src channels", "in": "diff_dst", "out": "src"}
    _check_channels_and_batch(r, view, named)
    if i != ic:
        r.fail("weights_shape", shape, f"its I ({weights_format}) must equal the src channels {ic}")
    if o * groups != oc:
        r.fail("weights_shape", shape, f"its O ({weights_format}) x groups must equal the diff_dst channels {oc} "
               "(O holds out_channels / groups)")  # fmt: skip
    if dst_batch != batch:
        r.fail("diff_dst.shape", dst_shape, f"batch must equal the src batch {batch}")
    if padding is not None:
        for axis, (op_, s) in enumerate(zip(padding, strides)):
            if op_ >= s:
                r.fail("output_padding", padding, f"axis {axis}: must be < the stride {s}")
    if mode != "none":  # the regular-conv rule on the diff_dst size (spec §5)
        view = _with_pads(view, [auto_pads(s_dst[a], kernel[a], strides[a], dilations[a], mode) for a in range(nd)])
    _check_spatial(r, view, named)
    if padding is not None:
        for axis in range(nd):
            eff = (kernel[axis] - 1) * dilations[axis] + 1
            expect = strides[axis] * (s_src[axis] - 1) + eff - view.pads_begin[axis] - view.pads_end[axis] + padding[axis]
            if s_dst[axis] != expect:
                r.fail(f"diff_dst spatial axis {axis}", s_dst[axis],
                       f"must be s*(S_src-1) + (K-1)*d+1 - pads + output_padding = {expect}")  # fmt: skip
    return view, data_format, weights_format, shape


def _groups(r: Rules, groups: Any) -> int:
    if not is_int(groups) or groups < 1:
        r.fail("groups", groups, "must be an int >= 1")
    return int(groups)


def _with_pads(view: ConvView, pads: Sequence[tuple[int, int]]) -> ConvView:
    from dataclasses import replace

    return replace(view, pads_begin=tuple(p[0] for p in pads), pads_end=tuple(p[1] for p in pads))


# ---------------------------------------------------------------------------------------------
# DSP library
# ---------------------------------------------------------------------------------------------


def dsp_view(op: str, dy: Any, x: Any, params: Any, dtype: Any) -> ConvView:
    """DeconvGradFilter (spec §5): the conv view of ``params[18]`` with NHWC ``dy`` and ``x``.

    The conv view's x is ``dy`` (``out_c`` channels, ``out_h x out_w``), its dy is ``x``
    (``in_c`` channels, ``in_h x in_w``); the bottom / right pads are implied by the sizes."""
    r = Rules(op, _CODES)
    if dtype not in DSP_DTYPES:
        r.fail("dtype", dtype, f"must be one of {list(DSP_DTYPES)} (fp_ / hp_)")
    if isinstance(params, np.ndarray):
        params = params.tolist()
    if not isinstance(params, (list, tuple)) or len(params) != len(DSP_PARAMS) or not all(is_int(v) for v in params):
        r.fail("params", params, f"must be {len(DSP_PARAMS)} ints: {list(DSP_PARAMS)}")
    p = dict(zip(DSP_PARAMS, (int(v) for v in params)))
    for name in DSP_PARAMS[:12] + ("dilation_h", "dilation_w", "group"):
        if p[name] < 1:
            r.fail(f"params[{DSP_PARAMS.index(name)}] ({name})", p[name], "must be >= 1")
    for name in ("pad_u", "pad_l"):
        if p[name] < 0:
            r.fail(f"params[{DSP_PARAMS.index(name)}] ({name})", p[name], "must be >= 0")
    if p["input_batch"] != p["batch"]:
        r.fail("params[0] (input_batch)", p["input_batch"], f"must equal params[4] (batch) = {p['batch']}")
    for name in ("in_c", "out_c"):
        if p[name] % p["group"]:
            r.fail(f"params[{DSP_PARAMS.index(name)}] ({name})", p[name], f"must be a multiple of group = {p['group']}")
    for name, tensor, expect in (("dy", dy, ("batch", "out_h", "out_w", "out_c")), ("x", x, ("input_batch", "in_h", "in_w", "in_c"))):
        r.tensor(name, tensor)
        shape = r.static_shape(f"{name}.shape", tensor, 4, None)
        want = tuple(p[k] for k in expect)
        if shape != want:
            r.fail(f"{name}.shape", shape, f"must be NHWC {want} = params {list(expect)}")
    _dtypes(r, [("dy", str(dy.dtype)), ("x", str(x.dtype))], (dtype,))
    pads_end = []
    for axis, (size, out, k, s, d, pb) in enumerate(
        ((p["out_h"], p["in_h"], p["kernel_h"], p["stride_h"], p["dilation_h"], p["pad_u"]),
         (p["out_w"], p["in_w"], p["kernel_w"], p["stride_w"], p["dilation_w"], p["pad_l"]))
    ):  # fmt: skip
        eff = (k - 1) * d + 1
        crop = (out - 1) * s + eff - pb - size  # the deconv output's implied end crop
        name = ("out_h", "out_w")[axis]
        if crop <= -s:
            r.fail(f"params[{DSP_PARAMS.index(name)}] ({name})", size,
                   f"must be > {(out - 1) * s + eff - pb - s} and <= {(out - 1) * s + eff - pb}: "
                   f"(in - 1)*stride + (kernel - 1)*dilation + 1 - pad minus at most stride - 1 of output padding")  # fmt: skip
        pads_end.append(max(0, crop))  # windows past the end of dy (a crop of the deconv output) read zeros
    return ConvView(
        batch=p["batch"], cin=p["out_c"], cout=p["in_c"], groups=p["group"],
        spatial_in=(p["out_h"], p["out_w"]), spatial_out=(p["in_h"], p["in_w"]), kernel=(p["kernel_h"], p["kernel_w"]),
        strides=(p["stride_h"], p["stride_w"]), pads_begin=(p["pad_u"], p["pad_l"]), pads_end=tuple(pads_end),
        dilations=(p["dilation_h"], p["dilation_w"]), dtype=dtype,
    )  # fmt: skip
