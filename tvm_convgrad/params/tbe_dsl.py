"""The rules of TBE's DSL functions ``conv2d_backprop_filter`` / ``conv2d_backprop_input``.

Spec §2.3 and §3.3, in TBE's order, with TBE's error codes. Rules that depend on the Ascend chip
(L1 buffer size, SoC-specific load3d cases, fusion buffers) do not apply off the chip.
"""

from __future__ import annotations

from typing import Any

from ..layout import C0, GroupExtension, align, ceil_div, group_extension
from .geometry import FILTER_OP, INPUT_OP, ConvGeometry, ConvGradParams, out_size
from .rules import Rules, is_int

__all__ = [
    "filter_grad_params",
    "input_grad_params",
    "group_dict_of",
    "check_group_dict",
    "GROUP_DICT_KEYS",
    "FILTER_ORI_FORMATS",
]

# TBE's limits (tbe_spec.md §2.3 and §3.3).
DW_KERNEL_MAX = 255  # KH, KW outside DMA mode
DW_STRIDE_MAX = 63  # strides outside DMA mode
DW_PAD_MAX = 255  # pads outside DMA mode
DILATION_MAX = 255
H_MAX = 200_000
W_MAX = 4096
W_MAX_LIFTED = 2**31 - 1  # conv1d / w-split / DMA cases
ADDR_MAX = 2**63 - 1

_DW_CODES = {"type": "E64004", "length": "E64003", "value": "E64004"}
_DX_CODES = {"type": "E65001", "length": "E60006", "value": "E60114"}


def _check_addressing(r: Rules, param: str, nbytes: int):
    if nbytes > ADDR_MAX:
        r.fail(param, nbytes, "tensor size in bytes must be <= 2**63-1 (64-bit addressing)", "E60020")



_DW_KEYS = (
    "strides", "padding", "dilations", "groups", "res_dtype", "kernel_name",
    "correct_range_flag", "ori_tensors", "op_type", "is_binary_flag", "attrs",
)  # fmt: skip
DW_DEFAULT_KERNEL_NAME = "conv2d_backprop_filter_cce"


def _check_kernel_reach(r: Rules, hw, kernel, pads, dilations, codes):
    """The dilated kernel fits in the padded input: ``(K-1)*d+1 <= size + pads`` (per axis)."""
    for axis, (size, k, before, after, d, code) in enumerate(zip(hw, kernel, pads[::2], pads[1::2], dilations, codes)):
        name, what = ("H", "height") if axis == 0 else ("W", "width")
        if (k - 1) * d + 1 > size + before + after:
            r.fail(f"filter_sizes[{2 + axis}]", k, f"dilated kernel {what} (K{name}-1)*dilation+1 = {(k - 1) * d + 1} "
                   f"must be <= {name}+pads = {size + before + after}", code)  # fmt: skip


def _check_output_size(r: Rules, hw, out_hw, kernel, strides, pads, dilations, codes):
    """dy's Ho / Wo equal the forward convolution's output size."""
    for axis, (size, out, k, s, before, after, d, code) in enumerate(
        zip(hw, out_hw, kernel, strides, pads[::2], pads[1::2], dilations, codes)
    ):
        expect = out_size(size, k, s, before, after, d)
        if out != expect:
            name = "HW"[axis]
            r.fail(f"out_backprop.shape[{2 + axis}]", out, f"{name}o must be ({name}+pads-dilated K{name})//stride+1 = {expect}", code)


