"""Compile a gradient: its :class:`Workload`, the target, the schedule (a tuned record or the rule's
default), ``tvm.compile``, and the resulting :class:`Kernel`; :func:`emulate_cuda` runs a CUDA
schedule on this CPU, :func:`emulate_bf16_dot` a bf16 ``vdpbf16ps`` kernel."""

from .builder import CACHED_KERNELS, build, build_func, lower
from .emulate import EMULATION_TARGET, emulate_bf16_dot, emulate_cuda
from .kernel import ArgSpec, Kernel, Timing, numpy_dtype
from .records import SHIPPED, open_database, schedule_key, shipped_schedules, tuned_schedule, workload_key
from .target import KeepIndexWidth, isa_target, pass_context, resolve_target
from .workload import Workload

__all__ = [
    "CACHED_KERNELS", "EMULATION_TARGET", "SHIPPED", "ArgSpec", "KeepIndexWidth", "Kernel", "Timing", "Workload", "build", "build_func",
    "emulate_bf16_dot", "emulate_cuda",
    "isa_target", "lower", "numpy_dtype", "open_database", "pass_context", "resolve_target", "schedule_key", "shipped_schedules",
    "tuned_schedule", "workload_key",
]  # fmt: skip
