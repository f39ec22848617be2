"""A PyTorch ``nn.Module`` trained in Relax: the recipe from the module to a trainer, and its step time.

:func:`relax_backbone` is the recipe: ``torch.export.export(model, (example,))``,
``tvm.relax.frontend.torch.from_exported_program(ep, keep_params_as_input=True)``, and the
exported ``main`` (``(x, *parameters) -> (logits,)``) made the ``backbone`` function
``relax.training.SetupTrainer`` expects — its output the tensor, the module attributes
``param_num`` (the parameters, in ``ep.state_dict`` order) and ``state_num`` (0). Then
``tvm_convgrad.relax.SetupTrainer`` (the package's forward and gradient kernels, every other
PrimFunc scheduled), ``tvm.compile`` for the resolved target, ``relax.training.Trainer``.

BatchNorm: ``torch.export`` of a model in eval mode imports BatchNorm as the inference op with its
running statistics as constants of the parameters; Relax's ``DecomposeOpsForTraining`` (which
``SetupTrainer`` runs) then trains it with batch statistics and does not update those running
statistics (there is no state output for them): train a model whose BatchNorm Relax must keep
running statistics for with the PyTorch drop-in (:mod:`tvm_convgrad.torch`) instead.

    python -m tvm_convgrad.training.exported --batch 8,32 --steps 20   # Relax + the package vs PyTorch eager

It also times the inference forward: the exported ``main`` through ``ScheduleConvs``,
``LegalizeOps`` and ``ScheduleLoops``, compiled, against PyTorch's eager forward under ``no_grad``.
PyTorch's step is timed in a process of its own (its OpenMP team and TVM's would otherwise share
the cores), the two processes alternating.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

__all__ = ["main", "relax_backbone", "relax_forward_ms", "relax_inference", "relax_step_ms", "relax_trainer", "torch_forward_ms", "torch_step_ms"]

CLASSES = 10
SIZE = 32


def relax_backbone(model, example):
    """``(backbone module, parameter arrays)``: ``model`` (an ``nn.Module`` returning logits) exported
    with ``torch.export`` and imported into Relax as ``SetupTrainer``'s backbone (see the module
    docstring); the arrays are its parameters in the backbone's order."""
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    model = model.eval()
    with torch.no_grad():
        exported = torch.export.export(model, (example,))
    mod = from_exported_program(exported, keep_params_as_input=True)
    main = mod["main"]
    bb = relax.BlockBuilder()
    with bb.function("backbone", list(main.params)):
        with bb.dataflow():
            net = bb.add_func(main.without_attr("params").without_attr("global_symbol"), "exported")
            outputs = bb.emit(relax.Call(net, list(main.params)))
            logits = bb.emit_output(relax.TupleGetItem(outputs, 0) if isinstance(outputs.ty, relax.TupleType) else outputs)
        bb.emit_func_output(logits)
    backbone = relax.transform.DeadCodeElimination()(relax.transform.InlinePrivateFunctions()(bb.get()))
    backbone = tvm.IRModule({"backbone": backbone["backbone"]}).with_attrs({"param_num": len(main.params) - 1, "state_num": 0})
    return backbone, [v.detach().numpy() for v in exported.state_dict.values()]


def relax_trainer(backbone, batch: int, learning_rate: float = 0.01, target="llvm"):
    """``(trainer module, relax.training.Trainer)``: SGD on cross-entropy, the package's kernels, compiled for ``target``."""
    import tvm
    from tvm import relax
    from tvm.relax.training.loss import CrossEntropyLoss
    from tvm.relax.training.optimizer import SGD

    from ..compile import pass_context, resolve_target
    from ..relax import SetupTrainer

    target = resolve_target(target)
    loss_args = [relax.TensorType((batch, CLASSES), "float32"), relax.TensorType((batch,), "int64")]
    mod = SetupTrainer(CrossEntropyLoss(), SGD(learning_rate), loss_args, target=target)(backbone)
    with pass_context(target):
        executable = tvm.compile(mod, target)
    return mod, relax.training.Trainer(mod, relax.VirtualMachine(executable, tvm.cpu()), tvm.cpu())


