"""The package's gradient kernels for one PyTorch ``conv2d`` call, built once per signature.

A :class:`ConvCall` is what a kernel depends on: shapes, stride, the four pads, dilation, groups,
type and whether the activations are channels-last. Its two kernels are the oneDNN-frontend
operators on the same compute as every other path of the package:

* dX: ``ConvolutionBackwardData`` (diff_dst, weights OIX) -> diff_src;
* dW: ``ConvolutionBackwardWeights`` (src, diff_dst) -> diff_weights OIX;

with the activations NCX for contiguous tensors and NXC for channels-last ones, so that a
tensor's memory is passed as it lies (DLPack, no copy: a channels-last ``(N, C, H, W)`` tensor
is the contiguous NHWC ``t.permute(0, 2, 3, 1)``). Kernels are built for this CPU (``llvm``,
every usable core) and cached (:data:`CACHED_CALLS` signatures).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from tvm import te

from ..compile import Kernel, build
from ..errors import ConvGradError
from ..frontends import onednn

__all__ = ["CACHED_CALLS", "DTYPES", "ConvCall", "as_layout", "dtype_name", "input_grad_kernel", "weight_grad_kernel"]

CACHED_CALLS = 128
"""Signatures whose kernels stay built (least recently used first out)."""

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
"""The tensor types the kernels take; float64 tensors are computed in float32 (see :mod:`.ops`)."""


def dtype_name(dtype: torch.dtype, op: str = "tvm_convgrad.torch.conv2d") -> str:
    """The kernel type of ``dtype`` (float64: float32), else a :class:`ConvGradError`."""
    if dtype == torch.float64:
        return "float32"
    if dtype not in DTYPES:
        raise ConvGradError(op, "input.dtype", str(dtype), f"must be one of {[str(d) for d in (*DTYPES, torch.float64)]}")
    return DTYPES[dtype]


@dataclass(frozen=True)
class ConvCall:
    """One ``conv2d`` signature: ``input (N, C, H, W)``, ``weight (O, C/groups, KH, KW)``,
    ``pads (top, bottom, left, right)``, the kernels' type and the activations' memory format."""

    input_shape: tuple[int, int, int, int]
    weight_shape: tuple[int, int, int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: str
    channels_last: bool

    @property
    def data_format(self) -> str:
        return "NXC" if self.channels_last else "NCX"

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        n, _, h, w = self.input_shape
        o, _, kh, kw = self.weight_shape
        (sh, sw), (dh, dw), (pt, pb, pl, pr) = self.stride, self.dilation, self.pads
        return (n, o, (h + pt + pb - (kh - 1) * dh - 1) // sh + 1, (w + pl + pr - (kw - 1) * dw - 1) // sw + 1)

    def layout_shape(self, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """An NCHW shape as the kernels see it (NHWC when channels-last)."""
        n, c, h, w = shape
        return (n, h, w, c) if self.channels_last else (n, c, h, w)

    def attrs(self) -> dict:
        (pt, pb, pl, pr) = self.pads
        return {"strides": list(self.stride), "pads_begin": [pt, pl], "pads_end": [pb, pr], "dilations": list(self.dilation),
                "groups": self.groups, "data_format": self.data_format}  # fmt: skip


def as_layout(tensor: torch.Tensor, call: ConvCall) -> torch.Tensor:
    """``tensor`` (NCHW logical) as the kernels' layout: NHWC memory for a channels-last call (a
    view when the tensor is channels-last already, else one copy), NCHW contiguous otherwise."""
    if call.channels_last:
        return tensor.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    return tensor.contiguous()


@functools.lru_cache(maxsize=CACHED_CALLS)
def input_grad_kernel(call: ConvCall) -> Kernel:
    """dX of ``call``: ``(grad_output, weight OIHW) -> grad_input``, in the call's layout."""
    dy = te.placeholder(call.layout_shape(call.output_shape), call.dtype, name="diff_dst")
    w = te.placeholder(call.weight_shape, call.dtype, name="weights")
    result = onednn.convolution_backward_data(dy, w, list(call.layout_shape(call.input_shape)), weights_format="OIX",
                                              kernel_name="torch_conv2d_input_grad", **call.attrs())  # fmt: skip
    return build(result)


@functools.lru_cache(maxsize=CACHED_CALLS)
def weight_grad_kernel(call: ConvCall) -> Kernel:
    """dW of ``call``: ``(input, grad_output) -> grad_weight OIHW``, activations in the call's layout."""
    x = te.placeholder(call.layout_shape(call.input_shape), call.dtype, name="src")
    dy = te.placeholder(call.layout_shape(call.output_shape), call.dtype, name="diff_dst")
    result = onednn.convolution_backward_weights(x, dy, list(call.weight_shape), weights_format="OIX",
                                                 kernel_name="torch_conv2d_weight_grad", **call.attrs())  # fmt: skip
    return build(result)
