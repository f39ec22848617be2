"""The framework operators' common ground (``framework_ops/*.md``): the conv view they all reduce to,
their calls, and the checks they share; each operator's own rules are in :mod:`.onednn` and :mod:`.dsp`.

oneDNN Graph's ``ConvolutionBackpropFilters`` / ``ConvolutionBackwardWeights`` and
``ConvTransposeBackwardWeights``, and the DSP library's ``DeconvGradFilter``, compute the
weight gradient of one forward convolution, ``ConvolutionBackwardData`` (``ConvolutionBackpropData``)
its input gradient. Each is validated here and described by one
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
ConvolutionBackwardData        (diff_src: the result)  diff_dst / output_delta weights / filter
=============================  ======================  ======================  ==================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .geometry import FILTER_OP, FORWARD_OP, INPUT_OP, ConvGeometry, ConvGradParams, DepthAxis
from .rules import Rules, is_int

__all__ = [
    "AUTO_PADS", "CODES", "DATA_FORMATS", "DATA_GRADIENTS", "DTYPES", "WEIGHTS_FORMATS", "ConvView", "FrameworkCall", "activations", "auto_pad_mode", "auto_pads",
    "check_channels_and_batch", "check_spatial", "format_choice", "groups_attr", "one_dtype", "per_axis", "split_format", "split_weights",
    "weights_index", "weights_shape", "window_attrs", "with_pads",
]  # fmt: skip

DTYPES = ("float32", "float16", "bfloat16")
DATA_FORMATS = ("NXC", "NCX")
WEIGHTS_FORMATS = ("XIO", "OIX", "OXI")
"""A convolution's weight layouts: oneDNN Graph's XIO ``(*K, I, O)`` and OIX ``(O, I, *K)``, and the
package's OXI ``(O, *K, I)`` — PyTorch's channels-last weight (``(O, I, KH, KW)`` with I innermost in
memory) and TVM's OHWI kernel layout, read in place instead of copied to OIX."""
AUTO_PADS = ("none", "same_upper", "same_lower", "valid")
CODES = {"type": None, "length": None, "value": None}
DATA_GRADIENTS = ("ConvolutionBackwardData", "ConvolutionBackpropData")
"""The operators (:attr:`FrameworkCall.op`) whose result is the input gradient, not the weights'."""


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

    def params(self, kernel_name: str, op: str = FILTER_OP) -> ConvGradParams:
        """The parameters of the dW (``op`` = ``FILTER_OP``), dX (``INPUT_OP``) or forward
        (``FORWARD_OP``) compute: inputs in ``dtype``, the result in float32 (the frontend's
        layout stage rounds it once to ``dtype``)."""
        if op not in (FILTER_OP, INPUT_OP, FORWARD_OP):
            raise ValueError(f"op {op!r}: must be {FILTER_OP!r}, {INPUT_OP!r} or {FORWARD_OP!r}")
        return ConvGradParams(op, self.geometry(), self.dtype, "float32", kernel_name)


@dataclass(frozen=True)
class FrameworkCall:
    """A framework operator's call in its own terms, kept on its result for whoever checks or
    describes the kernel (:func:`tvm_convgrad.tools.verify.check_kernel`, the command line).

    ``op`` is the operator's name (``ConvolutionBackpropFilters``, ``ConvolutionBackwardWeights``,
    ``ConvTransposeBackwardWeights``, ``DeconvGradFilter``, ``ConvolutionBackwardData``,
    ``ConvolutionBackpropData``); the kernel's activations are in ``data_format`` (DeconvGradFilter:
    NHWC, ``"NXC"``) and its weights (the dW result, the dX input) in ``weights_format``
    (DeconvGradFilter: ``"dsp"``, ``[G, OCg*kh*kw, m]``). ``view`` holds the attributes (kernel,
    strides, pads as used, dilations, groups) and ``dsp_params`` DeconvGradFilter's ``params``;
    ``bias`` whether Convolution takes one, ``post_ops`` its post-ops (their ``src1`` the kernel's
    last inputs, in order)."""

    op: str
    view: ConvView
    data_format: str
    weights_format: str
    dsp_params: tuple[int, ...] | None = None
    bias: bool = False
    post_ops: tuple = ()


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


def activation(r: Rules, name: str, tensor: Any) -> tuple[tuple[int, ...], str]:
    """Static shape (rank 3-5) and dtype of an activation placeholder."""
    r.tensor(name, tensor)
    rank = len(tensor.shape)
    if rank not in (3, 4, 5):
        r.fail(f"{name}.shape", tuple(tensor.shape), f"must have rank 3, 4 or 5 (N, C and 1-3 spatial axes), got rank {rank}")
    return r.static_shape(f"{name}.shape", tensor, rank, None), str(tensor.dtype)