def filter_grad_params(input_x, out_backprop, filter_sizes, para_dict) -> ConvGradParams:
    """Validate TBE ``conv2d_backprop_filter`` arguments (spec §2.2, §2.3)."""
    r = Rules(FILTER_OP, _DW_CODES)
    r.tensor("input_x", input_x)
    r.tensor("out_backprop", out_backprop)
    r.keys("para_dict", para_dict, _DW_KEYS)
    r.flag_off("para_dict['is_binary_flag']", para_dict.get("is_binary_flag", False), "binary (dynamic-shape) mode")
    r.flag_off("para_dict['correct_range_flag']", para_dict.get("correct_range_flag", False), "dynamic-shape range correction")

    # Check 1: dtypes, integer lists, shapes and channel consistency.
    x_dtype, dy_dtype = str(input_x.dtype), str(out_backprop.dtype)
    if x_dtype != dy_dtype:
        r.fail("out_backprop.dtype", dy_dtype, f"must equal input_x.dtype ({x_dtype})", "E60038")
    r.choice("input_x.dtype", x_dtype, ("float16",), "E60005")
    res_dtype = r.choice("para_dict['res_dtype']", para_dict.get("res_dtype", "float32"), ("float32", "float16"), "E60005")
    kernel_name = r.kernel_name("para_dict['kernel_name']", para_dict.get("kernel_name", DW_DEFAULT_KERNEL_NAME))
    cout, cin_g, kh, kw = r.ints("filter_sizes", filter_sizes, 4, lo=1)
    sh, sw = r.ints("para_dict['strides']", para_dict.get("strides", [1, 1]), 2, lo=1)
    pads = r.ints("para_dict['padding']", para_dict.get("padding", [0, 0, 0, 0]), 4, lo=0)
    dil_n, dil_c, dh, dw = r.ints("para_dict['dilations']", para_dict.get("dilations", [1, 1, 1, 1]), 4, lo=1)
    groups = r.int_value("para_dict['groups']", para_dict.get("groups", 1), lo=1)
    n, c1x, h, w, x_c0 = r.static_shape("input_x.shape", input_x, 5, "E64003")
    n_dy, c1y, ho, wo, dy_c0 = r.static_shape("out_backprop.shape", out_backprop, 5, "E64003")
    if dy_c0 != C0:
        r.fail("out_backprop.shape[4]", dy_c0, f"C0 must be {C0} for float16", "E64002")
    if x_c0 != C0:
        r.fail("input_x.shape[4]", x_c0, f"C0 must be {C0} for float16", "E64002")
    if c1y * C0 != align(cout, C0):
        r.fail("out_backprop.shape[1]", c1y, f"must be ceil(Cout/16) = {ceil_div(cout, C0)} for filter_sizes[0] = Cout = {cout}", "E64002")
    cin = groups * cin_g
    if c1x * C0 != align(cin, C0):
        r.fail("input_x.shape[1]", c1x, f"must be ceil(groups*Cin_g/16) = {ceil_div(cin, C0)} for groups = {groups}, filter_sizes[1] = Cin_g = {cin_g}", "E64002")
    if n_dy != n:
        r.fail("out_backprop.shape[0]", n_dy, f"batch must equal input_x.shape[0] = {n}", "E64002")

    # Check 2: dilations, groups, kernel reach, output size.
    if (dil_n, dil_c) != (1, 1):
        r.fail("para_dict['dilations']", [dil_n, dil_c, dh, dw], "the N and C dilations must be 1", "E60023")
    r.in_range("para_dict['dilations'][2]", dh, 1, DILATION_MAX, "E64001", "dilation_h ")
    r.in_range("para_dict['dilations'][3]", dw, 1, DILATION_MAX, "E64001", "dilation_w ")
    if cout % groups:
        r.fail("para_dict['groups']", groups, f"must divide Cout = filter_sizes[0] = {cout}", "E60108")
    _check_kernel_reach(r, (h, w), (kh, kw), pads, (dh, dw), ("E60014", "E60015"))
    _check_output_size(r, (h, w), (ho, wo), (kh, kw), (sh, sw), pads, (dh, dw), ("E60024", "E60025"))

    # Limits. Kernel > 255, stride > 63 and pad > 255 are TBE's DMA mode, which needs dilation 1.
    dma = (dh, dw) == (1, 1)
    suffix = " (larger values need dilations of 1: TBE's DMA mode)"
    if not dma:
        r.in_range("filter_sizes[2]", kh, 1, DW_KERNEL_MAX, "E64001", f"KH{suffix} ")
        r.in_range("filter_sizes[3]", kw, 1, DW_KERNEL_MAX, "E64001", f"KW{suffix} ")
        r.in_range("para_dict['strides'][0]", sh, 1, DW_STRIDE_MAX, "E64001", f"stride_h{suffix} ")
        r.in_range("para_dict['strides'][1]", sw, 1, DW_STRIDE_MAX, "E64001", f"stride_w{suffix} ")
        for i, (name, p) in enumerate(zip(("pad_top", "pad_bottom", "pad_left", "pad_right"), pads)):
            r.in_range(f"para_dict['padding'][{i}]", p, 0, DW_PAD_MAX, "E64001", f"{name}{suffix} ")
    r.in_range("input_x.shape[2]", h, 1, H_MAX, "E64001", "H ")
    r.in_range("out_backprop.shape[2]", ho, 1, H_MAX, "E64001", "Ho ")
    r.in_range("input_x.shape[3]", w, 1, W_MAX_LIFTED, "E64001", "W ")
    r.in_range("out_backprop.shape[3]", wo, 1, W_MAX_LIFTED, "E64001", "Wo ")
    _check_addressing(r, "out_backprop.shape", n * c1y * ho * wo * C0 * 2)
    _check_addressing(r, "input_x.shape", n * c1x * h * w * C0 * 2)
    _check_addressing(r, "filter_sizes", c1x * kh * kw * c1y * C0 * C0 * 4)

    geom = ConvGeometry(n, cin, h, w, cout, kh, kw, ho, wo, (sh, sw), pads, (dh, dw), groups)
    return ConvGradParams(FILTER_OP, geom, x_dtype, res_dtype, kernel_name)


