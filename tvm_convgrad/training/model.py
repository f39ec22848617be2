"""The example CNN, written once and built three ways from the same weights.

:data:`DIGITS_CNN` (32x32 grayscale in, 10 classes) mixes what the package's gradients cover:

=========  ============  ======  =======  ========  ======  ===========================
layer      channels      kernel  stride   padding   groups  dilation
=========  ============  ======  =======  ========  ======  ===========================
conv1      1 -> 16       3x3     1        1         1       1
conv2      16 -> 32      3x3     2        1         1       1
conv3      32 -> 32      3x3     1        2         32      2 (depthwise, dilated)
conv4      32 -> 64      1x1     1        0         1       1
conv5      64 -> 64      3x3     2        1         2       1 (grouped)
=========  ============  ======  =======  ========  ======  ===========================

each followed by ReLU, then the spatial mean and a dense ``64 -> 10`` layer (the logits).
:func:`relax_backbone` gives it as the backbone module of ``relax.training`` (parameters in
:func:`init_params`' order), :func:`torch_model` as a ``torch.nn.Module`` with ``nn.Conv2d`` or
``tvm_convgrad.torch.Conv2d`` layers, both loading the same :func:`init_params` arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DIGITS_CNN", "Conv", "Net", "init_params", "relax_backbone", "torch_model"]


@dataclass(frozen=True)
class Conv:
    cin: int
    cout: int
    kernel: int
    stride: int = 1
    padding: int = 0
    groups: int = 1
    dilation: int = 1

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.cout, self.cin // self.groups, self.kernel, self.kernel)


@dataclass(frozen=True)
class Net:
    """Convolutions (each + ReLU), then the spatial mean and a dense layer to ``classes``."""

    convs: tuple[Conv, ...]
    classes: int
    size: int  # input height = width

    def param_shapes(self) -> list[tuple[int, ...]]:
        """Every conv's weight and bias, then the dense layer's ``(C, classes)`` weight and bias."""
        shapes: list[tuple[int, ...]] = []
        for conv in self.convs:
            shapes += [conv.weight_shape, (conv.cout,)]
        return shapes + [(self.convs[-1].cout, self.classes), (self.classes,)]


DIGITS_CNN = Net(
    convs=(Conv(1, 16, 3, padding=1), Conv(16, 32, 3, stride=2, padding=1), Conv(32, 32, 3, padding=2, groups=32, dilation=2),
           Conv(32, 64, 1), Conv(64, 64, 3, stride=2, padding=1, groups=2)),
    classes=10,
    size=32,
)  # fmt: skip


def init_params(net: Net, seed: int = 0) -> list[np.ndarray]:
    """He-uniform weights and small random biases (float32), in :meth:`Net.param_shapes` order.

    Not zero biases: a depthwise window of zeros (ReLU outputs) plus a zero bias is a
    pre-activation of exactly 0, where PyTorch's ReLU gradient is 0 and Relax's is 1 (``where(x <
    0, 0, dy)``); the clients would then differ by that convention, not by their conv gradients."""
    rng = np.random.default_rng(seed)
    params = []
    for shape in net.param_shapes():
        if len(shape) == 1:
            params.append(rng.uniform(-0.05, 0.05, shape).astype("float32"))
            continue
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        bound = np.sqrt(6.0 / fan_in)
        params.append(rng.uniform(-bound, bound, shape).astype("float32"))
    return params


def relax_backbone(net: Net, batch: int):
    """The backbone module of ``relax.training``: ``backbone(x, *params) -> logits``, with the
    module attributes ``param_num`` and ``state_num``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, net.convs[0].cin, net.size, net.size), "float32"))
    params = [relax.Var(f"p{i}", relax.TensorType(shape, "float32")) for i, shape in enumerate(net.param_shapes())]
    with bb.function("backbone", [x, *params]):
        with bb.dataflow():
            h = x
            for i, conv in enumerate(net.convs):
                weight, bias = params[2 * i], params[2 * i + 1]
                y = bb.emit(relax.op.nn.conv2d(h, weight, conv.stride, conv.padding, conv.dilation, conv.groups))
                h = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.op.reshape(bias, (1, conv.cout, 1, 1)))))
            pooled = bb.emit(relax.op.mean(h, axis=[2, 3]))
            logits = bb.emit_output(relax.op.add(relax.op.matmul(pooled, params[-2]), params[-1]))
        bb.emit_func_output(logits)
    return bb.get().with_attrs({"param_num": len(params), "state_num": 0})


def torch_model(net: Net, params: list[np.ndarray], ours: bool = False):
    """The net as a ``torch.nn.Module`` loaded with ``params``: ``nn.Conv2d`` layers, or
    ``tvm_convgrad.torch.Conv2d`` ones (``ours``: the package's gradients)."""
    import torch
    from torch import nn

    from ..torch import Conv2d

    layer = Conv2d if ours else nn.Conv2d

    class DigitsNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([layer(c.cin, c.cout, c.kernel, c.stride, c.padding, c.dilation, c.groups) for c in net.convs])
            self.dense = nn.Linear(net.convs[-1].cout, net.classes)

        def forward(self, x):
            for conv in self.convs:
                x = torch.relu(conv(x))
            return self.dense(x.mean((2, 3)))

    model = DigitsNet()
    with torch.no_grad():
        for i, conv in enumerate(model.convs):
            conv.weight.copy_(torch.from_numpy(params[2 * i]))
            conv.bias.copy_(torch.from_numpy(params[2 * i + 1]))
        model.dense.weight.copy_(torch.from_numpy(params[-2].T.copy()))
        model.dense.bias.copy_(torch.from_numpy(params[-1]))
    return model
