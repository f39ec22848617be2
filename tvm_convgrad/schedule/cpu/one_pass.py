"""What the kernels written out as TIR share: the one-pass kernels' arguments (a layer's dX and dW on
one read of dy: :mod:`.depthwise_backward`, :mod:`.pointwise_backward`), in the order the drop-in's
nodes pass them (``torch/native.cpp``'s kernel 3), and the sum of the cores' dW parts; the forward
kernels' arguments (:mod:`.pointwise_forward`, :mod:`.depthwise_forward`, :mod:`.weight_stream`)."""

from __future__ import annotations

from tvm.tirx.script import builder as T

__all__ = ["forward_arguments", "kernel_arguments", "parts_total"]


def _named(name: str) -> None:
    """Inside an open ``T.prim_func()`` frame: the function's name and attributes."""
    T.func_name(name)
    T.func_attr({"global_symbol": name, "tirx.noalias": True})


def forward_arguments(name: str, x_shape: tuple, w_shape: tuple, y_shape: tuple, bias: bool) -> tuple:
    """Inside an open ``T.prim_func()`` frame: the function's name and attributes, and its float32
    arguments ``(x, w, bias, y)``, as the package's forward kernels take them (``bias``: ``(O,)``, the
    weight's first dimension in every layout, or None where there is none)."""
    _named(name)
    x = T.arg("x", T.buffer(x_shape, "float32"))
    w = T.arg("w", T.buffer(w_shape, "float32"))
    b = T.arg("bias", T.buffer((w_shape[0],), "float32")) if bias else None
    return x, w, b, T.arg("y", T.buffer(y_shape, "float32"))


def kernel_arguments(name: str, x_shape: tuple, dy_shape: tuple, w_shape: tuple) -> tuple:
    """Inside an open ``T.prim_func()`` frame: the function's name and attributes, and its float32
    arguments ``(x, dy, w, dx, dw)``; dX has x's shape, dW the weight's."""
    _named(name)
    shapes = {"x": x_shape, "dy": dy_shape, "w": w_shape, "dx": x_shape, "dw": w_shape}
    return tuple(T.arg(arg, T.buffer(shape, "float32")) for arg, shape in shapes.items())


def parts_total(sums, cores: int, at: tuple):
    """``sums[0, *at] + ... + sums[cores - 1, *at]``, in that order: every run's dW the same bits."""
    total = sums[(0, *at)]
    for part in range(1, cores):
        total = total + sums[(part, *at)]
    return total