# ---------------------------------------------------------------------------------------------
# conv2d_backprop_input (dX)
# ---------------------------------------------------------------------------------------------

_DX_KEYS = (
    "strides", "padding", "dilations", "res_dtype", "tensor_bias", "offset_x", "offset_w",
    "fusion_para", "kernel_name", "group_dict", "is_fusion_flag", "pooling_mode", "impl_mode",
    "binary_mode", "ori_tensors", "correct_range_flag", "op_type",
)  # fmt: skip
DX_DEFAULT_KERNEL_NAME = "conv2d_backprop_input_cce"
GROUP_DICT_KEYS = (
    "groups", "g_extend", "multiple_extend", "dx_c1_extend", "dy_c1_extend",
    "dx_c_ori", "dy_c_ori", "filter_batch_ori", "filter_c_ori", "filter_ori_format",
)  # fmt: skip
FILTER_ORI_FORMATS = ("NCHW", "NHWC", "HWCN")


def group_dict_of(ext: GroupExtension, filter_ori_format: str = "NCHW") -> dict[str, Any]:
    """TBE's dX ``group_dict`` (cube_util ``GroupDictKeys``) for a group extension."""
    return {
        "groups": ext.groups,
        "g_extend": ext.g_extend,
        "multiple_extend": ext.multiple,
        "dx_c1_extend": ext.cin1_g,
        "dy_c1_extend": ext.cout1_g,
        "dx_c_ori": ext.cin_g,
        "dy_c_ori": ext.cout_g,
        "filter_batch_ori": ext.cout_g,
        "filter_c_ori": ext.cin_g,
        "filter_ori_format": filter_ori_format,
    }


def check_group_dict(r: Rules, group_dict: Any, ext: GroupExtension):
    """A given ``group_dict`` must hold exactly what the shapes imply (``calculate_group``)."""
    r.keys("para_dict['group_dict']", group_dict, GROUP_DICT_KEYS, required=GROUP_DICT_KEYS)
    r.choice("para_dict['group_dict']['filter_ori_format']", group_dict["filter_ori_format"], FILTER_ORI_FORMATS, "E65007")
    expected = group_dict_of(ext, group_dict["filter_ori_format"])
    for key in GROUP_DICT_KEYS:
        if group_dict[key] != expected[key]:
            r.fail(
                f"para_dict['group_dict'][{key!r}]",
                group_dict[key],
                f"must be {expected[key]!r}, as computed by cube_util.calculate_group from "
                f"filter_sizes and groups = {ext.groups}",
                "E65007",
            )


