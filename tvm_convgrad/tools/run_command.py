"""``tvm-convgrad run`` and ``demo``'s shared steps: build one operator's kernel for any call,
check every element against its float64 reference, time it (:func:`run`, :func:`report`).

The TBE DSL's three functions (``--op filter | input | forward``) take the forward convolution's
NCHW / OIHW shapes; the framework operators (:data:`FRAMEWORK_OPS`) their own tensors and
attribute names as flags."""

from __future__ import annotations

import argparse
import time

from .. import dsl, layout
from ..compile import Kernel, build
from ..dsl.compute import cube_util
from ..errors import ConvGradError
from ..params import out_size
from ..params.rules import Rules
from ..params.tbe_op import resolve_pads
from ..tvm import placeholder
from .verify import check_kernel

__all__ = ["ALGORITHM_OPS", "DATA_OPS", "FRAMEWORK_OPS", "flag", "report", "run", "timed_build"]


def report(title: str, kernel: Kernel, compile_s: float, repeat: int) -> bool:
    print(f"{title}")
    print(f"  kernel   {kernel!r}")
    print(f"  compile  {compile_s:.2f} s")
    if kernel.target.kind.name == "cuda" and not kernel.has_device:
        print(f"  PTX      {len(kernel.ptx)} chars, GPU kernels {kernel.ptx_entries} (not run: no CUDA device here)")
        return True
    check = check_kernel(kernel)
    print(f"  check    {check}")
    print(f"  time     {kernel.time(repeat=repeat)}")
    return check.ok


def timed_build(tensor, target: str) -> tuple[Kernel, float]:
    start = time.perf_counter()
    kernel = build(tensor, target)
    return kernel, time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    if args.op in FRAMEWORK_OPS:
        result, described = _framework_result(args)
        kernel, seconds = timed_build(result, args.target)
        return 0 if report(f"[{args.op}] {described}", kernel, seconds, args.repeat) else 1
    (n, cin, h, w), filter_sizes = _given(args, "input", "filter")
    if len(filter_sizes) != 4:
        raise ConvGradError(f"tvm-convgrad run --op {args.op}", "--filter", filter_sizes, "must be 4 comma-separated ints (Cout,Cin_g,KH,KW)")
    cout, cin_g, kh, kw = filter_sizes
    sh, sw = _pair(args, "strides", 1)
    dh, dw = _pair(args, "dilations", 1)
    pads = resolve_pads(Rules("tvm-convgrad run", {}), args.pads, (h, w), (kh, kw), (sh, sw), (dh, dw))
    ho = max(out_size(h, kh, sh, pads[0], pads[1], dh), 1)  # the DSL names an impossible geometry
    wo = max(out_size(w, kw, sw, pads[2], pads[3], dw), 1)
    dy = placeholder(layout.shape_5hd(n, cout, ho, wo), name="out_backprop", dtype="float16")
    para = {"strides": [sh, sw], "padding": pads, "dilations": [1, 1, dh, dw]}
    if args.res_dtype:
        para["res_dtype"] = args.res_dtype
    if args.op == "forward":  # TBE's conv: the fmap and the FracZ weight in, (N, C1, Ho*Wo, 16) float16 out
        data = placeholder(layout.shape_5hd(n, cin, h, w), name="data", dtype="float16")
        weight = placeholder(layout.shape_fracz((cout, cin_g, kh, kw), args.groups), name="weight", dtype="float16")
        conv_para = {"pad_h": list(pads[:2]), "pad_w": list(pads[2:]), "stride_h": sh, "stride_w": sw, "dilate_h": dh, "dilate_w": dw,
                     "filter_h": kh, "filter_w": kw, "group": args.groups, "weight_ori_shape_nchw": [cout, cin_g, kh, kw]}  # fmt: skip
        if args.bias:
            conv_para["bias_tensor"] = placeholder((cout,), name="bias", dtype="float16")
        result = dsl.conv(data, weight, conv_para)
    elif args.op == "filter":
        x = placeholder(layout.shape_5hd(n, cin, h, w), name="input_x", dtype="float16")
        result = dsl.conv2d_backprop_filter(x, dy, [cout, cin_g, kh, kw], {**para, "groups": args.groups})
    else:
        para["group_dict"] = cube_util.calculate_group([cout, cin_g, kh, kw], args.groups)  # checked by the DSL
        filters = placeholder(layout.shape_fracz((cout, cin_g, kh, kw), args.groups), name="filters", dtype="float16")
        result = dsl.conv2d_backprop_input(filters, dy, [cout, cin_g, kh, kw], [n, cin, h, w], para)
    geometry = f"x {args.input}, w {args.filter}, strides {(sh, sw)}, pads {tuple(pads)}, dilations {(dh, dw)}, groups {args.groups}"
    kernel, seconds = timed_build(result, args.target)
    name = "conv" if args.op == "forward" else f"conv2d_backprop_{args.op}"
    return 0 if report(f"[{name}] {geometry}", kernel, seconds, args.repeat) else 1


def _pair(args: argparse.Namespace, name: str, default: int) -> tuple[int, int]:
    """A TBE ``run`` attribute of the two spatial axes: one int for both, or two."""
    values = list(getattr(args, name) or (default,))
    values = values * 2 if len(values) == 1 else values
    if len(values) != 2:
        raise ConvGradError(f"tvm-convgrad run --op {args.op}", flag(name), values, "must be 1 or 2 comma-separated ints (H, W)")
    return values[0], values[1]


