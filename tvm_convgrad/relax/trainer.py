"""``SetupTrainer``: Relax's trainer set-up with every ``relax.nn.conv2d`` gradient on the package's kernels."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.training import SetupTrainer as RelaxSetupTrainer
from tvm.target import Target

from ..compile import resolve_target
from .gradient import conv2d_gradients

__all__ = ["SetupTrainer"]


@tvm.transform.module_pass(opt_level=0, name="tvm_convgrad.SetupTrainer")
class SetupTrainer:
    """A drop-in for ``tvm.relax.training.SetupTrainer`` (same arguments, plus ``target``).

    The backbone module becomes the same trainer module (``backbone``, ``backbone_loss``,
    ``backbone_loss_adjoint``, ``optimizer``, the ``input_num`` / ``optim_state`` attributes), but
    the adjoint differentiates each ``relax.nn.conv2d`` with the package's dX and dW kernels,
    scheduled for ``target`` (:mod:`.gradient`): any stride, asymmetric pads, dilation (which
    Relax's own gradient cannot take), groups and depthwise, NCHW / NHWC and any OIHW permutation,
    float32 / float16 / bfloat16. Compile the result with ``tvm.compile(mod, target)`` and run it in
    ``relax.training.Trainer``.

    Parameters
    ----------
    loss, optimizer, loss_args, legalize
        As ``tvm.relax.training.SetupTrainer``.
    target : str | dict | Target
        What the gradient kernels are scheduled for (default ``"llvm"``: this CPU, every core).
    """

    def __init__(self, loss, optimizer, loss_args, target: str | dict | Target = "llvm", legalize: bool = True):
        self._trainer = RelaxSetupTrainer(loss, optimizer, loss_args, legalize=False)
        self._target = resolve_target(target)
        self._legalize = legalize

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with conv2d_gradients(self._target):
            mod = self._trainer(mod)
        mod = relax.transform.DeadCodeElimination()(mod)  # the kernels of adjoints no one needs (an input's dX)
        if self._legalize:
            mod = relax.transform.LegalizeOps()(mod)
        return mod
