"""TBE DSL calls from a plain description of the forward convolution: the dict of
``tests/test_sweep.py``'s cases and of the random property sweeps (``n``, ``cin``, ``h``, ``w``,
``cout``, ``k``, ``strides``, ``pads``, ``dilations``, ``groups``, ``res_dtype``, ``bias``)."""

from __future__ import annotations

from tvm_convgrad import dsl, layout
from tvm_convgrad.dsl.compute import cube_util
from tvm_convgrad.params import out_size
from tvm_convgrad.tvm import placeholder

__all__ = ["case_id", "dw_result", "dx_result", "geometry"]


def case_id(c: dict) -> str:
    g = c["groups"]
    return (
        f"n{c['n']}_c{c['cin']}-{c['cout']}_g{g}_{c['h']}x{c['w']}_k{c['k'][0]}x{c['k'][1]}"
        f"_s{c['strides'][0]}{c['strides'][1]}_d{c['dilations'][0]}{c['dilations'][1]}"
        f"_p{''.join(map(str, c['pads']))}_{c['res_dtype'][5:]}{'_bias' if c['bias'] else ''}"
    )


def geometry(c: dict):
    kh, kw = c["k"]
    ho = out_size(c["h"], kh, c["strides"][0], c["pads"][0], c["pads"][1], c["dilations"][0])
    wo = out_size(c["w"], kw, c["strides"][1], c["pads"][2], c["pads"][3], c["dilations"][1])
    filter_sizes = [c["cout"], c["cin"] // c["groups"], kh, kw]
    para = {"strides": list(c["strides"]), "padding": c["pads"], "dilations": [1, 1, *c["dilations"]], "res_dtype": c["res_dtype"]}
    dy = placeholder(layout.shape_5hd(c["n"], c["cout"], ho, wo), name="dy", dtype="float16")
    return filter_sizes, para, dy


def dw_result(case: dict):
    """dW of a sweep case (fp16 5HD inputs)."""
    filter_sizes, para, dy = geometry(case)
    x = placeholder(layout.shape_5hd(case["n"], case["cin"], case["h"], case["w"]), name="x", dtype="float16")
    return dsl.conv2d_backprop_filter(x, dy, filter_sizes, {**para, "groups": case["groups"]})


def dx_result(case: dict):
    """dX of a sweep case (fp16 FracZ filters and 5HD dy; a float32 bias when the case has one)."""
    filter_sizes, para, dy = geometry(case)
    filters = placeholder(layout.shape_fracz(filter_sizes, case["groups"]), name="filters", dtype="float16")
    para["group_dict"] = cube_util.calculate_group(filter_sizes, case["groups"])
    if case["bias"]:
        para["tensor_bias"] = placeholder((case["cin"],), name="bias", dtype="float32")
    return dsl.conv2d_backprop_input(filters, dy, filter_sizes, [case["n"], case["cin"], case["h"], case["w"]], para)
