"""Whether running the drop-in slows PyTorch's own work in the same process
(``python -m tvm_convgrad.training.torch_beside [--net resnet18] [--size 8x64] [--channels-last] [--pairs 6]``).

Stock's training step is timed in three kinds of child process:

* **beside the drop-in**: stock's step, then the same network converted
  (:func:`tvm_convgrad.torch.convert_conv2d`, its kernels on PyTorch's OpenMP threads), alternating;
* **alone**: stock's steps one after another, in a process that never builds the drop-in and
  keeps glibc's own heap rule (``TVM_CONVGRAD_HEAP=glibc``: as in a process without the package;
  the issue's "a process that does not");
* **beside stock**: stock's step, then a second stock model of the same network, so that the
  working set between two of stock's steps is the same size and only whose kernels run differs.

Each child reports the median of its stock steps and of the minor page faults each of them takes
(``getrusage``). The kinds run in rounds of one process each (``pairs`` rounds, the order rotated
every round: the machines drift); the result is, for each control, the median over rounds of
``beside / control - 1`` (0.05: stock 5% slower beside the drop-in).

Two processes differ in more than whose kernels run: under glibc's own rule the heap keeps or
returns memory by what the whole process has allocated and freed, so stock may re-fault its heap
beside one neighbour and not the other (Zen 4, ResNet-18 8x64: 13,792 faults per stock step beside
the drop-in, 0 alone: stock's ``zero_grad`` freed its 9.4 MB weight gradients onto a free heap top,
which glibc trimmed). Importing :mod:`tvm_convgrad.torch` pins glibc's thresholds
(:mod:`tvm_convgrad.torch.heap`), which ends that; the "alone" child keeps glibc's rule, so the
comparison with it includes the pin's effect on stock. :func:`stock_after` separates the kernels'
effect from the process's: one process holds all three models and times stock's step right after
the drop-in's and right after the second stock model's, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from .torch_step import StepConfig, minor_faults, parse_size, timed_step, trainers

__all__ = ["main", "minor_faults", "stock_after", "stock_beside", "stock_step_ms"]

NEIGHBOURS = ("drop-in", "alone", "stock")
"""What runs between two of stock's steps in a child: the drop-in, nothing, or a second stock model."""
CONTROLS = ("alone", "stock")


def _medians(samples: list[tuple[float, int]]) -> tuple[float, float]:
    """The medians of :func:`.torch_backward.timed_step`'s ``(ms, faults)`` samples."""
    return statistics.median(ms for ms, _ in samples), statistics.median(faults for _, faults in samples)


def stock_step_ms(config: StepConfig, neighbour: str, rounds: int = 11, warmup: int = 2) -> tuple[float, float]:
    """In this process: the medians of ``rounds`` stock steps (ms, minor page faults), each
    followed by a step of ``neighbour`` (``"drop-in"``, ``"stock"``, or ``"alone"``: none)."""
    stock, other = trainers(config, convert=neighbour == "drop-in")
    if neighbour == "alone":
        other = _nothing  # (a second stock model is built, and never run)
    for _ in range(warmup):
        stock()
        other()
    samples = []
    for _ in range(rounds):
        samples.append(timed_step(stock))
        other()
    return _medians(samples)


def _nothing() -> None:
    """The neighbour of stock's steps in the ``"alone"`` child."""


def stock_after(config: StepConfig, rounds: int = 11, warmup: int = 2) -> dict:
    """In one process holding stock, the drop-in and a second stock model: stock's step timed
    right after a drop-in step and right after a second stock step, alternating; the medians
    (ms, minor page faults) of each and ``slowdown`` = after the drop-in / after stock - 1."""
    stock, ours = trainers(config)
    _, other = trainers(config, convert=False)
    for _ in range(warmup):
        for step in (stock, ours, stock, other):
            step()
    after = {"drop-in": [], "stock": []}
    for _ in range(rounds):
        for neighbour, step in (("drop-in", ours), ("stock", other)):
            step()
            after[neighbour].append(timed_step(stock))
    medians = {neighbour: _medians(samples) for neighbour, samples in after.items()}
    return {"config": config.name, "after": medians, "slowdown": medians["drop-in"][0] / medians["stock"][0] - 1}


