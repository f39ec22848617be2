"""TVM's tensor intrinsics, imported in seconds instead of a minute.

Importing ``tvm.s_tir.tensor_intrin`` parses a few hundred TVMScript functions (the description and
implementation of every intrinsic TVM has), and each ``@T.prim_func`` calls ``inspect.stack()``,
which reads the source context of every frame and scans ``sys.modules`` for each of them: about
70 s per process on a 2-core machine, 5 s with the cheap stack below. The parser only reads the
frames, their names and line numbers, and the text of the decorator's line, which
:func:`_cheap_stack` gives without the scan.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
from types import ModuleType

__all__ = ["cuda_intrinsics"]


def _cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` with one line of context per frame and no module lookups."""
    frame, infos = sys._getframe(1), []
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        infos.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, [line] if line else None, 0))
        frame = frame.f_back
    return infos


@contextlib.contextmanager
def _fast_tvmscript():
    real, inspect.stack = inspect.stack, _cheap_stack
    try:
        yield
    finally:
        inspect.stack = real


def cuda_intrinsics() -> ModuleType:
    """``tvm.s_tir.tensor_intrin.cuda``, which registers the WMMA / MMA intrinsics when imported."""
    name = "tvm.s_tir.tensor_intrin.cuda"
    if name not in sys.modules:
        with _fast_tvmscript():
            __import__(name)
    return sys.modules[name]
