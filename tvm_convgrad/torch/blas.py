"""A pointwise convolution's three GEMMs as PyTorch's BLAS GEMMs: a second way PyTorch can run a
1x1 layer, which ``"auto"`` times beside ``F.conv2d`` / ``convolution_backward`` (:mod:`.forward`,
:mod:`.backward`) and takes where it is the faster of PyTorch's two.

A float32 1x1 convolution at stride 1 without padding, not grouped (:func:`applies`), is one GEMM
per GEMM of the step, over the pixels ``P = N*H*W``: the forward ``y (P, O) = x (P, C) @ w (O,
C)^T``, dX ``(P, C) = dy (P, O) @ w``, dW ``(O, C) = dy^T @ x``. Channels-last tensors are those
``(P, C)`` matrices as they lie; contiguous (NCHW) ones are ``N`` matrices ``(C, H*W)``: the forward
and dX a batched GEMM with the weights shared, dW a GEMM per image accumulated in place; for images
of few pixels (:data:`ACCUMULATE_FROM`) dW one GEMM over channel-major copies of both, and the
forward and dX of a wide layer (:data:`COPIES_MIN_CHANNELS`) one GEMM over a copy too.
On an Intel core (an Emerald Rapids guest, 2 cores, 2026-12-01) MKL's sgemm ran ResNet-50's and
MobileNetV2's 1x1 layers 1.1-2x faster than both the package's cube and oneDNN's 1x1 convolution
(ResNet-50's 512 -> 128 on 28x28, N=8, channels-last: forward / dX / dW 3.3 / 3.3 / 3.2 ms against the
cube's 4.4 / 5.3 / 6.9); on AMD's cores it was the slowest of the three (Zen 4, an earlier
session: 84-133 GFLOP/s against 138-182), where the timing should leave it unused.

A second BLAS way is a weight-bound layer's dW (:func:`.backward.weight_bound`: megabytes of
weights over a few dozen output pixels): one GEMM ``dW (O, C*kh*kw) = dy (O, P) @ cols (P,
C*kh*kw)``, dy's rows over the input's im2col columns (``F.unfold``, a copy the size of the pixels' patches,
not of the weights), its dX PyTorch's convolution (:func:`column_gradients`). ResNet-18's 512 ->
512 3x3 on 2x2 maps at N=8 (9.4 MB of weights, 32 pixels; the Sapphire Rapids-class guest,
2026-12-06): dW 0.90 ms hot, 0.97 with its caches emptied, against the package's cube 1.15 / 1.57
and PyTorch's convolution 2.54 / 2.93; its forward and dX that way lost to both (1.22 / 1.84 ms
hot against 1.10-1.17 / 1.13-1.26).

Results are laid out as PyTorch's convolution lays them: the input's memory format for the
forward's output and dX, the weight's shape for dW (and its memory format, for the columns' dW).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from . import outputs
from .kernels import is_channels_last

__all__ = ["ACCUMULATE_FROM", "COPIES_MIN_CHANNELS", "applies", "column_gradients", "columns_apply", "forward", "gradients"]

ACCUMULATE_FROM = 128
"""Fewest pixels an image has for an NCHW dW to run as a GEMM per image accumulated in place,
rather than one GEMM over channel-major copies of dy and x (the copies read and write both again).
An Emerald Rapids guest (2 cores), dX + dW at N=8, per image / copies: ResNet-50's 512 -> 256 on
28x28 16.1 / 23.0 ms, 256 -> 64 on 56x56 12.0 / 21.1, 1024 -> 256 on 14x14 9.2 / 10.8, 2048 -> 512
on 7x7 13.5 / 12.5; MobileNetV2's 96 -> 24 on 56x56 N=32 23.1 / 37.4."""


