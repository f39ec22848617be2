"""The backward pass of ``tvm_convgrad.torch.Conv2d`` against ``torch.nn.Conv2d``'s, layer by layer
(``python -m tvm_convgrad.training.torch_backward [--layers resnet50] [--batch 8] [--channels-last]
[--dtype float32]``).

Layer sets (:data:`LAYER_SETS`):

* ``resnet50``: the bench's ResNet-50 v1.5 layers (oneDNN's benchdnn shapes);
* ``late``: those of them on 14x14 and 7x7 maps, where a call's fixed costs show;
* ``atrous``: DeepLabv3's dilated layers (ResNet-101 backbone at output stride 16 on 224x224
  images: the 14x14 layer-4 3x3 convolutions at dilation 2, the ASPP's 2048 -> 256 3x3 at rates
  6, 12 and 18);
* ``resnet18``, ``mobilenet_v2``: every distinct convolution of the package's networks
  (:mod:`tvm_convgrad.torch.nets`) on ``--size`` images, with how often each occurs.

``--batch`` takes a comma-separated list (each layer at each batch). For each layer both modules
hold the same weight (no bias, as in ResNet), the same input (requiring its gradient, as inside a
network, except an RGB stem's) and the same output gradient; one sample is ``y.backward(g)`` (dX
and dW, conversions and allocations included), timed with ``time.perf_counter``; ``rounds``
samples of each, interleaved, after two warm-up calls (the kernels are built then), medians
compared. ``--dtype bfloat16`` runs both sides in bf16 (PyTorch's bf16 convolution backward).
``--backward ours`` times the package's kernels for every GEMM (the default mode, ``"auto"``, runs
PyTorch's where it times faster for the layer: the log names those GEMMs, the summary counts them).
``--roofline`` adds each layer's stock backward against its least time on this host
(:func:`.roofline.backward_bound_s`): the most any drop-in could make of its ratio.

A line names the median minor page faults of each side's backward where there are any (stock /
drop-in): whichever call grows glibc's heap back after it trimmed pays ~1 us a 4 KiB page, which
the process's allocation history decides, not the kernels (a ResNet-50 stem at N=8, 2026-12-02:
6,272-7,501 faults, 6-7 ms of its 12-20 ms on either side).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, replace

try:
    import resource
except ImportError:  # (not on Windows: no fault counts)
    resource = None

__all__ = ["LAYER_SETS", "Layer", "LayerTime", "ceilings", "layers", "main", "minor_faults", "net_layers", "time_layers", "timed_step"]

LAYER_SETS = ("resnet50", "late", "atrous", "resnet18", "mobilenet_v2")


@dataclass(frozen=True)
class Layer:
    """One ``nn.Conv2d`` call: input ``(N, C, H, W)``, ``out_channels``, square kernel, stride,
    symmetric padding, dilation, groups; ``count``: how often a network calls it."""

    name: str
    input_shape: tuple[int, int, int, int]
    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1
    count: int = 1

    def module(self):
        import torch

        return torch.nn.Conv2d(self.input_shape[1], self.out_channels, self.kernel, self.stride, self.padding, self.dilation, self.groups, bias=False)


def _atrous(batch: int) -> list[Layer]:
    layer4 = [Layer("deeplabv3.layer4_3x3_d2", (batch, 512, 14, 14), 512, 3, 1, 2, 2, count=3)]
    aspp = [Layer(f"deeplabv3.aspp_3x3_r{rate}", (batch, 2048, 14, 14), 256, 3, 1, rate, rate) for rate in (6, 12, 18)]
    return layer4 + aspp


def _resnet50(batch: int, late: bool) -> list[Layer]:
    from ..tools.bench import load_cases

    return [Layer(case.name.removesuffix(".n1"), (batch, case.Cin, case.H, case.W), case.Cout, case.KH, case.stride[0], case.pad[0],
                  case.dilation[0], case.groups, case.count)
            for case in load_cases("resnet50", (1,)) if not late or case.H <= 14]  # fmt: skip


def net_layers(net: str, batch: int, size: int) -> list[Layer]:
    """Every distinct convolution of ``net`` (:data:`tvm_convgrad.torch.nets.NETS`) on ``batch``
    images of ``size x size``, in the order the forward pass calls them, with their counts."""
    import torch

    from ..torch.nets import NETS

    model, calls = NETS[net]().eval(), {}

    def record(module, inputs, output):
        key = (tuple(inputs[0].shape), module.out_channels, module.kernel_size[0], module.stride[0], module.padding[0], module.dilation[0], module.groups)
        calls[key] = calls.get(key, 0) + 1

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(torch.zeros(batch, 3, size, size))
    for hook in hooks:
        hook.remove()
    return [Layer(f"{net}.conv{i}", *key, count=count) for i, (key, count) in enumerate(calls.items())]


def layers(layer_set: str, batches=(8,), size: int = 64, pattern: str | None = None) -> list[Layer]:
    """The layers of ``layer_set`` (:data:`LAYER_SETS`) at each batch; ``pattern``: a regex on names."""
    import re

    if layer_set not in LAYER_SETS:
        raise ValueError(f"layer set {layer_set!r}: must be one of {', '.join(LAYER_SETS)}")
    chosen = []
    for batch in batches:
        if layer_set in ("resnet50", "late"):
            found = _resnet50(batch, layer_set == "late")
        elif layer_set == "atrous":
            found = _atrous(batch)
        else:
            found = net_layers(layer_set, batch, size)
        chosen += [replace(layer, name=f"{layer.name}.n{batch}") for layer in found]
    return [layer for layer in chosen if not pattern or re.search(pattern, layer.name)]


def minor_faults() -> int:
    """Minor page faults of this process so far (0 where ``resource`` is missing)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def timed_step(step) -> tuple[float, int]:
    """``(ms, minor page faults)`` of one call of ``step``."""
    faults, start = minor_faults(), time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1e3, minor_faults() - faults


