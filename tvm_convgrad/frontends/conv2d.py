"""A framework's 2-D convolution call and its two gradients as the oneDNN operators, written once for
the training clients (``tvm_convgrad.torch``, ``tvm_convgrad.relax``) and the measurements.

A :class:`Conv2dGradients` is what the kernels depend on: the NCHW / OIHW shapes, strides, the four
pads ``(top, bottom, left, right)``, dilation, groups, type, and the layouts the tensors are in
(NCX or NXC activations, OIX, XIO or OXI weights). :meth:`~Conv2dGradients.input_grad` is
``ConvolutionBackwardData(dy, w) -> dx``, :meth:`~Conv2dGradients.weight_grad`
``ConvolutionBackwardWeights(x, dy) -> dw``, :meth:`~Conv2dGradients.forward` ``Convolution(x, w[, b])
-> y`` (the step's third GEMM), all in those layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tvm import te

from ..params.framework import weights_index
from ..params.geometry import live_taps, out_size
from ..params.post_ops import PostOp
from . import onednn

__all__ = ["Conv2dGradients"]


@dataclass(frozen=True)
class Conv2dGradients:
    x_shape: tuple[int, int, int, int]  # (N, C, H, W)
    w_shape: tuple[int, int, int, int]  # (O, C/groups, KH, KW)
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # (top, bottom, left, right)
    dilation: tuple[int, int]
    groups: int
    dtype: str
    data_format: str = "NCX"
    weights_format: str = "OIX"

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        """The forward output, NCHW."""
        n, _, h, w = self.x_shape
        o, _, kh, kw = self.w_shape
        (sh, sw), (dh, dw), (pt, pb, pl, pr) = self.strides, self.dilation, self.pads
        return (n, o, out_size(h, kh, sh, pt, pb, dh), out_size(w, kw, sw, pl, pr, dw))

    def activation(self, shape) -> tuple[int, int, int, int]:
        """An NCHW shape in the activations' layout."""
        n, c, h, w = shape
        return (n, h, w, c) if self.data_format == "NXC" else (n, c, h, w)

    def weights(self) -> tuple[int, int, int, int]:
        """The weight shape in its layout."""
        o, i, kh, kw = self.w_shape
        return weights_index(self.weights_format, o, i, (kh, kw))

    def attrs(self) -> dict:
        pt, pb, pl, pr = self.pads
        return {"strides": list(self.strides), "pads_begin": [pt, pl], "pads_end": [pb, pr], "dilations": list(self.dilation),
                "groups": self.groups, "data_format": self.data_format, "weights_format": self.weights_format}  # fmt: skip

    def cropped(self) -> tuple[Conv2dGradients, slice, slice] | None:
        """``(call, rows, columns)``: the same convolution with its kernel cropped to the taps that
        read the input (:func:`~tvm_convgrad.params.geometry.live_taps`; its pads shifted, the
        output the same), and the kernel rows and columns it keeps. dX is the cropped call's (on
        ``w[:, :, rows, columns]``), dW the cropped call's in those rows and columns and 0
        elsewhere. None when every tap is live, no tap is, or a shifted pad would be negative."""
        (_, _, h, w), (o, i, kh, kw) = self.x_shape, self.w_shape
        (sh, sw), (dh, dw), (pt, pb, pl, pr) = self.strides, self.dilation, self.pads
        rows, cols = live_taps(h, kh, sh, pt, pb, dh), live_taps(w, kw, sw, pl, pr, dw)
        if rows is None or cols is None or (rows, cols) == ((0, kh - 1), (0, kw - 1)):
            return None
        pads = (pt - rows[0] * dh, pb - (kh - 1 - rows[1]) * dh, pl - cols[0] * dw, pr - (kw - 1 - cols[1]) * dw)
        if min(pads) < 0:
            return None
        kernel = (rows[1] - rows[0] + 1, cols[1] - cols[0] + 1)
        dilation = tuple(d if k > 1 else 1 for k, d in zip(kernel, self.dilation))  # one tap: no dilation
        call = replace(self, w_shape=(o, i, *kernel), pads=pads, dilation=dilation)
        return call, slice(rows[0], rows[1] + 1), slice(cols[0], cols[1] + 1)

    def input_grad(self, kernel_name: str = "conv2d_input_grad", algorithm: str = "direct") -> te.Tensor:
        """dX: ``(dy, w) -> dx`` (``algorithm``: :data:`~tvm_convgrad.params.onednn.ALGORITHMS`)."""
        dy = te.placeholder(self.activation(self.y_shape), self.dtype, name="diff_dst")
        w = te.placeholder(self.weights(), self.dtype, name="weights")
        return onednn.convolution_backward_data(dy, w, list(self.activation(self.x_shape)), kernel_name=kernel_name, algorithm=algorithm,
                                                **self.attrs())  # fmt: skip

    def forward(self, kernel_name: str = "conv2d_forward", bias: bool = False, post_ops: Sequence[PostOp] = (),
                algorithm: str = "direct") -> te.Tensor:  # fmt: skip
        """The convolution itself: ``(x, w[, bias], *src1) -> y``, each value of y through
        ``post_ops`` (oneDNN's, :mod:`tvm_convgrad.params.post_ops`) as it is written
        (``algorithm``: :data:`~tvm_convgrad.params.onednn.ALGORITHMS`)."""
        x = te.placeholder(self.activation(self.x_shape), self.dtype, name="src")
        w = te.placeholder(self.weights(), self.dtype, name="weights")
        b = te.placeholder((self.w_shape[0],), self.dtype, name="bias") if bias else None
        return onednn.convolution(x, w, b, kernel_name=kernel_name, post_ops=list(post_ops), algorithm=algorithm, **self.attrs())

    def weight_grad(self, kernel_name: str = "conv2d_weight_grad", algorithm: str = "direct", dw_dtype: str | None = None) -> te.Tensor:
        """dW: ``(x, dy) -> dw`` (``algorithm``: :data:`~tvm_convgrad.params.onednn.ALGORITHMS`;
        ``dw_dtype``: dw's type, None for the call's, ``"float32"`` for a bf16 / f16 call's fp32 sums)."""
        x = te.placeholder(self.activation(self.x_shape), self.dtype, name="src")
        dy = te.placeholder(self.activation(self.y_shape), self.dtype, name="diff_dst")
        return onednn.convolution_backward_weights(x, dy, list(self.weights()), kernel_name=kernel_name, algorithm=algorithm, diff_weights_dtype=dw_dtype,
                                                   **self.attrs())  # fmt: skip