def activations(r: Rules, first: tuple[str, Any], second: tuple[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """The two activation placeholders of an operator: their shapes (same rank) and shared dtype."""
    (a_name, a), (b_name, b) = first, second
    a_shape, a_dtype = activation(r, a_name, a)
    b_shape, b_dtype = activation(r, b_name, b)
    if len(b_shape) != len(a_shape):
        r.fail(f"{b_name}.shape", b_shape, f"must have the rank of {a_name} ({len(a_shape)})")
    return a_shape, b_shape, one_dtype(r, [(a_name, a_dtype), (b_name, b_dtype)], DTYPES)


def window_attrs(r: Rules, nd: int, strides: Any, dilations: Any, pads_begin: Any, pads_end: Any) -> tuple[tuple[int, ...], ...]:
    """strides, dilations (>= 1) and pads_begin, pads_end (>= 0): one int per spatial axis each."""
    return (per_axis(r, "strides", strides, nd, 1), per_axis(r, "dilations", dilations, nd, 1),
            per_axis(r, "pads_begin", pads_begin, nd, 0), per_axis(r, "pads_end", pads_end, nd, 0))  # fmt: skip


def split_weights(shape: tuple[int, ...], weights_format: str) -> tuple[int, int, tuple[int, ...]]:
    """``(O, I, kernel)`` of a weight shape in a :data:`WEIGHTS_FORMATS` layout."""
    if weights_format == "XIO":
        return shape[-1], shape[-2], tuple(shape[:-2])
    if weights_format == "OXI":
        return shape[0], shape[-1], tuple(shape[1:-1])
    return shape[0], shape[1], tuple(shape[2:])


def weights_index(weights_format: str, o, i, taps: Sequence) -> tuple:
    """The index of weight ``(o, i, *taps)`` in a :data:`WEIGHTS_FORMATS` layout; its inverse is
    :func:`split_weights` applied to an index."""
    if weights_format == "XIO":
        return (*taps, i, o)
    if weights_format == "OXI":
        return (o, *taps, i)
    return (o, i, *taps)


def split_format(shape: tuple[int, ...], data_format: str) -> tuple[int, int, tuple[int, ...]]:
    """``(batch, channels, spatial)`` of an activation in NCX or NXC."""
    if data_format == "NCX":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[-1], tuple(shape[1:-1])


def format_choice(r: Rules, name: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        r.fail(name, value, f"must be one of {list(allowed)}")
    return value


def auto_pad_mode(r: Rules, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in AUTO_PADS:
        r.fail("auto_pad", value, f"must be one of {list(AUTO_PADS)} (any case)")
    return value.lower()


def per_axis(r: Rules, name: str, value: Any, nd: int, lo: int) -> tuple[int, ...]:
    """An attribute vector of one int per spatial axis, each ``>= lo``."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) != nd or not all(is_int(v) for v in value):
        r.fail(name, value, f"must be a list of {nd} ints (one per spatial axis)")
    if any(v < lo for v in value):
        r.fail(name, value, f"every element must be >= {lo}")
    return tuple(int(v) for v in value)


def shape_given(r: Rules, name: str, value: Any, rank: int) -> tuple[int, ...] | None:
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


def weights_shape(r: Rules, names: tuple[str, str], given: Any, attribute: Any, rank: int) -> tuple[int, ...]:
    """The weight shape: the input when given (it wins), else the attribute (all zeros = unset)."""
    shape = shape_given(r, names[0], given, rank)
    if shape is None and attribute is not None:
        shape = shape_given(r, names[1], attribute, rank)
        shape = None if shape is not None and not any(shape) else shape
    if shape is None:
        r.fail(names[0], None, f"is required: give it as the input or as the attribute {names[1]} (all zeros means unset)")
    if any(d < 1 for d in shape):
        r.fail(names[0], shape, "every dimension must be >= 1")
    return shape


def one_dtype(r: Rules, pairs: Sequence[tuple[str, str]], allowed: Sequence[str]) -> str:
    """One dtype shared by every tensor, from ``allowed``."""
    name, dtype = pairs[0]
    if dtype not in allowed:
        r.fail(f"{name}.dtype", dtype, f"must be one of {list(allowed)}")
    for other, other_dtype in pairs[1:]:
        if other_dtype != dtype:
            r.fail(f"{other}.dtype", other_dtype, f"must equal {name}.dtype = {dtype!r} (the operator has one type T)")
    return dtype


def check_channels_and_batch(r: Rules, view: ConvView, names: dict[str, str]):
    if view.groups < 1:
        r.fail("groups", view.groups, "must be an int >= 1")
    for role in ("cin", "cout"):
        if getattr(view, role) % view.groups:
            r.fail(names[role], getattr(view, role), f"must be a multiple of groups = {view.groups}")


def check_spatial(r: Rules, view: ConvView, names: dict[str, str]):
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


def groups_attr(r: Rules, groups: Any) -> int:
    if not is_int(groups) or groups < 1:
        r.fail("groups", groups, "must be an int >= 1")
    return int(groups)


def with_pads(view: ConvView, pads: Sequence[tuple[int, int]]) -> ConvView:
    from dataclasses import replace

    return replace(view, pads_begin=tuple(p[0] for p in pads), pads_end=tuple(p[1] for p in pads))
