"""``SetupTrainer``: Relax's trainer set-up with every ``relax.nn.conv2d`` gradient on the package's kernels."""

from __future__ import annotations

import contextlib

import tvm
from tvm import relax
from tvm.relax.training import SetupTrainer as RelaxSetupTrainer
from tvm.target import Target

from ..compile import resolve_target
from .forward import ScheduleConvs, ScheduleLoops
from .gradient import conv2d_gradients, relu_gradients

__all__ = ["SetupTrainer"]


@tvm.transform.module_pass(opt_level=0, name="tvm_convgrad.SetupTrainer")
class SetupTrainer:
    """A drop-in for ``tvm.relax.training.SetupTrainer`` (same arguments, plus ``target`` and
    ``forward``).

    The backbone module becomes the same trainer module (``backbone``, ``backbone_loss``,
    ``backbone_loss_adjoint``, ``optimizer``, the ``input_num`` / ``optim_state`` attributes), but
    the adjoint differentiates each ``relax.nn.conv2d`` with the package's dX and dW kernels,
    scheduled for ``target`` (:mod:`.gradient`): any stride, asymmetric pads, dilation (which
    Relax's own gradient cannot take), groups and depthwise, NCHW / NHWC and any OIHW permutation,
    float32 / float16 / bfloat16. With ``forward`` (the default) every forward ``conv2d`` runs on
    the package's kernel too, with the elementwise operators after it inside (:class:`.ScheduleConvs`;
    ReLU's gradient then reads ReLU's output, as PyTorch's does: :func:`.gradient.relu_gradient`)
    and, on a CPU target, every other PrimFunc gets a parallel, vectorized schedule (:class:`.ScheduleLoops`). Compile the result with
    ``tvm.compile(mod, target)`` and run it in ``relax.training.Trainer``.

    Parameters
    ----------
    loss, optimizer, loss_args, legalize
        As ``tvm.relax.training.SetupTrainer``.
    forward : bool
        The forward convolutions on the package's kernel and the other PrimFuncs scheduled (default True).
    target : str | dict | Target
        What the gradient kernels are scheduled for (default ``"llvm"``: this CPU, every core).
    """

    def __init__(self, loss, optimizer, loss_args, target: str | dict | Target = "llvm", legalize: bool = True, forward: bool = True):
        self._trainer = RelaxSetupTrainer(loss, optimizer, loss_args, legalize=False)
        self._target = resolve_target(target)
        self._legalize = legalize
        self._forward = forward

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with conv2d_gradients(self._target), relu_gradients() if self._forward else contextlib.nullcontext():
            mod = self._trainer(mod)
        mod = relax.transform.DeadCodeElimination()(mod)  # the kernels of adjoints no one needs (an input's dX)
        if self._forward:
            mod = ScheduleConvs(self._target)(mod)
        if self._legalize:
            mod = relax.transform.LegalizeOps()(mod)
            if self._forward:
                mod = ScheduleLoops(self._target)(mod)
        return mod
