"""TVMScript parsed in milliseconds: :func:`fast_tvmscript`.

Each ``@T.prim_func`` calls ``inspect.stack()``, which reads the source context of every frame and
scans ``sys.modules`` for each of them: with PyTorch imported (thousands of modules) one decorator
costs about two seconds on a 2-core machine, and importing ``tvm.s_tir.tensor_intrin`` (a few
hundred of them) about 70 s. The parser only reads the frames, their names and line numbers and
the text of the decorator's line, which :func:`cheap_stack` gives without the scan.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys

__all__ = ["cheap_stack", "fast_tvmscript"]


def cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` with one line of context per frame and no module lookups."""
    frame, infos = sys._getframe(1), []
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        infos.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, [line] if line else None, 0))
        frame = frame.f_back
    return infos


@contextlib.contextmanager
def fast_tvmscript():
    """Within it, TVMScript's parser finds its source through :func:`cheap_stack`."""
    real, inspect.stack = inspect.stack, cheap_stack
    try:
        yield
    finally:
        inspect.stack = real
