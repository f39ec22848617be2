"""tvm_convgrad: the convolution gradients of Huawei's TBE DSL on Apache TVM.

``dsl.conv2d_backprop_filter`` / ``dsl.conv2d_backprop_input`` take ``te.placeholder`` tensors in
the Ascend layouts (5HD, FracZ) with TBE's exact signatures; :func:`build` compiles the result
for LLVM or CUDA with the package's cube schedules. See the README for a tour.
"""

from __future__ import annotations

import os

# TVM's CPU thread pool uses half the cores unless told otherwise (it assumes hyper-threading);
# use them all unless the user chose. Read when the pool starts, so set it before any kernel runs.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

from . import dsl, layout, reference, tvm  # noqa: E402
from .build import ArgSpec, Kernel, Timing, build, lower, pass_context, resolve_target  # noqa: E402
from .errors import ConvGradError  # noqa: E402
from .params import ConvGeometry, ConvGradParams  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ArgSpec",
    "ConvGeometry",
    "ConvGradError",
    "ConvGradParams",
    "Kernel",
    "Timing",
    "build",
    "dsl",
    "layout",
    "lower",
    "pass_context",
    "reference",
    "resolve_target",
    "tvm",
]