def relax_inference(model, example, target="llvm"):
    """``(VM function, parameter arrays)``: ``model``'s exported ``main`` with every convolution on the
    package's forward kernel and the other PrimFuncs scheduled, compiled for ``target``."""
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from ..compile import pass_context, resolve_target
    from ..relax import ScheduleConvs, ScheduleLoops

    target = resolve_target(target)
    with torch.no_grad():
        exported = torch.export.export(model.eval(), (example,))
    mod = from_exported_program(exported, keep_params_as_input=True)
    mod = ScheduleLoops(target)(relax.transform.LegalizeOps()(ScheduleConvs(target)(mod)))
    with pass_context(target):
        executable = tvm.compile(mod, target)
    return relax.VirtualMachine(executable, tvm.cpu())["main"], [v.detach().numpy() for v in exported.state_dict.values()]


def _median_ms(fn, steps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def relax_forward_ms(batch: int, steps: int) -> float:
    """Median ms of :func:`relax_inference`'s forward of :func:`~tvm_convgrad.torch.nets.small_resnet`."""
    import torch
    import tvm

    from ..torch.nets import small_resnet

    torch.manual_seed(0)
    x, _ = _data(batch)
    forward, params = relax_inference(small_resnet(CLASSES), torch.from_numpy(x))
    args = [tvm.runtime.tensor(a) for a in (x, *params)]
    return _median_ms(lambda: forward(*args), steps)


def torch_forward_ms(batch: int, steps: int) -> float:
    """Median ms of PyTorch's eager forward of the same model (``no_grad``, eval mode)."""
    import torch

    from ..torch.nets import small_resnet

    torch.manual_seed(0)
    model = small_resnet(CLASSES).eval()
    x = torch.from_numpy(_data(batch)[0])
    with torch.no_grad():
        return _median_ms(lambda: model(x), steps)


def _data(batch: int):
    rng = np.random.default_rng(0)
    return rng.random((batch, 3, SIZE, SIZE), dtype=np.float32), (np.arange(batch) % CLASSES).astype("int64")


def relax_step_ms(batch: int, steps: int) -> float:
    """Median ms of a Relax training step of :func:`~tvm_convgrad.torch.nets.small_resnet` on the package's kernels."""
    import torch

    from ..torch.nets import small_resnet

    torch.manual_seed(0)
    x, y = _data(batch)
    backbone, params = relax_backbone(small_resnet(CLASSES), torch.from_numpy(x))
    _, trainer = relax_trainer(backbone, batch)
    trainer.load_params(params)
    return _median_ms(lambda: trainer.update(x, y), steps)


def torch_step_ms(batch: int, steps: int) -> float:
    """Median ms of the same step in PyTorch eager (forward, cross-entropy, backward, SGD)."""
    import torch

    from ..torch.nets import small_resnet

    torch.manual_seed(0)
    model = small_resnet(CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), 0.01)
    x, y = (torch.from_numpy(a) for a in _data(batch))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return _median_ms(step, steps)


def _child(side: str, batch: int, steps: int) -> float:
    command = [sys.executable, "-m", __spec__.name, "--child", side, "--batch", str(batch), "--steps", str(steps)]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_convgrad.training.exported", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="8,32", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process (median)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating process pairs per batch size (median of the medians)")
    parser.add_argument("--child", choices=tuple(_SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(_SIDES[args.child](int(args.batch), args.steps))
        return 0
    for batch in (int(b) for b in args.batch.split(",")):
        for what, ours_side, torch_side in (("training step", "relax", "torch"), ("inference forward", "relax-forward", "torch-forward")):
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(_child(ours_side, batch, args.steps))
                theirs.append(_child(torch_side, batch, args.steps))
            o, t = statistics.median(ours), statistics.median(theirs)
            print(f"small_resnet N={batch} 3x{SIZE}x{SIZE} {what}: Relax + tvm_convgrad {o:.2f} ms, PyTorch eager {t:.2f} ms, "
                  f"PyTorch / ours {t / o:.2f}", flush=True)  # fmt: skip
    return 0


_SIDES = {"relax": relax_step_ms, "torch": torch_step_ms, "relax-forward": relax_forward_ms, "torch-forward": torch_forward_ms}


if __name__ == "__main__":
    sys.exit(main())
