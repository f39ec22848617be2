"""oneDNN's own convolution problems (benchdnn's shape files, ``tests/data/benchdnn_conv/``) through
ConvolutionBackwardWeights, ConvolutionBackwardData and ConvTransposeBackwardWeights, against the
float64 reference.

* The parser reads benchdnn's descriptor syntax as benchdnn does (``tests/benchdnn_shapes.py``).
* Every problem of every vendored file is a call the operators accept (no ``ConvGradError``).
* The fast tier runs a fixed sample of every file through the three operators (NXC / NCX and XIO /
  OIX alternating, f32, and a bf16 slice); the full suite every problem whose weight gradient is
  under :data:`MAX_MACS` multiply-adds at a minibatch of at most 2, each through one operator in
  turn.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np
import pytest

import benchdnn_shapes
from benchdnn_shapes import BenchdnnError, parse_descriptor, problems, shape_files
from conftest import slow, worker_cores
from random_cases import inputs_and_expected, valid_result
from tvm_convgrad import build

OPS = ("conv_v2", "data", "deconv")
MAX_MACS = 3e8
MAX_MB = 2
QUICK_WINDOWS = 2e7  # the fast tier's sample: input pixels x taps below this
FILES = shape_files()
WEIGHTS_FORMAT = {"conv_v2": ("XIO", "OIX"), "data": ("XIO", "OIX"), "deconv": ("XOI", "IOX")}


def _case(problem, op: str, index: int, dtype: str = "float32"):
    """The ``index``-th run's call: formats alternate with the index."""
    return problem.case(op, min(problem.mb, MAX_MB), ("NXC", "NCX")[index % 2], WEIGHTS_FORMAT[op][index // 2 % 2], dtype)


def _run(problem, op: str, index: int, dtype: str = "float32") -> str | None:
    """None when the kernel matches the reference, else what went wrong."""
    case = _case(problem, op, index, dtype)
    try:
        kernel = build(valid_result(op, case))
        inputs, expected, bound = inputs_and_expected(op, case, kernel, seed=index)
        result = kernel(*inputs)
        if result.shape != expected.shape:
            return f"shape {result.shape} != {expected.shape}"
        ratio = float((np.abs(result.astype(np.float64) - expected) / bound).max())
        return None if ratio <= 1.0 else f"error {ratio:.3g} x the bound"
    except Exception as err:  # noqa: BLE001 - any exception on a problem benchdnn accepts is a failure
        return f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"


def _failure(problem, op: str, index: int, dtype: str) -> str | None:
    what = _run(problem, op, index, dtype)
    return what and f"{problem.where} {problem.descriptor} {op} ({_case(problem, op, index, dtype).name()}): {what}"


def _sweep(selected: list[tuple[object, int]], dtype: str = "float32", ops=None) -> None:
    """Every operator (``ops[k]``: those of the ``k``-th) on every selected ``(problem, index)``."""
    start = time.perf_counter()
    ops = ops or [OPS] * len(selected)
    failures = [f for (problem, index), chosen in zip(selected, ops) for op in chosen if (f := _failure(problem, op, index, dtype))]
    head = f"{len(failures)} of {sum(map(len, ops))} {dtype} calls failed in {time.perf_counter() - start:.0f} s"
    assert not failures, "\n".join([head, *failures[:15]])


def _sweep_in_children(part: int, parts: int) -> None:
    """Part ``part`` of ``parts`` of the slow tier's work (:func:`_slow_calls`) split between a
    child process per core of this worker (the builds are single-threaded): ``python
    tests/test_benchdnn.py PART PARTS CHILD CHILDREN``; in this process where the worker has one
    core (a new process spends ~7 s of it importing TVM)."""
    cores = worker_cores()
    if cores == 1:
        errors = _sweep_share(part, parts, 0, 1)
        assert not errors, "\n".join(errors)
        return
    children = [subprocess.Popen([sys.executable, __file__, str(part), str(parts), str(k), str(cores)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k in range(cores)]  # fmt: skip
    failures = []
    for child in children:
        out, err = child.communicate(timeout=3600)
        if child.returncode != 0:
            failures.append(f"exit {child.returncode}: {err[-3000:]}")
    assert not failures, "\n".join(failures)


# --- the parser ----------------------------------------------------------------------------------


def test_the_parser_derives_what_benchdnn_derives():
    p = parse_descriptor('ic3oc16_iw5ow5kw3pw1_n"conv_basic_1d:1st"')  # 1-D; mb defaults to 2
    assert (p.rank, p.mb, p.g, p.i, p.o, p.k, p.p, p.p_r, p.dilation, p.name) == (1, 2, 1, (5,), (5,), (3,), (1,), (1,), (0,), "conv_basic_1d:1st")
    p = parse_descriptor("mb1ic16oc16_ih10kh5_ph7sh1")  # 2-D square from h; the output computed
    assert (p.i, p.k, p.p, p.o, p.p_r) == ((10, 10), (5, 5), (7, 7), (20, 20), (7, 7))
    p = parse_descriptor('mb20ic4ih8oc6oh3kh3sh2ph1dh1n"dilated_conv:1"')  # dilation written as d-1
    assert (p.dilation, p.o, p.p_r) == ((1, 1), (3, 3), (0, 0))
    assert p.case("conv_v2", 2).dilations == (2, 2)
    p = parse_descriptor('g3_ic6oc6_id56kd3sd2_n"3d_gconv_non-block_s2"')  # 3-D cubic from d; a negative right pad
    assert (p.rank, p.g, p.has_groups, p.i, p.o, p.s, p.p_r) == (3, 3, True, (56,) * 3, (27,) * 3, (2,) * 3, (-1,) * 3)
    assert p.case("conv_v2", 2).pads_end == (0, 0, 0) and p.case("deconv", 2).output_padding == (1, 1, 1)
    assert parse_descriptor("ic16ih10oc16oh10kh3").p == (1, 1)  # the pad from a written output
    assert parse_descriptor("ic16ih10oc16oh7kh3").p == (0, 0)  # (6 - 10 + 3) / 2 truncates toward 0, as in C
    p = parse_descriptor("ic16ih10iw12oc16oh10ow12kh3kw1ph1")  # a written width, not copied from h
    assert (p.i, p.k, p.p) == ((10, 12), (3, 1), (1, 0))
    assert parse_descriptor("g1mb1ic16oc32_id4ih5iw6_kd1kh3kw3_pd0ph1pw1").i == (4, 5, 6)


@pytest.mark.parametrize("descriptor, says", [
    ("ic16oc16", "at least one spatial"),
    ("ic16oc16ih-5kh3", "must be positive"),
    ("ic16oc16ih5kh3x", "unrecognized"),
    ("oc16ih5kh3", "`ic` was not specified"),
    ("ic16oc16id4ih5kd3kh3", "either all `h` and `w`"),
    ("ic16oc16ih2kh5", "deduced"),
    ("g0ic16oc16ih5kh3", "`g` was not specified"),
])  # fmt: skip
def test_the_parser_rejects_what_benchdnn_rejects(descriptor, says):
    with pytest.raises(BenchdnnError, match=says):
        parse_descriptor(descriptor)


def test_the_vendored_files_are_benchdnns():
    """Every vendored file parses (its comments, options and names too), with the license beside them."""
    assert len(FILES) >= 16 and (benchdnn_shapes.SHAPES / "LICENSE").exists()
    counts = {path.name: len(problems(path)) for path in FILES}
    assert counts["shapes_basic"] == 54 and counts["shapes_resnet_50"] == 20 and all(counts.values())
    ranks = {p.rank for path in FILES for p in problems(path)}
    assert ranks == {1, 2, 3}


def test_every_problem_is_a_call_the_operators_accept():
    """No ConvGradError on a problem benchdnn accepts: every problem of every file, each operator,
    both data formats, at benchdnn's own minibatch."""
    failures = []
    for path in FILES:
        for index, problem in enumerate(problems(path)):
            for op in OPS:
                for fmt in (0, 3):
                    case = problem.case(op, problem.mb, ("NXC", "NCX")[fmt % 2], WEIGHTS_FORMAT[op][fmt // 2 % 2])
                    try:
                        result = valid_result(op, case)
                    except Exception as err:  # noqa: BLE001
                        failures.append(f"{problem.where} {op}: {type(err).__name__}: {err}")
                        continue
                    assert tuple(int(d) for d in result.shape) == _result_shape(op, case), problem.where
    assert not failures, "\n".join(failures[:20])


def _result_shape(op: str, case) -> tuple:
    if op == "data":
        return case.layout_shape(case.x_channels, case.x_size)
    return case.weights_shape()


# --- the problems against the reference -------------------------------------------------------------


def _small(path) -> list:
    return [p for p in problems(path) if p.weight_macs(min(p.mb, MAX_MB)) < MAX_MACS]


def _quick(path) -> list:
    """The small problems whose dX windows are few (the dX cube visits every tap of every input
    pixel: a 33x33x33 kernel over a 33x33x33 input is 1e9 of them for a 1x1x1 output)."""
    return [p for p in _small(path) if min(p.mb, MAX_MB) * math.prod(p.i) * math.prod(p.k) < QUICK_WINDOWS]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_a_sample_of_each_file_matches_the_reference(path):
    """A problem of each file (its middle quick one) through the three operators, f32."""
    quick = _quick(path)
    _sweep([(quick[len(quick) // 2], len(quick) // 2)])


@pytest.mark.parametrize("path", FILES[::4], ids=[p.name for p in FILES[::4]])
def test_a_bf16_slice_matches_the_reference(path):
    quick = _quick(path)
    _sweep([(quick[len(quick) // 3], 1)], dtype="bfloat16")


def _slow_calls() -> list[tuple[object, int, str, str]]:
    """``(problem, index, dtype, op)``: every problem under MAX_MACS of every file in f32, every
    tenth of each file also in bf16, each through one of the three operators in turn (the index's:
    each operator takes a third of every file, its formats alternating; the fast tier runs a
    sample of every file through all three). All three on every problem took 508 s of the CI's
    2-core budget, a third of that since."""
    calls = []
    for path in FILES:
        small = _small(path)
        calls += [(p, i, "float32", OPS[i % len(OPS)]) for i, p in enumerate(small)]
        calls += [(p, i, "bfloat16", OPS[i // 10 % len(OPS)]) for i, p in enumerate(small) if i % 10 == 2]
    return calls


SLOW_PARTS = 4
"""The slow tier's sweep in this many tests, which xdist's workers share (one test of it was a
7.5-minute tail of the suite on 2 cores)."""


@slow
@pytest.mark.parametrize("part", range(SLOW_PARTS))
def test_every_small_problem_matches_the_reference(part):
    """Every problem under MAX_MACS at mb <= 2 of every vendored file, the operators in turn,
    formats alternating; every tenth also in bf16 (this part of them). A process per core."""
    _sweep_in_children(part, SLOW_PARTS)


def _sweep_share(part: int, parts: int, child: int, children: int) -> list[str]:
    """The failures of share ``child`` of ``children`` of part ``part`` of ``parts`` of the slow tier's calls."""
    mine, errors = _slow_calls()[part::parts][child::children], []
    for dtype in ("float32", "bfloat16"):
        try:
            _sweep([(p, i) for p, i, t, _ in mine if t == dtype], dtype, [(op,) for _, _, t, op in mine if t == dtype])
        except AssertionError as err:
            errors.append(str(err))
    return errors


if __name__ == "__main__":  # a child of _sweep_in_children
    sys.exit("\n".join(_sweep_share(*(int(a) for a in sys.argv[1:5]))) or None)
