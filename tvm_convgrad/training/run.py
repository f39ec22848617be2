"""Train :data:`.model.DIGITS_CNN` on scikit-learn's handwritten digits, three ways, from the same
initial weights and batch order:

* ``relax``: ``relax.training`` with :class:`tvm_convgrad.relax.SetupTrainer` (the conv2d gradients
  on the package's kernels), compiled with ``tvm.compile`` and run by ``relax.training.Trainer``;
* ``torch``: PyTorch with ``nn.Conv2d``;
* ``torch-ours``: PyTorch with ``tvm_convgrad.torch.Conv2d`` (PyTorch's forward, the package's backward).

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images shipped with scikit-learn, no download),
each pixel repeated 4x4 to 32x32, standardized; a fixed split holds out 297 images. SGD with momentum
0.9 (no dampening, no weight decay: Relax's ``MomentumSGD`` and ``torch.optim.SGD`` are the same
formula) on the mean cross-entropy; every client sees the same batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .model import DIGITS_CNN, Net, init_params, relax_backbone, torch_model

__all__ = ["CLIENTS", "Digits", "Run", "load_digits", "train"]

CLIENTS = ("relax", "torch", "torch-ours")


@dataclass(frozen=True)
class Digits:
    """The split dataset: ``(N, 1, 32, 32)`` float32 images and int64 labels."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def batches(self, batch: int, steps: int, seed: int):
        """``steps`` batches of ``batch`` training images, epoch after epoch, each epoch shuffled
        by ``(seed, epoch)``; the last partial batch of an epoch is dropped."""
        per_epoch = len(self.train_x) // batch
        for step in range(steps):
            epoch, index = divmod(step, per_epoch)
            if index == 0:
                order = np.random.default_rng([seed, epoch]).permutation(len(self.train_x))
            picked = order[index * batch : (index + 1) * batch]
            yield epoch, self.train_x[picked], self.train_y[picked]


def load_digits(held_out: int = 297, seed: int = 0, size: int = 32) -> Digits:
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    images = data.images.astype("float32") / 16.0
    scale = size // images.shape[1]
    images = np.kron(images, np.ones((1, scale, scale), dtype="float32"))[:, None]
    order = np.random.default_rng(seed).permutation(len(images))
    test, train = order[:held_out], order[held_out:]
    mean, std = images[train].mean(), images[train].std()
    images = (images - mean) / std
    labels = data.target.astype("int64")
    return Digits(images[train], labels[train], images[test], labels[test])


@dataclass
class Run:
    """One client's training: the loss per step, the held-out accuracy after each epoch, and the
    seconds per step (the median; compile time excluded)."""

    client: str
    losses: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)

    @property
    def seconds_per_step(self) -> float:
        return float(np.median(self.step_seconds)) if self.step_seconds else float("nan")


def _relax_client(net: Net, params: list[np.ndarray], batch: int, lr: float, momentum: float, target):
    import tvm
    from tvm import relax
    from tvm.relax.training import Trainer
    from tvm.relax.training.loss import CrossEntropyLoss
    from tvm.relax.training.optimizer import MomentumSGD

    from ..compile import pass_context, resolve_target
    from ..relax import SetupTrainer

    loss_args = [relax.TensorType((batch, net.classes), "float32"), relax.TensorType((batch,), "int64")]
    mod = SetupTrainer(CrossEntropyLoss(), MomentumSGD(lr, momentum), loss_args, target=target)(relax_backbone(net, batch))
    device = tvm.cpu()
    target = resolve_target(target)
    with pass_context(target):  # the package's kernels compile as tvm_convgrad.build compiles them
        executable = tvm.compile(mod, target)
    trainer = Trainer(mod, relax.VirtualMachine(executable, device), device)
    trainer.load_params([p.copy() for p in params])

    def step(x, y) -> float:
        return float(trainer.update(x, y).numpy())

    def predict(x) -> np.ndarray:
        return trainer.predict(x).numpy()

    return step, predict


def _torch_client(net: Net, params: list[np.ndarray], lr: float, momentum: float, ours: bool):
    import torch

    model = torch_model(net, params, ours=ours)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)

    def step(x, y) -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        return loss.item()

    def predict(x) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(x)).numpy()

    return step, predict


def train(clients=CLIENTS, steps: int = 460, batch: int = 64, lr: float = 0.05, momentum: float = 0.9, seed: int = 0, target="llvm",
          data: Digits | None = None, net: Net = DIGITS_CNN, progress: bool = True, log=print) -> dict[str, Run]:  # fmt: skip
    """Train ``net`` with each client for ``steps`` SGD steps of ``batch`` images, the same initial
    weights (``seed``) and batches; evaluate the held-out accuracy after each epoch and at the end."""
    from tqdm import tqdm

    data = data or load_digits(seed=seed)
    params = init_params(net, seed)
    runs = {}
    for client in clients:
        if client not in CLIENTS:
            raise ValueError(f"client {client!r}: must be one of {', '.join(CLIENTS)}")
        if client == "relax":
            step, predict = _relax_client(net, params, batch, lr, momentum, target)
        else:
            step, predict = _torch_client(net, params, lr, momentum, client == "torch-ours")
        run = runs[client] = Run(client)

        def evaluate(epoch: int):
            logits = np.concatenate([predict(_pad(data.test_x[i : i + batch], batch))[: len(data.test_x[i : i + batch])]
                                     for i in range(0, len(data.test_x), batch)])  # fmt: skip
            run.accuracy.append(float((logits.argmax(1) == data.test_y).mean()))
            log(f"{client:10s} epoch {epoch:2d}  loss {np.mean(run.losses[-per_epoch:]):.4f}  held-out accuracy {run.accuracy[-1]:.3f}  "
                f"{run.seconds_per_step * 1e3:.1f} ms/step")  # fmt: skip

        per_epoch = len(data.train_x) // batch
        bar = tqdm(data.batches(batch, steps, seed), total=steps, disable=not progress, desc=client, unit="step", dynamic_ncols=True)
        for i, (epoch, x, y) in enumerate(bar):
            start = time.perf_counter()
            run.losses.append(step(x, y))
            run.step_seconds.append(time.perf_counter() - start)
            bar.set_postfix(loss=f"{run.losses[-1]:.3f}")
            if (i + 1) % per_epoch == 0:
                evaluate(epoch)
        if steps % per_epoch:
            evaluate(steps // per_epoch)
    return runs


def _pad(x: np.ndarray, batch: int) -> np.ndarray:
    """A last partial batch padded with zeros to the compiled batch size."""
    if len(x) == batch:
        return x
    return np.concatenate([x, np.zeros((batch - len(x), *x.shape[1:]), dtype=x.dtype)])
