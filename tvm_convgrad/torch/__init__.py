"""PyTorch autograd with the package's gradients: ``conv2d`` and ``Conv2d``, drop-ins for
``torch.nn.functional.conv2d`` and ``torch.nn.Conv2d``.

The forward pass is PyTorch's, or the package's kernel where it is faster for the layer
(:mod:`.forward`: ``set_forward("auto" | "ours" | "pytorch")``); the backward pass runs the package's dX and dW kernels
(``ConvolutionBackwardData`` / ``ConvolutionBackwardWeights`` on the cube schedules; per GEMM
PyTorch's where it is faster for the layer, :mod:`.backward`: ``set_backward("auto" | "ours" |
"pytorch")``), on the tensors' memory through DLPack: NCHW tensors as NCX, channels-last tensors as NXC, no copies where the
layout and the data's 64-byte alignment allow (a weight gradient is written OIHW). Registered with ``torch.library``
(``tvm_convgrad::conv2d`` and its two gradient operators), so ``torch.compile`` keeps the calls
in its graph. Types float32, bfloat16, float16 (and float64, computed in float32 for
``gradcheck``); CPU tensors. The kernels run on PyTorch's own OpenMP threads (:mod:`.openmp`,
registered when this module is imported): one set of cores for both, neither pool spinning
against the other; their scratch buffers come from malloc as PyTorch's do, or are kept between
calls (:mod:`.workspace`: ``set_workspaces("malloc" | "kept")``); their large results (the
forward's output, dX) lie over mappings kept between calls, touched already (:mod:`.outputs`:
``set_outputs("kept" | "malloc")``, ``release_outputs()``); glibc's heap thresholds are
pinned at their dynamic rule's maxima, so that the drop-in's memory beside PyTorch's does not decide
when glibc returns PyTorch's (:mod:`.heap`; ``TVM_CONVGRAD_HEAP=glibc`` keeps glibc's rule). Once a
layer's gradients are settled as the package's, its autograd node is a C++ one, compiled on first
use (:mod:`.native`: ``set_native("on" | "off")``; the Python node where it cannot be built).

    >>> from tvm_convgrad.torch import Conv2d
    >>> layer = Conv2d(64, 64, 3, padding=1, bias=False)   # same constructor and state_dict as nn.Conv2d
    >>> y = layer(x); y.sum().backward()                   # x.grad and layer.weight.grad by tvm_convgrad
"""

from __future__ import annotations

import functools
import operator
import warnings
from typing import Optional, Sequence, Union

import torch
from torch import nn

from ..errors import ConvGradError
from .kernels import CACHED_CALLS, check_groups, check_output, input_grad_kernel, weight_grad_kernel
from .heap import heap_pinned, pin_heap
from .outputs import get_outputs, is_kept, kept_outputs, release_outputs, set_outputs
from .openmp import use_pytorch_threads, using_pytorch_threads
from .workspace import get_workspaces, kept_workspaces, set_workspaces, use_pytorch_allocator, using_pytorch_allocator, workspace_allocations
from . import flops, native, ops  # noqa: F401  (flops: the operators' FLOP formulas, registered)
from .backward import backward_choices, get_backward, set_backward
from .forward import forward_choices, get_forward, set_forward
from .native import get_native, set_native
from .ops import OP, conv2d_input_grad, conv2d_weight_grad, conv_call

use_pytorch_threads()  # every kernel built from here on runs on PyTorch's OpenMP threads (see .openmp)
use_pytorch_allocator()  # ... and takes its scratch buffers from malloc, as PyTorch's ops do (see .workspace)
pin_heap()  # glibc maps and trims by fixed thresholds, not by what the process has freed so far (see .heap)

__all__ = ["CACHED_CALLS", "Conv2d", "backward_choices", "conv2d", "convert_conv2d", "conv2d_input_grad", "conv2d_weight_grad", "conv_call", "forward_choices",
           "get_backward", "get_forward", "get_native", "get_outputs", "get_workspaces", "heap_pinned", "input_grad_kernel", "is_kept", "kept_outputs", "kept_workspaces", "pads_of", "pin_heap",
           "release_outputs", "set_backward", "set_forward", "set_native", "set_outputs", "set_workspaces", "use_pytorch_allocator",
           "use_pytorch_threads", "using_pytorch_allocator", "using_pytorch_threads", "weight_grad_kernel", "workspace_allocations"]  # fmt: skip

_IntPair = Union[int, Sequence[int]]


