"""Issue 27: F(2x2, 3x3) on bf16 pairs, what a ``vdpbf16ps`` target (Zen 4) runs for a bf16
forward, stride-1 dX or dW under ``algorithm="auto"`` where it pays: the transformed tiles and weights
(the dW: tiles of x and dy) rounded to bf16 (to nearest, ties to even), the 16 GEMMs on ``vdpbf16ps``.

Every kernel runs in its emulated form where the host lacks the instruction
(:func:`tvm_convgrad.emulate_bf16_dot`), against the float64 reference written from the
convolution's formula, within a bound written from F(2x2, 3x3)'s formulas (Lavin and Gray): each
operand of a product rounded once (relative error 2^-8 each, bf16's unit roundoff), so every output is off by at
most 2^-7 of the same sums taken over the transforms' magnitudes, plus the direct kernels' bound.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from framework_cases import Case, arrays, expected, pair_winograd_bound, placeholders
from framework_cases import call as case_call
from test_winograd import _case as winograd_case
from test_winograd import _check_rows_in_task, _cpu
from tvm import te
from tvm.target import Target

from tvm_convgrad import build, emulate_bf16_dot
from tvm_convgrad.compile import Workload
from tvm_convgrad.dsl.compute.pairs import PAIR_DTYPE, rounded_pair
from tvm_convgrad.frontends import onednn
from tvm_convgrad.schedule import rule_for
from tvm_convgrad.tools.verify import error_bound


def _znver4() -> Target:
    return _cpu("znver4")


def _case(op: str, batch: int, cin: int, cout: int, size, pads=((1, 1), (1, 1)), data_format="NXC", bias=False) -> Case:
    """``test_winograd``'s 3x3 stride-1 call in bf16 under ``"auto"``, OIX weights."""
    return replace(winograd_case(op, batch, cin, cout, size, pads, data_format, "OIX", bias, algorithm="auto"), dtype="bfloat16")


_CASES = [
    ("fwd", 2, 64, 64, (16, 16), ((1, 1), (1, 1)), "NXC", True),  # 8 tiles a row, a bias
    ("fwd", 4, 64, 64, (7, 7), ((1, 1), (1, 1)), "NCX", False),  # odd: 4 x 4 tiles, a register tile across rows and images
    ("data", 2, 64, 64, (14, 10), ((1, 1), (1, 1)), "NXC", False),
    ("data", 16, 64, 64, (4, 4), ((1, 1), (1, 1)), "NCX", False),  # 2 tiles a row: the register tile spans 16 images' tiles
    ("data", 4, 64, 80, (8, 10), ((2, 0), (0, 2)), "NXC", False),  # the dX's own pads 0..2, Cout 80 (5 blocks)
    ("conv_v2", 2, 64, 64, (16, 16), ((1, 1), (1, 1)), "NXC", False),  # dW: pairs of tiles, 8 tiles a row
    ("conv_v2", 4, 64, 80, (7, 10), ((1, 1), (1, 1)), "NCX", False),  # odd: 4 rows of 5 tiles (the last pair's second 0), Cout 80
    ("conv_v2", 1, 64, 64, (16, 18), ((2, 0), (0, 2)), "NXC", False),  # one image (its tile rows in parts), 9 tiles a row, pads 0..2
]


@pytest.mark.parametrize("op, batch, cin, cout, size, pads, data_format, bias", _CASES)
def test_bf16_pair_winograd_matches_the_reference(op, batch, cin, cout, size, pads, data_format, bias):
    """The pair form of ``"auto"``'s bf16 forward, dX and dW, emulated where the host lacks ``vdpbf16ps``:
    F(2x2, 3x3) on bf16 pairs (``winograd-bf16``), every element within the rounding bound of its
    operands (module docstring); the pairs' error shows (above the exact path's bound somewhere)."""
    case = _case(op, batch, cin, cout, size, pads, data_format, bias=bias)
    kernel = emulate_bf16_dot(case_call(case, *placeholders(case)))
    assert kernel.formulation == "winograd-bf16"
    inputs = arrays(case, seed=5)
    want = expected(case, *inputs)
    error = np.abs(kernel(*inputs).astype(np.float64) - want)
    assert (error / pair_winograd_bound(case, inputs, want, kernel)).max() <= 1.0
    assert (error / error_bound(kernel.params, want, "bfloat16")).max() > 1.0  # (the rounded operands, not the exact sums)


def _formulation(build_op, shape, wshape, target: Target) -> str:
    kw = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1], data_format="NXC", weights_format="OIX")
    with target:
        a, w = te.placeholder(shape, "bfloat16", name="a"), te.placeholder(wshape, "bfloat16", name="weights")
        result = build_op(a, w, shape, kw)
    return Workload.of(result).for_target(target).formulation


_FORWARD = lambda a, w, shape, kw: onednn.convolution(a, w, **kw, algorithm="auto")
_DATA = lambda a, w, shape, kw: onednn.convolution_backward_data(a, w, list(shape), **kw, algorithm="auto")
_WEIGHTS = lambda a, w, shape, kw: onednn.convolution_backward_weights(a, a, [int(d) for d in w.shape], **kw, algorithm="auto")
_NAMED = lambda a, w, shape, kw: onednn.convolution(a, w, **kw, algorithm="winograd")


_PAIRS, _CUBE = "winograd-bf16", "cube-bf16"


