"""Random calls of every operator for the property sweeps (``tests/test_properties.py``).

``valid_case(op, rng)`` draws a call the operator's spec allows, over its whole parameter space:
spatial ranks 1-3 (framework operators), every data / weights format, f32 / f16 / bf16, groups and
depthwise with channel counts that are not multiples of 16, 1-wide axes, strides larger than the
kernel, dilations, asymmetric and zero pads (and pads past the kernel's reach), every auto_pad
mode and output_padding; for the data operators, also strided 3-D batches large enough for the
CPU rule's image-by-image phases. Such a call must build and match the float64 reference.

``invalid_call(op, rng)`` takes a valid call and breaks exactly one of the spec's rules; it
returns the call and the parameter its ``ConvGradError`` must name.

Operators: ``tbe_filter`` / ``tbe_input`` (the TBE DSL), ``conv`` (ConvolutionBackpropFilters),
``conv_v2`` (ConvolutionBackwardWeights), ``deconv`` (ConvTransposeBackwardWeights), ``dsp``
(DeconvGradFilter), ``data`` (ConvolutionBackwardData), ``data_v1`` (ConvolutionBackpropData), ``fwd``
(Convolution, the forward), ``tbe_conv`` (TBE's forward DSL ``conv``).
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np
from tvm import te

import framework_cases
from framework_cases import DATA_OPS, FORWARD_OP, Case, DspCase
from tbe_calls import geometry
from tvm_convgrad import dsl, layout, reference
from tvm_convgrad.dsl.compute import cube_util
from tvm_convgrad.frontends import dsp, onednn
from tvm_convgrad.schedule.cpu.loops import PER_IMAGE_ABOVE
from tvm_convgrad.tools.verify import error_bound, expected_result, kernel_arrays, post_op_bound, random_inputs
from tvm_convgrad.tvm import placeholder

__all__ = ["OPERATORS", "call_of", "inputs_and_expected", "invalid_call", "valid_case", "valid_result"]

OPERATORS = ("tbe_filter", "tbe_input", "conv", "conv_v2", "deconv", "dsp", "data", "data_v1", "fwd", "tbe_conv")
_PER_GROUP = (1, 2, 3, 5, 8, 16, 17, 20, 33)  # channels per group: below, at and past one 16-lane block
LARGE_DATA_SHARE = 0.1  # data operators' draws that are a large strided 3-D batch (:func:`_large_strided_data_case`)


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _channels(rng: np.random.Generator) -> tuple[int, int, int]:
    """``(groups, in per group, out per group)``: one group, a few, many small ones, or depthwise."""
    kind = _pick(rng, ("one", "one", "few", "many", "depthwise"))
    if kind == "depthwise":
        return int(rng.integers(1, 41)), 1, int(rng.integers(1, 3))
    if kind == "many":
        return int(_pick(rng, (7, 16, 32))), int(rng.integers(1, 6)), int(rng.integers(1, 6))
    groups = 1 if kind == "one" else int(rng.integers(2, 5))
    return groups, int(_pick(rng, _PER_GROUP)), int(_pick(rng, _PER_GROUP))


def _axis(rng: np.random.Generator, max_size: int, max_kernel: int) -> dict:
    """One spatial axis: kernel, stride (often larger than the kernel), dilation, pads (zero,
    asymmetric, or past the dilated kernel) and an input size the window fits (often 1)."""
    k, s, d = int(rng.integers(1, max_kernel + 1)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
    eff = (k - 1) * d + 1
    pb, pe = (int(rng.integers(0, eff + 2)) for _ in range(2))
    if rng.random() < 0.3:
        pb, pe = 0, 0
    low = max(1, eff - pb - pe)
    size = low if rng.random() < 0.2 else int(rng.integers(low, low + max_size))
    return {"k": k, "s": s, "d": d, "pb": pb, "pe": pe, "size": size, "eff": eff}


# ---------------------------------------------------------------------------------------------
# TBE DSL
# ---------------------------------------------------------------------------------------------


def _tbe_case(rng: np.random.Generator, op: str) -> dict:
    """A ``tests/tbe_calls.py`` case dict (fp16 inputs)."""
    groups, cin_g, cout_g = _channels(rng)
    h, w = _axis(rng, 9, 5), _axis(rng, 9, 5)
    return {
        "n": int(rng.integers(1, 4)), "cin": groups * cin_g, "h": h["size"], "w": w["size"], "cout": groups * cout_g,
        "k": (h["k"], w["k"]), "strides": (h["s"], w["s"]), "pads": [h["pb"], h["pe"], w["pb"], w["pe"]],
        "dilations": (h["d"], w["d"]), "groups": groups, "bias": op == "tbe_input" and bool(rng.random() < 0.25),
        "res_dtype": _pick(rng, ("float32", "float16")), "group_dict": bool(rng.random() < 0.5),
    }  # fmt: skip


def _tbe_args(case: dict, op: str) -> dict:
    """The DSL call's arguments as plain data (shapes, dtypes, lists), so one rule can be broken."""
    filter_sizes, para, dy = geometry(case)
    args = {"filter_sizes": filter_sizes, "para": para, "dy": (tuple(int(d) for d in dy.shape), "float16")}
    if op == "tbe_filter":
        args["x"] = (layout.shape_5hd(case["n"], case["cin"], case["h"], case["w"]), "float16")
        para["groups"] = case["groups"]
    else:
        args["w"] = (layout.shape_fracz(filter_sizes, case["groups"]), "float16")
        args["input_sizes"] = [case["n"], case["cin"], case["h"], case["w"]]
        if case["group_dict"]:
            para["group_dict"] = cube_util.calculate_group(filter_sizes, case["groups"])
        if case["bias"]:
            args["bias"] = ((case["cin"],), "float32")
    return args


def _tbe_call(op: str, args: dict):
    para = dict(args["para"])
    dy = placeholder(args["dy"][0], name="out_backprop", dtype=args["dy"][1])
    if op == "tbe_filter":
        x = placeholder(args["x"][0], name="input_x", dtype=args["x"][1])
        return dsl.conv2d_backprop_filter(x, dy, args["filter_sizes"], para)
    if "bias" in args:
        para["tensor_bias"] = placeholder(args["bias"][0], name="bias", dtype=args["bias"][1])
    w = placeholder(args["w"][0], name="filters", dtype=args["w"][1])
    return dsl.conv2d_backprop_input(w, dy, args["filter_sizes"], args["input_sizes"], para)


