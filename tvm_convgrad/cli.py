"""``tvm-convgrad``: build, run and check the gradients from the command line.

* ``tvm-convgrad demo``: the two TBE documentation examples, end to end on LLVM.
* ``tvm-convgrad run --op filter|input|forward --input N,C,H,W --filter Cout,Cin_g,KH,KW [...]``: any shape
  (and the framework operators; :mod:`.tools.run_command`).
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
from pathlib import Path
from typing import Sequence

from .training import command as training
from .training.torch_step import add_arguments as add_step_arguments
from .errors import ConvGradError
from .examples import SEEDS
from .isa import BENCH_ISAS
from .tools.run_command import FRAMEWORK_OPS, flag, report, run, timed_build

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


def demo(args: argparse.Namespace) -> int:
    ok = True
    for op, (module, attr) in SEEDS.items():
        result = getattr(importlib.import_module(module), attr)
        kernel, seconds = timed_build(result, args.target)
        ok &= report(f"[{op}] TBE documentation example ({module})", kernel, seconds, args.repeat)
    return 0 if ok else 1


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
        frame.add_argument(flag(name), dest=name, type=_int_list, metavar="SHAPE", help=f"{name} shape")
    frame.add_argument("--params", type=_int_list, metavar="P0,..,P17", help="deconv_grad_filter: its 18 params")
    frame.add_argument("--pads-begin", type=_int_list, metavar="P[,P..]")
    frame.add_argument("--pads-end", type=_int_list, metavar="P[,P..]")
    frame.add_argument("--output-padding", type=_int_list, metavar="P[,P..]", help="conv_transpose_backward_weights, the *_data operators")
    frame.add_argument("--auto-pad", default="none", help="none | same_upper | same_lower | valid")
    frame.add_argument("--data-format", default="NXC", help="NXC | NCX")
    frame.add_argument("--filter-format", help="convolution_backprop_filters: XIO (default) | OIX")
    frame.add_argument("--weights-format", help="XIO | OIX (default XIO); conv_transpose_backward_weights: XOI (default) | IOX")
    frame.add_argument("--dtype", default="float32", help="float32 | float16 | bfloat16 (deconv_grad_filter: float32 | float16)")
    frame.add_argument("--algorithm", default="direct",
                       help="convolution, convolution_backward_data / _weights: direct (default) | winograd (F(2x2, 3x3)) | auto")  # fmt: skip
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
