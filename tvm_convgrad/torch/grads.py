"""The package's gradient kernels run on a call's tensors: dX, dW, and a depthwise or 1x1 layer's two in
one pass (:func:`both_grads`). Tensors are passed as their memory lies (:func:`.kernels.as_layout`);
float64 ones are computed in float32 and widened back, as :mod:`.ops` says."""

from __future__ import annotations

import torch

from . import outputs
from .kernels import CallPlan, as_layout, as_weights, empty_weights

__all__ = ["both_grads", "input_grad_of", "narrow", "weight_grad_of"]


def narrow(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the type the kernels take it in (float64: float32)."""
    return t.float() if t.dtype == torch.float64 else t


def input_grad_of(plan: CallPlan, grad_output: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dX of ``plan``'s call (its live taps' weights only)."""
    call = plan.live
    if plan.taps is not None:
        weight = weight[:, :, plan.taps[0], plan.taps[1]]
    dy, w = narrow(grad_output), narrow(weight)
    out = outputs.empty(call.x_shape, dy.dtype, call.data_format == "NXC")
    plan.input_grad.function(as_layout(dy, call), as_weights(w, call), as_layout(out, call))
    return out if out.dtype == grad_output.dtype else out.to(grad_output.dtype)


def weight_grad_of(plan: CallPlan, grad_output: torch.Tensor, input: torch.Tensor, wide: bool = False) -> torch.Tensor:
    """dW of ``plan``'s call (0 for the taps that read only padding), in the call's weight layout,
    in ``input``'s type (``wide``: float32, the sums of bf16 / f16 tensors unrounded)."""
    call, x, dy = plan.live, narrow(input), narrow(grad_output)
    kernel, dtype = (plan.weight_grad_f32, torch.float32) if wide else (plan.weight_grad, x.dtype)
    if plan.taps is None:
        out = empty_weights(call.w_shape, dtype, call)
        kernel.function(as_layout(x, call), as_layout(dy, call), as_weights(out, call))
    else:  # the live taps' dW into a zero one
        out = empty_weights(plan.call.w_shape, dtype, call, zero=True)
        live = empty_weights(call.w_shape, dtype, call)
        kernel.function(as_layout(x, call), as_layout(dy, call), as_weights(live, call))
        out[:, :, plan.taps[0], plan.taps[1]] = live
    return out if wide or out.dtype == input.dtype else out.to(input.dtype)


def both_grads(plan: CallPlan, grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(dX, dW)`` of a call whose plan :attr:`~.kernels.CallPlan.fuses`, in one pass over dy."""
    call, x, dy, w = plan.call, narrow(input), narrow(grad_output), narrow(weight)
    grad_input = outputs.empty(call.x_shape, x.dtype, True)
    grad_weight = empty_weights(call.w_shape, x.dtype, call)
    plan.both(as_layout(x, call), as_layout(dy, call), as_weights(w, call), as_layout(grad_input, call),
              as_weights(grad_weight, call))  # fmt: skip
    if grad_input.dtype != input.dtype:
        return grad_input.to(input.dtype), grad_weight.to(input.dtype)
    return grad_input, grad_weight