def _child(config: StepConfig, neighbour: str, rounds: int) -> tuple[float, float, bool]:
    """One child process of ``neighbour``'s kind: its stock step's medians (ms, minor page faults)
    and whether its heap thresholds were pinned."""
    command = [sys.executable, "-m", __spec__.name, "--net", config.net, "--size", f"{config.batch}x{config.size}",
               "--child", neighbour, "--rounds", str(rounds)] + (["--channels-last"] if config.channels_last else [])  # fmt: skip
    env = {**os.environ, "TVM_CONVGRAD_HEAP": "glibc"} if neighbour == "alone" else None
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["stock_ms"], report["stock_faults"], report["heap_pinned"]


def stock_beside(config: StepConfig, pairs: int = 6, rounds: int = 11, log=print) -> dict:
    """``pairs`` rounds of one child process of each kind (:data:`NEIGHBOURS`), the order rotated
    every round; returns each round's stock ms per kind, whether each kind's heap thresholds were
    pinned and, per control (:data:`CONTROLS`), the rounds' slowdowns beside the drop-in and their median."""
    rows = []
    for i in range(pairs):
        order = NEIGHBOURS[i % len(NEIGHBOURS):] + NEIGHBOURS[:i % len(NEIGHBOURS)]
        child = {neighbour: _child(config, neighbour, rounds) for neighbour in order}
        rows.append({neighbour: ms for neighbour, (ms, _, _) in child.items()})
        heaps = {neighbour: pinned for neighbour, (_, _, pinned) in child.items()}  # the same kinds every round
        beside = child["drop-in"][0]
        log(f"round {i + 1}: stock's step " + ", ".join(f"{_WHERE[n]} {ms:.1f} ms ({faults:.0f} page faults{'' if pinned else ', glibc heap rule'})" for n, (ms, faults, pinned) in child.items())
            + "; beside the drop-in against " + ", ".join(f"{_WHERE[c]} {beside / child[c][0] - 1:+.1%}" for c in CONTROLS))  # fmt: skip
    slowdowns = {control: [row["drop-in"] / row[control] - 1 for row in rows] for control in CONTROLS}
    return {"config": config.name, "rounds": rows, "slowdowns": slowdowns, "heap_pinned": heaps,
            "median_slowdown": {control: statistics.median(values) for control, values in slowdowns.items()}}  # fmt: skip


_WHERE = {"drop-in": "beside the drop-in", "alone": "alone", "stock": "beside a stock model"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", choices=("resnet18", "mobilenet_v2"), default="resnet18")
    parser.add_argument("--size", default="8x64", help="BATCHxSIZE")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--pairs", type=int, default=6, help="rounds of one process of each kind")
    parser.add_argument("--rounds", type=int, default=11, help="stock steps timed per process")
    parser.add_argument("--child", choices=NEIGHBOURS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = StepConfig(args.net, *parse_size(args.size), args.channels_last, "float32")
    if args.child:
        ms, faults = stock_step_ms(config, args.child, args.rounds)
        from ..torch import heap_pinned

        print(json.dumps({"stock_ms": ms, "stock_faults": faults, "heap_pinned": heap_pinned()}))
        return 0
    result = stock_beside(config, args.pairs, args.rounds)
    medians = result["median_slowdown"]
    print(f"{config.name}: stock's step beside the drop-in, median over {args.pairs} rounds of processes: {medians['alone']:+.1%} against "
          f"stock alone, {medians['stock']:+.1%} against stock beside a second stock model")  # fmt: skip
    after = stock_after(config, args.rounds)
    (ours_ms, ours_faults), (stock_ms, stock_faults) = after["after"]["drop-in"], after["after"]["stock"]
    print(f"{config.name}: in one process, stock's step right after the drop-in's {ours_ms:.1f} ms ({ours_faults:.0f} page faults), "
          f"right after a second stock model's {stock_ms:.1f} ms ({stock_faults:.0f}): {after['slowdown']:+.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
