"""How fast the loss adjoint of a conv-heavy CNN runs with the package's gradients against Relax's own,
and where the time goes (``python -m tvm_convgrad.training.profile``).

The network (:data:`RELAX_CNN`, N = 8, 32x32x3 in) has six 3x3 / 1x1 convolutions that Relax's own
gradient can take (NCHW / OIHW, no dilation). For each trainer module (Relax's ``SetupTrainer``,
the package's) it reports:

* the ``backbone_loss_adjoint`` call, timed by the VM's ``time_evaluator`` (median of repeats);
* a per-call profile of one adjoint: each VM call instruction timed (``VirtualMachine.set_instrument``),
  summed per PrimFunc, and the conv-gradient calls among them (ours: ``conv2d_input_grad*`` /
  ``conv2d_weight_grad*``; Relax's: the ``conv2d_transpose*`` calls, and the ``conv2d*`` /
  ``strided_slice*`` calls the forward function does not make);
* ours alone: the same kernels built by :func:`tvm_convgrad.build` and timed by ``Kernel.time``.

Both modules are compiled for this CPU (``resolve_target("llvm")``: its ``mcpu``, so its vector
ISA); Relax's as a Relax user compiles it, the package's inside :func:`tvm_convgrad.pass_context`,
as docs/training.md says to compile a trainer (TVM's ``NarrowDataType`` otherwise costs its kernels ~13%).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections import defaultdict

import numpy as np

from .model import Conv, Net, init_params, relax_backbone

__all__ = ["RELAX_CNN", "conv_gradient_calls", "instrumented_profile", "main", "profile_adjoint"]

RELAX_CNN = Net(
    convs=(Conv(3, 32, 3, padding=1), Conv(32, 32, 3, padding=1), Conv(32, 64, 3, stride=2, padding=1), Conv(64, 64, 3, padding=1),
           Conv(64, 128, 3, stride=2, padding=1), Conv(128, 128, 1)),
    classes=10,
    size=32,
)  # fmt: skip
ADJOINT = "backbone_loss_adjoint"


def _trainer(net: Net, batch: int, ours: bool, target):
    from tvm import relax
    from tvm.relax.training import SetupTrainer as RelaxSetupTrainer
    from tvm.relax.training.loss import CrossEntropyLoss
    from tvm.relax.training.optimizer import SGD

    from ..relax import SetupTrainer

    loss_args = [relax.TensorType((batch, net.classes), "float32"), relax.TensorType((batch,), "int64")]
    setup = SetupTrainer(CrossEntropyLoss(), SGD(0.01), loss_args, target=target) if ours else RelaxSetupTrainer(CrossEntropyLoss(), SGD(0.01), loss_args)
    return setup(relax_backbone(net, batch))


def _called(func) -> set[str]:
    """Names of the PrimFuncs a Relax function calls through ``call_tir``."""
    from tvm import relax

    names: set[str] = set()

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            names.add(expr.args[0].name_hint)

    relax.analysis.post_order_visit(func, visit)
    return names


def conv_gradient_calls(mod) -> set[str]:
    """The PrimFuncs of ``mod``'s adjoint that compute conv gradients (see the module docstring)."""
    forward = _called(mod["backbone_loss"])
    adjoint = _called(mod[ADJOINT])
    ours = {n for n in adjoint if n.startswith(("conv2d_input_grad", "conv2d_weight_grad"))}
    relax_own = {n for n in adjoint - forward if n.startswith(("conv2d_transpose", "conv2d", "strided_slice"))}
    return ours or relax_own


