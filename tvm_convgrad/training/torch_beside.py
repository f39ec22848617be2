"""Whether running the drop-in slows PyTorch's own work in the same process
(``python -m tvm_convgrad.training.torch_beside [--net resnet18] [--size 8x64] [--channels-last] [--pairs 6]``).

Stock's training step is timed in two kinds of child process, each alternating two models' steps:

* **beside the drop-in**: stock's step, then the same network converted
  (:func:`tvm_convgrad.torch.convert_conv2d`, its kernels on PyTorch's OpenMP threads);
* **the control**: stock's step, then a second stock model of the same network, so that the working
  set between two of stock's steps is the same size and only whose kernels run differs.

Each child reports the median of its stock steps and of the minor page faults each of them takes
(``getrusage``). The two kinds run in alternating pairs of processes (``pairs`` of each, the order
flipped every pair: the machines drift); the result is the median over pairs of ``beside /
control - 1`` (0.05: stock 5% slower beside the drop-in).

Two processes differ in more than whose kernels run: glibc's heap keeps or returns memory by what
the whole process has allocated and freed, so stock may re-fault its heap beside one neighbour and
not the other (Zen 4, ResNet-18 8x64: 9,700-13,800 faults per stock step beside the drop-in, 0-2,300
beside a second stock model: PyTorch's own 9.4 MB per-call buffers, which glibc returns from the
heap's top after stock's step, and which a second stock model's step takes back before stock's
next one while the drop-in's step, its buffers in TVM's workspace pool, does not).
:func:`stock_after` separates the kernels' effect from that: one process holds all three models
and times stock's step right after the drop-in's and right after the second stock model's,
alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

try:
    import resource
except ImportError:  # (not on Windows: no fault counts)
    resource = None

from .torch_step import StepConfig, parse_size, trainers

__all__ = ["main", "minor_faults", "stock_after", "stock_beside", "stock_step_ms"]

NEIGHBOURS = ("drop-in", "stock")


def minor_faults() -> int:
    """Minor page faults of this process so far (0 where ``resource`` is missing)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def _timed(step) -> tuple[float, int]:
    """``(ms, minor page faults)`` of one call of ``step``."""
    faults, start = minor_faults(), time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1e3, minor_faults() - faults


def _medians(samples: list[tuple[float, int]]) -> tuple[float, float]:
    """The medians of :func:`_timed`'s ``(ms, faults)`` samples."""
    return statistics.median(ms for ms, _ in samples), statistics.median(faults for _, faults in samples)


def stock_step_ms(config: StepConfig, neighbour: str, rounds: int = 11, warmup: int = 2) -> tuple[float, float]:
    """In this process: the medians of ``rounds`` stock steps (ms, minor page faults), each
    followed by a step of ``neighbour`` (``"drop-in"`` or ``"stock"``)."""
    stock, other = trainers(config, convert=neighbour == "drop-in")
    for _ in range(warmup):
        stock()
        other()
    samples = []
    for _ in range(rounds):
        samples.append(_timed(stock))
        other()
    return _medians(samples)


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
            after[neighbour].append(_timed(stock))
    medians = {neighbour: _medians(samples) for neighbour, samples in after.items()}
    return {"config": config.name, "after": medians, "slowdown": medians["drop-in"][0] / medians["stock"][0] - 1}


def _child(config: StepConfig, neighbour: str, rounds: int) -> float:
    command = [sys.executable, "-m", __spec__.name, "--net", config.net, "--size", f"{config.batch}x{config.size}",
               "--child", neighbour, "--rounds", str(rounds)] + (["--channels-last"] if config.channels_last else [])  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["stock_ms"], report["stock_faults"]


def stock_beside(config: StepConfig, pairs: int = 6, rounds: int = 11, log=print) -> dict:
    """``pairs`` alternating pairs of child processes; returns each pair's stock ms (control,
    beside the drop-in), their slowdowns and the median slowdown."""
    rows = []
    for i in range(pairs):
        order = NEIGHBOURS if i % 2 == 0 else NEIGHBOURS[::-1]
        child = {neighbour: _child(config, neighbour, rounds) for neighbour in order}
        (control, control_faults), (beside, beside_faults) = child["stock"], child["drop-in"]
        rows.append((control, beside))
        log(f"pair {i + 1}: stock's step beside a stock model {control:.1f} ms ({control_faults:.0f} page faults), beside the drop-in "
            f"{beside:.1f} ms ({beside_faults:.0f}) ({beside / control - 1:+.1%})")  # fmt: skip
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
        ms, faults = stock_step_ms(config, args.child, args.rounds)
        print(json.dumps({"stock_ms": ms, "stock_faults": faults}))
        return 0
    result = stock_beside(config, args.pairs, args.rounds)
    print(f"{config.name}: stock's step beside the drop-in, median over {args.pairs} process pairs: {result['median_slowdown']:+.1%} "
          f"against the control (a second stock model)")  # fmt: skip
    after = stock_after(config, args.rounds)
    (ours_ms, ours_faults), (stock_ms, stock_faults) = after["after"]["drop-in"], after["after"]["stock"]
    print(f"{config.name}: in one process, stock's step right after the drop-in's {ours_ms:.1f} ms ({ours_faults:.0f} page faults), "
          f"right after a second stock model's {stock_ms:.1f} ms ({stock_faults:.0f}): {after['slowdown']:+.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
