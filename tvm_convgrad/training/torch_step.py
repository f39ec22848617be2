"""Whole PyTorch training steps, stock ``nn.Conv2d`` against the drop-in, in one process
(``tvm-convgrad bench --client torch``).

A step is what a training loop runs: ``zero_grad``, the forward pass and cross-entropy loss
(inside ``torch.autocast("cpu", dtype=torch.bfloat16)`` for the bf16 rows), ``backward``, an SGD
update with momentum. The two models are the same network with the same weights
(:mod:`tvm_convgrad.torch.nets`; the drop-in's made by :func:`tvm_convgrad.torch.convert_conv2d`),
each with its own optimizer; their steps alternate, one timed sample each per round, and the
medians are compared (the machines are noisy: only ratios from one interleaved run mean anything).

For each configuration (network, batch x image size, NCHW or channels-last, float32 or bf16
autocast) the report gives both medians, their ratio, and where the time goes: a
``torch.profiler`` trace of a few steps of each, taken in turn, self CPU time per operator (the
package's kernels are the ``tvm_convgrad::`` operators; stock's convolution backward is
``aten::convolution_backward``), the convolutions' whole time on each side (:func:`conv_ms`), and
the step's *ceiling*: stock / drop-in for a drop-in whose convolutions all ran at this host's
roofline (:mod:`.roofline`, the host's rates measured before each configuration, the fastest kept).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .roofline import Roofline, ceiling, conv_bound_ms, measure
from .torch_backward import minor_faults, net_layers, timed_step

__all__ = ["CONV_ENTRIES", "StepConfig", "StepResult", "configs", "conv_ms", "main", "minor_faults", "parse_size", "time_steps", "timed_step", "trainers"]

SIZES = ("8x64", "32x112")
"""The default batch x image sizes (any ``BATCHxSIZE`` is accepted)."""


def parse_size(text: str) -> tuple[int, int]:
    """``"8x64"`` -> ``(8, 64)``: batch, image height = width."""
    batch, _, size = text.partition("x")
    if not (batch.isdigit() and size.isdigit() and int(batch) > 0 and int(size) >= 32):
        raise ValueError(f"size {text!r} must be BATCHxSIZE with BATCH >= 1 and SIZE >= 32 (e.g. 8x64)")
    return int(batch), int(size)


@dataclass(frozen=True)
class StepConfig:
    net: str  # a key of tvm_convgrad.torch.nets.NETS
    batch: int
    size: int
    channels_last: bool
    dtype: str  # float32, or bfloat16 (autocast)

    @property
    def name(self) -> str:
        return f"{self.net} {self.batch}x3x{self.size}x{self.size} {'channels-last' if self.channels_last else 'NCHW'} {self.dtype}"


@dataclass
class StepResult:
    config: StepConfig
    stock_ms: float
    ours_ms: float
    stock_samples: list[float]
    ours_samples: list[float]
    stock_profile: list[tuple[str, float]] = field(default_factory=list)  # (operator, ms per step)
    ours_profile: list[tuple[str, float]] = field(default_factory=list)
    stock_faults: list[int] = field(default_factory=list)  # minor page faults of each timed step
    ours_faults: list[int] = field(default_factory=list)
    stock_conv_ms: float = 0.0  # the convolutions' whole time per profiled step (see conv_ms)
    ours_conv_ms: float = 0.0
    stock_profiled_ms: float = 0.0  # a profiled step's time (profiler included): what stock_conv_ms is a share of
    ours_profiled_ms: float = 0.0
    conv_bound_ms: float = 0.0  # the least they could take on this host (roofline.conv_bound_ms); 0: not computed
    host: str = ""  # that roofline's two rates

    @property
    def ratio(self) -> float:
        """stock / drop-in (above 1: the drop-in trains faster)."""
        return self.stock_ms / self.ours_ms

    @property
    def round_ratios(self) -> list[float]:
        """stock / drop-in of each round: its two steps ran back to back, so a drift of the
        host's speed between rounds moves both (the spread of these is the run's noise)."""
        return [stock / ours for stock, ours in zip(self.stock_samples, self.ours_samples)]

    @property
    def ceiling(self) -> float:
        """The most any drop-in convolution could make of :attr:`ratio` on this host
        (:func:`.roofline.ceiling`); 0 where the step was not profiled or bounded."""
        if not (self.stock_conv_ms and self.conv_bound_ms):
            return 0.0
        return ceiling(self.stock_ms, self.stock_conv_ms, self.conv_bound_ms, self.stock_profiled_ms or None)


def configs(nets, sizes, layouts, dtypes) -> list[StepConfig]:
    return [StepConfig(net, *parse_size(size), layout == "channels-last", dtype) for net in nets for size in sizes for layout in layouts
            for dtype in dtypes]  # fmt: skip


def trainers(config: StepConfig, seed: int = 0, convert: bool = True):
    """Step functions of the stock model and of its copy (the drop-in; another stock model when
    not ``convert``), each with its own SGD optimizer, on the same batch."""
    import torch
    import torch.nn.functional as F

    from ..torch import convert_conv2d
    from ..torch.nets import NETS

    torch.manual_seed(seed)
    memory = torch.channels_last if config.channels_last else torch.contiguous_format
    stock = NETS[config.net](classes=100).to(memory_format=memory)
    ours = copy.deepcopy(stock)
    if convert:
        convert_conv2d(ours)
    x = torch.randn(config.batch, 3, config.size, config.size).to(memory_format=memory)
    target = torch.randint(0, 100, (config.batch,))
    autocast = config.dtype == "bfloat16"

    def trainer(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(model(x), target)
            loss.backward()
            optimizer.step()

        return step

    return trainer(stock), trainer(ours)


CONV_ENTRIES = ("aten::conv2d", "Conv2dFunction", "tvm_convgrad::conv2d", "autograd::engine::evaluate_function: ConvolutionBackward0",
                "autograd::engine::evaluate_function: Conv2dFunctionBackward",
                "autograd::engine::evaluate_function: torch::autograd::CppNode<tvm_convgrad::Conv2dNative>")  # fmt: skip
"""The profiler's ranges a convolution's forward or backward runs in, stock or drop-in (eager or
its operators; the drop-in's Python node or its C++ one, :mod:`tvm_convgrad.torch.native`): whatever
runs inside one (``mkldnn_convolution``, the package's kernels, the BLAS way's ``aten::mm``, a layout
copy) is the convolution's time."""


def conv_ms(events) -> float:
    """The whole CPU time (ms) of the outermost :data:`CONV_ENTRIES` ranges among a profiled
    step's ``events``."""

    def nested(event) -> bool:
        parent = event.cpu_parent
        while parent is not None and parent.name not in CONV_ENTRIES:
            parent = parent.cpu_parent
        return parent is not None

    return sum(e.cpu_time_total for e in events if e.name in CONV_ENTRIES and not nested(e)) / 1e3


def _profile(step) -> tuple[dict[str, float], float, float]:
    """One profiled step: self CPU time per operator (ms), the convolutions' whole time
    (:func:`conv_ms`) and the step's time (ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        step_ms = (time.perf_counter() - start) * 1e3
    return {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}, conv_ms(prof.events()), step_ms


def _in_turn(stock, ours, rounds: int):
    """The two sides' steps for ``rounds`` rounds, one of each a round, who goes first alternating
    (stock, drop-in, drop-in, stock, ...): a drift of the host's speed falls on both alike."""
    for r in range(rounds):
        yield from (stock, ours) if r % 2 == 0 else (ours, stock)


def _profiles(stock, ours, steps: int) -> dict:
    """``steps`` profiled steps of each side, one of each in turn, the order alternating as the
    timed steps': profiling one side's steps after the other's put the host's drift between them
    (MobileNetV2 channels-last f32 at 32 x 112x112, Zen 4: PyTorch's BatchNorm backward read 87 ms
    a step on the drop-in's side against 59 on stock's that way, 44 against 41 in four interleaved
    pairs). Per side: each operator's median self CPU time (ms per step; 0 in a step that did not
    run it), largest first, and the medians of the convolutions' time and of the step's."""
    samples: dict = {stock: [], ours: []}
    for step in _in_turn(stock, ours, steps):
        samples[step].append(_profile(step))
    profiles = {}
    for side, runs in samples.items():
        names = {name for ops, _, _ in runs for name in ops}
        rows = [(name, statistics.median(ops.get(name, 0.0) for ops, _, _ in runs)) for name in names]
        profiles[side] = (sorted(rows, key=lambda r: -r[1]), statistics.median(c for _, c, _ in runs), statistics.median(t for _, _, t in runs))
    return profiles


def time_steps(config: StepConfig, rounds: int = 9, warmup: int = 2, profile_steps: int = 3, log=print,
               host: Roofline | None = None) -> StepResult:  # fmt: skip
    """Medians of ``rounds`` interleaved steps of stock and drop-in (after ``warmup`` steps of
    each, which build the kernels), and ``profile_steps`` profiled steps of each, interleaved too
    (:func:`_profiles`); with the ``host``'s roofline, the least the step's convolutions could
    take (:mod:`.roofline`)."""
    stock, ours = trainers(config)
    for _ in range(warmup):
        stock()
        ours()
    samples: dict = {stock: [], ours: []}
    faults: dict = {stock: [], ours: []}
    for step in _in_turn(stock, ours, rounds):
        ms, step_faults = timed_step(step)
        samples[step].append(ms)
        faults[step].append(step_faults)
    result = StepResult(config, statistics.median(samples[stock]), statistics.median(samples[ours]), samples[stock], samples[ours],
                        stock_faults=faults[stock], ours_faults=faults[ours])  # fmt: skip
    if profile_steps:
        profiles = _profiles(stock, ours, profile_steps)
        result.stock_profile, result.stock_conv_ms, result.stock_profiled_ms = profiles[stock]
        result.ours_profile, result.ours_conv_ms, result.ours_profiled_ms = profiles[ours]
    if host is not None:
        result.conv_bound_ms, result.host = conv_bound_ms(net_layers(config.net, config.batch, config.size), host), str(host)
    log(f"{config.name:52s} stock {result.stock_ms:8.1f} ms   drop-in {result.ours_ms:8.1f} ms   stock/drop-in {result.ratio:.2f}")
    return result


def _faults(counts: list[int]) -> str:
    """The median and range of the timed steps' page faults (each costs ~1-2 us of zeroing; glibc
    hands a tensor of 32 MB or more fresh pages every time)."""
    return f"{statistics.median(counts):,.0f} ({min(counts):,}-{max(counts):,})" if counts else "-"


def _spread(ratios: list[float]) -> str:
    """The lowest and highest of the rounds' ratios."""
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"


def report(results: list[StepResult], top: int = 8) -> str:
    """Markdown: the table of steps, then each configuration's largest operators on both sides."""
    from ..tools.bench import geomean
    from ..torch.openmp import using_pytorch_threads

    lines = ["| network | batch x size | layout | type | stock ms/step | drop-in ms/step | stock / drop-in | each round | ceiling | "
             "page faults / step, stock / drop-in |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        c = r.config
        lines.append(f"| {c.net} | {c.batch} x {c.size}x{c.size} | {'channels-last' if c.channels_last else 'NCHW'} | "
                     f"{'bf16 autocast' if c.dtype == 'bfloat16' else 'f32'} | {r.stock_ms:.1f} | {r.ours_ms:.1f} | **{r.ratio:.2f}** | "
                     f"{_spread(r.round_ratios)} | {f'{r.ceiling:.2f}' if r.ceiling else '-'} | "
                     f"{_faults(r.stock_faults)} / {_faults(r.ours_faults)} |")  # fmt: skip
    ratios = [r.ratio for r in results]
    lines += ["", f"geomean stock / drop-in {geomean(ratios):.2f} over {len(results)} configurations "
              f"(min {min(ratios):.2f}); the drop-in's kernels on PyTorch's OpenMP threads: {using_pytorch_threads()}",
              "", "stock / drop-in: the ratio of the two sides' median steps; each round: the lowest and highest ratio of a "
              "round's two steps, run back to back (the run's noise)",
              "", "ceiling: the most any convolution kernel could make of stock / drop-in on this host: every convolution, "
              "forward and backward, at its roofline (tvm_convgrad.training.roofline)", ""]  # fmt: skip
    for r in results:
        if not r.stock_profile:
            continue
        lines += [f"### {r.config.name}", "", "| stock operator | ms/step | drop-in operator | ms/step |", "|---|---|---|---|"]
        for (a, ta), (b, tb) in zip(r.stock_profile[:top], r.ours_profile[:top]):
            lines.append(f"| `{a}` | {ta:.2f} | `{b}` | {tb:.2f} |")
        lines += ["", f"convolutions (forward and gradients, all they run): stock {r.stock_conv_ms:.1f} ms/step, "
                  f"drop-in {r.ours_conv_ms:.1f} ms/step (profiled steps, profiler overhead included)"
                  + (f"; at this host's roofline ({r.host}) at least {r.conv_bound_ms:.1f} ms/step" if r.conv_bound_ms else ""), ""]  # fmt: skip
    return "\n".join(lines)


def main(nets=("resnet18", "mobilenet_v2"), sizes=SIZES, layouts=("nchw", "channels-last"), dtypes=("float32", "bfloat16"),
         rounds: int = 9, out: Path = Path("bench_torch"), log=print) -> list[StepResult]:  # fmt: skip
    """Time every configuration; write ``steps.json`` and ``steps.md`` under ``out``."""
    import platform

    import torch

    hosts, results = {}, []
    for config in configs(nets, sizes, layouts, dtypes):  # the host's rates again before each: the fastest seen so far
        host = measure(config.dtype)
        hosts[config.dtype] = host = hosts[config.dtype].best(host) if config.dtype in hosts else host
        results.append(time_steps(config, rounds, log=log, host=host))
    log("this host's roofline: " + "; ".join(f"{dtype}: {host}" for dtype, host in hosts.items()))
    out.mkdir(parents=True, exist_ok=True)
    header = f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}\n\n"
    (out / "steps.md").write_text(header + report(results) + "\n")
    rows = [{**asdict(r), "ratio": r.ratio, "round_ratios": r.round_ratios, "ceiling": r.ceiling} for r in results]
    (out / "steps.json").write_text(json.dumps(rows, indent=1))
    log(f"wrote {out / 'steps.md'} and {out / 'steps.json'}")
    return results


def add_arguments(parser: argparse.ArgumentParser):
    """``bench``'s ``--client`` and the options of ``--client torch``."""
    parser.add_argument("--client", choices=("kernels", "torch"), default="kernels",
                        help="kernels: the shape set's gradients against PyTorch's; torch: whole PyTorch training steps, nn.Conv2d "
                             "against tvm_convgrad.torch.Conv2d (--nets, --sizes, --layouts, --dtypes)")  # fmt: skip
    parser.add_argument("--nets", default="resnet18,mobilenet_v2", help="comma-separated: resnet18, mobilenet_v2")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated BATCHxSIZE (images SIZE x SIZE)")
    parser.add_argument("--layouts", default="nchw,channels-last", help="comma-separated: nchw, channels-last")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16 (autocast)")


def _choices(text: str, allowed, option: str) -> tuple[str, ...]:
    values = tuple(v for v in text.split(",") if v)
    if not values or any(v not in allowed for v in values):
        raise ValueError(f"--{option} {text!r}: each must be one of {', '.join(allowed)}")
    return values


def command(args: argparse.Namespace) -> int:
    """``tvm-convgrad bench --client torch``: exit status 2 on a bad option."""
    import sys

    try:
        sizes = tuple(v for v in args.sizes.split(",") if v)
        if not sizes:
            raise ValueError(f"--sizes {args.sizes!r}: give at least one BATCHxSIZE")
        for size in sizes:
            try:
                parse_size(size)
            except ValueError as err:
                raise ValueError(f"--sizes {args.sizes!r}: {err}") from None
        selection = (_choices(args.nets, ("resnet18", "mobilenet_v2"), "nets"), sizes,
                     _choices(args.layouts, ("nchw", "channels-last"), "layouts"), _choices(args.dtypes, ("float32", "bfloat16"), "dtypes"))  # fmt: skip
    except ValueError as err:
        print(f"tvm-convgrad bench: {err}", file=sys.stderr)
        return 2
    main(*selection, rounds=args.rounds, out=Path(args.out))
    return 0
