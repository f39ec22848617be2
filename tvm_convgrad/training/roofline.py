"""How much faster any convolution kernel could make a training step on this host: the step's
ceiling.

Each convolution of a network (:func:`~tvm_convgrad.training.torch_backward.net_layers`) is
bounded below by its roofline on this host (:func:`measure`): the bytes it must move at the
bandwidth of a copy on PyTorch's threads, or its multiplies at ``torch.mm``'s best on squares,
whichever is longer. The forward reads ``x`` and ``w`` and writes ``y``; the backward is bounded as
one pass over ``dy`` computing dX and dW together (reads ``dy``, ``w``, ``x``; writes ``dx``,
``dw``), which no pair of separate GEMMs beats. A 3x3 layer at stride 1, undilated and ungrouped,
of whole 16-channel blocks each side, counts the multiplies of Winograd's F(2x2, 3x3)
(:data:`WINOGRAD_3X3`, the package's own way of it): the bound holds for the algorithms the
package runs, not for larger Winograd tiles. A network's input takes no dX (as in
:mod:`.torch_backward`, a layer of 3 input channels). Under bf16 autocast every tensor counts 2
bytes (a result or a weight in fp32 moves more: the bound stays a bound) and the FLOPs run at
bf16 ``torch.mm``'s best. A shared host's rates swing (an Emerald Rapids guest: copies at
12.7-52.9 GB/s, ``torch.mm`` at 188-322 GFLOP/s within one session): the step bench keeps the
fastest it measures during its run (:meth:`Roofline.best`), so a ceiling is a generous limit,
not a forecast.

If stock's step takes ``S`` ms of which its convolutions take ``C`` (the profiler's
:func:`~tvm_convgrad.training.torch_step.conv_ms`), a drop-in whose convolutions all ran at their
bound ``B`` would take ``S - C + B``: :func:`ceiling` is ``S / (S - C + B)``, the most any
``nn.Conv2d`` replacement can gain on that step without touching the other operators
(BatchNorm, activations, the optimizer) or fusing across them. The profiled steps are not the timed
ones (the profiler's overhead, their own page faults): ``C`` is the convolutions' share of the
profiled steps' time applied to ``S`` (a profiled MobileNetV2 step's convolutions had read 484 ms
against a timed step of 429, which made ``S - C + B`` 5 ms and the ceiling 77).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..layout import C0

__all__ = ["WINOGRAD_3X3", "Roofline", "backward_bound_s", "ceiling", "conv_bound_ms", "forward_bound_s", "layer_bound_s", "measure"]

WINOGRAD_3X3 = 2.25
"""Direct multiplies per multiply of F(2x2, 3x3): (2 * 2 * 9) / (4 * 4)."""


@dataclass(frozen=True)
class Roofline:
    """This host's two rates: ``bytes_per_s`` (a copy's bytes read plus written per second, every
    thread) and ``flops_per_s`` (``torch.mm``'s best) for tensors of ``element_bytes``."""

    bytes_per_s: float
    flops_per_s: float
    element_bytes: int

    def __str__(self) -> str:
        return f"copy {self.bytes_per_s / 1e9:.1f} GB/s (read + written), torch.mm {self.flops_per_s / 1e9:.0f} GFLOP/s"

    def best(self, other: "Roofline") -> "Roofline":
        """The faster of each rate of two measurements (a shared host's rates swing 2x between
        seconds: the fastest seen keeps the bound a bound)."""
        return Roofline(max(self.bytes_per_s, other.bytes_per_s), max(self.flops_per_s, other.flops_per_s), self.element_bytes)


def _best_s(fn, repeat: int) -> float:
    """The shortest of ``repeat`` timed calls of ``fn`` (after one untimed)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _copy_bytes_per_s(mib: int, repeat: int) -> float:
    """A copy's bytes read plus written per second, ``mib`` MiB into a buffer already touched (no
    page faults counted), the best of ``repeat``, on PyTorch's threads."""
    import torch

    source = torch.ones(mib << 20 >> 2)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / _best_s(lambda: target.copy_(source), repeat)


SLOW_MM_S = 0.05
"""A ``torch.mm`` call this long ends the squares' growth in :func:`measure`: the type has no fast
GEMM on this host (bf16 on an AVX2 Zen 3 took 62 s for two 2048 x 2048 squares, 0.3 GFLOP/s)."""


