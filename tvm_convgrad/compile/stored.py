"""Compiled CPU kernels kept on disk between processes, so that a restarted notebook or a second
training run loads its kernels instead of compiling them again (``build(..., store=True)``; the
PyTorch drop-in's kernels are stored so).

A stored kernel is a shared library (``export_library``: LLVM's object code linked by the C
compiler), loaded with ``tvm.runtime.load_module``: ~0.3 ms against 0.2-0.7 s to schedule and
compile it, and its code is mapped from the file (~0.04-0.4 MB) rather than held by LLVM's JIT
(~1.2 MB a kernel). Its key (:func:`key`) is the SHA-256 of everything the code depends on:

* the workload's TE graph (``tvm.ir.save_json`` of its argument tensors: shapes, types, every
  compute body and attribute), as the target compiles it (:meth:`Workload.for_target`);
* the target (its ``mcpu``, features and cores), and the schedules looked up (the shipped ones);
* the package's own code (:func:`fingerprint`: every ``.py`` file of ``tvm_convgrad`` and the
  shipped tuning records) and the versions of TVM and tvm-ffi.

The folder is ``$TVM_CONVGRAD_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/tvm_convgrad/kernels`` (or
``~/.cache/tvm_convgrad/kernels``); ``TVM_CONVGRAD_KERNEL_CACHE=off`` (or ``0``, or empty) keeps
nothing on disk. Files are written under a temporary name and renamed, so processes that build the
same kernel at once (DDP's ranks) never load a partial file; the folder is kept under
:data:`STORE_BYTES` (the least recently used go first). Where the library cannot be written (no C
compiler, a read-only folder) or loaded (a damaged file: it is removed), the kernel is the
in-process one, as without the store.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import tvm
import tvm_ffi
from tvm.target import Target

from .kernel import Kernel
from .workload import Workload

__all__ = ["ENV", "STORE_BYTES", "fingerprint", "folder", "key", "load", "save", "write_whole"]

ENV = "TVM_CONVGRAD_KERNEL_CACHE"
"""The environment variable naming the folder (``off``, ``0`` or empty: none)."""

STORE_BYTES = 1 << 30
"""The most the folder holds; past it the least recently used kernels are removed."""

_OFF = ("", "0", "off", "false", "no")
_STALE_TEMPORARY_S = 3600.0


def folder() -> Path | None:
    """The folder kernels are stored in (created on first use), or None where ``$TVM_CONVGRAD_KERNEL_CACHE`` says off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tvm_convgrad" / "kernels"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """The SHA-256 of the code a kernel comes from: every ``.py`` file of the package and every
    file of the shipped tuning records (read once a process, ~10 ms), TVM's and tvm-ffi's versions."""
    digest = hashlib.sha256(f"tvm {tvm.__version__} tvm-ffi {tvm_ffi.__version__}".encode())
    roots = [Path(__file__).resolve().parent.parent]  # the package's folder
    try:
        from importlib import resources

        roots.append(Path(str(resources.files("tvm_convgrad_schedules"))))
    except (ModuleNotFoundError, TypeError):
        pass
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".json")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def key(workload: Workload, target: Target, schedules) -> str:
    """The stored name of ``workload`` (as ``target`` compiles it) built for ``target`` with ``schedules``."""
    digest = hashlib.sha256(fingerprint().encode())
    for part in (str(target), str(schedules), tvm.ir.save_json(list(workload.args))):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:40]


def _path(where: Path, name: str, schedule: str) -> Path:
    """``<key>.default.so`` for the rule's schedule, ``<key>.tuned-<database>.so`` for a record's."""
    return where / f"{name}.{schedule.replace(':', '-')}.so"


def load(name: str, workload: Workload, target: Target, rebuild) -> Kernel | None:
    """The kernel stored as ``name``, or None (none stored; a file that does not load is removed).
    ``rebuild() -> (executable, mod)``: its TVM executable and scheduled module, made again where
    asked for (inspection)."""
    where = folder()
    if where is None or not where.is_dir():
        return None
    for path in where.glob(f"{name}.*.so"):
        schedule = path.name[len(name) + 1 : -len(".so")].replace("tuned-", "tuned:", 1)
        try:
            library = tvm.runtime.load_module(str(path))
            library[workload.name]
        except Exception:  # a damaged or foreign file: build again
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):  # (a folder shared read-only)
            os.utime(path)  # recently used
        return Kernel(None, None, workload, target, schedule, library=library, rebuild=rebuild)
    return None


def save(name: str, kernel: Kernel) -> Kernel:
    """``kernel`` stored as ``name`` and running from its library; ``kernel`` itself where it
    cannot be stored (a warning once a process says why)."""
    where = folder()
    if where is None:
        return kernel
    try:
        path = _path(where, name, kernel.schedule)
        write_whole(path, kernel.executable.export_library)
        library = tvm.runtime.load_module(str(path))
    except Exception as error:  # no C compiler, a read-only folder: the in-process kernel
        _warn_once(f"tvm_convgrad: kernels are not kept on disk ({type(error).__name__}: {error}); set {ENV}=off to silence")
        return kernel
    with contextlib.suppress(OSError):  # (trimming is housekeeping: never a build's failure)
        _trim(where)
    return Kernel(kernel.executable, kernel.mod, kernel.workload, kernel.target, kernel.schedule, library=library)


def write_whole(path: Path, write: Callable[[str], object]):
    """``write(temporary)`` a file in ``path``'s folder (made if missing), then renamed ``path``:
    another process sees the whole file or none, and one that has the old file mapped keeps it
    (a file rewritten in place would fault it). The temporary is removed where ``write`` raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".building-", suffix=path.suffix, dir=path.parent)
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)


def _trim(where: Path, limit: int = STORE_BYTES):
    """Remove the least recently used libraries past ``limit`` bytes, and temporaries an hour old
    (a process that died writing). Other processes write and remove files meanwhile: one gone
    before it is looked at is passed over."""
    entries, now = [], time.time()
    for entry in os.scandir(where):
        try:
            info = entry.stat()
        except FileNotFoundError:  # another process's temporary, renamed or removed since the listing
            continue
        if entry.name.startswith(".building-"):
            if now - info.st_mtime > _STALE_TEMPORARY_S:
                Path(entry.path).unlink(missing_ok=True)
        elif entry.name.endswith(".so"):
            entries.append((info.st_mtime, info.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        Path(path).unlink(missing_ok=True)
        total -= size


@functools.lru_cache(maxsize=None)
def _warn_once(message: str):
    warnings.warn(message, RuntimeWarning, stacklevel=4)