COPIES_MIN_CHANNELS = 512
"""Fewest channels on each side for an NCHW forward or dX of fewer than :data:`ACCUMULATE_FROM`
pixels an image to run as one GEMM over a channel-major copy of its operand (the result copied
back), rather than a GEMM per image of so few columns. The Emerald Rapids guest (2 cores,
2026-12-02), dX / forward ms, GEMM per image against copies: ResNet-50's 512 -> 2048 on 7x7 N=8
5.42 / 4.89 -> 3.96 / 3.58 (PyTorch's convolution 4.52 / 4.02), 2048 -> 512 5.64 / 4.91 -> 3.90 /
3.75; with fewer channels the copies cost what the wider GEMM saves or more: MobileNetV2's 960 ->
320 on 4x4 N=32 2.58 / 2.20 -> 2.59 / 2.50, 384 -> 64 on 7x7 0.62 / 0.60 -> 0.83 / 0.79."""


def _few_pixels(images: int, pixels: int) -> bool:
    """Whether a batch of several ``images`` has fewer than :data:`ACCUMULATE_FROM` ``pixels`` an image."""
    return images > 1 and pixels < ACCUMULATE_FROM


def _planar_gemm(w2: torch.Tensor, t: torch.Tensor, copies: bool) -> torch.Tensor:
    """``(N, O, H, W)`` with ``out[n] = w2 (O, C) @ t[n] (C, H*W)`` of an NCHW ``t``: a GEMM per image,
    or one GEMM over a channel-major copy of ``t`` (``copies``, see :data:`COPIES_MIN_CHANNELS`)."""
    n, c, h, w = t.shape
    if not copies:
        return torch.matmul(w2, t.reshape(n, c, h * w), out=outputs.empty((n, w2.shape[0], h * w), t.dtype, False)).view(n, -1, h, w)
    rows = torch.mm(w2, t.transpose(0, 1).reshape(c, n * h * w))
    return rows.view(-1, n, h, w).transpose(0, 1).contiguous()


