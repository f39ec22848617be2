"""The rules of TBE's forward DSL function ``conv(data, weight, para_dict, optim_dict, dsl_flag)``.

In the order of TBE's ``conv_compute.conv`` (``check_optim_dict``, ``check_data``, ``check_weight``,
the ``para_dict`` completion, then ``check_conv_shape``), with the codes of TBE's
``error_manager_conv2d``: E60011 a value out of its range, E60108 a specific rule, E61205 a
missing ``para_dict`` key, E61603 two values that must be equal, E61602 a wrong type, E60005 a
dtype. Chip-dependent rules (the L1 buffer size, the SoC's load3d cases) do not apply off the chip.

Accepted ``para_dict`` keys: ``pad_h`` / ``pad_w`` (an int or ``[begin, end]``; TBE's older
``padh`` / ``padw``), ``stride_h`` / ``stride_w`` (``strideh`` / ``stridew``), ``filter_h`` /
``filter_w`` (``filterh`` / ``filterw``) required; ``dilate_h`` / ``dilate_w`` (``dilateh`` /
``dilatew``, default 1), ``mad_dtype`` (``"float32"``), ``offset_x`` (0), ``kernel_name``
(``"conv2d"``), ``bias_tensor``; the group fields of TBE's grouped conv2d: ``group`` (default 1),
``weight_ori_shape_nchw`` ``[Cout, Cin_g, KH, KW]`` (required with ``group > 1``; without it Cout
is the weight's ``Cout1*16``), ``group_opt`` / ``c1_opt`` / ``cout1_opt`` (checked against what
``cube_util.calculate_group`` gives), ``a_shape`` (checked against ``data``'s shape); and, only
with their "off" values, ``fusion_para`` (L1 fusion), ``padding_mode`` / ``pooling_mode`` (a
pooling fused behind the conv), ``dynamic_mode``, ``correct_range_flag``, ``new_in_range``,
``compress_index`` (compressed weights).
"""

from __future__ import annotations

from typing import Any

from ..layout import C0, ceil_div, group_extension
from .geometry import FORWARD_OP, ConvGeometry, ConvGradParams, out_size
from .rules import Rules, is_int

__all__ = ["CONV_DEFAULT_KERNEL_NAME", "conv_params"]

CONV_DEFAULT_KERNEL_NAME = "conv2d"
FMAP_H_MAX, FMAP_W_MAX = 100_000, 4096
FILTER_MAX, PAD_MAX, STRIDE_MAX, DILATE_MAX = 255, 255, 63, 255

_CODES = {"type": "E61602", "length": "E60108", "value": "E60011"}
_SPELLINGS = {  # TBE's key, its older spelling
    "pad_h": "padh", "pad_w": "padw", "stride_h": "strideh", "stride_w": "stridew",
    "dilate_h": "dilateh", "dilate_w": "dilatew", "filter_h": "filterh", "filter_w": "filterw",
}  # fmt: skip
_KEYS = (
    *_SPELLINGS, *_SPELLINGS.values(), "mad_dtype", "offset_x", "kernel_name", "bias_tensor", "group", "weight_ori_shape_nchw",
    "group_opt", "c1_opt", "cout1_opt", "a_shape", "fusion_para", "padding_mode", "pooling_mode", "dynamic_mode",
    "correct_range_flag", "new_in_range", "compress_index",
)  # fmt: skip
_OPTIM_KEYS = ("c0_optim_flg", "use_v200_c04_flg", "invalid_data_rm")


def _key(r: Rules, para_dict: dict, key: str, default: Any = None) -> Any:
    """``para_dict[key]``, else its older spelling, else ``default`` (None: required, E61205)."""
    if key in para_dict:
        return para_dict[key]
    if _SPELLINGS.get(key) in para_dict:
        return para_dict[_SPELLINGS[key]]
    if default is None:
        r.fail(f"para_dict[{key!r}]", None, f"is required (or its older spelling {_SPELLINGS[key]!r})", "E61205")
    return default


def _pads(r: Rules, key: str, value: Any) -> tuple[int, int]:
    """An int (both sides) or ``[begin, end]``."""
    if is_int(value):
        value = [value, value]
    return r.ints(f"para_dict[{key!r}]", value, 2, lo=0)


