"""TVM's tensor intrinsics, imported in seconds instead of a minute.

Importing ``tvm.s_tir.tensor_intrin`` parses a few hundred TVMScript functions (the description and
implementation of every intrinsic TVM has): about 70 s per process on a 2-core machine, 5 s under
:func:`tvm_convgrad.tvmscript.fast_tvmscript`.
"""

from __future__ import annotations

import sys
from types import ModuleType

from ...tvmscript import fast_tvmscript

__all__ = ["cuda_intrinsics"]


def cuda_intrinsics() -> ModuleType:
    """``tvm.s_tir.tensor_intrin.cuda``, which registers the WMMA / MMA intrinsics when imported."""
    name = "tvm.s_tir.tensor_intrin.cuda"
    if name not in sys.modules:
        with fast_tvmscript():
            __import__(name)
    return sys.modules[name]
