"""``tvm-convgrad``: build, run and check the gradients from the command line.

* ``tvm-convgrad demo``: the two TBE documentation examples, end to end on LLVM.
* ``tvm-convgrad run --op filter|input --input N,C,H,W --filter Cout,Cin_g,KH,KW [...]``: any shape.
* ``tvm-convgrad tune [--suite resnet50|all] [--trials N] [--rpc HOST:PORT --key K] [--target llvm|cuda]
  [--out DIR]``: the bench's cases tuned on MetaSchedule over the schedule rules' space
  (:func:`tvm_convgrad.tune`; CUDA: measured on a GPU machine's RPC server, or on this machine's GPU).
* ``tvm-convgrad train [--clients relax,torch,torch-ours] [--steps N]``: a CNN trained on the digits
  dataset with the package's gradients in Relax and PyTorch (:mod:`tvm_convgrad.training`).
* ``tvm-convgrad bench [--suite resnet50|all|conv3d] [--batch 1|8] [--op filter|input|both] [--filter REGEX]
  [--isa native|avx2|avx512] [--api tbe|onednn] [--target llvm|cuda]``: the benchmark shape set against
  PyTorch's oneDNN kernels, both on one vector ISA, with the machine's measured FMA peak as the roofline
  (the ``bench`` extra); ``--api onednn`` calls ours through the oneDNN Graph frontend; ``--target cuda``:
  the tensor-core kernels against PyTorch's cuDNN on this machine's GPU (:mod:`tvm_convgrad.tools.bench.cuda`).
* ``tvm-convgrad bench --client torch [--nets resnet18,mobilenet_v2] [--sizes 8x64,32x112]
  [--layouts nchw,channels-last] [--dtypes float32,bfloat16]``: whole PyTorch training steps, stock
  ``nn.Conv2d`` against the drop-in, interleaved, with where the time goes (:mod:`tvm_convgrad.training.torch_step`).

Each builds the kernel, runs it on random data, compares every element with the float64
reference, and prints the error, the time and GFLOP/s. Bad arguments print the error message and
exit with status 2; a result outside the error bound exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from . import dsl, layout
from .training import command as training
from .training.torch_step import add_arguments as add_step_arguments
from .compile import Kernel, build
from .dsl.compute import cube_util
from .errors import ConvGradError
from .examples import SEEDS
from .params import out_size
from .params.rules import Rules
from .params.tbe_op import resolve_pads
from .isa import BENCH_ISAS
from .tools.verify import check_kernel
from .tvm import placeholder

__all__ = ["main"]

RUN_HELP = """Build one gradient, run it on random data, check every element against the float64 reference
and time it. Examples:

  tvm-convgrad run --op filter --input 8,64,56,56 --filter 64,64,3,3 --pads 1,1,1,1
  tvm-convgrad run --op input --input 1,144,28,28 --filter 144,1,3,3 --groups 144 --strides 2 --pads SAME
  tvm-convgrad run --op convolution_backprop_filters --input-forward 8,56,56,64 --output-delta 8,56,56,64 \\
      --filter-shape 3,3,64,64 --pads-begin 1 --pads-end 1
  tvm-convgrad run --op conv_transpose_backward_weights --src 2,8,7,7 --diff-dst 2,4,14,14 --weights-shape 8,4,3,3 \\
      --strides 2 --pads-begin 1 --pads-end 0 --data-format NCX --weights-format IOX --dtype bfloat16
  tvm-convgrad run --op deconv_grad_filter --params 2,8,8,4,2,15,15,6,3,3,2,2,1,1,1,1,2,0
  tvm-convgrad run --op convolution_backward_data --diff-dst 8,28,28,128 --weights 3,3,64,128 --dst-shape 8,56,56,64 \
      --strides 2 --pads-begin 1 --pads-end 1
  tvm-convgrad run --op forward --input 8,64,56,56 --filter 128,64,3,3 --strides 2 --pads 1,1,1,1 --bias
  tvm-convgrad run --op convolution --src 8,56,56,64 --weights 3,3,64,128 --strides 2 --pads-begin 1 --pads-end 1 --bias
"""


def _ints(count: int, names: str):
    """argparse type: ``count`` comma-separated ints (a single int is repeated)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {count} comma-separated ints ({names})") from None
        if len(values) == 1:
            values *= count
        if len(values) != count:
            raise argparse.ArgumentTypeError(f"{text!r} must be {count} comma-separated ints ({names})")
        return values

    return parse


def _int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated ints, any number."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of comma-separated ints") from None


def _pads(text: str):
    return text if text in ("SAME", "VALID") else _ints(4, "top,bottom,left,right")(text)