def _integer(value) -> Optional[int]:
    """``value`` as an int where ``F.conv2d`` takes it as one (a Python or numpy integer, through
    ``__index__``; not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _pair(name: str, value: _IntPair, low: int) -> tuple[int, int]:
    single = _integer(value)
    try:
        values = (single, single) if single is not None else tuple(_integer(v) for v in value)
    except TypeError:  # neither an integer nor a sequence of them
        values = ()
    values = values * 2 if len(values) == 1 else values  # (one for both axes, as F.conv2d reads ``(2,)``)
    if len(values) != 2 or any(v is None or v < low for v in values):
        raise ConvGradError(OP, name, value, f"must be an int >= {low} or two of them (H, W)")
    return values


def pads_of(padding: Union[str, _IntPair], kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` of PyTorch's ``padding``: an int, ``(H, W)``, ``"valid"`` or
    ``"same"`` (stride 1; ``d*(k-1)`` in all, the odd one at the end, as PyTorch pads)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ConvGradError(OP, "padding", padding, "must be 'valid', 'same', an int or (H, W)")
        if any(s != 1 for s in stride):
            raise ConvGradError(OP, "padding", padding, f"'same' needs stride 1 (PyTorch's rule), got stride {tuple(stride)}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (totals[0] // 2, totals[0] - totals[0] // 2, totals[1] // 2, totals[1] - totals[1] // 2)
    ph, pw = _pair("padding", padding, 0)
    return (ph, ph, pw, pw)


def conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: _IntPair = 1,
    padding: Union[str, _IntPair] = 0,
    dilation: _IntPair = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` whose gradients (input, weight) are the package's kernels.

    ``input (N, C, H, W)`` (contiguous or channels-last) or unbatched ``(C, H, W)``, ``weight (O,
    C/groups, KH, KW)``, ``bias (O,)``; ``stride``, ``dilation``: an int or ``(H, W)``; ``padding``:
    an int, ``(H, W)``, ``"valid"`` or ``"same"``. Returns the convolution (PyTorch's, or the
    package's where :func:`set_forward`'s mode chooses it); every order
    of gradient (``create_graph=True``) is the package's, and ``torch.autocast("cpu")`` casts the
    tensors as it casts ``F.conv2d``'s. A call whose forward and gradients the modes all give to
    PyTorch (``"auto"``: once timed) is ``F.conv2d``'s own, every order of its gradient PyTorch's.
    Under ``torch.jit.trace`` the graph records PyTorch's convolution (see :func:`.ops.conv2d`)."""
    if not torch.compiler.is_compiling():  # a signature settled on the C++ node (:func:`.native.fast`), else None
        output = native.fast(input, weight, bias, stride, padding, dilation, groups)
        if output is not None:
            return output
    if torch.jit.is_tracing():  # sizes are the trace's tensors: the checks read them as the constants they are
        with warnings.catch_warnings():  # (nn.Conv2d's trace warns of none of them)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return _conv2d(input, weight, bias, stride, padding, dilation, groups)
    return _conv2d(input, weight, bias, stride, padding, dilation, groups)


torch.fx.wrap("conv2d")  # ``torch.fx.symbolic_trace`` records a call of it, as of ``F.conv2d``, not its checks


def _conv2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: _IntPair, padding: Union[str, _IntPair],
            dilation: _IntPair, groups: int) -> torch.Tensor:  # fmt: skip
    """:func:`conv2d`: its arguments checked, then :func:`.ops.conv2d`."""
    if weight.dim() != 4 or input.dim() not in (3, 4):
        raise ConvGradError(OP, "input.dim()" if weight.dim() == 4 else "weight.dim()", (input.dim(), weight.dim()),
                            f"input must be 3-D (C, H, W) or 4-D (N, C, H, W) and weight 4-D (O, C/groups, KH, KW); "
                            f"got input.dim() = {input.dim()}, weight.dim() = {weight.dim()}")  # fmt: skip
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ConvGradError(OP, "bias.shape", tuple(bias.shape), f"must be (weight.shape[0],) = ({weight.shape[0]},)")
    if input.dim() == 3:
        return _conv2d(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    try:  # (Dynamo traces the check itself: it warns of an lru_cache it would skip)
        check = _arguments.__wrapped__ if torch.compiler.is_compiling() else _arguments
        stride, pads, dilation, groups = check(input.shape[1], weight.shape, stride, padding, dilation, groups)
    except TypeError:  # a list among them (unhashable): checked without the cache
        stride, pads, dilation, groups = _arguments.__wrapped__(input.shape[1], weight.shape, stride, padding, dilation, groups)
    if input.numel():  # (an empty tensor is PyTorch's call, its errors too: see ops.conv2d)
        check_output(OP, "input.shape", input.shape, weight.shape, pads, dilation)
    return ops.conv2d(input, weight, bias, stride, pads, dilation, groups)


@functools.lru_cache(maxsize=256, typed=True)  # (typed: a bool is not taken for the int it equals)
def _arguments(channels: int, weight_shape: Sequence[int], stride: _IntPair, padding: Union[str, _IntPair], dilation: _IntPair,
               groups: int) -> tuple[tuple, tuple, tuple, int]:  # fmt: skip
    """``(stride, pads, dilation, groups)`` of a call's arguments (``channels``: the input's),
    checked (``groups``, :func:`_pair`, :func:`pads_of`) and made ints: worked out once per distinct
    arguments (a layer's are the same every step)."""
    given, groups = groups, _integer(groups)
    check_groups(OP, "input.shape[1]", channels, weight_shape, groups, given)
    stride, dilation = _pair("stride", stride, 1), _pair("dilation", dilation, 1)
    return stride, pads_of(padding, tuple(weight_shape[2:]), stride, dilation), dilation, groups


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` (same constructor, parameters and ``state_dict``) whose backward pass runs
    the package's dX and dW kernels. ``padding_mode`` other than ``"zeros"`` pads with PyTorch
    first, as ``nn.Conv2d`` does."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if torch.jit.is_scripting():  # ``torch.jit.script``: nn.Conv2d's own call (TorchScript cannot call the kernels;
            # its padding branches stay apart: TorchScript types a module's padding as it is, a str or a tuple)
            if self.padding_mode != "zeros":
                padded = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
                return torch.nn.functional.conv2d(padded, weight, bias, self.stride, (0, 0), self.dilation, self.groups)
            return torch.nn.functional.conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)
        return self._drop_in_forward(input, weight, bias)

    @torch.jit.unused
    def _drop_in_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if self.padding_mode != "zeros":
            padded = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv2d(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def convert_conv2d(module: nn.Module) -> nn.Module:
    """``module`` with every ``nn.Conv2d`` in it (exactly that class) made a :class:`Conv2d`, in
    place: the same parameters, buffers, hooks and ``state_dict``. Returns ``module``.

    >>> model = tvm_convgrad.torch.convert_conv2d(model)   # its training step now runs the package's gradients"""
    for child in module.modules():
        if type(child) is nn.Conv2d:
            child.__class__ = Conv2d
    return module