def _check_off_options(r: Rules, para_dict: dict, optim_dict: Any):
    """The options of TBE's conv that this package does not implement, each only in its "off" form."""
    if optim_dict is not None:
        r.keys("optim_dict", optim_dict, _OPTIM_KEYS, required=("c0_optim_flg",))
        if not isinstance(optim_dict["c0_optim_flg"], bool):
            r.fail("optim_dict['c0_optim_flg']", optim_dict["c0_optim_flg"], "must be a bool", "E60108")
        r.flag_off("optim_dict['c0_optim_flg']", optim_dict["c0_optim_flg"], "the C0 = 4 (c04) fmap optimization")
        r.flag_off("optim_dict['use_v200_c04_flg']", optim_dict.get("use_v200_c04_flg", False), "the v200 c04 optimization")
        r.flag_off("optim_dict['invalid_data_rm']", optim_dict.get("invalid_data_rm", False), "keeping the 16-aligned Ho*Wo rows")
    fusion = para_dict.get("fusion_para")
    if fusion is not None:
        if not isinstance(fusion, dict):
            r.fail("para_dict['fusion_para']", type(fusion).__name__, "must be a dict")
        off = {"l1_fusion_type": (-1, None), "input_memory_type": (0, None, [0], (0,)), "output_memory_type": (0, None, [0], (0,)),
               "valid_shape": ((), [], None), "slice_offset": ((), [], None)}  # fmt: skip
        for key, values in off.items():
            if fusion.get(key) not in values:
                r.fail(f"para_dict['fusion_para'][{key!r}]", fusion[key], "L1 / L2 fusion is not supported: must be its default "
                       f"({values[0]!r})")  # fmt: skip
    for key in ("padding_mode", "pooling_mode", "dynamic_mode", "new_in_range", "compress_index"):
        if para_dict.get(key) is not None:
            r.fail(f"para_dict[{key!r}]", para_dict[key], "must be None: "
                   + {"padding_mode": "a pooling fused behind the conv is not supported", "pooling_mode": "a pooling fused behind the conv is not supported",
                      "dynamic_mode": "dynamic shapes are not supported", "new_in_range": "dynamic shapes are not supported",
                      "compress_index": "compressed weights (TBE's conv_compress) are not supported"}[key])  # fmt: skip
    r.flag_off("para_dict['correct_range_flag']", para_dict.get("correct_range_flag", False), "dynamic-shape range correction")


