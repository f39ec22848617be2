"""The DSP math library's ``DeconvGradFilter`` (FT78NE / MT7004) on the package's dW compute.

``fp_deconv_grad_filter`` (float32) and ``hp_deconv_grad_filter`` (float16) are the C library's
two spellings; :func:`deconv_grad_filter` takes the type as an argument. ``dy`` is the gradient of
a deconvolution's output, NHWC ``[batch, out_h, out_w, out_c]``; ``x`` its input, NHWC
``[input_batch, in_h, in_w, in_c]``; ``params`` the C signature's 18 ``long long``::

    input_batch, in_h, in_w, in_c, batch, out_h, out_w, out_c, kernel_h, kernel_w,
    stride_h, stride_w, pad_u, pad_l, dilation_h, dilation_w, group, workspace

The result is ``[group, out_c/group*kernel_h*kernel_w, in_c/group]`` with row
``(c*kernel_h + kr)*kernel_w + kc`` (channel c of the group outermost)::

    dw[g, (c*kh + kr)*kw + kc, i] = sum_b sum_{h<in_h, w<in_w}
        dy[b, h*sh - pu + kr*dh, w*sw - pl + kc*dw, g*OCg + c] * x[b, h, w, g*m + i]

(dy read as 0 outside it). The bottom / right extent is implied by ``out_h`` / ``out_w``: up to
``stride - 1`` rows of output padding are accepted (they meet no window).

``workspace`` (params[17]) is accepted and ignored: it is the C library's scratch buffer for its
im2row panels (MindSpore's kernel of the same parameters needs ``in_w*kh*kw*out_c/group`` floats
per row); here the compiled kernel allocates what its schedule needs itself, so no caller buffer
is read or written.

How: the weight gradient of a regular convolution with x = dy and dy = x (spec §4), the package's
dW compute between layout stages, so it runs on the cube schedules (both CPU ISAs, CUDA).
"""

from __future__ import annotations

from typing import Sequence

from tvm import te

from ..dsl import attach
from ..dsl.compute import conv2d_backprop_filter_compute
from ..dsl.compute.stages import DSP_DW, DY_5HD, FMAP_5HD
from ..params.dsp import dsp_view
from ..params.framework import FrameworkCall
from .layouts import as_5hd, weight_stage

__all__ = ["deconv_grad_filter", "fp_deconv_grad_filter", "hp_deconv_grad_filter"]


def deconv_grad_filter(
    dy: te.Tensor, x: te.Tensor, params: Sequence[int], dtype: str = "float32", kernel_name: str = "deconv_grad_filter"
) -> te.Tensor:
    """DeconvGradFilter: ``dy`` and ``x`` NHWC placeholders of ``dtype`` (float32 or float16)
    matching ``params``; returns ``dw [group, out_c/group*k_h*k_w, in_c/group]`` in ``dtype``."""
    view = dsp_view("DeconvGradFilter", dy, x, params, dtype)
    group, m = view.groups, view.cout // view.groups
    kh, kw = view.kernel
    rows = view.cin // group * kh * kw
    compute_params = view.params(kernel_name)
    dw = conv2d_backprop_filter_compute(as_5hd(dy, "NXC", FMAP_5HD), as_5hd(x, "NXC", DY_5HD), compute_params)

    def to_oix(g, row, i):  # conv view: o = the x channel g*m + i, i = the dy channel c of group g
        return g * m + i, row // (kh * kw), (row // kw % kh, row % kw)

    attrs = {"kernel_name": kernel_name, "flops": compute_params.flops, "weights_format": "dsp"}
    result = weight_stage(dw, view, (group, rows, m), to_oix, dtype, DSP_DW, attrs)
    return attach(result, compute_params, (dy, x), FrameworkCall("DeconvGradFilter", view, "NXC", "dsp", tuple(int(v) for v in params)))


def fp_deconv_grad_filter(dy: te.Tensor, x: te.Tensor, params: Sequence[int], kernel_name: str = "fp_deconv_grad_filter") -> te.Tensor:
    """float32 :func:`deconv_grad_filter`."""
    return deconv_grad_filter(dy, x, params, "float32", kernel_name)


def hp_deconv_grad_filter(dy: te.Tensor, x: te.Tensor, params: Sequence[int], kernel_name: str = "hp_deconv_grad_filter") -> te.Tensor:
    """float16 (half precision) :func:`deconv_grad_filter`."""
    return deconv_grad_filter(dy, x, params, "float16", kernel_name)
