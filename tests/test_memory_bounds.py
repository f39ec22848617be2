"""No kernel reads or writes outside its argument buffers (issue 26.3).

Each input and the output are placed flush against a page mapped ``PROT_NONE``, after the array
(overruns) and then before it (underruns), zero-copy through DLPack (``tests/guard_pages.py``);
any access past an edge faults. Random valid calls of every operator and formulation — f32 / f16 /
bf16, NCX / NXC, channel counts that are not multiples of 16, groups and depthwise, ranks 1-3,
stems, TBE's 5HD / FracZ operators — in every form they compile to: this CPU's build (alternating
ISA plans), the bf16-pair form, AMX tiles, the CUDA schedule's emulation. The calls run in child
processes (``tests/guarded_calls.py``), so that a fault fails the test and names its call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import guarded_calls
from conftest import slow
from guard_pages import GuardedMemory, run_in_children

CHILD = [sys.executable, str(Path(__file__).parent / "guarded_calls.py")]


def _assert_clean(names: list[str]):
    faults = run_in_children(CHILD, names)
    assert not faults, f"{len(faults)} of {len(names)} calls faulted or failed:\n" + "\n".join(map(str, faults))


def test_the_guard_pages_catch_a_stray_read():
    """The harness can fail: one element past an array's end (and one before its start) faults."""
    script = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); from guard_pages import GuardedMemory\n"
        "a = GuardedMemory().array((64,), np.float32, sys.argv[2]); print('start read', flush=True)\n"
        "import ctypes; p = a.ctypes.data + (256 if sys.argv[2] == 'after' else -4); ctypes.c_float.from_address(p).value\n"
        "print('done')"
    )
    for side in ("after", "before"):
        faults = run_in_children([sys.executable, "-c", script, str(Path(__file__).parent), side], ["read"])
        assert len(faults) == 1 and faults[0].returncode < 0, (side, faults)


def test_guarded_arrays_hold_their_values():
    memory = GuardedMemory()
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        values = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dtype)
        for side in ("after", "before"):
            assert (memory.tensor(values, side).numpy() == values).all()


def test_the_calls_issue_26_found_and_one_of_each_operator_stay_inside():
    """The fixed calls (24 channels NCX / NXC, a 3-D depthwise dW, stems) and one random call of
    every operator built for this CPU."""
    _assert_clean(guarded_calls.labels({"build": 1, "f32dw": 2}))


@slow
def test_random_calls_of_every_operator_and_formulation_stay_inside():
    """Random calls of every operator built for this CPU's ISA plans, in the bf16-pair form, in AMX
    tiles and as the emulated CUDA schedule; float32 weight gradients of bf16 / f16 inputs."""
    _assert_clean(guarded_calls.labels({"build": 12, "pairs": 6, "amx": 4, "cuda": 3, "f32dw": 8})[len(guarded_calls.FIXED) :])