def _mm_flops_per_s(tensor_type, side: int, repeat: int) -> float:
    """``torch.mm``'s best rate on two squares: the side doubled from 256 up to ``side``, unless a
    call takes :data:`SLOW_MM_S` first."""
    import torch

    edge = min(256, side)
    while True:
        square = torch.randn(edge, edge).to(tensor_type)
        start = time.perf_counter()
        torch.mm(square, square)
        if edge >= side or time.perf_counter() - start >= SLOW_MM_S:
            return 2 * edge**3 / _best_s(lambda: torch.mm(square, square), repeat)
        edge = min(2 * edge, side)


def measure(dtype: str = "float32", copy_mib: tuple[int, ...] = (32, 256), side: int = 2048, repeat: int = 5) -> Roofline:
    """This host's :class:`Roofline` for ``dtype`` tensors: the fastest copy of each size in
    ``copy_mib`` (a step's activations, 1-40 MB, may stay in a large L3: an Emerald Rapids guest
    with 260 MB of it once copied 32 MiB at 27 GB/s and 256 MiB at 14 GB/s; the faster rate keeps
    the bound a bound), ``torch.mm`` of two ``side x side`` squares (smaller where the type's GEMM is
    slow here: :func:`_mm_flops_per_s`); the best of ``repeat`` each."""
    import torch

    tensor_type = getattr(torch, dtype)
    flops_per_s = _mm_flops_per_s(tensor_type, side, repeat)
    copy_rate = max(_copy_bytes_per_s(mib, repeat) for mib in copy_mib)
    return Roofline(copy_rate, flops_per_s, torch.finfo(tensor_type).bits // 8)


def _gemm(layer) -> tuple[int, int, int, float]:
    """``(x, y, w)`` elements of ``layer`` (a :class:`~tvm_convgrad.training.torch_backward.Layer`)
    and the multiplies of one of its GEMMs (x 2: FLOPs; F(2x2, 3x3)'s where it applies, see the
    module docstring)."""
    n, c, h, w = layer.input_shape
    k, s, p, d, g = layer.kernel, layer.stride, layer.padding, layer.dilation, layer.groups
    ho, wo = ((side + 2 * p - d * (k - 1) - 1) // s + 1 for side in (h, w))
    flops = 2 * n * ho * wo * layer.out_channels * (c // g) * k * k
    if (k, s, d, g) == (3, 1, 1, 1) and c % C0 == 0 and layer.out_channels % C0 == 0:
        flops /= WINOGRAD_3X3
    return n * c * h * w, n * layer.out_channels * ho * wo, layer.out_channels * (c // g) * k * k, flops


def _bound(elements: int, flops: float, roofline: Roofline) -> float:
    return max(elements * roofline.element_bytes / roofline.bytes_per_s, flops / roofline.flops_per_s)


def forward_bound_s(layer, roofline: Roofline) -> float:
    """Seconds one forward of ``layer`` takes at least on ``roofline``: reads x and w, writes y."""
    x, y, weight, flops = _gemm(layer)
    return _bound(x + weight + y, flops, roofline)


def backward_bound_s(layer, roofline: Roofline) -> float:
    """Seconds one backward of ``layer`` takes at least on ``roofline``: one pass over dy for dX and
    dW (reads dy, w, x; writes dx, dw), or for dW alone where the layer takes the network's input
    (3 channels: reads dy and x, writes dw)."""
    x, y, weight, flops = _gemm(layer)
    if layer.input_shape[1] == 3:
        return _bound(y + x + weight, flops, roofline)
    return _bound(y + weight + x + x + weight, 2 * flops, roofline)


def layer_bound_s(layer, roofline: Roofline) -> float:
    """Seconds one call of ``layer`` takes at least, forward and backward, on ``roofline``."""
    return forward_bound_s(layer, roofline) + backward_bound_s(layer, roofline)


def conv_bound_ms(layers, roofline: Roofline) -> float:
    """ms per step the convolutions of ``layers`` (each ``count`` times) take at least."""
    return sum(layer.count * layer_bound_s(layer, roofline) for layer in layers) * 1e3


def ceiling(stock_ms: float, stock_conv_ms: float, bound_ms: float, profiled_ms: float | None = None) -> float:
    """The step ratio stock / drop-in of a drop-in whose convolutions take ``bound_ms`` where
    stock's take ``stock_conv_ms`` of a profiled step of ``profiled_ms`` (None: of ``stock_ms``
    itself), that share of its timed ``stock_ms``."""
    conv_ms = stock_ms * min(1.0, stock_conv_ms / (profiled_ms or stock_ms))
    return stock_ms / (stock_ms - conv_ms + bound_ms)
