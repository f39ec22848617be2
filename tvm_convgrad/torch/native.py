"""The drop-in's autograd node in C++ (``native.cpp``), for the calls whose gradients are settled.

Every eager call of the drop-in whose gradients are the package's kernels goes through an autograd
node, and a Python one (:class:`.ops.Conv2dFunction`) costs the autograd engine a call into the
interpreter per node: a minimal Python ``autograd.Function`` around PyTorch's own convolutions
made MobileNetV2's channels-last training step at 8 x 64x64 2.9-3.2 ms slower (8-9%, ~56 us a
convolution; ResNet-18's 1.5-1.7 ms), the same node in C++ 0.4 ms. This one, against the Python
node, steps interleaved: that MobileNetV2 step 39.93 -> 37.89 ms, ResNet-18 NCHW 54.22 -> 52.98 (Zen
4, 2 cores, 2026-12-05, ``docs/performance/avx512-zen4-torch-steps/layers/dec05c-zen4.txt``).

Where a signature's gradients are the package's kernels for good (:func:`.backward.ours_throughout`:
``"ours"``, or ``"auto"`` having chosen them), :func:`node` hands the call to a C++ node
(:func:`module`): its apply runs the caller's forward (no graph recorded), its backward calls the
dW kernel, then the dX kernel, through tvm-ffi's C ABI on the saved tensors' memory, laid out as
:func:`.kernels.as_layout` and :func:`.kernels.as_weights` lay them, and sums the bias's gradient;
the profiler sees the forward and the kernels under the Python path's labels (``Conv2dFunction``,
``tvm_convgrad::conv2d_weight_grad`` and ``conv2d_input_grad``: what the step benchmark counts). A
dX of :data:`.outputs.OUTPUTS_FROM` bytes or more under ``"kept"`` outputs is a kept mapping, as
the Python node's: the extension holds :mod:`.outputs`' mappings once loaded (its ``kept_empty``,
no call into Python). Under autocast, a float32 weight beside a bf16 / f16 input is cast in the
node's forward, and its gradient is the dW kernel's float32 sums, as the Python node's. A backward
that records a graph (``create_graph=True``), or whose grad_output is batched or wrapped (legacy
``vmap``, functorch, a subclass), calls back into Python (the Python node's backward). The rest
takes the Python node: the first calls of a signature (its choices made there), forward-mode AD
(its ``jvp``), float64 and cropped taps.

Once a call taking the C++ node has its forward chosen too, its signature is *settled*
(:func:`_settle`): later calls of it go from :func:`tvm_convgrad.torch.conv2d` straight to the node
(:func:`fast`), the checks and choices of the Python path skipped where the call's tensors, arguments
and the global state are those it settled with. Cold, in a step whose large tensors evict the
interpreter's data, the Python path cost ~100 us a call more than ``nn.Conv2d``'s whole call; with
:func:`fast`, ~25 us (a 1x1 layer on 16 x 4x4, the caches flushed before each call, Zen 4). Where the
settled forward is the package's (:func:`.forward.ours`), the node calls its kernel itself
(:func:`.forward.ours_kernel`'s handle, its output from ``kept_empty`` where :func:`.outputs.empty`
would map it): cold, ``forward.ours`` cost ~120 us a call above its kernel (its allocation, the
views, the kernel's lookup).

The extension is compiled on first use with PyTorch's ``torch.utils.cpp_extension`` (a C++
compiler and ninja; ~30 s, kept in PyTorch's extensions folder for later processes) against
tvm-ffi's headers and library. Where it cannot be built or loaded, every call takes the Python
node: :func:`available` says which, :func:`build_error` why. ``TVM_CONVGRAD_NATIVE=off`` (read at
import) or :func:`set_native` turn it off. A signature that ran the C++ node keeps its kernels
loaded for the life of the process (the node holds their handles).
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.autograd import forward_ad

from ..errors import ConvGradError
from . import forward as forward_module
from . import outputs, settled
from .backward import ours_throughout
from .kernels import ALIGNMENT, DTYPES, CallPlan

__all__ = ["MODES", "available", "build_error", "fast", "get_native", "module", "node", "set_native", "settle_pytorchs"]

MODES = ("on", "off")
SOURCE = Path(__file__).with_name("native.cpp")

_LOCK = threading.Lock()
_STATE: dict = {"mode": os.environ.get("TVM_CONVGRAD_NATIVE", "on"), "module": None, "tried": False, "error": None}
_PLANS: list[CallPlan] = []  # a registered plan's id is its index; kept, so that its kernels stay loaded
_backward: list[Callable] = []  # the Python backward of a node that records a graph (set by :mod:`.ops`)


def _check(mode: str, name: str = "mode") -> str:
    if mode not in MODES:
        raise ConvGradError("tvm_convgrad.torch.set_native", name, mode, f"must be one of {list(MODES)}")
    return mode


_check(_STATE["mode"], "TVM_CONVGRAD_NATIVE")


def set_native(mode: str) -> None:
    """``"on"`` (the default: the C++ node where it applies and builds) or ``"off"`` (the Python node for every call)."""
    _STATE["mode"] = _check(mode)
    settled.reset()


def get_native() -> str:
    """The current mode."""
    return _STATE["mode"]


def module():
    """The compiled extension, built (or loaded from PyTorch's extensions folder) on the first call;
    None where it cannot be (:func:`build_error` says why)."""
    if _STATE["tried"]:
        return _STATE["module"]
    with _LOCK:
        if not _STATE["tried"]:
            try:
                import tvm_ffi.libinfo
                from torch.utils import cpp_extension

                library, include = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent, tvm_ffi.libinfo.find_include_path()
                links = [f"-L{library}", "-ltvm_ffi", f"-Wl,-rpath,{library}"]
                defines = ["-O2", f"-DTVM_CONVGRAD_ALIGNMENT={ALIGNMENT}"]  # (kernels.ALIGNMENT: the one constant)
                flags = {"extra_cflags": defines, "extra_include_paths": [include], "extra_ldflags": links}
                built = cpp_extension.load("tvm_convgrad_native", [str(SOURCE)], verbose=False, **flags)
                built.set_fallback(_fallback)
                outputs.use_native(built)
                settled.on_reset(built.unsettle)
                _STATE["module"] = built
            except Exception as error:  # noqa: BLE001 -- no compiler, no ninja, a failed build: the Python node
                _STATE["error"] = f"{type(error).__name__}: {error}"
            _STATE["tried"] = True
    return _STATE["module"]


def available() -> bool:
    """Whether the C++ node is on and built (building it now if it has not been tried)."""
    return _STATE["mode"] == "on" and module() is not None


def build_error() -> Optional[str]:
    """Why the extension could not be built or loaded (None where it was, or has not been tried)."""
    return _STATE["error"]


def node(plan: CallPlan, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], forward: Callable,
         backward: Callable, wide: bool = False, autocast: bool = False) -> Optional[torch.Tensor]:  # fmt: skip
    """The convolution of an eager call (its tensors plain, checked by the caller; ``autocast``:
    its casts made, ``wide`` its float32 weight kept beside a bf16 / f16 input) through the C++
    node, its result ``forward(weight)`` (run there without recording a graph, on the weight cast
    to the input's type where ``wide``); None where the call takes the Python node instead (see the
    module docstring). ``backward(ctx, grad_output)``: the Python node's, for a backward that
    records a graph."""
    grad = torch.is_grad_enabled()
    needs = (grad and input.requires_grad, grad and weight.requires_grad)
    if _STATE["mode"] != "on" or not any(needs) or forward_ad._current_level >= 0:  # (forward-mode AD: the Python node's jvp)
        return None
    if input.dtype not in DTYPES or (weight.dtype != input.dtype and not wide):
        return None
    if bias is not None and bias.dtype != input.dtype:
        return None
    if plan.native is _NEVER or not ours_throughout(plan.call, needs):
        return None
    native = plan.native
    if native is None or not _has_kernels(plan, needs, wide):
        native = _register(plan, needs, backward, wide)
        if native is None:
            return None
    kept = outputs.kept_for(input.nbytes)  # (a dX :mod:`.outputs` maps)
    if kept != native.kept_input_grad:
        _STATE["module"].set_kept(native.id, kept)
        native.kept_input_grad = kept
    _settle(plan, input, weight, bias, needs, autocast)
    return _STATE["module"].apply(input, weight, bias, forward, native.id, wide)


def fast(input, weight, bias, stride, padding, dilation, groups: int) -> Optional[torch.Tensor]:
    """A call of :func:`tvm_convgrad.torch.conv2d` (its arguments as given) through the C++ node,
    without the Python checks, where its signature is settled (:func:`_settle`: the same tensors'
    sizes, strides and types, the same arguments and gradients needed) and the state it settled in
    holds (grad mode on; autocast on or off as then; no tracing, functorch transform, torch function or
    dispatch mode, forward-mode AD or deterministic algorithms; plain tensors; the settings unchanged
    since, :mod:`.settled`); else None (the Python path). Cold, as in a step whose large tensors
    evict the interpreter's data, the Python path costs ~100 us a call more than ``nn.Conv2d``'s
    whole call (Zen 4, 2026-12-05)."""
    built = _STATE["module"]
    return None if built is None or _STATE["mode"] != "on" else built.fast(input, weight, bias, stride, padding, dilation, groups)


def _settle(plan: CallPlan, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], needs: tuple[bool, bool],
            autocast: bool):  # fmt: skip
    """Register a call taking the C++ node (its tensors autocast's casts, where ``autocast`` was on)
    as its signature's settled route, once its forward is chosen (:func:`.forward.settled_way`)."""
    call = plan.call
    if call.weights_format == "OXI" and call.data_format != "NXC":  # (:func:`.forward.forward` gives these to PyTorch)
        way = None
    else:
        way = forward_module.settled_way(call, bias is not None)
    if way is not forward_module.PENDING:
        _settled_route(plan, input, weight, bias, needs, autocast, plan.native.id, way)


def settle_pytorchs(plan: CallPlan, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], autocast: bool):
    """Register a call the modes give to PyTorch throughout (``F.conv2d``'s own, :func:`.ops._pytorchs_throughout`)
    as settled: its later calls go from :func:`tvm_convgrad.torch.conv2d` to ``at::conv2d`` (:func:`fast`)."""
    grad = torch.is_grad_enabled()
    needs = (grad and input.requires_grad, grad and weight.requires_grad)
    if _STATE["module"] is None or _STATE["mode"] != "on" or not any(needs):
        return
    if torch.are_deterministic_algorithms_enabled():  # ("auto" runs PyTorch's untimed: not the choice a later call would make)
        return
    _settled_route(plan, input, weight, bias, needs, autocast, -1, None)


def _settled_route(plan: CallPlan, input, weight, bias, needs: tuple[bool, bool], autocast: bool, plan_id: int, way):
    """The extension's ``settle`` of a call (``plan_id``: its node's, -1 for PyTorch's own; ``way``:
    the forward's function, None for ``at::conv2d``), where its pads are PyTorch's (symmetric). The
    package's forward (:func:`.forward.ours`) is given as its kernel's handle, which the node calls
    itself, its output over a kept mapping where :func:`.outputs.empty` would take one."""
    call = plan.call
    pt, pb, pl, pr = call.pads
    if pt == pb and pl == pr:
        handle, output_sizes, kept = 0, [], False
        if getattr(way, "func", None) is forward_module.ours:
            kernel = forward_module.ours_kernel(call, bias is not None)
            plan.native.forwards[bias is not None] = kernel  # (kept: the node holds its handle)
            handle, output_sizes = kernel.__chandle__(), list(call.y_shape)
            kept = outputs.kept_for(math.prod(output_sizes) * input.element_size())
        arguments = (call.strides, (pt, pl), call.dilation, call.groups, needs[0], needs[1], plan_id, way, autocast)
        _STATE["module"].settle(input, weight, bias, *arguments, handle, output_sizes, kept)


class _Native:
    """A plan's registration with the C++ node: its ``id`` there, and which of its kernels it has
    (each built and given to it when a call first needs it)."""

    __slots__ = ("id", "input_grad", "weight_grad", "weight_grad_f32", "both", "kept_input_grad", "forwards")

    def __init__(self, id: int):
        self.id, self.input_grad, self.weight_grad, self.weight_grad_f32, self.kept_input_grad = id, False, False, False, False
        self.both = False
        self.forwards: dict = {}  # (with a bias: the package's forward kernel whose handle a settled call holds)


def _has_kernels(plan: CallPlan, needs: tuple[bool, bool], wide: bool) -> bool:
    """Whether the C++ node has the kernels a call of ``plan`` and ``needs`` runs (``wide``:
    autocast's float32 weight): a depthwise or 1x1 layer's two in one where both are needed (as the
    Python node runs them), else each needed."""
    native = plan.native
    if all(needs) and not wide and plan.fuses:
        return native.both
    return (not needs[0] or native.input_grad) and (not needs[1] or (native.weight_grad_f32 if wide else native.weight_grad))


_NEVER = _Native(-1)
"""The registration of a plan whose calls never take the C++ node (cropped taps)."""


def _register(plan: CallPlan, needs: tuple[bool, bool], backward: Callable, wide: bool) -> Optional[_Native]:
    """``plan`` registered with the C++ node, with the kernels ``needs`` asks for (``wide``: the dW
    of float32 sums); None where its calls take the Python node (cropped taps: for good) or the
    extension is not there."""
    if plan.taps is not None:
        plan.native = _NEVER
    if plan.native is _NEVER or module() is None:
        return None
    built = _STATE["module"]
    with _LOCK:
        if not _backward:
            _backward.append(backward)
        if plan.native is None:
            plan.native = _Native(built.add_plan(plan.call.data_format == "NXC", plan.call.weights_format == "OXI"))
            _PLANS.append(plan)
        native = plan.native
        if all(needs) and not wide and plan.fuses:  # (a depthwise or 1x1 layer's two in one: the only kernel those calls run)
            if not native.both:
                built.set_kernel(native.id, 3, plan.both.__chandle__())
                native.both = True
            return native
        if needs[0] and not native.input_grad:
            built.set_kernel(native.id, 0, plan.input_grad.function.__chandle__())
            native.input_grad = True
        if needs[1] and not wide and not native.weight_grad:
            built.set_kernel(native.id, 1, plan.weight_grad.function.__chandle__())
            native.weight_grad = True
        if needs[1] and wide and not native.weight_grad_f32:
            built.set_kernel(native.id, 2, plan.weight_grad_f32.function.__chandle__())
            native.weight_grad_f32 = True
    return native


class _Context:
    """What the Python node's backward reads of its context, for a C++ node's (see :func:`_fallback`)."""

    __slots__ = ("saved_tensors", "attrs", "has_bias", "plan", "needs_input_grad")


def _fallback(plan_id: int, grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, needs: tuple,
              narrow: Optional[torch.Tensor]) -> tuple:  # fmt: skip
    """A C++ node's backward that records a graph: the Python node's (the operators), ``(dX, dW,
    db)`` (``narrow``: autocast's float32 ``weight`` cast, as the forward ran it; None else)."""
    plan = _PLANS[plan_id]
    call = plan.call
    ctx = _Context()
    saved = (input, weight) if narrow is None else (input, weight, narrow)
    ctx.saved_tensors, ctx.has_bias, ctx.plan, ctx.needs_input_grad = saved, needs[2], plan, tuple(needs)
    ctx.attrs = (call.strides, call.pads, call.dilation, call.groups, call.data_format == "NXC")
    return tuple(_backward[0](ctx, grad_output)[:3])
