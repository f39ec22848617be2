"""tvm_convgrad: the convolution gradients of Huawei's TBE DSL on Apache TVM.

``dsl.conv2d_backprop_filter`` / ``dsl.conv2d_backprop_input`` take ``te.placeholder`` tensors in
the Ascend layouts (5HD, FracZ) with TBE's exact signatures; ``frontends.onednn`` and
``frontends.dsp`` give the framework operators (oneDNN Graph, the DSP library) on the same
compute; :func:`build` compiles any of them for LLVM or CUDA with the package's cube schedules,
and :func:`tune` searches their schedule space on MetaSchedule. ``docs/architecture.md`` maps
the layers; the README and ``docs/`` give a tour.
"""

from __future__ import annotations

from .machine import usable_cores, use_every_core

use_every_core()  # TVM's thread pool reads it when it starts: before any kernel runs

from . import dsl, frontends, layout, reference, tvm  # noqa: E402
from .compile import (  # noqa: E402
    ArgSpec, Kernel, Timing, Workload, build, emulate_bf16_dot, emulate_cuda, isa_target, lower, pass_context, resolve_target,
)  # fmt: skip
from .errors import ConvGradError  # noqa: E402
from .params import ConvGeometry, ConvGradParams  # noqa: E402
from .params.post_ops import PostOp  # noqa: E402
from .tuning import TuneReport, tune  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ArgSpec",
    "ConvGeometry",
    "ConvGradError",
    "ConvGradParams",
    "Kernel",
    "PostOp",
    "Timing",
    "TuneReport",
    "Workload",
    "build",
    "dsl",
    "emulate_bf16_dot",
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