@dataclass(frozen=True)
class LayerTime:
    layer: Layer
    torch_s: float
    ours_s: float
    pytorch_gemms: tuple[str, ...] = ()  # the drop-in's GEMMs ("dx", "dw") that ran PyTorch's (tvm_convgrad.torch.backward)
    faults: tuple[int, int] = (0, 0)  # the median minor page faults of a backward, stock's and the drop-in's

    @property
    def ratio(self) -> float:
        return self.torch_s / self.ours_s


def time_layers(chosen: list[Layer], channels_last: bool = False, dtype: str = "float32", rounds: int = 7, log=print) -> list[LayerTime]:
    """The medians of ``rounds`` interleaved backward passes of each layer, stock and drop-in."""
    import torch

    from ..torch import Conv2d, backward_choices

    memory = torch.channels_last if channels_last else torch.contiguous_format
    tensor_type = getattr(torch, dtype)
    rows = []
    for layer in chosen:
        reference = layer.module().to(tensor_type, memory_format=memory)
        ours = layer.module().to(tensor_type, memory_format=memory)
        ours.__class__ = Conv2d
        x = torch.randn(layer.input_shape).to(tensor_type, memory_format=memory).requires_grad_(layer.input_shape[1] != 3)
        g = torch.randn_like(reference(x))

        def sample(module) -> tuple[float, int]:
            y = module(x)
            ms, faults = timed_step(lambda: y.backward(g))
            return ms / 1e3, faults

        chosen_before = backward_choices()
        for module in (reference, ours, reference, ours):
            sample(module)
        given_up = tuple(sorted(gemm for (call, gemm), package in backward_choices().items() if (call, gemm) not in chosen_before and not package))
        theirs, mine = [], []
        for _ in range(rounds):
            theirs.append(sample(reference))
            mine.append(sample(ours))
        (theirs_s, theirs_faults), (mine_s, mine_faults) = (tuple(map(statistics.median, zip(*samples))) for samples in (theirs, mine))
        rows.append(LayerTime(layer, theirs_s, mine_s, given_up, (round(theirs_faults), round(mine_faults))))
        r = rows[-1]
        note = f"   (PyTorch's {' and '.join(given_up)})" if given_up else ""
        faults = f"   page faults {r.faults[0]:,} / {r.faults[1]:,}" if any(r.faults) else ""
        log(f"{layer.name:40s} x{layer.count:<2d} nn.Conv2d {r.torch_s * 1e3:8.3f} ms   tvm_convgrad {r.ours_s * 1e3:8.3f} ms   ratio {r.ratio:.2f}{faults}{note}")
    return rows


