"""The package's old module paths, kept importable: ``from tvm_convgrad.build import Kernel``,
``import tvm_convgrad.bench``, ``tvm_convgrad.schedule.tensor_core.Config`` ... still work.

Each old module is a thin namespace that looks its names up, on first use, in the modules that hold
them now (:data:`OLD_MODULES`), under their new names where they were renamed (:data:`RENAMED`).
Nothing is imported until a name is used.
"""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["OLD_MODULES", "RENAMED", "install"]

OLD_MODULES = {
    "tvm_convgrad.build": ("tvm_convgrad.compile", "tvm_convgrad.compile.workload", "tvm_convgrad.isa"),
    "tvm_convgrad.tune": ("tvm_convgrad.tuning.tune", "tvm_convgrad.tuning.runners", "tvm_convgrad.tuning.space", "tvm_convgrad.compile.records"),
    "tvm_convgrad.bench": ("tvm_convgrad.tools.bench", "tvm_convgrad.tools.bench.run", "tvm_convgrad.tools.bench.measure",
                           "tvm_convgrad.tools.bench.report", "tvm_convgrad.isa"),
    "tvm_convgrad.bench_cuda": ("tvm_convgrad.tools.bench.cuda",),
    "tvm_convgrad.verify": ("tvm_convgrad.tools.verify",),
    "tvm_convgrad.peak": ("tvm_convgrad.tools.peak",),
    "tvm_convgrad.asm": ("tvm_convgrad.tools.asm",),
    "tvm_convgrad.ptxas": ("tvm_convgrad.tools.ptxas",),
    "tvm_convgrad.schedule.isa": ("tvm_convgrad.isa",),
    "tvm_convgrad.schedule.tensor_core": ("tvm_convgrad.schedule.cuda.tensor_core", "tvm_convgrad.schedule.cuda.gemm",
                                          "tvm_convgrad.schedule.cuda.lowering", "tvm_convgrad.schedule.cuda.rule", "tvm_convgrad.aliases"),
    "tvm_convgrad.schedule.simt": ("tvm_convgrad.schedule.cuda.simt",),
    "tvm_convgrad.schedule.intrinsics": ("tvm_convgrad.schedule.cuda.intrinsics",),
}  # fmt: skip
"""Old module -> the modules that now hold its names, searched in order."""

RENAMED = {
    "tvm_convgrad.bench": {"ISAS": "BENCH_ISAS", "_geomean": "geomean", "_ours": "timed_ours", "_sample": "sample", "_torch_call": "torch_call"},
    "tvm_convgrad.bench_cuda": {"_gpu_name": "gpu_name", "_sample_cuda": "sample_cuda"},
    "tvm_convgrad.schedule.tensor_core": {"Config": "GemmConfig", "get_config": "tensor_core_config"},
}
"""Old module -> {old name: new name} of the names that were renamed."""


def tensor_core_config(gemm, target):
    """The old ``schedule.tensor_core.get_config(gemm, target)``: :func:`~.schedule.cuda.gemm_config`
    for the target's SM count."""
    from .schedule.cuda import gemm_config, sm_count

    return gemm_config(gemm, sm_count(target))


class OldModule(types.ModuleType):
    """An old module path: its names resolved in the modules that hold them now."""

    def __init__(self, name: str, sources: tuple[str, ...], renamed: dict[str, str]):
        super().__init__(name, f"Old path of {', '.join(sources)} (kept importable).")
        self._sources, self._renamed = sources, renamed

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        new = self._renamed.get(name, name)
        for source in self._sources:
            module = importlib.import_module(source)
            if hasattr(module, new):
                return getattr(module, new)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} (see {', '.join(self._sources)})")

    def __dir__(self):
        return sorted({n for s in self._sources for n in dir(importlib.import_module(s))} | set(self._renamed))


def install() -> None:
    """Register every old module path (without importing what it points to). A parent's attribute of
    the same name is set only where the parent has none (``tvm_convgrad.build`` stays the function)."""
    for name, sources in OLD_MODULES.items():
        if name in sys.modules:
            continue
        module = OldModule(name, sources, RENAMED.get(name, {}))
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and not hasattr(sys.modules[parent], child):
            setattr(sys.modules[parent], child, module)
