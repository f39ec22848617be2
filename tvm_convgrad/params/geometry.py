"""The validated parameter set every gradient compute receives."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..layout import C0, GroupExtension, ceil_div, group_extension

__all__ = ["ConvGeometry", "ConvGradParams", "DepthAxis", "FILTER_OP", "FORWARD_OP", "INPUT_OP", "out_size"]

FILTER_OP = "conv2d_backprop_filter"
INPUT_OP = "conv2d_backprop_input"
FORWARD_OP = "conv"


@dataclass(frozen=True)
class DepthAxis:
    """The depth axis of a 3-D convolution (TBE's conv3d gradients: NDC1HWC0 / FracZ_3D).

    x holds ``size`` planes, y ``out``; output plane ``o`` and tap ``k`` read x plane
    ``o*stride - pad_before + k*dilation`` (0 outside ``[0, size)``).
    """

    size: int
    kernel: int
    out: int
    stride: int
    pad_before: int
    pad_after: int
    dilation: int

    @property
    def padded(self) -> int:
        """Planes of zero-padded x the reduction reads: ``(out-1)*stride + (kernel-1)*dilation + 1``."""
        return (self.out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1


@dataclass(frozen=True)
class ConvGeometry:
    """NCHW view of the forward convolution ``y = conv2d(x, w)`` whose gradients are taken.

    ``x: (batch, cin, h, w)``, ``w: (cout, cin // groups, kh, kw)``, ``y: (batch, cout, ho, wo)``.
    ``pads`` is ``(top, bottom, left, right)``, ``strides`` and ``dilations`` are ``(h, w)``.
    A 3-D convolution (NCDHW, weights ``(cout, cin // groups, kd, kh, kw)``) adds ``depth``.
    """

    batch: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    ho: int
    wo: int
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]
    groups: int
    depth: DepthAxis | None = None

    @property
    def kd(self) -> int:
        """Kernel depth (1 for a 2-D convolution)."""
        return self.depth.kernel if self.depth else 1

    @property
    def cin_g(self) -> int:
        return self.cin // self.groups

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    @functools.cached_property
    def group(self) -> GroupExtension:
        return group_extension(self.cin_g, self.cout_g, self.groups)

    @property
    def filter_sizes(self) -> tuple[int, int, int, int]:
        return (self.cout, self.cin_g, self.kh, self.kw)

    @property
    def input_sizes(self) -> tuple[int, int, int, int]:
        return (self.batch, self.cin, self.h, self.w)

    @property
    def output_sizes(self) -> tuple[int, int, int, int]:
        return (self.batch, self.cout, self.ho, self.wo)

    @property
    def c1_x(self) -> int:
        """16-channel blocks of x / dX."""
        return ceil_div(self.cin, C0)

    @property
    def c1_y(self) -> int:
        """16-channel blocks of dy."""
        return ceil_div(self.cout, C0)

    @property
    def kh_dilated(self) -> int:
        return (self.kh - 1) * self.dilations[0] + 1

    @property
    def kw_dilated(self) -> int:
        return (self.kw - 1) * self.dilations[1] + 1

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of one gradient: ``2*N*Cout*(Cin/groups)*KH*KW*Ho*Wo`` (x ``KD*Do`` in 3-D)."""
        planes = self.depth.kernel * self.depth.out if self.depth else 1
        return 2 * self.batch * self.cout * self.cin_g * self.kh * self.kw * self.ho * self.wo * planes


def out_size(size: int, kernel: int, stride: int, pad_before: int, pad_after: int, dilation: int) -> int:
    """Forward-convolution output size along one axis."""
    return (size + pad_before + pad_after - ((kernel - 1) * dilation + 1)) // stride + 1


def live_taps(size: int, kernel: int, stride: int, pad_before: int, pad_after: int, dilation: int) -> tuple[int, int] | None:
    """``(first, last)``: the taps of one axis that read the input for some output, or None when
    none does. Tap ``k`` of output ``o`` reads position ``o*stride + k*dilation - pad_before``;
    the taps outside ``[first, last]`` read only padding, so they add nothing to dX and their dW
    is 0 (a dilated layer on a small map: DeepLab's rate-18 ASPP on a 14x14 map has one live row
    and one live column of its 3x3)."""
    outputs = out_size(size, kernel, stride, pad_before, pad_after, dilation)
    live = [k for k in range(kernel)
            if max(0, -(-(pad_before - k * dilation) // stride)) <= min(outputs - 1, (size - 1 + pad_before - k * dilation) // stride)]  # fmt: skip
    return (live[0], live[-1]) if live else None


@dataclass(frozen=True)
class ConvGradParams:
    """Everything a gradient compute needs, validated.

    ``op`` is ``"conv2d_backprop_filter"``, ``"conv2d_backprop_input"`` or ``"conv"`` (the forward
    convolution, whose compute shares the geometry); ``in_dtype`` is the
    dtype of both inputs, ``res_dtype`` the dtype of the result (the reduction runs in float32).
    ``offset_x`` is the dX ``offset_x`` (0 for float16 inputs); ``has_bias`` says whether dX adds
    ``tensor_bias``.
    """

    op: str
    geom: ConvGeometry
    in_dtype: str
    res_dtype: str
    kernel_name: str
    offset_x: int = 0
    has_bias: bool = False

    @property
    def flops(self) -> int:
        return self.geom.flops


