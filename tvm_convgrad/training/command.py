"""``tvm-convgrad train``: the digits CNN trained three ways (see :mod:`.run`), with a progress bar,
the loss and held-out accuracy per epoch, the time per step, and a loss-curve PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "command"]

HELP = """Train a small CNN (5 convs: strided, depthwise dilated, grouped) on scikit-learn's handwritten
digits (1797 images, no download), the same initial weights and batches three ways: Relax with the
package's conv2d gradients (relax), PyTorch with nn.Conv2d (torch), PyTorch with
tvm_convgrad.torch.Conv2d (torch-ours). Writes train.json and loss_curve.png under --out.

  tvm-convgrad train                       # 460 steps of 64 images, SGD lr 0.05, momentum 0.9
  tvm-convgrad train --clients relax --steps 100
"""


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a CNN on the digits dataset: Relax and PyTorch with the package's gradients",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--clients", default="relax,torch,torch-ours", help="comma-separated: relax, torch, torch-ours")
    p.add_argument("--steps", type=int, default=460)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("train-digits"))
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .report import summary, write
    from .run import CLIENTS, train

    clients = tuple(c.strip() for c in args.clients.split(",") if c.strip())
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown or not clients:
        raise SystemExit(f"tvm-convgrad train: --clients {args.clients!r}: each must be one of {', '.join(CLIENTS)}")
    settings = {k: getattr(args, k) for k in ("steps", "batch", "lr", "momentum", "seed")} | {"clients": list(clients)}
    runs = train(clients, args.steps, args.batch, args.lr, args.momentum, args.seed, progress=args.progress)
    for line in summary(runs):
        print(line)
    for path in write(runs, args.out, settings):
        print(f"wrote {path}")
    return 0
