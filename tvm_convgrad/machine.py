"""This machine's cores, and TVM's CPU thread pool on all of them.

TVM's thread pool takes ``TVM_NUM_THREADS``, else ``OMP_NUM_THREADS``, else half the cores (on x86
it assumes hyper-threading: on a 2-core machine, one thread). :func:`use_every_core` sets
``TVM_NUM_THREADS`` to every usable core unless the user set one of them; the pool reads it when it
starts (the first parallel kernel), so the package calls it on import, and tuning's runner workers
in their own processes.
"""

from __future__ import annotations

import os

__all__ = ["usable_cores", "use_every_core"]


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def use_every_core() -> None:
    """TVM's thread pool on every usable core, unless ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS`` says otherwise."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(usable_cores())
