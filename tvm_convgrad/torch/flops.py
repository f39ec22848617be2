"""FLOP formulas of the package's three operators for ``torch.utils.flop_counter.FlopCounterMode``.

Under a dispatch mode such as ``FlopCounterMode`` the drop-in's calls go through the operators
(:func:`.ops.eager`), which the counter knows nothing of: a model of drop-ins counted 0 FLOPs where
the same model of ``nn.Conv2d`` counts its convolutions. Each formula here is PyTorch's own
(``torch.utils.flop_counter.conv_flop_count``, as its ``aten.convolution`` and
``aten.convolution_backward`` formulas call it), so a model counts the same FLOPs either way, a
gradient only where it is computed. Shapes: ``input (N, C, H, W)``, ``weight (O, C/groups, KH, KW)``,
``grad_output (N, O, HO, WO)``; registered when :mod:`tvm_convgrad.torch` is imported.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import conv_flop_count, register_flop_formula

from . import ops  # noqa: F401  (defines the operators registered below)

__all__ = ["conv2d_flop", "input_grad_flop", "weight_grad_flop"]


def _channels_first(shape) -> list[int]:
    """``shape`` with its first two axes swapped (PyTorch's dW count reads dW as a convolution of
    ``x`` over ``dy``, batch and channels exchanged)."""
    return [shape[1], shape[0], *shape[2:]]


@register_flop_formula(torch.ops.tvm_convgrad.conv2d)
def conv2d_flop(input_shape, weight_shape, *args, out_shape, **kwargs) -> int:
    """The forward: ``aten.convolution``'s count (the bias not counted)."""
    return conv_flop_count(input_shape, weight_shape, out_shape)


@register_flop_formula(torch.ops.tvm_convgrad.conv2d_input_grad)
def input_grad_flop(grad_output_shape, weight_shape, *args, out_shape, **kwargs) -> int:
    """dX: ``aten.convolution_backward``'s count of its ``grad_input``, a transposed convolution of dy."""
    return conv_flop_count(grad_output_shape, weight_shape, out_shape, transposed=True)


@register_flop_formula(torch.ops.tvm_convgrad.conv2d_weight_grad)
def weight_grad_flop(grad_output_shape, input_shape, *args, out_shape, **kwargs) -> int:
    """dW: ``aten.convolution_backward``'s count of its ``grad_weight``."""
    return conv_flop_count(_channels_first(input_shape), _channels_first(grad_output_shape), _channels_first(out_shape))