def _copies(t: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether :func:`_planar_gemm` of ``w2`` over ``t`` runs over copies."""
    return _few_pixels(t.shape[0], t.shape[2] * t.shape[3]) and min(w2.shape) >= COPIES_MIN_CHANNELS


def applies(input: torch.Tensor, weight: torch.Tensor, stride, pads, groups: int) -> bool:
    """Whether the call is a float32 1x1 convolution at stride 1, unpadded and ungrouped (its
    dilation is then immaterial)."""
    return (input.dtype == torch.float32 and weight.dtype == torch.float32 and groups == 1 and tuple(weight.shape[2:]) == (1, 1)
            and tuple(stride) == (1, 1) and not any(pads))  # fmt: skip


def _pixels(t: torch.Tensor) -> torch.Tensor:
    """``(N*H*W, C)`` of an ``(N, C, H, W)`` tensor (a view where it lies channels-last)."""
    return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])


def _from_pixels(rows: torch.Tensor, n: int, h: int, w: int) -> torch.Tensor:
    """The ``(N, C, H, W)`` channels-last view of ``(N*H*W, C)`` rows."""
    return rows.view(n, h, w, rows.shape[1]).permute(0, 3, 1, 2)


def forward(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], channels_last: bool) -> torch.Tensor:
    """The convolution ``(N, O, H, W)`` of a call :func:`applies` to, in the input's layout (no
    autograd history: the callers' formulas are their own)."""
    input, weight = input.detach(), weight.detach()  # (see gradients)
    n, c, h, w = input.shape
    w2 = weight.reshape(weight.shape[0], c)
    if channels_last:
        x2 = _pixels(input)
        rows = outputs.empty((x2.shape[0], w2.shape[0]), input.dtype, False)
        return _from_pixels(torch.mm(x2, w2.t(), out=rows) if bias is None else torch.addmm(bias, x2, w2.t(), out=rows), n, h, w)
    y = _planar_gemm(w2, input, _copies(input, w2))
    if bias is not None:
        y += bias[:, None, None]
    return y


def _planar_weight_grad(dy3: torch.Tensor, x3: torch.Tensor) -> torch.Tensor:
    """dW ``(O, C) = sum_n dy3[n] @ x3[n]^T`` of NCHW tensors seen as ``(N, O, H*W)`` and ``(N, C,
    H*W)``: a GEMM per image accumulated in place where an image has at least
    :data:`ACCUMULATE_FROM` pixels (both operands as they lie), else one GEMM over channel-major
    copies of both (a GEMM of few pixels a step runs below MKL's speed)."""
    if _few_pixels(x3.shape[0], x3.shape[2]):
        return torch.mm(dy3.transpose(0, 1).reshape(dy3.shape[1], -1), x3.transpose(0, 1).reshape(x3.shape[1], -1).t())
    rows = torch.mm(dy3[0], x3[0].t())
    for image in range(1, x3.shape[0]):
        rows.addmm_(dy3[image], x3[image].t())
    return rows


def gradients(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, channels_last: bool) -> Callable[[bool, bool], tuple]:
    """The call's gradients as a function of which to compute, ``(dx, dw) -> (dX or None, dW or
    None)`` (as :func:`.backward.pytorch_gradients`), for a call :func:`applies` to.

    The tensors are read detached: ``torch.matmul`` of a tensor that requires grad takes another
    way even under ``no_grad`` (ResNet-50's 512 -> 256 on 28x28, N=8, NCHW, with the module's
    weight: dX + dW 21.7 against 16.4 ms detached)."""
    grad_output, input, weight = grad_output.detach(), input.detach(), weight.detach()
    n, c, h, w = input.shape
    o = weight.shape[0]
    w2 = weight.reshape(o, c)

    def grads(dx: bool, dw: bool) -> tuple:
        grad_input = grad_weight = None
        if channels_last:
            dy2 = _pixels(grad_output)
            if dx:
                grad_input = _from_pixels(torch.mm(dy2, w2, out=outputs.empty((dy2.shape[0], c), dy2.dtype, False)), n, h, w)
            if dw:
                grad_weight = torch.mm(dy2.t(), _pixels(input)).view(o, c, 1, 1)
            return grad_input, grad_weight
        dy3 = grad_output.reshape(n, o, h * w)
        if dx:
            grad_input = _planar_gemm(w2.t(), grad_output, _copies(grad_output, w2))
        if dw:
            grad_weight = _planar_weight_grad(dy3, input.reshape(n, c, h * w)).view(o, c, 1, 1)
        return grad_input, grad_weight

    return grads


def columns_apply(input: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    """Whether :func:`column_gradients` can take the call: float32 tensors, ungrouped (the caller
    asks :func:`.backward.weight_bound` whether it should be timed)."""
    return input.dtype == torch.float32 and weight.dtype == torch.float32 and groups == 1


def _column_weight_grad(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride, padding,
                        dilation) -> torch.Tensor:  # fmt: skip
    """dW ``(O, C, kh, kw)`` as one GEMM of dy's ``(O, N*Ho*Wo)`` rows over the input's im2col
    columns ``(N*Ho*Wo, C*kh*kw)``, ordered ``(kh, kw, C)`` where the weight is channels-last so
    that the GEMM writes dW in the weight's layout."""
    n, c = input.shape[:2]
    o, _, kh, kw = weight.shape
    cols = F.unfold(input, (kh, kw), dilation, padding, stride)  # (N, C*kh*kw, Ho*Wo)
    channels_last = is_channels_last(weight)
    cols = cols.view(n, c, kh * kw, -1).permute(0, 3, 2, 1) if channels_last else cols.transpose(1, 2)
    rows = torch.mm(grad_output.transpose(0, 1).reshape(o, -1), cols.reshape(-1, c * kh * kw))
    return rows.view(o, kh, kw, c).permute(0, 3, 1, 2) if channels_last else rows.view(o, c, kh, kw)


def column_gradients(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride, pads, dilation,
                     theirs: Callable[[bool, bool], tuple]) -> Callable[[bool, bool], tuple]:  # fmt: skip
    """The call's gradients as :func:`gradients` makes them, for a call :func:`columns_apply` to
    whose pads are even (``pads = (top, bottom, left, right)``): dW over the im2col columns
    (:func:`_column_weight_grad`), dX by ``theirs`` (:func:`.backward.pytorch_gradients`)."""
    grad_output, input, weight = grad_output.detach(), input.detach(), weight.detach()  # (see gradients)
    padding = (pads[0], pads[2])

    def grads(dx: bool, dw: bool) -> tuple:
        grad_input = theirs(True, False)[0] if dx else None
        grad_weight = _column_weight_grad(grad_output, input, weight, tuple(stride), padding, tuple(dilation)) if dw else None
        return grad_input, grad_weight

    return grads