def _shape_plus(key: str, axis: int, by: int = 1):
    def change(args):
        shape = list(args[key][0])
        shape[axis] += by
        args[key] = (tuple(shape), args[key][1])

    return change


def _list_set(key: str, index, value, container: str = "para"):
    def change(args):
        target = args[container] if container else args
        seq = list(target[key])
        seq[index] = value
        target[key] = seq

    return change


def _set(key: str, value, container: str = "para"):
    def change(args):
        (args[container] if container else args)[key] = value

    return change


def _drop(key: str):
    def change(args):
        del args["para"][key]

    return change


def _too_big_kernel(axis: int):
    """A kernel that the padded input cannot hold (and the weights' FracZ rows to match it)."""

    def change(args):
        pads = args["para"]["padding"]
        size = (args["x"][0] if "x" in args else (None, None, *args["input_sizes"][2:]))[2 + axis]
        args["filter_sizes"][2 + axis] = size + pads[2 * axis] + pads[2 * axis + 1] + 1
        if "w" in args:
            args["w"] = (layout.shape_fracz(args["filter_sizes"], args["input_sizes"][1] // args["filter_sizes"][1]), args["w"][1])

    return change


_TBE_COMMON = [
    ("para_dict['strides']", _list_set("strides", 0, 0)),
    ("para_dict['strides']", _set("strides", [1])),
    ("para_dict['padding']", _list_set("padding", 3, -1)),
    ("para_dict['dilations']", _set("dilations", [1, 1, 1])),
    ("para_dict['dilations']", _list_set("dilations", 0, 2)),
    ("para_dict['res_dtype']", _set("res_dtype", "int32")),
    ("para_dict['kernel_name']", _set("kernel_name", "1st kernel")),
    ("filter_sizes", _set("filter_sizes", [16, 16, 3], None)),
    ("out_backprop.dtype", lambda a: a.__setitem__("dy", (a["dy"][0], "float32"))),
    ("out_backprop.shape", lambda a: a.__setitem__("dy", (a["dy"][0][:4], "float16"))),
    ("out_backprop.shape[0]", _shape_plus("dy", 0)),
    ("out_backprop.shape[1]", _shape_plus("dy", 1)),
    ("out_backprop.shape[2]", _shape_plus("dy", 2)),
    ("out_backprop.shape[3]", _shape_plus("dy", 3)),
    ("filter_sizes[2]", _too_big_kernel(0)),
    ("filter_sizes[3]", _too_big_kernel(1)),
]
_TBE_BREAKS = {
    "tbe_filter": _TBE_COMMON + [
        ("filter_sizes", _list_set("filter_sizes", 1, 0, None)),
        ("para_dict['groups']", _set("groups", 0)),
        ("para_dict['stride']", _set("stride", [1, 1])),
        ("input_x.shape", lambda a: a.__setitem__("x", (a["x"][0][:4], "float16"))),
        ("input_x.shape[1]", _shape_plus("x", 1)),
        ("input_x.shape[4]", lambda a: a.__setitem__("x", ((*a["x"][0][:4], 8), "float16"))),
        ("input_x.dtype", lambda a: (a.__setitem__("x", (a["x"][0], "float32")), a.__setitem__("dy", (a["dy"][0], "float32")))),
    ],
    "tbe_input": _TBE_COMMON + [
        ("filter_sizes", _list_set("filter_sizes", 1, 0, None)),
        ("para_dict['strides']", _drop("strides")),
        ("para_dict['offset_w']", _set("offset_w", 0)),
        ("para_dict['pooling_mode']", _set("pooling_mode", "AVG")),
        ("input_sizes", _set("input_sizes", [1, 16, 4], None)),
        ("filters.shape[0]", _shape_plus("w", 0)),
        ("filters.shape[1]", _shape_plus("w", 1)),
        ("filters.shape", lambda a: a.__setitem__("w", ((*a["w"][0][:3], 8), "float16"))),
        ("filters.dtype", lambda a: (a.__setitem__("w", (a["w"][0], "float32")), a.__setitem__("dy", (a["dy"][0], "float32")))),
        ("para_dict['tensor_bias'].shape", lambda a: a.__setitem__("bias", ((a["input_sizes"][1] + 17,), "float32"))),
    ],
}  # fmt: skip


def _tbe_conv_case(rng: np.random.Generator) -> dict:
    """A TBE ``conv`` call: the sweep dict plus how its ``para_dict`` spells the keys (``old``: TBE's
    ``padh`` / ``strideh`` / ...), whether it states the group fields, and a bias."""
    case = _tbe_case(rng, "tbe_conv")
    case.update(old=bool(rng.random() < 0.3), ori=bool(case["groups"] > 1 or rng.random() < 0.5), bias=bool(rng.random() < 0.4))
    return case


def _tbe_conv_args(case: dict) -> dict:
    """TBE ``conv``'s arguments as plain data: ``x`` / ``w`` ``(shape, dtype)``, ``para``, ``optim``."""
    kh, kw = case["k"]
    cin_g = case["cin"] // case["groups"]
    spell = (lambda key: key.replace("_", "")) if case["old"] else (lambda key: key)
    para = {spell("pad_h"): case["pads"][:2], spell("pad_w"): case["pads"][2:], spell("stride_h"): case["strides"][0],
            spell("stride_w"): case["strides"][1], spell("dilate_h"): case["dilations"][0], spell("dilate_w"): case["dilations"][1],
            spell("filter_h"): kh, spell("filter_w"): kw}  # fmt: skip
    cout, cin = case["cout"], case["cin"]
    if case["ori"]:
        ext = layout.group_extension(cin_g, cout // case["groups"], case["groups"])
        para.update(group=case["groups"], weight_ori_shape_nchw=[cout, cin_g, kh, kw], group_opt=ext.g_extend, c1_opt=ext.cin1_g,
                    cout1_opt=ext.cout1_g)  # fmt: skip
    else:  # TBE's ungrouped call: Cin and Cout are the blocks' 16s
        cout, cin = layout.align(cout, layout.C0), layout.align(cin, layout.C0)
    args = {"x": (layout.shape_5hd(case["n"], cin, case["h"], case["w"]), "float16"),
            "w": (layout.shape_fracz([cout, cin // case["groups"] if case["ori"] else cin, kh, kw], case["groups"] if case["ori"] else 1), "float16"),
            "para": para, "optim": None}  # fmt: skip
    if case["bias"]:
        args["bias"] = ((cout,), "float16")
    return args


def _tbe_conv_call(args: dict):
    para = dict(args["para"])
    if "bias" in args:
        para["bias_tensor"] = placeholder(args["bias"][0], name="bias", dtype=args["bias"][1])
    x = placeholder(args["x"][0], name="data", dtype=args["x"][1])
    w = placeholder(args["w"][0], name="weight", dtype=args["w"][1])
    return dsl.conv(x, w, para, args["optim"])


def _either(key: str, value):
    """Set ``key`` to ``value`` under whichever spelling the call uses."""

    def change(args):
        old = key.replace("_", "")
        args["para"][old if old in args["para"] else key] = value

    return change


def _state_ori(args: dict):
    """State ``weight_ori_shape_nchw`` where the call leaves Cout to the weight's blocks."""
    para = args["para"]
    if "weight_ori_shape_nchw" not in para:
        kernel = [para.get(key, para.get(key.replace("_", ""))) for key in ("filter_h", "filter_w")]
        para["weight_ori_shape_nchw"] = [args["w"][0][1] * layout.C0, args["x"][0][1] * layout.C0, *kernel]


def _drop_either(key: str):
    def change(args):
        args["para"].pop(key, None)
        args["para"].pop(key.replace("_", ""), None)

    return change


_TBE_CONV_BREAKS = [
    ("para_dict['pad_h']", _drop_either("pad_h")),
    ("para_dict['stride_w']", _drop_either("stride_w")),
    ("para_dict['filter_h']", _drop_either("filter_h")),
    ("para_dict['pad_h']", _either("pad_h", [1, 2, 3])),
    ("para_dict['pad_w']", _either("pad_w", [0, -1])),
    ("para_dict['pad_h']", _either("pad_h", 256)),
    ("para_dict['stride_h']", _either("stride_h", 0)),
    ("para_dict['stride_w']", _either("stride_w", 64)),
    ("para_dict['dilate_h']", _either("dilate_h", 256)),
    ("para_dict['dilate_w']", _either("dilate_w", 0)),
    ("para_dict['mad_dtype']", _set("mad_dtype", "float16")),
    ("para_dict['offset_x']", _set("offset_x", 3)),
    ("para_dict['kernel_name']", _set("kernel_name", "1st kernel")),
    ("para_dict['stride']", _set("stride", [1, 1])),
    ("para_dict['pooling_mode']", _set("pooling_mode", "MAX")),
    ("para_dict['fusion_para']", _set("fusion_para", {"l1_fusion_type": 0})),
    ("para_dict['group_opt']", _set("group_opt", 99)),
    ("para_dict['weight_ori_shape_nchw']", lambda a: a["para"].update(group=2, weight_ori_shape_nchw=[3, 1, 1])),
    ("optim_dict['c0_optim_flg']", _set("optim", {"c0_optim_flg": True}, None)),
    ("optim_dict", _set("optim", [False], None)),
    ("data.dtype", lambda a: a.__setitem__("x", (a["x"][0], "float32"))),
    ("data.dtype", lambda a: (a.__setitem__("x", (a["x"][0], "int8")), a.__setitem__("w", (a["w"][0], "int8")))),
    ("data.shape", lambda a: a.__setitem__("x", (a["x"][0][:4], "float16"))),
    ("data.shape[4]", lambda a: a.__setitem__("x", ((*a["x"][0][:4], 8), "float16"))),
    ("weight.shape[0]", _shape_plus("w", 0)),
    ("weight.shape[1]", lambda a: (_state_ori(a), _shape_plus("w", 1)(a))),  # (without the group fields it sets Cout)
    ("weight.shape", lambda a: a.__setitem__("w", ((*a["w"][0][:3], 8), "float16"))),
    ("para_dict['bias_tensor'].shape", lambda a: a.__setitem__("bias", ((a["w"][0][1] * 16 + 1,), "float16"))),
]  # fmt: skip



# ---------------------------------------------------------------------------------------------
# oneDNN Graph
# ---------------------------------------------------------------------------------------------

_ONEDNN_NAMES = {
    "conv": {"x": "input_forward", "dy": "output_delta", "shape": "filter_shape", "format": "filter_format"},
    "conv_v2": {"x": "src", "dy": "diff_dst", "shape": "weights_shape", "format": "weights_format"},
    "deconv": {"x": "src", "dy": "diff_dst", "shape": "weights_shape", "format": "weights_format"},
    "data": {"dy": "diff_dst", "w": "weights", "shape": "dst_shape", "format": "weights_format"},
    "data_v1": {"dy": "output_delta", "w": "filter", "shape": "output_shape", "format": "filter_format"},
}


def _large_strided_data_case(rng: np.random.Generator, op: str) -> Case:
    """A strided 3-D dX of a batch whose packed diff_dst is above the size where the CPU rule runs
    the stride phases image by image (``PER_IMAGE_ABOVE``): that schedule's region, which small
    draws never reach. Few channels, so that the float64 reference stays quick."""
    groups, per_x, per_dy = _pick(rng, ((1, 1, 1), (1, int(rng.integers(2, 7)), int(rng.integers(2, 7))), (int(rng.integers(2, 4)), 1, 1)))
    batch = int(rng.integers(2, 4))
    dy_blocks = -(-per_dy * groups // layout.C0)
    cells = -(-PER_IMAGE_ABOVE // (4 * layout.C0 * dy_blocks * batch)) + 1  # diff_dst positions per channel
    side = round(cells ** (1 / 3)) + 1
    axes = []
    for axis in range(3):
        k, s, d = int(rng.integers(1, 4)), int(rng.integers(2, 4)) if axis == 0 else int(rng.integers(1, 3)), 1
        pb, pe = int(rng.integers(0, k)), int(rng.integers(0, k))
        size = (side - 1) * s + k - pb - pe + int(rng.integers(0, s))  # side outputs on this axis
        axes.append({"k": k, "s": s, "d": d, "pb": pb, "pe": pe, "size": size, "eff": k})
    out = tuple((a["size"] + a["pb"] + a["pe"] - a["eff"]) // a["s"] + 1 for a in axes)
    implied = tuple((a["size"] + a["pb"] + a["pe"] - a["eff"]) % a["s"] for a in axes)
    given = _pick(rng, ("input", "attr", "none"))
    return Case(
        op, batch, per_x * groups, per_dy * groups, groups, tuple(a["size"] for a in axes), out,
        kernel=tuple(a["k"] for a in axes), strides=tuple(a["s"] for a in axes), pads_begin=tuple(a["pb"] for a in axes),
        pads_end=tuple(a["pe"] for a in axes), dilations=(1, 1, 1), data_format=_pick(rng, ("NXC", "NCX")),
        weights_format=_pick(rng, ("XIO", "OIX")), dtype=_pick(rng, ("float32", "float32", "bfloat16")),
        effective_pads=tuple(a["pb"] for a in axes), output_padding=implied if given == "none" else None, shape_given=given,
    )  # fmt: skip


def _onednn_case(rng: np.random.Generator, op: str) -> Case:
    if op in DATA_OPS and rng.random() < LARGE_DATA_SHARE:
        return _large_strided_data_case(rng, op)
    rank = int(rng.integers(1, 4))
    groups, per_x, per_dy = _channels(rng)
    mode = _pick(rng, ("none", "none", "none", "same_upper", "same_lower", "valid", "SAME_UPPER"))
    data_format = _pick(rng, ("NXC", "NCX"))
    weights_format = _pick(rng, ("XOI", "IOX") if op == "deconv" else ("XIO", "OIX"))
    dtype = _pick(rng, ("float32", "float16", "bfloat16"))
    batch = int(rng.integers(1, 4))
    max_size, max_kernel = (9, 4) if rank < 3 else (5, 3)
    for _ in range(1000):
        axes = [_axis(rng, max_size, max_kernel) for _ in range(rank)]
        if op != "deconv":
            if mode != "none":
                for a in axes:
                    a["pb"], a["pe"] = reference.auto_pad(a["size"], a["k"], a["s"], a["d"], mode.lower())
            if all(a["size"] + a["pb"] + a["pe"] >= a["eff"] for a in axes):
                break
            continue
        # ConvTranspose: the conv view's x is diff_dst (``size`` here), its dy is src.
        padding = None
        if mode != "none":  # the regular rule on the diff_dst size; src then is its conv output
            for a in axes:
                a["pb"], a["pe"] = reference.auto_pad(a["size"], a["k"], a["s"], a["d"], mode.lower())
        if any(a["size"] + a["pb"] + a["pe"] < a["eff"] for a in axes):
            continue
        if rng.random() < 0.4:  # the output_padding the sizes imply, stated
            padding = tuple((a["size"] + a["pb"] + a["pe"] - a["eff"]) % a["s"] for a in axes)
        break
    else:
        raise AssertionError("no valid draw in 1000 tries")
    out = tuple((a["size"] + a["pb"] + a["pe"] - a["eff"]) // a["s"] + 1 for a in axes)
    spatial = tuple(a["size"] for a in axes)
    given_pb = tuple(a["pb"] if mode == "none" else int(rng.integers(0, 3)) for a in axes)  # ignored with auto_pad
    given_pe = tuple(a["pe"] if mode == "none" else int(rng.integers(0, 3)) for a in axes)
    common = {"kernel": tuple(a["k"] for a in axes), "strides": tuple(a["s"] for a in axes), "pads_begin": given_pb, "pads_end": given_pe,
              "dilations": tuple(a["d"] for a in axes), "auto_pad": mode, "data_format": data_format, "weights_format": weights_format,
              "dtype": dtype, "effective_pads": tuple(a["pb"] for a in axes)}  # fmt: skip
    if op == "deconv":  # src (x of the Case) has the conv view's output size
        return Case(op, batch, per_dy * groups, per_x * groups, groups, out, spatial, output_padding=padding, **common)
    if op == FORWARD_OP:
        post_ops = _post_ops(rng) if rng.random() < 0.5 else ()
        return Case(op, batch, per_x * groups, per_dy * groups, groups, spatial, out, bias=bool(rng.random() < 0.5), post_ops=post_ops, **common)
    if op in DATA_OPS:  # the diff_src shape: given (input or attribute) or inferred from output_padding
        given = _pick(rng, ("input", "attr") if mode != "none" else ("input", "attr", "none", "none"))
        implied = tuple((a["size"] + a["pb"] + a["pe"] - a["eff"]) % a["s"] for a in axes)
        padding = None
        if given == "none" and (any(implied) or rng.random() < 0.5) or given != "none" and mode == "none" and rng.random() < 0.3:
            padding = implied
        return Case(op, batch, per_x * groups, per_dy * groups, groups, spatial, out, output_padding=padding, shape_given=given, **common)
    return Case(op, batch, per_x * groups, per_dy * groups, groups, spatial, out, **common)


_ELTWISE = (("relu", 0.0, 0.0), ("relu", 0.25, 0.0), ("clip", 0.0, 6.0), ("clip", -0.5, 0.5), ("linear", -2.0, 0.5), ("logistic", 0.0, 0.0),
            ("swish", 1.0, 0.0), ("tanh", 0.0, 0.0))  # fmt: skip


def _post_ops(rng: np.random.Generator) -> tuple:
    """One to three of oneDNN's post-ops, binary ones with a src1 broadcast one of four ways."""
    ops = []
    for _ in range(int(rng.integers(1, 4))):
        if rng.random() < 0.5:
            ops.append(_ELTWISE[int(rng.integers(len(_ELTWISE)))])
        else:
            ops.append((_pick(rng, ("add", "sub", "mul", "div", "max", "min")), 0.0, 0.0, _pick(rng, ("full", "channel", "scalar", "image"))))
    return tuple(op if len(op) == 4 else (*op, None) for op in ops)


def _effective_pads_end(case: Case) -> list[int]:
    """The pads_end the sum uses: as given, or auto_pad's on the conv view's input (src; diff_dst
    for ConvTranspose)."""
    if case.auto_pad == "none":
        return list(case.pads_end)
    size = case.dy_size if case.op == "deconv" else case.x_size
    return [reference.auto_pad(n, k, s, d, case.auto_pad.lower())[1] for n, k, s, d in zip(size, case.kernel, case.strides, case.dilations)]


def _onednn_args(case: Case) -> dict:
    args = _data_args(case) if case.op in DATA_OPS else _forward_args(case) if case.op == FORWARD_OP else _weights_args(case)
    if case.algorithm != "direct":  # (fwd, data, conv_v2: the operators that take one)
        args["attrs"]["algorithm"] = case.algorithm
    return args


def _weights_args(case: Case) -> dict:
    """A weight gradient's call: ``x`` / ``dy`` ``(shape, dtype)``, the weights ``shape``, ``attrs``."""
    attrs = {"strides": list(case.strides), "pads_begin": list(case.pads_begin), "pads_end": list(case.pads_end),
             "dilations": list(case.dilations), "auto_pad": case.auto_pad, "groups": case.groups, "data_format": case.data_format}  # fmt: skip
    if case.op == "deconv":
        attrs["output_padding"] = None if case.output_padding is None else list(case.output_padding)
    attrs[_ONEDNN_NAMES[case.op]["format"]] = case.weights_format
    return {
        "x": (case.layout_shape(case.x_channels, case.x_size), case.dtype),
        "dy": (case.layout_shape(case.dy_channels, case.dy_size), case.dtype),
        "shape": list(case.weights_shape()),
        "attrs": attrs,
        "pads": (list(case.effective_pads), _effective_pads_end(case)),
    }


def _data_args(case: Case) -> dict:
    """The data operators' call: ``dy`` / ``w`` ``(shape, dtype)``, the diff_src ``shape`` (as
    given or None) and ``shape_key`` (the input or the attribute), ``attrs``, ``case``."""
    names = _ONEDNN_NAMES[case.op]
    attrs = {"strides": list(case.strides), "pads_begin": list(case.pads_begin), "pads_end": list(case.pads_end),
             "dilations": list(case.dilations), "auto_pad": case.auto_pad, "groups": case.groups, "data_format": case.data_format,
             names["format"]: case.weights_format,
             "output_padding": None if case.output_padding is None else list(case.output_padding)}  # fmt: skip
    full = list(case.layout_shape(case.x_channels, case.x_size))
    return {
        "dy": (case.layout_shape(case.dy_channels, case.dy_size), case.dtype),
        "w": (case.weights_shape(), case.dtype),
        "shape": None if case.shape_given == "none" else full,
        "shape_key": "attr" if case.shape_given == "attr" else "input",
        "full_shape": full,
        "attrs": attrs,
        "pads": (list(case.effective_pads), _effective_pads_end(case)),
    }


def _data_call(op: str, args: dict):
    names = _ONEDNN_NAMES[op]
    dy = te.placeholder(args["dy"][0], args["dy"][1], name=names["dy"])
    w = te.placeholder(args["w"][0], args["w"][1], name=names["w"])
    shape_input, shape_attr = (args["shape"], None) if args["shape_key"] == "input" else (None, args["shape"])
    fn = onednn.convolution_backward_data if op == "data" else onednn.convolution_backprop_data
    return fn(dy, w, shape_input, **{f"{names['shape']}_attr": shape_attr}, **args["attrs"])


def _forward_args(case: Case) -> dict:
    """Convolution's call: ``x`` (src) / ``w`` / ``bias`` ``(shape, dtype)`` (bias None without), ``attrs``."""
    attrs = {"strides": list(case.strides), "pads_begin": list(case.pads_begin), "pads_end": list(case.pads_end),
             "dilations": list(case.dilations), "auto_pad": case.auto_pad, "groups": case.groups, "data_format": case.data_format,
             "weights_format": case.weights_format}  # fmt: skip
    return {
        "x": (case.layout_shape(case.x_channels, case.x_size), case.dtype),
        "w": (case.weights_shape(), case.dtype),
        "bias": ((case.dy_channels,), case.dtype) if case.bias else None,
        "post_ops": [(alg, alpha, beta, None if how is None else (case.dst_operand(how), case.dtype)) for alg, alpha, beta, how in case.post_ops],
        "attrs": attrs,
        "pads": (list(case.effective_pads), _effective_pads_end(case)),
    }


def _forward_call(args: dict):
    src = te.placeholder(args["x"][0], args["x"][1], name="src")
    w = te.placeholder(args["w"][0], args["w"][1], name="weights")
    bias = None if args["bias"] is None else te.placeholder(args["bias"][0], args["bias"][1], name="bias")
    post_ops = [onednn.PostOp(alg, None if src1 is None else te.placeholder(src1[0], src1[1], name=f"src1_{k}"), alpha, beta)
                for k, (alg, alpha, beta, src1) in enumerate(args["post_ops"])]  # fmt: skip
    return onednn.convolution(src, w, bias, post_ops=post_ops, **args["attrs"])


def _onednn_call(op: str, args: dict):
    if op in DATA_OPS:
        return _data_call(op, args)
    if op == FORWARD_OP:
        return _forward_call(args)
    names = _ONEDNN_NAMES[op]
    x = te.placeholder(args["x"][0], args["x"][1], name=names["x"])
    dy = te.placeholder(args["dy"][0], args["dy"][1], name=names["dy"])
    fn = {"conv": onednn.convolution_backprop_filters, "conv_v2": onednn.convolution_backward_weights,
          "deconv": onednn.conv_transpose_backward_weights}[op]  # fmt: skip
    return fn(x, dy, args["shape"], **args["attrs"])


def _attr_set(key: str, value):
    return lambda a: a["attrs"].__setitem__(key, value)


def _attr_item(key: str, value):
    def change(args):
        seq = list(args["attrs"][key])
        seq[-1] = value
        args["attrs"][key] = seq

    return change


def _spatial_axes(args: dict, key: str) -> list[int]:
    """The positions of the spatial axes in ``args[key]``'s shape (NCX or NXC)."""
    rank = len(args[key][0])
    return list(range(2, rank)) if args["attrs"]["data_format"] == "NCX" else list(range(1, rank - 1))


def _activation_axis_plus(key: str, channel: bool = False):
    def change(args):
        shape = list(args[key][0])
        axis = (1 if args["attrs"]["data_format"] == "NCX" else len(shape) - 1) if channel else _spatial_axes(args, key)[-1]
        shape[axis] += 1
        args[key] = (tuple(shape), args[key][1])

    return change


def _weights_kernel_too_big(op: str):
    """The last kernel axis larger than the padded input (pads as given, no auto_pad)."""

    def change(args):
        fmt, x_key = args["attrs"][_ONEDNN_NAMES[op]["format"]], "dy" if op == "deconv" else "x"
        size = args[x_key][0][_spatial_axes(args, x_key)[-1]]
        args["attrs"].update(auto_pad="none", pads_begin=args["pads"][0], pads_end=args["pads"][1])  # the other axes stay valid
        big = size + args["pads"][0][-1] + args["pads"][1][-1] + 1
        shape = args["shape"]
        shape[-1 if fmt in ("OIX", "IOX") else -3] = big

    return change


def _weights_out_plus(op: str):
    """The weight's O (output channels of the conv view) off by one."""

    def change(args):
        fmt = args["attrs"][_ONEDNN_NAMES[op]["format"]]
        index = {"OIX": 0, "XIO": -1, "IOX": 1, "XOI": -2}[fmt]
        args["shape"][index] += 1

    return change


_ATTRIBUTE_BREAKS = [  # every oneDNN operator's window attributes and groups, each broken once
    ("strides", _attr_item("strides", 0)),
    ("strides", _attr_set("strides", [1] * 4)),
    ("strides", _attr_item("strides", 1.5)),
    ("dilations", _attr_item("dilations", 0)),
    ("pads_begin", _attr_item("pads_begin", -1)),
    ("pads_end", _attr_set("pads_end", [0] * 4)),
    ("groups", _attr_set("groups", 0)),
]


def _with_shape(change: Callable) -> Callable:
    """A data-operator break that needs the diff_src shape given (as the input)."""

    def wrapped(args):
        args["shape"], args["shape_key"] = list(args["full_shape"]), "input"
        change(args)

    return wrapped


def _data_spatial_axis(args: dict) -> int:
    rank = len(args["dy"][0])
    return rank - 1 if args["attrs"]["data_format"] == "NCX" else rank - 2


def _data_kernel_too_big(args):
    """The last kernel axis larger than the padded diff_src (pads as given, no auto_pad)."""
    args["attrs"].update(auto_pad="none", pads_begin=args["pads"][0], pads_end=args["pads"][1])
    size = args["shape"][_data_spatial_axis(args)]
    w_shape = list(args["w"][0])
    w_shape[-1 if args["attrs"].get("weights_format", args["attrs"].get("filter_format")) == "OIX" else -3] = size + args["pads"][0][-1] + args["pads"][1][-1] + 1
    args["w"] = (tuple(w_shape), args["w"][1])


def _data_weights_dim_plus(index_of: dict):
    def change(args):
        fmt = args["attrs"].get("weights_format", args["attrs"].get("filter_format"))
        w_shape = list(args["w"][0])
        w_shape[index_of[fmt]] += 1
        args["w"] = (tuple(w_shape), args["w"][1])

    return change


def _data_breaks(op: str) -> list[tuple[str, Callable]]:
    n = _ONEDNN_NAMES[op]
    dy, w, shape = n["dy"], n["w"], n["shape"]
    return [
        *_ATTRIBUTE_BREAKS,
        ("data_format", _attr_set("data_format", "NHWC")),
        (n["format"], _attr_set(n["format"], "HWIO")),
        ("auto_pad", _attr_set("auto_pad", "same")),
        ("output_padding", _attr_set("output_padding", [-1] * 4)),
        ("output_padding", lambda a: a["attrs"].__setitem__("output_padding", list(a["attrs"]["strides"]))),
        (shape, _with_shape(lambda a: a.__setitem__("shape", a["shape"][:-1]))),
        (shape, _with_shape(lambda a: a["shape"].__setitem__(0, 0))),
        (shape, _with_shape(lambda a: a["shape"].__setitem__(0, a["shape"][0] + 1))),  # batch
        (shape, lambda a: (a.__setitem__("shape", None), a["attrs"].__setitem__("auto_pad", "same_upper"))),  # auto_pad needs it
        (f"{w}.shape", _with_shape(_data_weights_dim_plus({"OIX": 1, "XIO": -2}))),  # I x groups != the diff_src channels
        (f"{w}.shape", _data_weights_dim_plus({"OIX": 0, "XIO": -1})),  # O != the diff_dst channels
        (f"{dy} spatial axis", _with_shape(lambda a: a.__setitem__("dy", (tuple(d + (i == _data_spatial_axis(a)) for i, d in enumerate(a["dy"][0])), a["dy"][1])))),
        (f"{shape} spatial axis", _with_shape(_data_kernel_too_big)),
        (f"{dy}.dtype", lambda a: (a.__setitem__("dy", (a["dy"][0], "int8")), a.__setitem__("w", (a["w"][0], "int8")))),
        (f"{w}.dtype", lambda a: a.__setitem__("w", (a["w"][0], "float64"))),
        (f"{dy}.shape", lambda a: a.__setitem__("dy", ((*a["dy"][0], 1, 1, 1), a["dy"][1]))),
        (f"{w}.shape", lambda a: a.__setitem__("w", ((*a["w"][0], 1), a["w"][1]))),
    ]


def _forward_kernel_too_big(args):
    """The last kernel axis larger than the padded src (pads as given, no auto_pad)."""
    args["attrs"].update(auto_pad="none", pads_begin=args["pads"][0], pads_end=args["pads"][1])
    size = args["x"][0][_spatial_axes(args, "x")[-1]]
    w_shape = list(args["w"][0])
    w_shape[-1 if args["attrs"]["weights_format"] == "OIX" else -3] = size + args["pads"][0][-1] + args["pads"][1][-1] + 1
    args["w"] = (tuple(w_shape), args["w"][1])


def _forward_breaks() -> list[tuple[str, Callable]]:
    return [
        *_ATTRIBUTE_BREAKS,
        ("data_format", _attr_set("data_format", "NHWC")),
        ("weights_format", _attr_set("weights_format", "HWIO")),
        ("auto_pad", _attr_set("auto_pad", "same")),
        ("weights.shape", _data_weights_dim_plus({"OIX": 1, "XIO": -2})),  # I x groups != the src channels
        ("weights.shape", lambda a: a["attrs"].__setitem__("groups", a["w"][0][0 if a["attrs"]["weights_format"] == "OIX" else -1] + 1)),
        ("weights.shape", lambda a: a.__setitem__("w", ((*a["w"][0], 1), a["w"][1]))),
        ("src spatial axis", _forward_kernel_too_big),
        ("src.dtype", lambda a: (a.__setitem__("x", (a["x"][0], "int8")), a.__setitem__("w", (a["w"][0], "int8")))),
        ("weights.dtype", lambda a: a.__setitem__("w", (a["w"][0], "float64"))),
        ("src.shape", lambda a: a.__setitem__("x", ((*a["x"][0], 1, 1, 1), a["x"][1]))),
        ("bias.shape", lambda a: a.__setitem__("bias", ((_out_channels(a) + 1,), a["x"][1]))),
        ("bias.shape", lambda a: a.__setitem__("bias", ((_out_channels(a), 1), a["x"][1]))),
        ("bias.dtype", lambda a: a.__setitem__("bias", ((_out_channels(a),), "float64"))),
        ("post_ops[0].alg", lambda a: a.__setitem__("post_ops", [("gelu_erf", 0.0, 0.0, None)])),
        ("post_ops[0].alpha", lambda a: a.__setitem__("post_ops", [("clip", 1.0, 0.0, None)])),
        ("post_ops[0].beta", lambda a: a.__setitem__("post_ops", [("linear", 1.0, float("nan"), None)])),
        ("post_ops[0].src1", lambda a: a.__setitem__("post_ops", [("relu", 0.0, 0.0, ((1,), a["x"][1]))])),
        ("post_ops[0].src1", lambda a: a.__setitem__("post_ops", [("add", 0.0, 0.0, None)])),
        ("post_ops[0].src1.shape", lambda a: a.__setitem__("post_ops", [("add", 0.0, 0.0, (_per_channel(a, _out_channels(a) + 1), a["x"][1]))])),
        ("post_ops[0].src1.shape", lambda a: a.__setitem__("post_ops", [("mul", 0.0, 0.0, ((2, *a["x"][0]), a["x"][1]))])),
        ("post_ops[0].src1.dtype", lambda a: a.__setitem__("post_ops", [("max", 0.0, 0.0, ((1,), "int32"))])),
    ]  # fmt: skip


def _per_channel(args: dict, channels: int) -> tuple:
    """A src1 shape of ``channels`` on dst's channel axis (NCX ``(C, 1, .., 1)``, NXC ``(C,)``)."""
    return (channels,) + (1,) * (len(args["x"][0]) - 2) if args["attrs"]["data_format"] == "NCX" else (channels,)


def _out_channels(args: dict) -> int:
    """Convolution's OC: the weights' O."""
    return args["w"][0][0 if args["attrs"]["weights_format"] == "OIX" else -1]


def _onednn_breaks(op: str) -> list[tuple[str, Callable]]:
    if op in DATA_OPS:
        return _data_breaks(op)
    if op == FORWARD_OP:
        return _forward_breaks()
    n = _ONEDNN_NAMES[op]
    x, dy = n["x"], n["dy"]
    conv_x, conv_dy = (dy, x) if op == "deconv" else (x, dy)  # the conv view's roles
    breaks = [
        *_ATTRIBUTE_BREAKS,
        (f"{conv_x} channels", lambda a: a["attrs"].__setitem__("groups", max(a["x"][0][1], a["x"][0][-1], a["dy"][0][1], a["dy"][0][-1]) + 1)),
        ("data_format", _attr_set("data_format", "NHWC")),
        (n["format"], _attr_set(n["format"], "HWIO")),
        ("auto_pad", _attr_set("auto_pad", "same")),
        (n["shape"], lambda a: a.__setitem__("shape", a["shape"][:-1])),
        (n["shape"], lambda a: a["shape"].__setitem__(0, 0)),
        (n["shape"], lambda a: a.__setitem__("shape", None)),
        (n["shape"], _weights_out_plus(op)),
        (f"{conv_dy} spatial axis", _activation_axis_plus("x" if op == "deconv" else "dy")),
        (f"{conv_x} spatial axis", _weights_kernel_too_big(op)),
        (f"{x}.dtype", lambda a: (a.__setitem__("x", (a["x"][0], "int8")), a.__setitem__("dy", (a["dy"][0], "int8")))),
        (f"{dy}.dtype", lambda a: a.__setitem__("dy", (a["dy"][0], "float64"))),
        (f"{dy}.shape", lambda a: a.__setitem__("dy", ((a["dy"][0][0] + 1, *a["dy"][0][1:]), a["dy"][1]))),
        (f"{dy}.shape", lambda a: a.__setitem__("dy", ((*a["dy"][0], 1), a["dy"][1]))),
        (f"{x}.shape", lambda a: a.__setitem__("x", ((*a["x"][0], 1, 1, 1), a["x"][1]))),
    ]
    if op == "conv_v2":  # the result's type: the inputs' or float32, never a third
        breaks.append(("diff_weights_dtype", lambda a: a["attrs"].__setitem__("diff_weights_dtype", "float16" if a["x"][1] == "bfloat16" else "bfloat16")))
    if op == "deconv":
        breaks += [
            ("output_padding", _attr_set("output_padding", [-1] * 4)),
            ("output_padding", lambda a: a["attrs"].__setitem__("output_padding", [s for s in a["attrs"]["strides"]])),
        ]
    return breaks


# ---------------------------------------------------------------------------------------------
# DSP DeconvGradFilter
# ---------------------------------------------------------------------------------------------


def _dsp_case(rng: np.random.Generator) -> DspCase:
    groups, m, ocg = _channels(rng)
    axes = []
    for _ in range(2):
        k, s, d = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        eff, pad = (k - 1) * d + 1, int(rng.integers(0, 4))
        size = 1 if rng.random() < 0.2 else int(rng.integers(1, 7))  # x: in_h / in_w
        top = (size - 1) * s + eff - pad + s - 1  # the largest out: s - 1 rows of output padding
        if top < 1:
            pad, top = 0, (size - 1) * s + eff + s - 1
        out = int(rng.integers(max(1, top - s - 3), top + 1))  # crops (windows past dy's end) to output padding
        axes.append((size, out, k, s, pad, d))
    (in_h, out_h, kh, sh, pu, dh), (in_w, out_w, kw, sw, pl, dw) = axes
    batch = int(rng.integers(1, 4))
    params = (batch, in_h, in_w, groups * m, batch, out_h, out_w, groups * ocg, kh, kw, sh, sw, pu, pl, dh, dw, groups, 0)
    return DspCase(params, _pick(rng, ("float32", "float16")))


def _dsp_args(case: DspCase) -> dict:
    return {"params": list(case.params), "dy": (case.dy_shape, case.dtype), "x": (case.x_shape, case.dtype), "dtype": case.dtype}


def _dsp_call(args: dict):
    dy = te.placeholder(args["dy"][0], args["dy"][1], name="dy")
    x = te.placeholder(args["x"][0], args["x"][1], name="x")
    return dsp.deconv_grad_filter(dy, x, args["params"], args["dtype"])


def _param_set(index: int, value):
    return lambda a: a["params"].__setitem__(index, value)


def _dsp_out_too_big(axis: int):
    def change(args):
        p = args["params"]
        size, k, s, pad, d = p[1 + axis], p[8 + axis], p[10 + axis], p[12 + axis], p[14 + axis]
        p[5 + axis] = (size - 1) * s + (k - 1) * d + 1 - pad + s  # one row more than output padding allows
        args["dy"] = ((p[4], p[5], p[6], p[7]), args["dy"][1])

    return change


_DSP_BREAKS = [
    *[(f"params[{i}]", _param_set(i, 0)) for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16)],
    ("params[12]", _param_set(12, -1)),
    ("params[13]", _param_set(13, -2)),
    ("params[0]", lambda a: a["params"].__setitem__(0, a["params"][4] + 1)),
    ("params[3]", lambda a: a["params"].__setitem__(16, a["params"][3] + 1)),
    ("params[5]", _dsp_out_too_big(0)),
    ("params[6]", _dsp_out_too_big(1)),
    ("params", lambda a: a.__setitem__("params", a["params"][:17])),
    ("params", _param_set(8, 2.0)),
    ("dy.shape", lambda a: a.__setitem__("dy", ((*a["dy"][0][:3], a["dy"][0][3] + 1), a["dy"][1]))),
    ("x.shape", lambda a: a.__setitem__("x", ((a["x"][0][0], a["x"][0][1] + 1, *a["x"][0][2:]), a["x"][1]))),
    ("x.dtype", lambda a: a.__setitem__("x", (a["x"][0], "float16" if a["dtype"] == "float32" else "float32"))),
    ("dtype", lambda a: a.__setitem__("dtype", "bfloat16")),
]


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def valid_case(op: str, rng: np.random.Generator):
    """A valid call of ``op``: a TBE case dict, a :class:`Case` or a :class:`DspCase`."""
    if op == "tbe_conv":
        return _tbe_conv_case(rng)
    if op.startswith("tbe_"):
        return _tbe_case(rng, op)
    if op == "dsp":
        return _dsp_case(rng)
    return _onednn_case(rng, op)


def _args(op: str, case) -> dict:
    if op == "tbe_conv":
        return _tbe_conv_args(case)
    if op.startswith("tbe_"):
        return _tbe_args(case, op)
    return _dsp_args(case) if op == "dsp" else _onednn_args(case)


def call_of(op: str, args: dict):
    """The operator's result tensor for call ``args`` (see :func:`_args`)."""
    if op == "tbe_conv":
        return _tbe_conv_call(args)
    if op.startswith("tbe_"):
        return _tbe_call(op, args)
    return _dsp_call(args) if op == "dsp" else _onednn_call(op, args)


def valid_result(op: str, case, **attrs):
    """The result tensor of a valid case (``attrs``: more keyword arguments of a oneDNN operator)."""
    args = _args(op, case)
    if attrs:
        args["attrs"].update(attrs)
    return call_of(op, args)


def inputs_and_expected(op: str, case, kernel, seed: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """``(kernel inputs, float64 expected result, allowed |error|)`` of a valid case on random
    inputs drawn from ``seed`` (TBE: NCHW / OIHW arrays packed into the kernel's 5HD / FracZ)."""
    if op.startswith("tbe_"):
        params = kernel.params
        inputs = random_inputs(params, seed, kernel.inputs[2] if len(kernel.inputs) > 2 else None)
        expected = expected_result(params, inputs)
        return kernel_arrays(params, inputs), expected, error_bound(params, expected)
    if op == "dsp":
        arrays = list(case.arrays(seed))
        expected = case.expected(*(a.astype(np.float64) for a in arrays))
    else:
        arrays = list(framework_cases.arrays(case, seed))
        expected = framework_cases.expected(case, *arrays)
        if getattr(case, "post_ops", ()):
            return arrays, expected, post_op_bound(kernel.call, arrays, kernel.params, kernel.output.dtype)
        if kernel.formulation == "winograd-bf16":
            return arrays, expected, framework_cases.pair_winograd_bound(case, arrays, expected, kernel)
    return arrays, expected, error_bound(kernel.params, expected, kernel.output.dtype)


def _breaks(op: str) -> list[tuple[str, Callable]]:
    if op == "tbe_conv":
        return _TBE_CONV_BREAKS
    if op.startswith("tbe_"):
        return _TBE_BREAKS[op]
    return _DSP_BREAKS if op == "dsp" else _onednn_breaks(op)


def invalid_call(op: str, rng: np.random.Generator, index: int) -> tuple[Callable, str, str]:
    """``(make, param, what)``: a valid call of ``op`` with its ``index``-th rule (cycling)
    broken; ``make()`` must raise ``ConvGradError`` whose ``param`` starts with ``param``."""
    case = valid_case(op, rng)
    breaks = _breaks(op)
    param, change = breaks[index % len(breaks)]
    args = copy.deepcopy(_args(op, case))
    change(args)
    return (lambda: call_of(op, args)), param, f"{op} break {index % len(breaks)} ({param}) of {case!r}"