def instrumented_profile(vm, args, repeat: int = 5) -> dict[str, float]:
    """Seconds per call of each VM function in one adjoint (median over ``repeat`` runs)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        totals: dict[str, float] = defaultdict(float)
        started: dict[str, float] = {}

        def instrument(func, symbol, before, ret, *rest):
            if before:
                started[symbol] = time.perf_counter()
            else:
                totals[symbol] += time.perf_counter() - started.pop(symbol)
            return 0

        vm.set_instrument(instrument)
        vm[ADJOINT](*args)
        vm.set_instrument(None)
        for name, seconds in totals.items():
            samples[name].append(seconds)
    return {name: statistics.median(values) for name, values in samples.items()}


def profile_adjoint(net: Net = RELAX_CNN, batch: int = 8, target="llvm", rounds: int = 5) -> dict:
    """The numbers of the module docstring, for Relax's trainer and the package's: each round
    times every quantity once, interleaved (this machine is shared: one side must not get the
    quiet minutes), and each reported number is the median over ``rounds``."""
    import tvm
    from tvm import relax

    from ..compile import pass_context, resolve_target

    target = resolve_target(target)
    params = init_params(net, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, net.convs[0].cin, net.size, net.size)).astype("float32")
    y = rng.integers(0, net.classes, batch).astype("int64")
    device = tvm.cpu()
    args = [tvm.runtime.tensor(a, device) for a in (x, *params, y)]
    sides = {}
    for side, ours in (("relax", False), ("ours", True)):
        mod = _trainer(net, batch, ours, target)
        with pass_context(target) if ours else contextlib.nullcontext():
            vm = relax.VirtualMachine(tvm.compile(mod, target), device)
        sides[side] = (vm, vm.time_evaluator(ADJOINT, device, number=1, repeat=3, min_repeat_ms=100), conv_gradient_calls(mod))
    alone = _kernels_alone(net, batch, target)
    samples: dict[str, list[float]] = defaultdict(list)
    calls_seen: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for side, (vm, timer, grads) in sides.items():
            samples[f"{side}.adjoint"].append(statistics.median(timer(*args).results))
            calls = instrumented_profile(vm, args, repeat=3)
            calls_seen[side] = calls
            samples[f"{side}.conv_gradients"].append(sum(calls.get(n, 0.0) for n in grads))
        samples["ours.alone"].append(sum(kernel.time(repeat=3, min_repeat_ms=50).median for kernel in alone))
    report = {side: {"adjoint_s": statistics.median(samples[f"{side}.adjoint"]),
                     "conv_gradients_s": statistics.median(samples[f"{side}.conv_gradients"]),
                     "calls": calls_seen[side], "conv_gradient_funcs": sorted(sides[side][2])} for side in sides}  # fmt: skip
    report["ours"]["kernels_alone_s"] = statistics.median(samples["ours.alone"])
    return report


def _kernels_alone(net: Net, batch: int, target) -> list:
    """The package's dX (all but the first conv's) and dW kernels of ``net``, built alone."""
    from ..compile import build
    from ..frontends.conv2d import Conv2dGradients

    kernels, size = [], net.size
    for index, conv in enumerate(net.convs):
        gradients = Conv2dGradients((batch, conv.cin, size, size), conv.weight_shape, (conv.stride,) * 2, (conv.padding,) * 4,
                                    (conv.dilation,) * 2, conv.groups, "float32")  # fmt: skip
        kernels.append(build(gradients.weight_grad(), target=target))
        if index > 0:  # the network's input needs no gradient
            kernels.append(build(gradients.input_grad(), target=target))
        size = gradients.y_shape[2]
    return kernels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    r = profile_adjoint(batch=args.batch, rounds=args.rounds)
    relax_own, ours = r["relax"], r["ours"]
    print(f"loss adjoint, N={args.batch}: Relax's own {relax_own['adjoint_s'] * 1e3:.1f} ms, ours {ours['adjoint_s'] * 1e3:.1f} ms "
          f"({relax_own['adjoint_s'] / ours['adjoint_s']:.1f}x)")  # fmt: skip
    print(f"conv-gradient calls in it: Relax's {relax_own['conv_gradients_s'] * 1e3:.1f} ms, ours {ours['conv_gradients_s'] * 1e3:.1f} ms "
          f"({relax_own['conv_gradients_s'] / ours['conv_gradients_s']:.1f}x); the same kernels alone {ours['kernels_alone_s'] * 1e3:.1f} ms "
          f"(in the VM / alone = {ours['conv_gradients_s'] / ours['kernels_alone_s']:.2f})")  # fmt: skip
    for side in ("relax", "ours"):
        top = sorted(r[side]["calls"].items(), key=lambda kv: -kv[1])[:8]
        print(f"{side}: " + ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
