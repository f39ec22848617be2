"""Relax training with the package's gradients.

* :class:`SetupTrainer`: a drop-in for ``tvm.relax.training.SetupTrainer`` whose adjoint runs every
  ``relax.nn.conv2d`` gradient (dX and dW) on the package's scheduled kernels;
* :func:`conv2d_gradients`: a ``with`` block in which ``relax.transform.Gradient`` does the same;
* :class:`ConvGradients`: a module pass for a module already differentiated by Relax's own
  ``Gradient``: its conv2d gradients (``conv2d_transpose`` for dX, the ``CNHW`` weight-gradient
  ``conv2d`` for dW) become the package's kernels;
* :class:`ScheduleConvs`: a module pass putting every forward ``relax.nn.conv2d`` (an inference
  module's too) on the package's forward kernel; :class:`ScheduleLoops`: a CPU schedule for the
  other PrimFuncs after ``LegalizeOps``.

    >>> from tvm_convgrad.relax import SetupTrainer
    >>> mod = SetupTrainer(CrossEntropyLoss(), SGD(0.01), loss_args, target="llvm")(backbone)
    >>> trainer = relax.training.Trainer(mod, relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu()), tvm.cpu())
"""

from .forward import ScheduleConvs, ScheduleLoops, forward_func
from .gradient import Conv2dCall, conv2d_gradient, conv2d_gradients, gradient_funcs
from .rewrite import ConvGradients
from .trainer import SetupTrainer

__all__ = ["Conv2dCall", "ConvGradients", "ScheduleConvs", "ScheduleLoops", "SetupTrainer", "conv2d_gradient", "conv2d_gradients", "forward_func",
           "gradient_funcs"]  # fmt: skip
