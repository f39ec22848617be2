"""What the one-pass kernels share (a layer's dX and dW on one read of dy, their loops written out
as TIR: :mod:`.depthwise_backward`, :mod:`.pointwise_backward`): their arguments, in the order the
drop-in's nodes pass them (``torch/native.cpp``'s kernel 3), and the sum of the cores' dW parts."""

from __future__ import annotations

from tvm.tirx.script import builder as T

__all__ = ["kernel_arguments", "parts_total"]


def kernel_arguments(name: str, x_shape: tuple, dy_shape: tuple, w_shape: tuple) -> tuple:
    """Inside an open ``T.prim_func()`` frame: the function's name and attributes, and its float32
    arguments ``(x, dy, w, dx, dw)``; dX has x's shape, dW the weight's."""
    T.func_name(name)
    T.func_attr({"global_symbol": name, "tirx.noalias": True})
    shapes = {"x": x_shape, "dy": dy_shape, "w": w_shape, "dx": x_shape, "dw": w_shape}
    return tuple(T.arg(arg, T.buffer(shape, "float32")) for arg, shape in shapes.items())


def parts_total(sums, cores: int, at: tuple):
    """``sums[0, *at] + ... + sums[cores - 1, *at]``, in that order: every run's dW the same bits."""
    total = sums[(0, *at)]
    for part in range(1, cores):
        total = total + sums[(part, *at)]
    return total
