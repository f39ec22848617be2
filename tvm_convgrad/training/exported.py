"""A PyTorch ``nn.Module`` trained in Relax: the recipe from the module to a trainer, and its step time.

:func:`relax_backbone` is the recipe: ``torch.export.export(model, (example,))``,
``tvm.relax.frontend.torch.from_exported_program(ep, keep_params_as_input=True)``, and the
exported ``main`` (``(x, *parameters) -> (logits,)``) made the ``backbone`` function
``relax.training.SetupTrainer`` expects — its output the tensor (and the updated states), the
module attributes ``param_num`` (the parameters, in ``ep.graph_signature`` order) and
``state_num`` (BatchNorm's running statistics, below). Then
``tvm_convgrad.relax.SetupTrainer`` (the package's forward and gradient kernels, every other
PrimFunc scheduled), ``tvm.compile`` for the resolved target, ``relax.training.Trainer``.

BatchNorm: exported in training mode, PyTorch's BatchNorm is ``relax.nn.batch_norm(..., training=True)``
(batch statistics), but TVM 0.27's importer keeps only the parameters as inputs: the running mean
and variance (PyTorch's buffers) become constants, and the updated ones it should return are
dropped (zeros in their place). :func:`relax_backbone` makes them Relax **states**: each constant a
parameter after the model's parameters (``state_num`` of them), and the backbone returns
``(logits, *updated running statistics)`` as PyTorch updates them (batch_norm's outputs 1 and 2, the
variance's batch term made unbiased as PyTorch's is) — what ``SetupTrainer`` threads through
``backbone_loss`` and the trainer keeps (``export_states``).

    python -m tvm_convgrad.training.exported --nets small_resnet,resnet18 --batch 8,32   # Relax + the package vs PyTorch eager

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
from dataclasses import dataclass

import numpy as np

__all__ = ["Backbone", "main", "relax_backbone", "relax_forward_ms", "relax_inference", "relax_step_ms", "relax_trainer", "torch_forward_ms", "torch_step_ms"]

CLASSES = 10
SIZE = 32


@dataclass(frozen=True)
class Backbone:
    """What :func:`relax_backbone` exports: the module ``SetupTrainer`` takes, the parameters'
    and the states' initial values (in the backbone's order)."""

    module: "tvm.IRModule"  # noqa: F821
    params: list
    states: list


def relax_backbone(model, example, train: bool = True) -> Backbone:
    """``model`` (an ``nn.Module`` returning logits) exported with ``torch.export`` and imported into
    Relax as ``SetupTrainer``'s backbone (see the module docstring): in training mode (``train``)
    its BatchNorm layers use batch statistics and update their running ones as states."""
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    model = model.train(train)
    exported = torch.export.export(model, (example,))
    main = from_exported_program(exported, keep_params_as_input=True)["main"]
    states = _batch_norm_states()(main.body.body)
    body = states.visit_expr(main.body)
    func = relax.Function(list(main.params) + [var for var, _ in states.found], body)
    bb = relax.BlockBuilder()
    with bb.function("backbone", list(func.params)):
        with bb.dataflow():
            net = bb.add_func(func, "exported")
            outputs = bb.emit(relax.Call(net, list(func.params)))
            if isinstance(outputs.ty, relax.TupleType):  # (logits, *updated states): SetupTrainer wants a tuple expression
                fields = [bb.emit_output(relax.TupleGetItem(outputs, i)) for i in range(1 + len(states.found))]
            else:
                fields = [bb.emit_output(outputs)]
        bb.emit_func_output(relax.Tuple(fields) if states.found else fields[0])
    backbone = relax.transform.DeadCodeElimination()(relax.transform.InlinePrivateFunctions()(bb.get()))
    module = tvm.IRModule({"backbone": backbone["backbone"]}).with_attrs({"param_num": len(main.params) - 1, "state_num": len(states.found)})
    return Backbone(module, _parameters(exported), [value for _, value in states.found])


def _parameters(exported) -> list:
    """The exported program's parameters (not its buffers), in the order of the imported ``main``'s arguments."""
    import torch

    parameter = torch.export.graph_signature.InputKind.PARAMETER
    return [exported.state_dict[spec.target].detach().numpy() for spec in exported.graph_signature.input_specs if spec.kind == parameter]


def _batch_norm_states():
    """The mutator class (built on first use: it needs TVM's Relax functors)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    batch_norm = tvm.ir.Op.get("relax.nn.batch_norm")

    def training(call) -> bool:
        return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.same_as(batch_norm) and bool(call.attrs.training)

    @mutator
    class BatchNormStates(PyExprMutator):
        """Each training batch_norm's running statistics (constants of the import) made parameters
        (``found``: ``(var, initial value)``), and the function's output tuple extended by their
        updated values (batch_norm's outputs 1 and 2)."""

        def __init__(self, output):
            super().__init__()
            self.output = output
            self.found, self.updates = [], []

        def _updated(self, result, running_var, momentum: float, count: int):
            """The running mean and variance as PyTorch updates them: batch_norm's mean, and its
            variance with the batch's unbiased variance (``n/(n-1)`` times the biased one batch_norm
            blends in): ``v + (v - (1-m)*running_var) / (n-1)``."""
            mean = self.builder_.emit(relax.TupleGetItem(result, 1))
            biased = self.builder_.emit(relax.TupleGetItem(result, 2))
            if count < 2:
                return [mean, biased]
            dtype = str(running_var.ty.dtype)
            blended = relax.op.subtract(biased, relax.op.multiply(running_var, relax.const(1.0 - momentum, dtype)))
            return [mean, self.builder_.emit(relax.op.add(biased, relax.op.divide(blended, relax.const(float(count - 1), dtype))))]

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not training(call):
                return call
            args = list(call.args)
            for i, what in ((3, "running_mean"), (4, "running_var")):
                if isinstance(args[i], tvm.ir.expr.Constant):
                    var = relax.Var(f"bn{len(self.updates)}_{what}", args[i].ty)
                    self.found.append((var, args[i].value.numpy()))
                    args[i] = var
            return relax.Call(call.op, args, call.attrs, call.ty_args)

        def visit_var_binding_(self, binding):
            if binding.var.same_as(self.output) and self.updates:
                value = binding.value
                fields = [self.visit_expr(f) for f in value.fields] if isinstance(value, relax.Tuple) else [self.visit_expr(value)]
                updated = [u for update in self.updates for u in self._updated(*update)]
                self.set_var_remap(binding.var, self.builder_.emit_output(relax.Tuple(fields[:1] + updated)))
                return
            super().visit_var_binding_(binding)
            if training(binding.value) and any(isinstance(a, tvm.ir.expr.Constant) for a in binding.value.args[3:5]):
                call = binding.value
                shape = [int(d) for d in call.args[0].ty.shape.values]
                count = int(np.prod(shape)) // shape[int(call.attrs.axis)]  # the values each statistic is taken over
                self.updates.append((self.get_var_remap(binding.var), self.found[-1][0], float(call.attrs.momentum), count))

    return BatchNormStates


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
    return relax.VirtualMachine(executable, tvm.cpu())["main"], _parameters(exported)


def _median_ms(fn, steps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def relax_forward_ms(net: str, batch: int, steps: int) -> float:
    """Median ms of :func:`relax_inference`'s forward of ``net``."""
    import torch
    import tvm

    x, _ = _data(batch)
    forward, params = relax_inference(_net(net), torch.from_numpy(x))
    args = [tvm.runtime.tensor(a) for a in (x, *params)]
    return _median_ms(lambda: forward(*args), steps)


def torch_forward_ms(net: str, batch: int, steps: int) -> float:
    """Median ms of PyTorch's eager forward of the same model (``no_grad``, eval mode)."""
    import torch

    model = _net(net).eval()
    x = torch.from_numpy(_data(batch)[0])
    with torch.no_grad():
        return _median_ms(lambda: model(x), steps)


def _data(batch: int):
    rng = np.random.default_rng(0)
    return rng.random((batch, 3, SIZE, SIZE), dtype=np.float32), (np.arange(batch) % CLASSES).astype("int64")


def _net(name: str):
    import torch

    from ..torch.nets import NETS, small_resnet

    torch.manual_seed(0)
    return small_resnet(CLASSES) if name == "small_resnet" else NETS[name](CLASSES)


def relax_step_ms(net: str, batch: int, steps: int) -> float:
    """Median ms of a Relax training step of ``net`` (:mod:`tvm_convgrad.torch.nets`) on the package's kernels."""
    import torch

    x, y = _data(batch)
    backbone = relax_backbone(_net(net), torch.from_numpy(x))
    _, trainer = relax_trainer(backbone.module, batch)
    trainer.load_params(backbone.params)
    if backbone.states:
        trainer.load_states(backbone.states)
    return _median_ms(lambda: trainer.update(x, y), steps)


def torch_step_ms(net: str, batch: int, steps: int) -> float:
    """Median ms of the same step in PyTorch eager (forward, cross-entropy, backward, SGD)."""
    import torch

    model = _net(net).train()
    optimizer = torch.optim.SGD(model.parameters(), 0.01)
    x, y = (torch.from_numpy(a) for a in _data(batch))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return _median_ms(step, steps)


def _child(side: str, net: str, batch: int, steps: int) -> float:
    command = [sys.executable, "-m", __spec__.name, "--child", side, "--nets", net, "--batch", str(batch), "--steps", str(steps)]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_convgrad.training.exported", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="small_resnet", help="comma-separated: small_resnet, resnet18, mobilenet_v2")
    parser.add_argument("--batch", default="8,32", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process (median)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating process pairs per batch size (median of the medians)")
    parser.add_argument("--child", choices=tuple(_SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(_SIDES[args.child](args.nets, int(args.batch), args.steps))
        return 0
    for net in args.nets.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            for what, ours_side, torch_side in (("training step", "relax", "torch"), ("inference forward", "relax-forward", "torch-forward")):
                ours, theirs = [], []
                for _ in range(args.rounds):
                    ours.append(_child(ours_side, net, batch, args.steps))
                    theirs.append(_child(torch_side, net, batch, args.steps))
                o, t = statistics.median(ours), statistics.median(theirs)
                print(f"{net} N={batch} 3x{SIZE}x{SIZE} {what}: Relax + tvm_convgrad {o:.2f} ms, PyTorch eager {t:.2f} ms, "
                      f"PyTorch / ours {t / o:.2f}", flush=True)  # fmt: skip
    return 0


_SIDES = {"relax": relax_step_ms, "torch": torch_step_ms, "relax-forward": relax_forward_ms, "torch-forward": torch_forward_ms}


if __name__ == "__main__":
    sys.exit(main())
