"""The benchmark shape set (``data/bench_shapes.json``: ResNet-50 v1.5 from oneDNN's benchdnn, a
ResNeXt grouped conv, MobileNetV2 depthwise, a dilated conv, R3D-18's 3-D layers; N = 1 and 8)
and each case's gradients as the package's operators."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Sequence

from tvm import te

from ... import dsl, layout
from ...dsl.compute import cube_util
from ...frontends import onednn
from ...tvm import placeholder

__all__ = ["OPS", "SUITES", "BenchCase", "load_cases", "onednn_result", "tbe_result"]

OPS = {"filter": "wgrad", "input": "dgrad", "forward": "fwd"}


@dataclass(frozen=True)
class BenchCase:
    """One convolution of the shape set (NCHW, PyTorch conventions, symmetric pads). A 3-D one
    (kind ``conv3d``, NCDHW) adds ``D``, ``KD``, ``OD``; its ``stride`` / ``pad`` / ``dilation``
    then have three entries, depth first."""

    name: str
    kind: str
    N: int
    Cin: int
    H: int
    W: int
    Cout: int
    KH: int
    KW: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    OH: int
    OW: int
    count: int = 1
    D: int = 1
    KD: int = 1
    OD: int = 1

    @property
    def rank(self) -> int:
        """Spatial rank: 2 or 3."""
        return len(self.stride)

    @property
    def flops(self) -> int:
        return 2 * self.N * self.Cout * (self.Cin // self.groups) * self.KD * self.KH * self.KW * self.OD * self.OH * self.OW

    @property
    def spatial(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(input, output, kernel)`` spatial extents, depth first in 3-D."""
        depth = self.rank == 3
        return (
            ((self.D,) if depth else ()) + (self.H, self.W),
            ((self.OD,) if depth else ()) + (self.OH, self.OW),
            ((self.KD,) if depth else ()) + (self.KH, self.KW),
        )

    @property
    def filter_sizes(self) -> list[int]:
        return [self.Cout, self.Cin // self.groups, *self.spatial[2]]

    @property
    def pads(self) -> list[int]:
        return [self.pad[0], self.pad[0], self.pad[1], self.pad[1]]


SUITES = ("resnet50", "all", "conv3d")
"""``resnet50``; ``all`` (every 2-D kind); ``conv3d`` (3-D layers, through ``--api onednn``)."""


def load_cases(suite: str = "resnet50", batches: Sequence[int] = (1, 8), pattern: str | None = None) -> list[BenchCase]:
    """Cases of the shape set: ``suite`` (:data:`SUITES`), batch sizes, a name regex."""
    text = resources.files("tvm_convgrad").joinpath("data/bench_shapes.json").read_text()
    cases = []
    for c in json.loads(text)["cases"]:
        wanted = {"all": c["kind"] != "conv3d", "resnet50": c["kind"] == "resnet50", "conv3d": c["kind"] == "conv3d"}
        if not wanted.get(suite, False):
            continue
        if c["N"] not in batches:
            continue
        if pattern and not re.search(pattern, c["name"]):
            continue
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in c.items() if k in BenchCase.__dataclass_fields__}
        cases.append(BenchCase(**fields))
    return cases


def tbe_result(case: BenchCase, op: str):
    """The DSL result tensor of one gradient of ``case`` (float16 inputs in TBE layouts); ``op``
    forward: the forward itself (TBE's ``conv``)."""
    name = re.sub(r"\W", "_", f"bench_{OPS[op]}_{case.name}")
    if op == "forward":
        data = placeholder(layout.shape_5hd(case.N, case.Cin, case.H, case.W), name="data", dtype="float16")
        weight = placeholder(layout.shape_fracz(case.filter_sizes, case.groups), name="weight", dtype="float16")
        para = {"pad_h": case.pad[0], "pad_w": case.pad[1], "stride_h": case.stride[0], "stride_w": case.stride[1], "dilate_h": case.dilation[0],
                "dilate_w": case.dilation[1], "filter_h": case.KH, "filter_w": case.KW, "group": case.groups,
                "weight_ori_shape_nchw": case.filter_sizes, "kernel_name": name}  # fmt: skip
        return dsl.conv(data, weight, para)
    dy = placeholder(layout.shape_5hd(case.N, case.Cout, case.OH, case.OW), name="out_backprop", dtype="float16")
    para = {"strides": list(case.stride), "padding": case.pads, "dilations": [1, 1, *case.dilation]}
    if op == "filter":
        x = placeholder(layout.shape_5hd(case.N, case.Cin, case.H, case.W), name="input_x", dtype="float16")
        return dsl.conv2d_backprop_filter(x, dy, case.filter_sizes, {**para, "groups": case.groups, "kernel_name": name})
    filters = placeholder(layout.shape_fracz(case.filter_sizes, case.groups), name="filters", dtype="float16")
    group_dict = cube_util.calculate_group(case.filter_sizes, case.groups)
    return dsl.conv2d_backprop_input(
        filters, dy, case.filter_sizes, [case.N, case.Cin, case.H, case.W], {**para, "group_dict": group_dict, "kernel_name": name}
    )


def onednn_result(case: BenchCase, op: str = "filter", dtype: str = "float32"):
    """One gradient of ``case`` through the oneDNN Graph frontend (NXC, XIO, ``dtype`` float32 or
    bfloat16): ``ConvolutionBackwardWeights`` (``op`` filter) or ``ConvolutionBackwardData`` (input);
    or the forward ``Convolution`` (``op`` forward)."""
    size, out, kernel = case.spatial
    dy = te.placeholder((case.N, *out, case.Cout), dtype, name="diff_dst")
    weights_shape = [*kernel, case.Cin // case.groups, case.Cout]
    attrs = {"strides": list(case.stride), "pads_begin": list(case.pad), "pads_end": list(case.pad), "dilations": list(case.dilation),
             "groups": case.groups, "kernel_name": re.sub(r"\W", "_", f"bench_onednn_{OPS[op]}_{case.name}")}  # fmt: skip
    if op == "input":
        w = te.placeholder(weights_shape, dtype, name="weights")
        return onednn.convolution_backward_data(dy, w, [case.N, *size, case.Cin], **attrs)
    if op == "forward":
        x = te.placeholder((case.N, *size, case.Cin), dtype, name="src")
        return onednn.convolution(x, te.placeholder(weights_shape, dtype, name="weights"), **attrs)
    x = te.placeholder((case.N, *size, case.Cin), dtype, name="src")
    return onednn.convolution_backward_weights(x, dy, weights_shape, **attrs)
