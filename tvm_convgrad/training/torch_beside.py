"""Whether running the drop-in slows PyTorch's own work in the same process
(``python -m tvm_convgrad.training.torch_beside [--net resnet18] [--size 8x64] [--channels-last] [--pairs 6]``).

Stock's training step is timed in two kinds of child process, each alternating two models' steps:

* **beside the drop-in**: stock's step, then the same network converted
  (:func:`tvm_convgrad.torch.convert_conv2d`, its kernels on PyTorch's OpenMP threads);
* **the control**: stock's step, then a second stock model of the same network, so that the working
  set between two of stock's steps is the same size and only whose kernels run differs.

Each child reports the median of its stock steps. The two kinds run in alternating pairs of
processes (``pairs`` of each, the order flipped every pair: the machines drift); the result is the
median over pairs of beside / control - 1 (0.05: stock 5% slower beside the drop-in).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from .torch_step import StepConfig, parse_size, trainers

__all__ = ["main", "stock_beside", "stock_step_ms"]

NEIGHBOURS = ("drop-in", "stock")


def stock_step_ms(config: StepConfig, neighbour: str, rounds: int = 11, warmup: int = 2) -> float:
    """In this process: the median of ``rounds`` stock steps, each followed by a step of
    ``neighbour`` (``"drop-in"`` or ``"stock"``)."""
    stock, other = trainers(config, convert=neighbour == "drop-in")
    for _ in range(warmup):
        stock()
        other()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        stock()
        samples.append((time.perf_counter() - start) * 1e3)
        other()
    return statistics.median(samples)


def _child(config: StepConfig, neighbour: str, rounds: int) -> float:
    command = [sys.executable, "-m", __spec__.name, "--net", config.net, "--size", f"{config.batch}x{config.size}",
               "--child", neighbour, "--rounds", str(rounds)] + (["--channels-last"] if config.channels_last else [])  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["stock_ms"]


def stock_beside(config: StepConfig, pairs: int = 6, rounds: int = 11, log=print) -> dict:
    """``pairs`` alternating pairs of child processes; returns each pair's stock ms (control,
    beside the drop-in), their slowdowns and the median slowdown."""
    rows = []
    for i in range(pairs):
        order = NEIGHBOURS if i % 2 == 0 else NEIGHBOURS[::-1]
        ms = {neighbour: _child(config, neighbour, rounds) for neighbour in order}
        rows.append((ms["stock"], ms["drop-in"]))
        log(f"pair {i + 1}: stock's step beside a stock model {ms['stock']:.1f} ms, beside the drop-in {ms['drop-in']:.1f} ms "
            f"({ms['drop-in'] / ms['stock'] - 1:+.1%})")  # fmt: skip
    slowdowns = [beside / control - 1 for control, beside in rows]
    return {"config": config.name, "pairs": rows, "slowdowns": slowdowns, "median_slowdown": statistics.median(slowdowns)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", choices=("resnet18", "mobilenet_v2"), default="resnet18")
    parser.add_argument("--size", default="8x64", help="BATCHxSIZE")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=11, help="stock steps timed per process")
    parser.add_argument("--child", choices=NEIGHBOURS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = StepConfig(args.net, *parse_size(args.size), args.channels_last, "float32")
    if args.child:
        print(json.dumps({"stock_ms": stock_step_ms(config, args.child, args.rounds)}))
        return 0
    result = stock_beside(config, args.pairs, args.rounds)
    print(f"{config.name}: stock's step beside the drop-in, median over {args.pairs} process pairs: {result['median_slowdown']:+.1%} "
          f"against the control (a second stock model)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
