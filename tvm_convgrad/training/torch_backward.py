"""The backward pass of ``tvm_convgrad.torch.Conv2d`` against ``torch.nn.Conv2d``'s, per ResNet-50 layer
(``python -m tvm_convgrad.training.torch_backward [--channels-last] [--batch 8]``).

For each layer of the bench's ResNet-50 set: both modules hold the same weight (no bias, as in
ResNet), the same input (requiring its gradient, as inside a network) and the same output
gradient; one sample is ``y.backward(g)`` (dX and dW, conversions and allocations included),
timed with ``time.perf_counter``; ``rounds`` samples of each, interleaved, after two warm-up
calls (the kernels are built then), medians compared.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

__all__ = ["main", "time_layers"]


def time_layers(batch: int = 8, channels_last: bool = False, rounds: int = 7, pattern: str | None = None, log=print) -> list[tuple[str, float, float]]:
    """``[(layer, torch seconds, ours seconds)]``: the medians of ``rounds`` backward passes."""
    import torch

    from ..tools.bench import load_cases
    from ..torch import Conv2d

    memory = torch.channels_last if channels_last else torch.contiguous_format
    rows = []
    for case in load_cases("resnet50", (batch,), pattern):
        shape = (case.Cin, case.Cout, (case.KH, case.KW), case.stride, case.pad, case.dilation, case.groups)
        reference = torch.nn.Conv2d(*shape, bias=False).to(memory_format=memory)
        ours = Conv2d(*shape, bias=False).to(memory_format=memory)
        ours.load_state_dict(reference.state_dict())
        x = torch.randn(case.N, case.Cin, case.H, case.W).to(memory_format=memory).requires_grad_()
        g = torch.randn(case.N, case.Cout, case.OH, case.OW).to(memory_format=memory)

        def sample(module) -> float:
            y = module(x)
            start = time.perf_counter()
            y.backward(g)
            return time.perf_counter() - start

        for module in (reference, ours, reference, ours):
            sample(module)
        theirs, mine = [], []
        for _ in range(rounds):
            theirs.append(sample(reference))
            mine.append(sample(ours))
        rows.append((case.name, statistics.median(theirs), statistics.median(mine)))
        log(f"{case.name:36s} nn.Conv2d {rows[-1][1] * 1e3:8.2f} ms   tvm_convgrad {rows[-1][2] * 1e3:8.2f} ms   ratio {rows[-1][1] / rows[-1][2]:.2f}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--filter", default=None, help="a regex on the layer names")
    args = parser.parse_args(argv)
    rows = time_layers(args.batch, args.channels_last, args.rounds, args.filter)
    ratios = [t / o for _, t, o in rows]
    print(f"geomean nn.Conv2d / tvm_convgrad.torch.Conv2d backward: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(rows)} layers, N={args.batch}, "
          f"{'channels-last' if args.channels_last else 'NCHW'}, float32)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
