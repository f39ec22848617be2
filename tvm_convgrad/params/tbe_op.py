"""The rules of TBE's operators ``Conv2DBackpropFilterD`` / ``Conv2DBackpropInputD`` (spec §2.3, §3.3
"op-level"): tensors described by ``{"ori_shape", "ori_format", "dtype"}`` dicts in NCHW / NHWC /
HWCN, strides and dilations in ``data_format`` order, pads as a list or ``"SAME"`` / ``"VALID"``.

They translate an operator call into the DSL's arguments (5HD / FracZ shapes, ``filter_sizes``,
``para_dict``); the DSL rules (:mod:`.tbe_dsl`) then check the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .. import layout
from ..layout import align
from .rules import Rules, is_int
from .tbe_dsl import FILTER_ORI_FORMATS, group_dict_of

__all__ = ["OpArgs", "filter_op_args", "input_op_args", "resolve_pads"]

FILTER_OP_NAME = "Conv2DBackpropFilterD"
INPUT_OP_NAME = "Conv2DBackpropInputD"
DATA_FORMATS = ("NCHW", "NHWC")
OP_DIM_MAX = 1_000_000
_CODES = {"type": "E60107", "length": "E60107", "value": "E60107"}


@dataclass(frozen=True)
class OpArgs:
    """DSL arguments of an operator call: placeholder shapes/dtypes and the DSL's own arguments."""

    shapes: tuple[tuple[int, ...], ...]  # DSL input placeholders, in DSL argument order
    dtypes: tuple[str, ...]
    filter_sizes: tuple[int, int, int, int]
    input_sizes: tuple[int, int, int, int] | None
    para_dict: dict[str, Any]


def _to_nchw(shape: Sequence[int], fmt: str) -> tuple[int, int, int, int]:
    """An ori shape in ``fmt`` (NCHW / NHWC / HWCN) as ``(N, C, H, W)``."""
    index = {axis: shape[i] for i, axis in enumerate(fmt)}
    return (index["N"], index["C"], index["H"], index["W"])


def _tensor(r: Rules, name: str, desc: Any, formats: Sequence[str]) -> tuple[tuple[int, int, int, int], str]:
    """``(NCHW shape, dtype)`` of an operator tensor dict."""
    r.keys(name, desc, ("ori_shape", "ori_format", "dtype", "shape", "format"), required=("ori_shape", "ori_format", "dtype"))
    fmt = r.choice(f"{name}['ori_format']", desc["ori_format"], formats, None)
    shape = desc["ori_shape"]
    if not isinstance(shape, (list, tuple)) or len(shape) != 4:
        r.fail(f"{name}['ori_shape']", shape, "must be 4-D", "E60107")
    for d in shape:
        if not is_int(d) or not 1 <= d <= OP_DIM_MAX:
            r.fail(f"{name}['ori_shape']", shape, f"every dimension must be an int in [1, {OP_DIM_MAX}]", "E60107")
    return _to_nchw(tuple(int(d) for d in shape), fmt), desc["dtype"]


def _hw_attr(r: Rules, name: str, value: Any, data_format: str) -> tuple[int, int, int, int]:
    """A 4-int attribute in ``data_format`` order, as ``(n, c, h, w)``."""
    if not isinstance(value, (list, tuple)) or len(value) != 4 or not all(is_int(v) for v in value):
        r.fail(name, value, f"must be 4 ints in data_format ({data_format}) order", "E60107")
    return _to_nchw(tuple(int(v) for v in value), data_format)