def _report(title: str, kernel: Kernel, compile_s: float, repeat: int) -> bool:
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


def _build(tensor, target: str) -> tuple[Kernel, float]:
    start = time.perf_counter()
    kernel = build(tensor, target)
    return kernel, time.perf_counter() - start


def demo(args: argparse.Namespace) -> int:
    ok = True
    for op, (module, attr) in SEEDS.items():
        result = getattr(importlib.import_module(module), attr)
        kernel, seconds = _build(result, args.target)
        ok &= _report(f"[{op}] TBE documentation example ({module})", kernel, seconds, args.repeat)
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    if args.op in FRAMEWORK_OPS:
        result, described = _framework_result(args)
        kernel, seconds = _build(result, args.target)
        return 0 if _report(f"[{args.op}] {described}", kernel, seconds, args.repeat) else 1
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
    kernel, seconds = _build(result, args.target)
    name = "conv" if args.op == "forward" else f"conv2d_backprop_{args.op}"
    return 0 if _report(f"[{name}] {geometry}", kernel, seconds, args.repeat) else 1


def _pair(args: argparse.Namespace, name: str, default: int) -> tuple[int, int]:
    """A TBE ``run`` attribute of the two spatial axes: one int for both, or two."""
    values = list(getattr(args, name) or (default,))
    values = values * 2 if len(values) == 1 else values
    if len(values) != 2:
        raise ConvGradError(f"tvm-convgrad run --op {args.op}", _flag(name), values, "must be 1 or 2 comma-separated ints (H, W)")
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(args: argparse.Namespace, *names: str) -> list:
    for name in names:
        if getattr(args, name) is None:
            raise ConvGradError(f"tvm-convgrad run --op {args.op}", _flag(name), None, "is required")
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

    from .frontends import onednn

    src_shape, w_shape = _given(args, "src", "weights")
    nd = len(src_shape) - 2
    attrs = {name: _per_axis(args, name, nd) for name in ("strides", "pads_begin", "pads_end", "dilations")}
    attrs = {"strides": [1] * nd, "dilations": [1] * nd, "pads_begin": [0] * nd, "pads_end": [0] * nd, **{k: v for k, v in attrs.items() if v},
             "auto_pad": args.auto_pad, "groups": args.groups, "data_format": args.data_format, "weights_format": args.weights_format or "XIO"}  # fmt: skip
    src = te.placeholder(src_shape, args.dtype, name="src")
    weights = te.placeholder(w_shape, args.dtype, name="weights")
    out_channels = w_shape[-1] if attrs["weights_format"] == "XIO" else w_shape[0]
    bias = te.placeholder((out_channels,), args.dtype, name="bias") if args.bias else None
    described = ", ".join(f"{k} {v}" for k, v in attrs.items())
    return onednn.convolution(src, weights, bias, **attrs), f"src {src_shape}, weights {w_shape}, bias {bias is not None}, {described}, {args.dtype}"


def _framework_result(args: argparse.Namespace):
    """``(result, description)`` of a framework operator's call: placeholders of the given shapes
    in ``--dtype``, the attributes under the operator's own names."""
    from tvm import te

    from .frontends import dsp, onednn

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
    x = te.placeholder(x_shape, args.dtype, name=x_name)
    dy = te.placeholder(dy_shape, args.dtype, name=dy_name)
    result = getattr(onednn, args.op)(x, dy, weights, **attrs)
    described = ", ".join(f"{k} {v}" for k, v in attrs.items())
    return result, f"{x_name} {x_shape}, {dy_name} {dy_shape}, {shape_name} {weights}, {described}, {args.dtype}"


