"""A real network trained end to end with the package's gradients (``tvm-convgrad train``):
:mod:`.model` (the digits CNN, as a Relax backbone and a PyTorch module from the same weights) and
:mod:`.run` (scikit-learn's digits, three clients, the same batches)."""

from .model import DIGITS_CNN, Conv, Net, init_params, relax_backbone, torch_model
from .run import CLIENTS, Digits, Run, load_digits, train

__all__ = ["CLIENTS", "DIGITS_CNN", "Conv", "Digits", "Net", "Run", "init_params", "load_digits", "relax_backbone", "torch_model", "train"]