@pytest.mark.parametrize("batch, size, channels, way, dw_way", [(32, 28, 64, _PAIRS, _PAIRS), (32, 14, 128, _PAIRS, _PAIRS),
                                                                (8, 56, 64, _PAIRS, _PAIRS), (8, 16, 64, _PAIRS, _PAIRS),
                                                                (32, 7, 256, _PAIRS, _CUBE), (4, 14, 256, _PAIRS, _CUBE),
                                                                (8, 14, 256, _PAIRS, _CUBE), (8, 7, 256, _CUBE, _CUBE), (2, 14, 256, _CUBE, _CUBE),
                                                                (32, 4, 512, _CUBE, _CUBE), (8, 14, 32, _CUBE, _CUBE)])  # fmt: skip
def test_auto_takes_the_pair_winograd_on_zen4_where_it_pays(batch, size, channels, way, dw_way):
    """``"auto"``'s bf16 forward and dX for Zen 4: F(2x2, 3x3) on pairs with 12 tiles or more per
    64 x 64 block of weights (ResNet-18's 3x3 layers at N=32 down to 7x7; 256 on 14x14 at N=4: 12.25),
    the bf16-pair cube below (N=2: 6.1; 256 on 7x7 at N=8: 8; 512 on 4x4: 2) or under 64 channels;
    the dW on pairs of tiles up to 128 x 128 weights a tap (ResNet-18's and ResNet-50's first two
    stages), the cube past them; Winograd asked for by name keeps its exact form (no operand rounded)."""
    shape, wshape = (batch, size, size, channels), (channels, channels, 3, 3)
    assert _formulation(_FORWARD, shape, wshape, _znver4()) == way
    assert _formulation(_DATA, shape, wshape, _znver4()) == way
    assert _formulation(_WEIGHTS, shape, wshape, _znver4()) == dw_way
    assert _formulation(_NAMED, shape, wshape, _znver4()) == "winograd"


def test_the_pair_winograd_runs_its_gemms_on_vdpbf16ps():
    """Cross-compiled for Zen 4 whatever the host: F(2x2, 3x3) on pairs, its GEMMs ``vdpbf16ps``
    (unrolled over a register tile); Winograd asked for by name, the exact form, has none."""
    case = replace(_case("fwd", 8, 64, 64, (16, 16)), data_format="NCX")
    kernel = build(case_call(case, *placeholders(case)), target=_znver4())
    assert kernel.formulation == "winograd-bf16"
    assert kernel.inspect_source("asm").count("vdpbf16ps") >= 16
    exact = build(case_call(replace(case, algorithm="winograd"), *placeholders(case)), target=_znver4())
    assert exact.formulation == "winograd" and "vdpbf16ps" not in exact.inspect_source("asm")
    dw = replace(_case("conv_v2", 8, 64, 64, (16, 16)), data_format="NCX")
    kernel = build(case_call(dw, *placeholders(dw)), target=_znver4())
    assert kernel.formulation == "winograd-bf16" and kernel.inspect_source("asm").count("vdpbf16ps") >= 8
    assert "T.int64(" in kernel.inspect_source("tir")  # (the dW's pairs keep a CPU's 64-bit indices: no fused loop over them)


@pytest.mark.parametrize("op", ["fwd", "data", "conv_v2"])
def test_the_pair_forms_copy_an_ncx_input_to_channel_vectors_in_each_task(op):
    """As the fp32 forms (``test_winograd``): over NCX each task of the pair forms (a dW chunk) copies
    the rows its windows read into channel vectors (``wino_x`` under the parallel loop, whole padded
    rows of 2 x 8 + 2 columns, 16 lanes), scheduled for Zen 4 whatever the host."""
    case = replace(_case(op, 8, 64, 64, (16, 16)), data_format="NCX")
    target = _znver4()
    workload = Workload.of(case_call(case, *placeholders(case))).for_target(target)
    assert workload.formulation == "winograd-bf16"
    _check_rows_in_task(rule_for(target).apply(workload.prim_func(target), target), tiles_a_row=8)


def test_a_rounded_pair_rounds_to_nearest_with_ties_to_even():
    """:func:`rounded_pair` against numpy's rounding of the same fp32 values to bf16: ties (exact
    halves) to the even neighbour, above and below them to the nearest, signs, a carry into the
    exponent, the largest finite values and infinities."""
    import tvm

    edges = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-10, 1 + 2**-8 - 2**-12, -(1 + 2**-8 + 2**-9), 2 - 2**-9, 3.4e38, np.inf, -np.inf, 0.0]
    values = np.concatenate([np.array(edges, np.float32), np.random.default_rng(0).standard_normal(54).astype(np.float32)])
    a = te.placeholder((64,), "float32", name="a")
    words = te.compute((32,), lambda i: rounded_pair(a[2 * i], a[2 * i + 1]), name="words")
    out = tvm.runtime.tensor(np.zeros(32, np.uint32))
    tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, words])}), target="llvm")["main"](tvm.runtime.tensor(values), out)
    got = np.stack([out.numpy() & 0xFFFF, out.numpy() >> 16], axis=1).reshape(-1).astype(PAIR_DTYPE)
    bits = values.view(np.uint32).astype(np.uint64)
    want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(PAIR_DTYPE) & 0xFFFF
    assert np.array_equal(got, want)
    assert got[0] == 0x3F80 and got[1] == 0x3F82 and got[2] == 0x3F81  # (1 + 2^-8 ties to 1; 1 + 3 * 2^-8 to 1 + 2^-6)
