"""Importing the drop-in pins glibc's heap thresholds (``tvm_convgrad.torch.heap``): in a fresh
process a 24 MiB request then comes from the heap, below the break, and freeing it leaves the
break where it was; ``TVM_CONVGRAD_HEAP=glibc`` and thresholds the environment set keep glibc's
own rule, and a wrong policy is a ``ConvGradError`` naming the variable. (Why: stock's step beside
the drop-in re-faulted 56 MB a step that glibc trimmed; ``python -m tvm_convgrad.training.torch_beside``
measures it. Timing is not a test.)"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from conftest import torch

pytestmark = [
    pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)"),
    pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's"),
]

CHILD = r"""
import ctypes, json
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
libc.free.argtypes = [ctypes.c_void_p]
import tvm_convgrad.torch as tt
block = libc.malloc(24 << 20)
brk = libc.sbrk(0)
in_heap = block < brk and brk - block <= (25 << 20)  # a mapped block lies far from the break
libc.free(block)
print(json.dumps({"pinned": tt.heap_pinned(), "in_heap": in_heap, "break_kept": libc.sbrk(0) == brk}))
"""


def _child(**env) -> subprocess.CompletedProcess:
    from tvm_convgrad.torch.heap import USER_SETTINGS

    environ = {k: v for k, v in os.environ.items() if k not in ("TVM_CONVGRAD_HEAP", "GLIBC_TUNABLES", *USER_SETTINGS)}  # the child's own settings only
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env={**environ, **env})


def _report(**env) -> dict:
    done = _child(**env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_import_pins_the_thresholds_a_24_mib_block_comes_from_the_heap_and_stays():
    assert _report() == {"pinned": True, "in_heap": True, "break_kept": True}


@pytest.mark.parametrize("env", [{"TVM_CONVGRAD_HEAP": "glibc"}, {"MALLOC_TRIM_THRESHOLD_": "1048576"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"}], ids=["opted-out", "env-trim", "tunables"])  # fmt: skip
def test_glibcs_own_rule_is_kept_where_asked_or_set_already(env):
    report = _report(**env)
    assert report["pinned"] is False
    if "GLIBC_TUNABLES" in env:  # glibc read the tunable itself: 24 MiB is above its 1 MiB threshold, so mapped
        assert report["in_heap"] is False


def test_a_wrong_policy_names_the_variable():
    done = _child(TVM_CONVGRAD_HEAP="always")
    assert done.returncode != 0
    assert "TVM_CONVGRAD_HEAP" in done.stderr and "'always'" in done.stderr and "pinned" in done.stderr