def input_grad_params(filters, out_backprop, filter_sizes, input_sizes, para_dict) -> ConvGradParams:
    """Validate TBE ``conv2d_backprop_input`` arguments (spec §3.2, §3.3)."""
    r = Rules(INPUT_OP, _DX_CODES)
    r.tensor("filters", filters)
    r.tensor("out_backprop", out_backprop)
    r.keys("para_dict", para_dict, _DX_KEYS, required=("strides", "padding", "dilations"))
    r.flag_off("para_dict['binary_mode']", para_dict.get("binary_mode", False), "binary (dynamic-shape) mode")
    r.flag_off("para_dict['correct_range_flag']", para_dict.get("correct_range_flag", False), "dynamic-shape range correction")
    if para_dict.get("pooling_mode") is not None:
        r.fail("para_dict['pooling_mode']", para_dict["pooling_mode"], "must be None: avg_pool_grad fusion is not supported")

    # 1. dtypes (TBE's sets first, then equality, then what this package implements).
    w_dtype, dy_dtype = str(filters.dtype), str(out_backprop.dtype)
    r.choice("filters.dtype", w_dtype, ("float16", "int8"), "E60011")
    r.choice("out_backprop.dtype", dy_dtype, ("float16", "int8"), "E60011")
    if w_dtype != dy_dtype:
        r.fail("out_backprop.dtype", dy_dtype, f"must equal filters.dtype ({w_dtype})", "E65002")
    if w_dtype == "int8":
        r.fail("filters.dtype", "int8", "int8 (quantized) dX is not implemented by tvm_convgrad; use float16")
    res_dtype = r.choice("para_dict['res_dtype']", para_dict.get("res_dtype", "float16"), ("float16", "float32"), "E60011")
    kernel_name = r.kernel_name("para_dict['kernel_name']", para_dict.get("kernel_name", DX_DEFAULT_KERNEL_NAME))

    # 2. ranks and integer lists.
    fz_shape = r.static_shape("filters.shape", filters, 4, "E65003")
    n_dy, c1y, ho, wo, dy_c0 = r.static_shape("out_backprop.shape", out_backprop, 5, "E65003")
    cout, cin_g, kh, kw = r.ints("filter_sizes", filter_sizes, 4, lo=1)
    n, cin, h, w = r.ints("input_sizes", input_sizes, 4, lo=1)
    sh, sw = r.ints("para_dict['strides']", para_dict["strides"], 2, lo=1)
    pads = r.ints("para_dict['padding']", para_dict["padding"], 4, lo=0)
    dil_n, dil_c, dh, dw = r.ints("para_dict['dilations']", para_dict["dilations"], 4, lo=1)

    # 3. offsets.
    if para_dict.get("offset_w") is not None:
        r.fail("para_dict['offset_w']", para_dict["offset_w"], "must be None", "E65004")
    offset_x = para_dict.get("offset_x", 0)
    if not is_int(offset_x):
        r.fail("para_dict['offset_x']", offset_x, "must be an int", "E65001")
    if offset_x != 0:
        r.fail("para_dict['offset_x']", offset_x, "must be 0 for float16 inputs (it is the int8 quantization offset of dy)")

    # Groups: from group_dict when given (and checked), else implied by the shapes.
    group_dict = para_dict.get("group_dict")
    if group_dict is not None:
        r.keys("para_dict['group_dict']", group_dict, GROUP_DICT_KEYS, required=GROUP_DICT_KEYS)
        groups = r.int_value("para_dict['group_dict']['groups']", group_dict["groups"], lo=1)
    else:
        if cin % cin_g:
            r.fail("input_sizes[1]", cin, f"Cin must be a multiple of filter_sizes[1] = Cin_g = {cin_g} (groups = Cin/Cin_g)", "E60108")
        groups = cin // cin_g
    if cin != groups * cin_g:
        r.fail("input_sizes[1]", cin, f"Cin must be groups*Cin_g = {groups}*{cin_g} = {groups * cin_g}", "E65007")
    if cout % groups:
        r.fail("filter_sizes[0]", cout, f"Cout must be a multiple of groups = {groups}", "E60108")
    ext = group_extension(cin_g, cout // groups, groups)
    if group_dict is not None:
        check_group_dict(r, group_dict, ext)

    bias = para_dict.get("tensor_bias")
    if bias is not None:
        r.channel_bias("para_dict['tensor_bias']", bias, cin, "Cin", "E60011", "E60011")

    # 4./5. dy and filter shapes.
    if dy_c0 != C0:
        r.fail("out_backprop.shape[4]", dy_c0, f"C0 must be {C0} for float16", "E65007")
    if c1y != ceil_div(cout, C0):
        r.fail("out_backprop.shape[1]", c1y, f"must be ceil(Cout/16) = {ceil_div(cout, C0)} for filter_sizes[0] = Cout = {cout}", "E65007")
    if fz_shape[2] != C0 or fz_shape[3] != C0:
        r.fail("filters.shape", fz_shape, f"FracZ blocks must be {C0}x{C0}: shape[2] = shape[3] = {C0}", "E65007")
    if fz_shape[1] != ext.cout1_g:
        r.fail("filters.shape[1]", fz_shape[1], f"must be dy_c1_extend = {ext.cout1_g} (FracZ Cout blocks)", "E65007")
    rows = ext.g_extend * ext.cin1_g * kh * kw
    if fz_shape[0] != rows:
        r.fail("filters.shape[0]", fz_shape[0], f"must be g_extend*dx_c1_extend*KH*KW = {ext.g_extend}*{ext.cin1_g}*{kh}*{kw} = {rows}", "E65007")
    _check_kernel_reach(r, (h, w), (kh, kw), pads, (dh, dw), ("E65005", "E65005"))

    # 9. dilations.
    if (dil_n, dil_c) != (1, 1):
        r.fail("para_dict['dilations']", [dil_n, dil_c, dh, dw], "the N and C dilations must be 1", "E60023")
    r.in_range("para_dict['dilations'][2]", dh, 1, DILATION_MAX, "E60011", "dilation_h ")
    r.in_range("para_dict['dilations'][3]", dw, 1, DILATION_MAX, "E60011", "dilation_w ")

    # 6. dx shape against dy.
    if n != n_dy:
        r.fail("out_backprop.shape[0]", n_dy, f"batch must equal input_sizes[0] = {n}", "E65007")
    _check_output_size(r, (h, w), (ho, wo), (kh, kw), (sh, sw), pads, (dh, dw), ("E65007", "E65007"))

    # 4./6. Size limits; the conv1d situation lifts the W limits.
    conv1d = h + pads[0] + pads[1] == 1 and kh == 1 and ho == 1
    w_max = W_MAX_LIFTED if conv1d else W_MAX
    r.in_range("input_sizes[2]", h, 1, H_MAX, "E60011", "dx H ")
    r.in_range("input_sizes[3]", w, 1, w_max, "E60011", "dx W ")
    r.in_range("out_backprop.shape[2]", ho * sh, 1, H_MAX, "E60011", "Ho*stride_h ")
    dy_w_filled = wo * sw * (sh if (kh, kw) == (1, 1) else 1)
    what = "Wo*stride_w*stride_h (1x1 kernel) " if (kh, kw) == (1, 1) else "Wo*stride_w "
    r.in_range("out_backprop.shape[3]", dy_w_filled, 1, w_max, "E60011", what)
    _check_addressing(r, "input_sizes", n * align(cin, C0) * h * w * 4)
    _check_addressing(r, "out_backprop.shape", n_dy * c1y * ho * wo * C0 * 2)
    _check_addressing(r, "filters.shape", rows * ext.cout1_g * C0 * C0 * 2)

    geom = ConvGeometry(n, cin, h, w, cout, kh, kw, ho, wo, (sh, sw), pads, (dh, dw), groups)
    return ConvGradParams(INPUT_OP, geom, w_dtype, res_dtype, kernel_name, int(offset_x), bias is not None)
