"""No kernel reads or writes outside its argument buffers.

Each input and the output are placed flush against a page mapped PROT_NONE, after the array (to
catch overruns) and then before it (underruns), zero-copy through DLPack; any access past an edge
faults. The kernels run in a child process so that a fault fails the test instead of the run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import RUNNABLE_ISAS

CHILD = textwrap.dedent(
    r'''
    import ctypes, mmap, sys
    import numpy as np
    import tvm
    sys.path.insert(0, sys.argv[1])
    from tbe_calls import geometry
    from test_sweep import CASES
    from tvm_convgrad import build, dsl, isa_target, layout
    from tvm_convgrad.dsl.compute import cube_util
    from tvm_convgrad.tvm import placeholder
    from tvm_convgrad.tools.verify import expected_result, kernel_arrays, random_inputs, error_bound

    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    keep = []

    def guarded(array, side):
        """A 64-byte aligned copy of ``array`` with a PROT_NONE page right after (or before) it."""
        nbytes = array.nbytes
        body = -(-(nbytes + 64) // PAGE) * PAGE
        mm = mmap.mmap(-1, body + 2 * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if side == "after":  # end as close to the guard page as 64-byte alignment allows
            offset = PAGE + body - nbytes
            offset -= offset % 64
            assert libc.mprotect(base + PAGE + body, PAGE, 0) == 0
        else:
            offset = PAGE
            assert libc.mprotect(base, PAGE, 0) == 0
        view = np.frombuffer(mm, dtype=array.dtype, count=array.size, offset=offset).reshape(array.shape)
        view[...] = array
        keep.append(mm)
        return view

    for side in ("after", "before"):
        for i, case in enumerate(CASES):
            filter_sizes, para, dy = geometry(case)
            groups = case["groups"]
            x = placeholder(layout.shape_5hd(case["n"], case["cin"], case["h"], case["w"]), name="x", dtype="float16")
            filters = placeholder(layout.shape_fracz(filter_sizes, groups), name="filters", dtype="float16")
            sizes = [case["n"], case["cin"], case["h"], case["w"]]
            results = (
                dsl.conv2d_backprop_filter(x, dy, filter_sizes, {**para, "groups": groups}),
                dsl.conv2d_backprop_input(filters, dy, filter_sizes, sizes, {**para, "group_dict": cube_util.calculate_group(filter_sizes, groups)}),
            )
            for result in results:
                kernel = build(result, target=isa_target(sys.argv[2]))
                inputs = random_inputs(kernel.params, seed=i)
                arrays = [guarded(a, side) for a in kernel_arrays(kernel.params, inputs)]
                out = guarded(np.zeros(kernel.output.shape, kernel.output.dtype), side)
                print(side, i, kernel.params.op, flush=True)
                kernel(*[tvm.runtime.from_dlpack(a) for a in arrays], out=tvm.runtime.from_dlpack(out))
                expected = expected_result(kernel.params, inputs)
                assert (np.abs(out.astype(np.float64) - expected) <= error_bound(kernel.params, expected)).all()
    print("all in bounds")
    '''
)

pytestmark = pytest.mark.slow  # the fast tier (-m "not slow") leaves these to the full suite


@pytest.mark.parametrize("isa", RUNNABLE_ISAS[:1])  # this CPU's plan (the sweep runs the others)
def test_kernels_stay_inside_their_buffers(isa):
    tests = Path(__file__).parent
    run = subprocess.run([sys.executable, "-c", CHILD, str(tests), isa], capture_output=True, text=True, timeout=900)
    last = run.stdout.strip().splitlines()[-1:] or ["(nothing)"]
    assert run.returncode == 0 and "all in bounds" in run.stdout, (
        f"exit {run.returncode} after {last[0]!r}: {run.stderr[-2000:]}"
    )
