"""The rules of the DSP library's ``DeconvGradFilter`` (``framework_ops/DeconvGradFilter.md`` §5): its
18 ``params`` validated into the conv view of its weight gradient."""

from __future__ import annotations

from typing import Any

import numpy as np

from .framework import CODES, ConvView, one_dtype
from .rules import Rules, is_int

__all__ = ["DSP_DTYPES", "DSP_PARAMS", "dsp_view"]

DSP_DTYPES = ("float32", "float16")
DSP_PARAMS = (
    "input_batch", "in_h", "in_w", "in_c", "batch", "out_h", "out_w", "out_c", "kernel_h", "kernel_w",
    "stride_h", "stride_w", "pad_u", "pad_l", "dilation_h", "dilation_w", "group", "workspace",
)  # fmt: skip


def dsp_view(op: str, dy: Any, x: Any, params: Any, dtype: Any) -> ConvView:
    """DeconvGradFilter (spec §5): the conv view of ``params[18]`` with NHWC ``dy`` and ``x``.

    The conv view's x is ``dy`` (``out_c`` channels, ``out_h x out_w``), its dy is ``x``
    (``in_c`` channels, ``in_h x in_w``); the bottom / right pads are implied by the sizes."""
    r = Rules(op, CODES)
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
    one_dtype(r, [("dy", str(dy.dtype)), ("x", str(x.dtype))], (dtype,))
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