def _selection(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(batches, ops)`` of the bench's and tune's ``--batch`` and ``--op``."""
    batches = (1, 8) if args.batch == "all" else (int(args.batch),)
    return batches, (("filter", "input") if args.op == "both" else (args.op,))


def tune(args: argparse.Namespace) -> int:
    """Tune the bench's cases (the TBE DSL's kernels) on MetaSchedule; records kept in ``--out``."""
    from .tools import bench as bench_module
    from .tuning import tune as tune_one

    batches, ops = _selection(args)
    cases = bench_module.load_cases(args.suite, batches, args.filter)
    if not cases:
        print(f"tvm-convgrad tune: no benchmark case matches suite={args.suite!r}, filter={args.filter!r}", file=sys.stderr)
        return 2
    runner = f"rpc://{args.rpc}/{args.key}" if args.rpc else "local"
    out = Path(args.out)
    reports, failed = [], []
    for case in cases:
        for op in ops:
            try:  # one kernel's failure does not end a long run: the others are still tuned
                report = tune_one(bench_module.tbe_result(case, op), args.target, args.trials, out / "work" / f"{case.name}.{op}", runner,
                                  database=Path(args.database) if args.database else out / "best", progress=not args.no_progress)  # fmt: skip
            except ConvGradError:  # the arguments themselves (e.g. --target cuda with no GPU and no --rpc): no kernel can tune
                raise
            except Exception as error:  # noqa: BLE001 - reported with the kernel's name, counted in the exit status
                failed.append(f"{case.name} {op}: {type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}")
                print(f"tuning {case.name} {op} failed: {failed[-1]}", file=sys.stderr)
                continue
            print(report, flush=True)
            reports.append(report)
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    if not reports:
        return 1
    geomean = bench_module.geomean([r.speedup for r in reports])
    kept = sum(r.kept for r in reports)
    print(f"{len(reports)} kernels tuned, {kept} records kept; geomean tuned/default speed {geomean:.3f}; records: {reports[0].database}")
    (out / "tune.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps([dataclasses.asdict(r) for r in reports], indent=1))
    return 1 if failed else 0


def bench(args: argparse.Namespace) -> int:
    missing = [name for name in ("matplotlib", "torch", "tqdm") if importlib.util.find_spec(name) is None]
    if missing:  # torch must not load here: the bench caps its ISA first
        print(f"tvm-convgrad bench: {missing[0]} is missing: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    if args.client == "torch":
        from .training import torch_step

        return torch_step.command(args)
    from .tools import bench as bench_module

    batches, ops = _selection(args)
    try:
        if args.target == "cuda":
            if (args.isa, args.api, args.schedule, args.dtype) != ("native", "tbe", "default", "float32"):
                raise ValueError("--target cuda times the DSL's default kernels: --isa, --api and --schedule are for the CPU")
            from .tools.bench import cuda

            cuda.main(args.suite, batches, ops, args.filter, args.rounds, Path(args.out), not args.no_progress)
            return 0
        bench_module.main(args.suite, batches, ops, args.filter, args.rounds, Path(args.out), not args.no_progress, args.isa, args.api,
                          args.schedule, args.schedules, args.dtype)  # fmt: skip
    except ValueError as err:
        print(f"tvm-convgrad bench: {err}", file=sys.stderr)
        return 2
    except bench_module.CheckFailed as err:
        print(f"tvm-convgrad bench: {err}", file=sys.stderr)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-convgrad", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser):
        p.add_argument("--target", default="llvm", choices=("llvm", "cuda"), help="llvm (this CPU) or cuda (PTX only without a GPU)")
        p.add_argument("--repeat", type=int, default=5, help="timing repeats (median reported)")

    p_demo = sub.add_parser("demo", help="build, run and check the two TBE documentation examples")
    common(p_demo)
    p_demo.set_defaults(func=demo)

    p_run = sub.add_parser("run", help="build, run and check one gradient for any shape", description=RUN_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p_run.add_argument("--op", required=True, choices=("filter", "input", "forward", *FRAMEWORK_OPS),
                       help="conv2d_backprop_filter (dW), _input (dX) or the forward conv of TBE's DSL, or a framework operator")  # fmt: skip
    p_run.add_argument("--bias", action="store_true", help="the forward (forward, convolution): with a bias input")
    tbe = p_run.add_argument_group("TBE DSL (--op filter | input | forward): the forward convolution, NCHW / OIHW")
    tbe.add_argument("--input", type=_ints(4, "N,C,H,W"), metavar="N,C,H,W", help="forward input x (= dX) shape")
    tbe.add_argument("--filter", type=_int_list, metavar="Cout,Cin_g,KH,KW",
                     help="weight shape, Cin per group (convolution_backprop_data: its filter tensor's shape)")  # fmt: skip
    tbe.add_argument("--pads", type=_pads, default=(0, 0, 0, 0), metavar="T,B,L,R|SAME|VALID")
    tbe.add_argument("--res-dtype", choices=("float32", "float16"), help="result dtype (default: float32 for dW, float16 for dX)")
    both = p_run.add_argument_group("both (one int for every spatial axis, or one per axis)")
    both.add_argument("--strides", type=_int_list, metavar="S[,S..]")
    both.add_argument("--dilations", type=_int_list, metavar="D[,D..]")
    both.add_argument("--groups", type=int, default=1)
    frame = p_run.add_argument_group("framework operators: their own tensors and attributes")
    for name in sorted({n for names in FRAMEWORK_OPS.values() for n in names[:3] if n not in ("params", "filter", None)}):
        frame.add_argument(_flag(name), dest=name, type=_int_list, metavar="SHAPE", help=f"{name} shape")
    frame.add_argument("--params", type=_int_list, metavar="P0,..,P17", help="deconv_grad_filter: its 18 params")
    frame.add_argument("--pads-begin", type=_int_list, metavar="P[,P..]")
    frame.add_argument("--pads-end", type=_int_list, metavar="P[,P..]")
    frame.add_argument("--output-padding", type=_int_list, metavar="P[,P..]", help="conv_transpose_backward_weights, the *_data operators")
    frame.add_argument("--auto-pad", default="none", help="none | same_upper | same_lower | valid")
    frame.add_argument("--data-format", default="NXC", help="NXC | NCX")
    frame.add_argument("--filter-format", help="convolution_backprop_filters: XIO (default) | OIX")
    frame.add_argument("--weights-format", help="XIO | OIX (default XIO); conv_transpose_backward_weights: XOI (default) | IOX")
    frame.add_argument("--dtype", default="float32", help="float32 | float16 | bfloat16 (deconv_grad_filter: float32 | float16)")
    common(p_run)
    p_run.set_defaults(func=run)

    p_tune = sub.add_parser("tune", help="tune the benchmark cases on MetaSchedule (local or over a TVM RPC tracker)")
    p_tune.add_argument("--suite", choices=("resnet50", "all"), default="resnet50")
    p_tune.add_argument("--batch", choices=("1", "8", "all"), default="all")
    p_tune.add_argument("--op", choices=("filter", "input", "both"), default="both")
    p_tune.add_argument("--filter", metavar="REGEX", help="only cases whose name matches")
    p_tune.add_argument("--trials", type=int, default=64, help="candidates per kernel")
    p_tune.add_argument("--rpc", metavar="HOST:PORT", help="a TVM RPC tracker: measure on its device servers")
    p_tune.add_argument("--key", default="local", help="the device key the servers registered under (with --rpc)")
    p_tune.add_argument("--out", default="tune_out", help="folder for the trial databases, the kept records (best/) and tune.json")
    p_tune.add_argument("--database", help="write the kept records into this database folder instead (e.g. schedules/<target key>)")
    p_tune.add_argument("--target", choices=("llvm", "cuda"), default="llvm",
                        help="llvm (this CPU) or cuda (this GPU's arch; measured on --rpc's servers or this machine's GPU)")
    p_tune.add_argument("--no-progress", action="store_true", help="no progress bar")
    p_tune.set_defaults(func=tune)

    p_bench = sub.add_parser("bench", help="time the benchmark shape set against PyTorch (oneDNN), interleaved")
    p_bench.add_argument("--suite", choices=("resnet50", "all", "conv3d"), default="resnet50",
                         help="ResNet-50 layers, every 2-D case, or the 3-D layers (with --api onednn)")
    p_bench.add_argument("--batch", choices=("1", "8", "all"), default="all")
    p_bench.add_argument("--op", choices=("filter", "input", "both", "forward"), default="both",
                         help="wgrad, dgrad, both, or the forward convolution (TBE's conv; with --api onednn, Convolution)")
    p_bench.add_argument("--filter", metavar="REGEX", help="only cases whose name matches")
    p_bench.add_argument("--rounds", type=int, default=5, help="interleaved samples per kernel (medians reported)")
    p_bench.add_argument("--isa", choices=BENCH_ISAS, default="native",
                         help="vector ISA of both sides: ours built for it, PyTorch capped to it (default: this CPU's)")
    p_bench.add_argument("--api", choices=("tbe", "onednn"), default="tbe",
                         help="ours through TBE's DSL (float16 5HD) or the oneDNN Graph frontend (float32 NXC activations, XIO weights)")
    p_bench.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                         help="with --api onednn: both sides in this type (bfloat16: PyTorch bf16; the bf16 dot-product peak where the CPU has it)")
    p_bench.add_argument("--schedule", choices=("default", "tuned"), default="default",
                         help="tuned: time ours twice, the rule's default and the kernel built from the tuning records")
    p_bench.add_argument("--schedules", metavar="DIR", help="with --schedule tuned: a database folder (default: the shipped records)")
    p_bench.add_argument("--out", default="bench_out", help="folder for bench.json and bench.png")
    p_bench.add_argument("--target", choices=("llvm", "cuda"), default="llvm",
                         help="cuda: ours on this machine's GPU against PyTorch's cuDNN (float16), instead of the CPU")
    p_bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_step_arguments(p_bench)
    p_bench.set_defaults(func=bench)

    training.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except ConvGradError as err:
        print(f"tvm-convgrad: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
