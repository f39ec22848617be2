"""The ``"auto"`` modes' choices kept on disk beside the kernels, so that a later process (a
restarted notebook, a second training run) takes them instead of timing every signature again.

A signature's first call in ``"auto"`` times every way of running it (:mod:`.forward`,
:mod:`.backward`): MobileNetV2 channels-last at 32 x 112x112 spent 6 of its first step's 7 s so
on a 2-core Zen 3 once its kernels were loaded from disk (:mod:`tvm_convgrad.compile.stored`).
The choices are a JSON file in the kernels' folder, one per (package code, CPU target, PyTorch
version, thread count, kernel algorithm) -- :func:`path` -- since a choice is a timing on those. They are recalled
only in ``"auto"``; ``TVM_CONVGRAD_KERNEL_CACHE=off`` keeps none, and :func:`forget` (or removing
the file) has the next process time them again. Written whole under a temporary name and renamed,
merged with what other processes wrote meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

import torch

from ..compile import resolve_target, stored
from . import kernels

__all__ = ["forget", "path", "recall", "remember"]

_recalled: dict[Path, dict[str, Any]] = {}


@functools.lru_cache(maxsize=8)
def _name(threads: int, algorithm: str) -> str:
    parts = (stored.fingerprint(), str(resolve_target("llvm")), torch.__version__, str(threads), algorithm)
    return f"choices-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:32]}.json"


def path() -> Optional[Path]:
    """The file of this process's choices (None where the store is off): one per package code, CPU
    target, PyTorch version, thread count and kernel algorithm (:data:`.kernels.ALGORITHM`)."""
    where = stored.folder()
    return None if where is None else where / _name(torch.get_num_threads(), kernels.ALGORITHM)


def _read(file: Path) -> dict[str, Any]:
    try:
        with open(file) as f:
            found = json.load(f)
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):  # none yet, or damaged: time again
        return {}


def _key(kind: str, key) -> str:
    return f"{kind} {key!r}"


def recall(kind: str, key) -> Any:
    """The choice remembered for ``key`` (a signature's) of ``kind`` (``"forward"``, ``"backward"``), or None."""
    file = path()
    if file is None:
        return None
    if file not in _recalled:
        _recalled[file] = _read(file)
    return _recalled[file].get(_key(kind, key))


def remember(kind: str, key, choice: Any) -> None:
    """Keep ``choice`` (JSON) for ``key`` of ``kind``, merged into the file with what other processes wrote."""
    file = path()
    if file is None:
        return
    choices = _recalled.setdefault(file, {})
    choices[_key(kind, key)] = choice
    merged = {**_read(file), **choices}

    def write(temporary: str):
        with open(temporary, "w") as f:
            json.dump(merged, f)

    with contextlib.suppress(OSError):  # a folder that cannot be written: kept in this process only
        stored.write_whole(file, write)


def forget() -> None:
    """Remove the remembered choices of this process's file, on disk too: the next process times
    its signatures again, and so does this one after :func:`.set_backward` / :func:`.set_forward`
    (which forget the choices it has made)."""
    file = path()
    _recalled.clear()
    if file is not None:
        file.unlink(missing_ok=True)
