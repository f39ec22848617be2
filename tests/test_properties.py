"""Property sweeps over random calls of every operator (``tests/random_cases.py``).

* Every valid call builds and matches the float64 reference elementwise, within the bound of fp32
  sums rounded once to the result's type; any exception is a failure (a ``ConvGradError`` on a
  call the spec allows is a rule stricter than the spec). The calls alternate between the vector-ISA
  plans this host runs.
* Every invalid call (a valid one with one rule broken) raises ``ConvGradError`` naming the
  parameter; any other exception, or none, is a failure.

Sizes and seed come from the environment, so that CI runs a slice and a full run is one command:

    CONVGRAD_SWEEP_CASES=2000 python -m pytest -q tests/test_properties.py     # the full sweep

``CONVGRAD_SWEEP_CASES`` (default 20) valid calls and ``CONVGRAD_SWEEP_INVALID`` (default 2000)
invalid calls per operator, drawn from ``CONVGRAD_SWEEP_SEED`` (default 20261124). Call ``i`` of an
operator is drawn from ``(seed, operator, i)`` alone, so a failure names the one call to re-run.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest

from conftest import RUNNABLE_ISAS
from random_cases import OPERATORS, inputs_and_expected, invalid_call, valid_case, valid_result
from tvm_convgrad import ConvGradError, build, emulate_bf16_dot, isa_target
from tvm_convgrad.dsl.compute.stages import NO_MAD, Formulation

SEED = int(os.environ.get("CONVGRAD_SWEEP_SEED", "20261124"))
VALID = int(os.environ.get("CONVGRAD_SWEEP_CASES", "20"))
INVALID = int(os.environ.get("CONVGRAD_SWEEP_INVALID", "2000"))
SHOWN = 10  # failures listed in a report


def _rng(op: str, index: int) -> np.random.Generator:
    return np.random.default_rng([SEED, OPERATORS.index(op), index])


def _worst_ratio(op: str, case, kernel, seed: int) -> float:
    """The largest ``|result - reference| / bound`` of one run on random inputs."""
    inputs, reference, bound = inputs_and_expected(op, case, kernel, seed)
    result = kernel(*inputs)
    assert result.shape == reference.shape, f"shape {result.shape} != {reference.shape}"
    return float((np.abs(result.astype(np.float64) - reference) / bound).max())


def _report(what: str, failures: list[str], total: int, seconds: float) -> str:
    head = (f"{len(failures)} of {total} {what} failed in {seconds:.0f} s (CONVGRAD_SWEEP_SEED={SEED}; "
            f"call i is drawn from (seed, operator, i))")  # fmt: skip
    return "\n".join([head, *failures[:SHOWN]] + ([f"... and {len(failures) - SHOWN} more"] if len(failures) > SHOWN else []))


FAMILIES = {f.family for f in Formulation} | {NO_MAD}
"""What ``Kernel.formulation`` may say."""
BF16_OPERATORS = ("conv", "conv_v2", "deconv", "data", "data_v1", "fwd")  # the operators that take bf16


@pytest.mark.slow
@pytest.mark.parametrize("op, amx", [(op, False) for op in BF16_OPERATORS] + [(op, True) for op in ("conv", "conv_v2", "deconv")])
def test_every_valid_bf16_call_in_pairs_matches_the_reference(op, amx):
    """The same calls in bf16, built in the bf16-pair form a ``vdpbf16ps`` target compiles (the
    instruction itself where this host has it, its arithmetic emulated elsewhere); ``amx``: the
    dWs in an AMX target's tiles (emulated where this host has none)."""
    failures, start = [], time.perf_counter()
    for i in range(VALID):
        case = dataclasses.replace(valid_case(op, _rng(op, i)), dtype="bfloat16")
        try:
            ratio = _worst_ratio(op, case, emulate_bf16_dot(valid_result(op, case), amx=amx), seed=i)
            if not ratio <= 1.0:
                failures.append(f"call {i}: error {ratio:.3g} x the bound: {case!r}")
        except Exception as err:  # noqa: BLE001 - every exception of a valid call is a failure
            failures.append(f"call {i}: {type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}: {case!r}")
    assert not failures, _report(f"valid bf16 {op} calls in pairs", failures, VALID, time.perf_counter() - start)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPERATORS)
def test_every_valid_call_builds_and_matches_the_reference(op):
    failures, start = [], time.perf_counter()
    for i in range(VALID):
        case = valid_case(op, _rng(op, i))
        isa = RUNNABLE_ISAS[i % len(RUNNABLE_ISAS)]
        try:
            kernel = build(valid_result(op, case), target=isa_target(isa))
            ratio = _worst_ratio(op, case, kernel, seed=i)
            if kernel.formulation not in FAMILIES:
                failures.append(f"call {i} ({isa}): Kernel.formulation {kernel.formulation!r} is none of {sorted(FAMILIES)}: {case!r}")
            if not ratio <= 1.0:
                failures.append(f"call {i} ({isa}): error {ratio:.3g} x the bound: {case!r}")
        except Exception as err:  # noqa: BLE001 - every exception of a valid call is a failure
            failures.append(f"call {i} ({isa}): {type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}: {case!r}")
    assert not failures, _report(f"valid {op} calls", failures, VALID, time.perf_counter() - start)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPERATORS)
def test_every_invalid_call_raises_convgraderror_naming_the_parameter(op):
    failures, start, named = [], time.perf_counter(), set()
    for i in range(INVALID):
        make, param, what = invalid_call(op, _rng(op, 10**7 + i), i)
        try:
            make()
        except ConvGradError as err:
            named.add(param)
            if not err.param.startswith(param):
                failures.append(f"call {i}: named {err.param!r}, not {param!r} ({err}): {what}")
        except Exception as err:  # noqa: BLE001 - anything but ConvGradError is a failure
            failures.append(f"call {i}: {type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}: {what}")
        else:
            failures.append(f"call {i}: accepted: {what}")
    assert not failures, _report(f"invalid {op} calls", failures, INVALID, time.perf_counter() - start)
    assert INVALID < 100 or len(named) > 10, f"only {sorted(named)} were broken"