FRAMEWORK_OPS = {
    # --op: (x, dy, weights shape, weights format, its default) in the operator's own names
    "convolution_backprop_filters": ("input_forward", "output_delta", "filter_shape", "filter_format", "XIO"),
    "convolution_backward_weights": ("src", "diff_dst", "weights_shape", "weights_format", "XIO"),
    "conv_transpose_backward_weights": ("src", "diff_dst", "weights_shape", "weights_format", "XOI"),
    "deconv_grad_filter": ("dy", "x", "params", None, None),
    # the input gradients: (dy, weights, the optional diff_src shape, weights format, its default)
    "convolution_backward_data": ("diff_dst", "weights", "dst_shape", "weights_format", "XIO"),
    "convolution_backprop_data": ("output_delta", "filter", "output_shape", "filter_format", "XIO"),
    # the forward: (src, weights, -, weights format, its default)
    "convolution": ("src", "weights", None, "weights_format", "XIO"),
}
"""The framework operators ``run`` takes, each with its own argument names as flags."""

DATA_OPS = ("convolution_backward_data", "convolution_backprop_data")
ALGORITHM_OPS = ("convolution_backward_data", "convolution_backward_weights")
"""The gradient operators that take ``--algorithm`` (and ``convolution``, the forward)."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(args: argparse.Namespace, *names: str) -> list:
    for name in names:
        if getattr(args, name) is None:
            raise ConvGradError(f"tvm-convgrad run --op {args.op}", flag(name), None, "is required")
    return [list(getattr(args, name)) for name in names]


def _per_axis(args: argparse.Namespace, name: str, nd: int) -> list[int] | None:
    """An attribute given as one int (for every spatial axis) or as one per axis."""
    values = getattr(args, name)
    if values is None:
        return None
    return list(values) * nd if len(values) == 1 else list(values)


def _forward_result(args: argparse.Namespace):
    """oneDNN's ``Convolution``: ``--src`` and ``--weights`` (and ``--bias``) in ``--dtype``."""
    from tvm import te

    from ..frontends import onednn

    src_shape, w_shape = _given(args, "src", "weights")
    nd = len(src_shape) - 2
    attrs = {name: _per_axis(args, name, nd) for name in ("strides", "pads_begin", "pads_end", "dilations")}
    attrs = {"strides": [1] * nd, "dilations": [1] * nd, "pads_begin": [0] * nd, "pads_end": [0] * nd, **{k: v for k, v in attrs.items() if v},
             "auto_pad": args.auto_pad, "groups": args.groups, "data_format": args.data_format, "weights_format": args.weights_format or "XIO"}  # fmt: skip
    src = te.placeholder(src_shape, args.dtype, name="src")
    weights = te.placeholder(w_shape, args.dtype, name="weights")
    out_channels = w_shape[-1] if attrs["weights_format"] == "XIO" else w_shape[0]
    bias = te.placeholder((out_channels,), args.dtype, name="bias") if args.bias else None
    attrs["algorithm"] = args.algorithm
    described = ", ".join(f"{k} {v}" for k, v in attrs.items())
    return onednn.convolution(src, weights, bias, **attrs), f"src {src_shape}, weights {w_shape}, bias {bias is not None}, {described}, {args.dtype}"


def _framework_result(args: argparse.Namespace):
    """``(result, description)`` of a framework operator's call: placeholders of the given shapes
    in ``--dtype``, the attributes under the operator's own names."""
    from tvm import te

    from ..frontends import dsp, onednn

    x_name, dy_name, shape_name, format_name, default_format = FRAMEWORK_OPS[args.op]
    if args.op == "convolution":
        return _forward_result(args)
    if args.op == "deconv_grad_filter":
        (params,) = _given(args, "params")
        dy = te.placeholder(params[4:8], args.dtype, name="dy") if len(params) == 18 else None
        x = te.placeholder(params[0:4], args.dtype, name="x") if len(params) == 18 else None
        return dsp.deconv_grad_filter(dy, x, params, args.dtype), f"params {params}, {args.dtype}"
    x_shape, dy_shape = _given(args, x_name, dy_name)
    weights = list(getattr(args, shape_name)) if getattr(args, shape_name) is not None else None
    if weights is None and args.op not in DATA_OPS:
        _given(args, shape_name)
    nd = len(x_shape) - 2
    attrs = {name: _per_axis(args, name, nd) for name in ("strides", "pads_begin", "pads_end", "dilations", "output_padding")}
    with_padding = ("conv_transpose_backward_weights", *DATA_OPS)
    attrs = {k: v for k, v in attrs.items() if v is not None and (k != "output_padding" or args.op in with_padding)}
    attrs = {"strides": [1] * nd, "dilations": [1] * nd, "pads_begin": [0] * nd, "pads_end": [0] * nd, **attrs, "auto_pad": args.auto_pad,
             "groups": args.groups, "data_format": args.data_format, format_name: getattr(args, format_name) or default_format}  # fmt: skip
    if args.op in ALGORITHM_OPS:
        attrs["algorithm"] = args.algorithm
    elif args.algorithm != "direct":
        raise ConvGradError(args.op, "algorithm", args.algorithm, f"only {', '.join(ALGORITHM_OPS)} and convolution take it")
    x = te.placeholder(x_shape, args.dtype, name=x_name)
    dy = te.placeholder(dy_shape, args.dtype, name=dy_name)
    result = getattr(onednn, args.op)(x, dy, weights, **attrs)
    described = ", ".join(f"{k} {v}" for k, v in attrs.items())
    return result, f"{x_name} {x_shape}, {dy_name} {dy_shape}, {shape_name} {weights}, {described}, {args.dtype}"
