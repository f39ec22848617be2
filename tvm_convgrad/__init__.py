"""tvm_convgrad: the convolution gradients of Huawei's TBE DSL on Apache TVM.

``dsl.conv2d_backprop_filter`` / ``dsl.conv2d_backprop_input`` take ``te.placeholder`` tensors in
the Ascend layouts (5HD, FracZ) with TBE's exact signatures; ``frontends.onednn`` and
``frontends.dsp`` give the framework operators (oneDNN Graph, the DSP library) on the same
compute; :func:`build` compiles any of them for LLVM or CUDA with the package's cube schedules.
See the README for a tour.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# TVM's CPU thread pool takes TVM_NUM_THREADS, else OMP_NUM_THREADS, else half the cores (on x86 it
# assumes hyper-threading). Unless the user set one of them, use every core. The pool reads it when
# it starts (the first parallel kernel), so this must run before any TVM kernel does.
if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
    os.environ["TVM_NUM_THREADS"] = str(usable_cores())

from . import dsl, frontends, layout, reference, tvm  # noqa: E402
from .build import ArgSpec, Kernel, Timing, build, emulate_cuda, isa_target, lower, pass_context, resolve_target  # noqa: E402
from .errors import ConvGradError  # noqa: E402
from .tune import TuneReport, tune  # noqa: E402
from .params import ConvGeometry, ConvGradParams  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ArgSpec",
    "ConvGeometry",
    "ConvGradError",
    "ConvGradParams",
    "Kernel",
    "Timing",
    "TuneReport",
    "build",
    "dsl",
    "emulate_cuda",
    "frontends",
    "isa_target",
    "layout",
    "lower",
    "pass_context",
    "reference",
    "resolve_target",
    "tune",
    "tvm",
    "usable_cores",
]
