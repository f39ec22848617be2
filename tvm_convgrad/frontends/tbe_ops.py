"""TBE's operators ``Conv2DBackpropFilterD`` and ``Conv2DBackpropInputD`` on top of the DSL.

As in TBE's ``impl/conv2d_backprop_{filter,input}_d.py``: the tensors are dicts
``{"ori_shape": ..., "ori_format": "NCHW"|"NHWC"|"HWCN", "dtype": ...}``, strides and dilations
are 4-tuples in ``data_format`` order, ``pads`` is ``[top, bottom, left, right]``, ``"SAME"`` or
``"VALID"``. Each function creates the 5HD / FracZ placeholders, calls the DSL and returns the
result tensor, ready for :func:`tvm_convgrad.build`.
"""

from __future__ import annotations

from typing import Any, Sequence

from tvm import te

from .. import dsl
from ..params import filter_op_args, input_op_args

__all__ = ["conv2d_backprop_filter_d", "conv2d_backprop_input_d"]


def conv2d_backprop_filter_d(
    x: dict[str, Any],
    out_backprop: dict[str, Any],
    y: dict[str, Any],
    filter_size: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int] | str,
    dilations: Sequence[int] = (1, 1, 1, 1),
    groups: int = 1,
    data_format: str = "NCHW",
    kernel_name: str = "conv2d_backprop_filter",
) -> te.Tensor:
    """dW of TBE's ``Conv2DBackpropFilterD``: placeholders ``fmap`` / ``dedy`` (5HD), result
    ``(real_g, cin1_g*KH*KW, cout_g, 16)`` in y's dtype (float32)."""
    args = filter_op_args(x, out_backprop, y, filter_size, strides, pads, dilations, groups, data_format, kernel_name)
    fmap = te.placeholder(args.shapes[0], args.dtypes[0], name="fmap")
    dedy = te.placeholder(args.shapes[1], args.dtypes[1], name="dedy")
    return dsl.conv2d_backprop_filter(fmap, dedy, args.filter_sizes, args.para_dict)


def conv2d_backprop_input_d(
    filter: dict[str, Any],  # noqa: A002 - TBE's name
    out_backprop: dict[str, Any],
    y: dict[str, Any],
    input_size: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int] | str,
    dilations: Sequence[int] = (1, 1, 1, 1),
    groups: int = 1,
    data_format: str = "NCHW",
    kernel_name: str = "conv2d_backprop_input",
) -> te.Tensor:
    """dX of TBE's ``Conv2DBackpropInputD``: placeholders ``filter`` (FracZ_g) / ``dedy`` (5HD),
    result ``(N, ceil(Cin,16), H*W, 16)`` in y's dtype (float16)."""
    args = input_op_args(filter, out_backprop, y, input_size, strides, pads, dilations, groups, data_format, kernel_name)
    weight = te.placeholder(args.shapes[0], args.dtypes[0], name="filter")
    dedy = te.placeholder(args.shapes[1], args.dtypes[1], name="dedy")
    return dsl.conv2d_backprop_input(weight, dedy, args.filter_sizes, args.input_sizes, args.para_dict)