def summary(rows: list[LayerTime]) -> str:
    """Geomean, min and max of the ratios; the count-weighted totals (a network's backward convs)."""
    from ..tools.bench import geomean

    ratios = [r.ratio for r in rows]
    theirs, mine = sum(r.torch_s * r.layer.count for r in rows), sum(r.ours_s * r.layer.count for r in rows)
    given_up = sum(len(r.pytorch_gemms) for r in rows)
    return (f"geomean nn.Conv2d / tvm_convgrad.torch.Conv2d backward {geomean(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(rows)} layers); every call counted: "
            f"{theirs * 1e3:.1f} ms against {mine * 1e3:.1f} ms, {theirs / mine:.2f}; "
            f"{given_up} of the drop-in's GEMMs PyTorch's (backward mode {_mode()})")  # fmt: skip


def ceilings(rows: list[LayerTime], host) -> str:
    """Each layer's stock backward against its least time on ``host`` (a
    :class:`~tvm_convgrad.training.roofline.Roofline`: dX and dW in one pass over dy), and their
    geomean: the most a drop-in's backward could make of :func:`summary`'s geomean on this host."""
    from ..tools.bench import geomean
    from .roofline import backward_bound_s

    lines, ratios = [f"roofline: {host}"], []
    for r in rows:
        bound = backward_bound_s(r.layer, host)
        ratios.append(r.torch_s / bound)
        lines.append(f"{r.layer.name:40s} nn.Conv2d {r.torch_s * 1e3:8.3f} ms   at the roofline {bound * 1e3:8.3f} ms   ceiling {ratios[-1]:.2f}")
    lines.append(f"geomean nn.Conv2d / roofline backward {geomean(ratios):.2f} (min {min(ratios):.2f}, "
                 f"{len(rows)} layers): the most any drop-in's backward could reach here")  # fmt: skip
    return "\n".join(lines)


def _mode() -> str:
    from ..torch import get_backward

    return get_backward()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", choices=LAYER_SETS, default="resnet50")
    parser.add_argument("--batch", default="8", help="comma-separated batch sizes")
    parser.add_argument("--size", type=int, default=64, help="image size for --layers resnet18 / mobilenet_v2")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--filter", default=None, help="a regex on the layer names")
    parser.add_argument("--roofline", action="store_true", help="also each layer's stock backward against its least time on this host "
                                                                    "(tvm_convgrad.training.roofline): the ceiling of the ratio")  # fmt: skip
    parser.add_argument("--backward", choices=("auto", "ours", "pytorch"), default=None,
                        help="the drop-in's backward mode (tvm_convgrad.torch.set_backward; default: TVM_CONVGRAD_BACKWARD, else auto)")
    args = parser.parse_args(argv)
    if args.backward:
        from ..torch import set_backward

        set_backward(args.backward)
    batches = tuple(int(b) for b in args.batch.split(",") if b)
    chosen = layers(args.layers, batches, args.size, args.filter)
    if not chosen:
        names = ", ".join(layer.name for layer in layers(args.layers, batches, args.size))
        parser.error(f"--filter {args.filter!r} matches none of the layers: {names}")
    rows = time_layers(chosen, args.channels_last, args.dtype, args.rounds)
    print(f"{summary(rows)} [{args.layers}, N={args.batch}, {'channels-last' if args.channels_last else 'NCHW'}, {args.dtype}]")
    if args.roofline:
        from .roofline import measure

        print(ceilings(rows, measure(args.dtype)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