def resolve_pads(
    r: Rules, pads: Any, in_hw: Sequence[int], k_hw: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> list[int]:
    """``[top, bottom, left, right]`` from a 4-list or TBE's ``"SAME"`` / ``"VALID"``.

    SAME: ``total = max(align(in, s) - s + (k-1)*d + 1 - in, 0)``, ``top = total // 2``.
    """
    if isinstance(pads, str):
        if pads == "VALID":
            return [0, 0, 0, 0]
        if pads == "SAME":
            out = []
            for size, k, s, d in zip(in_hw, k_hw, strides, dilations):
                total = max(align(size, s) - s + (k - 1) * d + 1 - size, 0)
                out += [total // 2, total - total // 2]
            return out
        r.fail("pads", pads, 'must be a list of 4 ints, "SAME" or "VALID"', "E60021")
    if not isinstance(pads, (list, tuple)) or len(pads) != 4 or not all(is_int(p) for p in pads):
        r.fail("pads", pads, 'must be a list of 4 ints [top, bottom, left, right], "SAME" or "VALID"', "E60107")
    return [int(p) for p in pads]


def _window_attrs(r: Rules, strides, dilations, pads, data_format: str, in_hw, kernel_hw) -> tuple[list, list, list]:
    """``(strides [sh, sw], dilations [n, c, dh, dw], padding [t, b, l, r])`` in the DSL's form."""
    _, _, sh, sw = _hw_attr(r, "strides", strides, data_format)
    dilation_nchw = _hw_attr(r, "dilations", dilations, data_format)
    return [sh, sw], list(dilation_nchw), resolve_pads(r, pads, in_hw, kernel_hw, (sh, sw), dilation_nchw[2:])


def _groups(r: Rules, groups: Any, x_c: int, dy_c: int, filter_n: int, filter_c: int, x_param: str):
    """Op-level group checks (UDC / OPW): divisibility and channel consistency."""
    if not is_int(groups) or groups < 1:
        r.fail("groups", groups, "must be a positive int", "E60108")
    if x_c % groups:
        r.fail("groups", groups, f"must divide the channels of {x_param}, C = {x_c}", "E60108")
    if dy_c % groups:
        r.fail("groups", groups, f"must divide the channels of out_backprop, C = {dy_c}", "E60108")
    if dy_c != filter_n:
        r.fail("out_backprop['ori_shape']", dy_c, f"channels must equal the filter's N = {filter_n}", "E64002")
    if x_c != filter_c * groups:
        r.fail(x_param, x_c, f"channels must equal filter C * groups = {filter_c}*{groups}", "E64002")


def filter_op_args(
    x: dict, out_backprop: dict, y: dict, filter_size: Sequence[int], strides: Sequence[int], pads: Any,
    dilations: Sequence[int], groups: int, data_format: str, kernel_name: str,
) -> OpArgs:  # fmt: skip
    """``Conv2DBackpropFilterD`` -> arguments of ``dsl.conv2d_backprop_filter``."""
    r = Rules(FILTER_OP_NAME, _CODES)
    r.choice("data_format", data_format, DATA_FORMATS, None)
    x_nchw, x_dtype = _tensor(r, "x", x, DATA_FORMATS)
    dy_nchw, dy_dtype = _tensor(r, "out_backprop", out_backprop, DATA_FORMATS)
    y_nchw, y_dtype = _tensor(r, "y", y, FILTER_ORI_FORMATS)
    if not isinstance(filter_size, (list, tuple)) or tuple(filter_size) != tuple(y["ori_shape"]):
        r.fail("filter_size", filter_size, f"must equal y's ori_shape {tuple(y['ori_shape'])}", "E64002")
    cout, cin_g, kh, kw = y_nchw
    stride_hw, dilation_nchw, padding = _window_attrs(r, strides, dilations, pads, data_format, x_nchw[2:], (kh, kw))
    _groups(r, groups, x_nchw[1], dy_nchw[1], cout, cin_g, "x['ori_shape']")
    r.choice("y['dtype']", y_dtype, ("float32",), None)
    para_dict = {
        "strides": stride_hw,
        "padding": padding,
        "dilations": dilation_nchw,
        "groups": int(groups),
        "res_dtype": y_dtype,
        "kernel_name": kernel_name,
    }
    shapes = (layout.shape_5hd(*x_nchw), layout.shape_5hd(*dy_nchw))
    return OpArgs(shapes, (x_dtype, dy_dtype), y_nchw, None, para_dict)


def input_op_args(
    filter: dict, out_backprop: dict, y: dict, input_size: Sequence[int], strides: Sequence[int], pads: Any,
    dilations: Sequence[int], groups: int, data_format: str, kernel_name: str,
) -> OpArgs:  # fmt: skip
    """``Conv2DBackpropInputD`` -> arguments of ``dsl.conv2d_backprop_input``."""
    r = Rules(INPUT_OP_NAME, _CODES)
    r.choice("data_format", data_format, DATA_FORMATS, None)
    w_nchw, w_dtype = _tensor(r, "filter", filter, FILTER_ORI_FORMATS)
    dy_nchw, dy_dtype = _tensor(r, "out_backprop", out_backprop, DATA_FORMATS)
    _, dx_dtype = _tensor(r, "y", y, DATA_FORMATS)
    # input_size is dX's shape (in y's format), as in TBE: y lends only its format and dtype.
    if not isinstance(input_size, (list, tuple)) or len(input_size) != 4 or not all(is_int(v) for v in input_size):
        r.fail("input_size", input_size, f"must be 4 ints in y's ori_format ({y['ori_format']}) order", "E60107")
    dx_nchw = _to_nchw(tuple(int(v) for v in input_size), y["ori_format"])
    r.choice("filter['dtype']", w_dtype, ("float16", "int8"), "E60011")
    r.choice("out_backprop['dtype']", dy_dtype, ("float16", "int8"), "E60011")
    if w_dtype == dy_dtype:  # (a mismatch is the DSL's E65002)
        if w_dtype == "int8":
            r.fail("filter['dtype']", w_dtype, "int8 (quantized) dX is not implemented by tvm_convgrad; use float16")
        r.choice("y['dtype']", dx_dtype, ("float16",), "E60011")
    cout, cin_g, kh, kw = w_nchw
    stride_hw, dilation_nchw, padding = _window_attrs(r, strides, dilations, pads, data_format, dx_nchw[2:], (kh, kw))
    _groups(r, groups, dx_nchw[1], dy_nchw[1], cout, cin_g, "input_size")
    filter_sizes = (cout, cin_g, kh, kw)
    ext = layout.group_extension(cin_g, cout // groups, groups)
    para_dict = {
        "strides": stride_hw,
        "padding": padding,
        "dilations": dilation_nchw,
        "res_dtype": dx_dtype,
        "kernel_name": kernel_name,
        "group_dict": group_dict_of(ext, filter["ori_format"]),
    }
    shapes = (layout.shape_fracz(filter_sizes, groups), layout.shape_5hd(*dy_nchw))
    return OpArgs(shapes, (w_dtype, dy_dtype), filter_sizes, dx_nchw, para_dict)