def conv_params(data: Any, weight: Any, para_dict: Any, optim_dict: Any = None, dsl_flag: Any = True) -> ConvGradParams:
    """Validate TBE ``conv`` arguments into the forward's :class:`ConvGradParams` (inputs and
    result float16, sums in float32)."""
    r = Rules(FORWARD_OP, _CODES)
    if not isinstance(dsl_flag, bool):
        r.fail("dsl_flag", dsl_flag, "must be a bool", "E61602")
    if optim_dict is not None and not isinstance(optim_dict, dict):
        r.fail("optim_dict", type(optim_dict).__name__, "must be None or a dict with the bool 'c0_optim_flg'", "E60108")
    if not isinstance(para_dict, dict):
        r.fail("para_dict", type(para_dict).__name__, "the third input must be a dict", "E61602")
    r.keys("para_dict", para_dict, _KEYS)
    _check_off_options(r, para_dict, optim_dict)

    # check_data / check_weight: 5-D float16 fmap with C0 = 16, 4-D FracZ weight with K0 = 16.
    r.tensor("data", data)
    r.tensor("weight", weight)
    n, c1, h, w, c0 = r.static_shape("data.shape", data, 5, "E60108")
    rows, cout1, cout0, k0 = r.static_shape("weight.shape", weight, 4, "E60108")
    for name, dtype in (("data.dtype", str(data.dtype)), ("weight.dtype", str(weight.dtype))):
        if dtype == "int8":
            r.fail(name, dtype, "int8 (quantized) conv is not implemented by tvm_convgrad; use float16", "E60005")
        r.choice(name, dtype, ("float16",), "E60005")
    if c0 != C0:
        r.fail("data.shape[4]", c0, f"the last dim of the fmap must equal {C0}", "E61603")
    if k0 != C0 or cout0 != C0:
        r.fail("weight.shape", (rows, cout1, cout0, k0), f"FracZ blocks must be {C0}x{C0}: shape[2] = shape[3] = {C0}", "E61603")

    # para_dict completion (TBE's defaults and older spellings).
    pad_h = _pads(r, "pad_h", _key(r, para_dict, "pad_h"))
    pad_w = _pads(r, "pad_w", _key(r, para_dict, "pad_w"))
    sh = r.int_value("para_dict['stride_h']", _key(r, para_dict, "stride_h"), 1)
    sw = r.int_value("para_dict['stride_w']", _key(r, para_dict, "stride_w"), 1)
    dh = r.int_value("para_dict['dilate_h']", _key(r, para_dict, "dilate_h", 1), 1)
    dw = r.int_value("para_dict['dilate_w']", _key(r, para_dict, "dilate_w", 1), 1)
    kh = r.int_value("para_dict['filter_h']", _key(r, para_dict, "filter_h"), 1)
    kw = r.int_value("para_dict['filter_w']", _key(r, para_dict, "filter_w"), 1)
    r.choice("para_dict['mad_dtype']", para_dict.get("mad_dtype", "float32"), ("float32",), "E60005")
    offset_x = para_dict.get("offset_x", 0)
    if not is_int(offset_x) or offset_x != 0:
        r.fail("para_dict['offset_x']", offset_x, "must be 0 for float16 inputs (it is the int8 quantization offset)", "E60108")
    kernel_name = r.kernel_name("para_dict['kernel_name']", para_dict.get("kernel_name", CONV_DEFAULT_KERNEL_NAME))

    # Groups and channels.
    groups = r.int_value("para_dict['group']", para_dict.get("group", 1), 1)
    ori = para_dict.get("weight_ori_shape_nchw")
    if ori is None:
        if groups > 1:
            r.fail("para_dict['weight_ori_shape_nchw']", None, "is required with group > 1: [Cout, Cin_g, KH, KW]", "E61205")
        cout, cin_g = cout1 * C0, c1 * C0
    else:
        cout, cin_g, ori_kh, ori_kw = r.ints("para_dict['weight_ori_shape_nchw']", ori, 4, lo=1)
        if (ori_kh, ori_kw) != (kh, kw):
            r.fail("para_dict['weight_ori_shape_nchw']", list(ori), f"its KH, KW must equal filter_h, filter_w = {kh}, {kw}", "E61603")
        if cout % groups:
            r.fail("para_dict['weight_ori_shape_nchw'][0]", cout, f"Cout must be a multiple of group = {groups}", "E60108")
    cin = groups * cin_g
    ext = group_extension(cin_g, cout // groups, groups)
    for key, expect in (("group_opt", ext.g_extend), ("c1_opt", ext.cin1_g), ("cout1_opt", ext.cout1_g)):
        if key in para_dict and para_dict[key] != expect:
            r.fail(f"para_dict[{key!r}]", para_dict[key], f"must be {expect}, as cube_util.calculate_group gives for group = {groups}, "
                   f"Cin_g = {cin_g}, Cout = {cout}", "E61603")  # fmt: skip
    if "a_shape" in para_dict and list(para_dict["a_shape"]) != [n, c1, h, w, c0]:
        r.fail("para_dict['a_shape']", para_dict["a_shape"], f"must be data's shape {[n, c1, h, w, c0]}", "E61603")
    if c1 != ceil_div(cin, C0):
        r.fail("data.shape[1]", c1, f"must be ceil(group*Cin_g/16) = {ceil_div(cin, C0)} for weight_ori_shape_nchw Cin_g = {cin_g}, "
               f"group = {groups}", "E61603")  # fmt: skip
    if rows != ext.g_extend * ext.cin1_g * kh * kw:
        r.fail("weight.shape[0]", rows, f"must be data_shape[1]*filter_h*filter_w = group_opt*c1_opt*KH*KW = "
               f"{ext.g_extend}*{ext.cin1_g}*{kh}*{kw} = {ext.g_extend * ext.cin1_g * kh * kw}", "E61603")  # fmt: skip
    if cout1 != ext.cout1_g:
        r.fail("weight.shape[1]", cout1, f"must be cout1_opt = {ext.cout1_g} (the FracZ Cout blocks)", "E61603")

    bias = para_dict.get("bias_tensor")
    if bias is not None:
        r.channel_bias("para_dict['bias_tensor']", bias, cout, "Cout", "E60108", "E60005")

    # check_conv_shape: sizes, dilations, output size, kernel, pads, strides.
    r.in_range("data.shape[2]", h, 1, FMAP_H_MAX, "E60011", "feature map H ")
    conv1d = h == 1 and kh == 1 and pad_h == (0, 0)  # TBE's conv1d split-w lifts the W limit
    if not conv1d:
        r.in_range("data.shape[3]", w, 1, FMAP_W_MAX, "E60011", "feature map W ")
    r.in_range("para_dict['dilate_h']", dh, 1, DILATE_MAX, "E60011", "dilate_h ")
    r.in_range("para_dict['dilate_w']", dw, 1, DILATE_MAX, "E60011", "dilate_w ")
    ho, wo = out_size(h, kh, sh, *pad_h, dh), out_size(w, kw, sw, *pad_w, dw)
    if ho < 1 or wo < 1:
        r.fail("data.shape", (n, c1, h, w, c0), f"the output must be at least 1x1: (H + pads - (KH-1)*dilate_h - 1)//stride_h + 1 = {ho}, "
               f"(W + pads - (KW-1)*dilate_w - 1)//stride_w + 1 = {wo}", "E60108")  # fmt: skip
    r.in_range("para_dict['filter_h']", kh, 1, FILTER_MAX, "E60011", "kernel H ")
    r.in_range("para_dict['filter_w']", kw, 1, FILTER_MAX, "E60011", "kernel W ")
    for name, (before, after) in (("pad_h", pad_h), ("pad_w", pad_w)):
        r.in_range(f"para_dict[{name!r}]", max(before, after), 0, PAD_MAX, "E60011", f"{name} ")
    r.in_range("para_dict['stride_h']", sh, 1, STRIDE_MAX, "E60011", "stride_h ")
    r.in_range("para_dict['stride_w']", sw, 1, STRIDE_MAX, "E60011", "stride_w ")

    geom = ConvGeometry(n, cin, h, w, cout, kh, kw, ho, wo, (sh, sw), (*pad_h, *pad_w), (dh, dw), groups)
    return ConvGradParams(FORWARD_OP, geom, "float16", "float16", kernel_name, 0, bias is not None)
