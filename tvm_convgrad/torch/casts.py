"""``torch.autocast("cpu")``'s casts of a convolution's tensors, for the drop-in's calls.

The C++ node's fast path (``native.cpp``, ``fast``) makes the same casts; this is what they mirror.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["autocast_inputs"]


def autocast_inputs(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], keep_f32_weight: bool = False):
    """``(input, weight, bias, wide)``: the tensors cast as ``torch.autocast("cpu")`` casts
    ``F.conv2d``'s, to its lower-precision type, float64 left alone; but with ``keep_f32_weight``
    a float32 weight of a call cast to bf16 / f16 is kept (``wide``: see :class:`.ops.Conv2dFunction`)."""
    dtype = torch.get_autocast_dtype("cpu")

    def cast(t):
        return t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t

    input = cast(input)
    wide = keep_f32_weight and weight.dtype == torch.float32 and input.dtype in (torch.bfloat16, torch.float16)
    return input, weight if wide else cast(weight), cast(bias), wide
