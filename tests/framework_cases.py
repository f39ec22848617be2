"""The framework operators' calls as data: one :class:`Case` per oneDNN call, one :class:`DspCase`
per DeconvGradFilter call, with the placeholders, random arrays, float64 references (written from
``framework_ops/*.md``), the PyTorch autograd oracle and the elementwise closeness check that the
frontend tests, the CUDA emulation tests and the random property sweeps share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import te

from conftest import torch
from tvm_convgrad import reference
from tvm_convgrad.compile import numpy_dtype
from tvm_convgrad.frontends import dsp, onednn
from tvm_convgrad.tools.verify import error_bound

__all__ = ["DATA_OPS", "FORWARD_OP", "Case", "DspCase", "dsp_params", "arrays", "call", "check", "expected", "oracles", "placeholders", "torch_result"]

DATA_OPS = ("data", "data_v1")
"""The input-gradient operators: ``data`` (ConvolutionBackwardData), ``data_v1`` (ConvolutionBackpropData)."""
FORWARD_OP = "fwd"
"""The forward operator (Convolution): x = src, dy = dst (its result), the weights and a bias inputs."""


@dataclass(frozen=True)
class Case:
    """One call of a oneDNN operator. ``conv``: x = input_forward / src, dy = output_delta /
    diff_dst; ``deconv``: x = src, dy = diff_dst; ``data`` / ``data_v1``: x = the result diff_src,
    dy = diff_dst / output_delta, the weights an input; ``fwd`` (Convolution): x = src, dy = dst
    (the result), the weights (and ``bias``) inputs. Shapes are NCX here; the call uses
    data_format. ``shape_given`` (data ops): the diff_src shape as the ``input``, as the
    ``attr``ibute, or ``none`` (inferred with ``output_padding``)."""

    op: str  # "conv", "conv_v2" (ConvolutionBackwardWeights), "deconv", "data", "data_v1", "fwd" (Convolution)
    batch: int
    x_channels: int
    dy_channels: int
    groups: int
    x_size: tuple
    dy_size: tuple
    kernel: tuple
    strides: tuple
    pads_begin: tuple  # as passed (ignored with auto_pad)
    pads_end: tuple
    dilations: tuple
    auto_pad: str = "none"
    output_padding: tuple | None = None
    data_format: str = "NXC"
    weights_format: str = "XIO"
    dtype: str = "float32"
    effective_pads: tuple = field(default=(), compare=False)  # pads_begin the sum uses
    shape_given: str = "input"
    bias: bool = False  # fwd: with a bias input
    post_ops: tuple = ()  # fwd: oneDNN post-ops ``(alg, alpha, beta, src1)``, src1 None or how it broadcasts (see dst_operand)
    algorithm: str = "direct"  # fwd, data, conv_v2: the cube, "winograd" (F(2x2, 3x3)) or "auto"

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def name(self) -> str:
        return (
            f"{self.op}-r{self.rank}-g{self.groups}-{self.x_channels}x{self.dy_channels}-s{''.join(map(str, self.strides))}"
            f"-d{''.join(map(str, self.dilations))}-{self.auto_pad}-{self.data_format}-{self.weights_format}-{self.dtype}"
            + (f"-shape_{self.shape_given}" if self.op in DATA_OPS else "")
            + (f"-{self.algorithm}" if self.algorithm != "direct" else "")
        )

    def weights_shape(self) -> tuple:
        if self.op == "deconv":  # IOX (IC, OC/G, *K) / XOI (*K, OC/G, IC)
            i, o = self.x_channels, self.dy_channels // self.groups
            return (i, o, *self.kernel) if self.weights_format == "IOX" else (*self.kernel, o, i)
        o, i = self.dy_channels, self.x_channels // self.groups  # OIX / XIO / OXI
        return {"OIX": (o, i, *self.kernel), "OXI": (o, *self.kernel, i)}.get(self.weights_format, (*self.kernel, i, o))

    def layout_shape(self, channels: int, size: tuple) -> tuple:
        return (self.batch, channels, *size) if self.data_format == "NCX" else (self.batch, *size, channels)

    def dst_operand(self, how: str) -> tuple:
        """The shape of a binary post-op's src1 that broadcasts to dst (in data_format) ``how``:
        ``full`` dst's shape, ``channel`` one value per channel (NCX ``(C, 1, .., 1)``, NXC
        ``(C,)``), ``scalar`` ``()``, ``image`` one value per image ``(N, 1, .., 1)``."""
        dst = self.layout_shape(self.dy_channels, self.dy_size)
        if how == "full":
            return dst
        if how == "channel":
            return (self.dy_channels,) + (1,) * self.rank if self.data_format == "NCX" else (self.dy_channels,)
        if how == "image":
            return (self.batch,) + (1,) * (len(dst) - 1)
        return ()



def call(case: Case, *inputs: te.Tensor):
    """The operator's result tensor on ``inputs`` (:func:`placeholders`)."""
    attrs = dict(strides=list(case.strides), pads_begin=list(case.pads_begin), pads_end=list(case.pads_end),
                 dilations=list(case.dilations), auto_pad=case.auto_pad, groups=case.groups, data_format=case.data_format)  # fmt: skip
    if case.op in DATA_OPS:
        return _data_call(case, *inputs, attrs)
    if case.op == FORWARD_OP:
        src, w, *rest = inputs
        bias, src1 = (rest[0] if case.bias else None), iter(rest[case.bias :])
        post_ops = [onednn.PostOp(alg, None if how is None else next(src1), alpha, beta) for alg, alpha, beta, how in case.post_ops]
        return onednn.convolution(src, w, bias, weights_format=case.weights_format, post_ops=post_ops, algorithm=case.algorithm, **attrs)
    x, dy = inputs
    shape = list(case.weights_shape())
    if case.op == "conv":
        return onednn.convolution_backprop_filters(x, dy, shape, filter_format=case.weights_format, **attrs)
    if case.op == "conv_v2":
        return onednn.convolution_backward_weights(x, dy, shape, weights_format=case.weights_format, algorithm=case.algorithm, **attrs)
    return onednn.conv_transpose_backward_weights(x, dy, shape, weights_format=case.weights_format, output_padding=case.output_padding, **attrs)


def _data_call(case: Case, dy: te.Tensor, w: te.Tensor, attrs: dict):
    shape = list(case.layout_shape(case.x_channels, case.x_size))
    given = {"input": (shape, None), "attr": (None, shape), "none": (None, None)}[case.shape_given]
    padding = None if case.output_padding is None else list(case.output_padding)
    if case.op == "data":
        return onednn.convolution_backward_data(dy, w, given[0], dst_shape_attr=given[1], weights_format=case.weights_format,
                                                output_padding=padding, algorithm=case.algorithm, **attrs)  # fmt: skip
    return onednn.convolution_backprop_data(dy, w, given[0], output_shape_attr=given[1], filter_format=case.weights_format,
                                            output_padding=padding, **attrs)  # fmt: skip


def _input_shapes(case: Case) -> list[tuple[str, tuple]]:
    """The operator's inputs in order: ``(name, shape in the call's layouts)``."""
    x_shape = case.layout_shape(case.x_channels, case.x_size)
    dy_shape = case.layout_shape(case.dy_channels, case.dy_size)
    if case.op in DATA_OPS:
        return [("diff_dst" if case.op == "data" else "output_delta", dy_shape), ("weights" if case.op == "data" else "filter", case.weights_shape())]
    if case.op == FORWARD_OP:
        src1 = [(f"src1_{k}", case.dst_operand(how)) for k, (_, _, _, how) in enumerate(case.post_ops) if how is not None]
        return [("src", x_shape), ("weights", case.weights_shape())] + ([("bias", (case.dy_channels,))] if case.bias else []) + src1
    return [("src" if case.op != "conv" else "input_forward", x_shape), ("diff_dst" if case.op != "conv" else "output_delta", dy_shape)]


def placeholders(case: Case):
    """The operator's input placeholders, in its argument order."""
    return tuple(te.placeholder(shape, case.dtype, name=name) for name, shape in _input_shapes(case))


def arrays(case: Case, seed: int = 0):
    """Random arrays of the operator's inputs, in its argument order."""
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(case.dtype)
    return tuple(rng.uniform(-1, 1, shape).astype(dtype) for _, shape in _input_shapes(case))


def _ncx(case: Case, a: np.ndarray) -> np.ndarray:
    return reference.from_data_format(a.astype(np.float64), case.data_format)


def expected(case: Case, *inputs: np.ndarray) -> np.ndarray:
    """float64 reference of the operator's result in its own layout (from the rounded inputs)."""
    if case.op == FORWARD_OP:
        x, w, *rest = inputs
        wn = reference.from_weights_format(w.astype(np.float64), case.weights_format)
        y = reference.conv_forward_nd(_ncx(case, x), wn, case.strides, case.effective_pads, case.dilations, case.groups, _pads_end(case),
                                      rest[0] if case.bias else None)  # fmt: skip
        src1 = iter(rest[case.bias :])
        ops = [(alg, alpha, beta, None if how is None else next(src1)) for alg, alpha, beta, how in case.post_ops]
        return reference.post_ops(reference.to_data_format(y, case.data_format), ops)
    if case.op in DATA_OPS:
        dy, w = inputs
        wn = reference.from_weights_format(w.astype(np.float64), case.weights_format)
        dx = reference.conv_backward_data_nd(_ncx(case, dy), wn, case.x_size, case.strides, case.effective_pads, case.dilations, case.groups)
        return reference.to_data_format(dx, case.data_format)
    xn, dyn = (_ncx(case, a) for a in inputs)
    if case.op == "deconv":
        w = reference.conv_transpose_backward_weights(xn, dyn, case.kernel, case.strides, case.effective_pads, case.dilations, case.groups)
    else:
        w = reference.conv_backprop_filter_nd(xn, dyn, case.kernel, case.strides, case.effective_pads, case.dilations, case.groups)
    return reference.to_weights_format(w, case.weights_format)


def _pads_end(case: Case) -> list[int]:
    """The pads_end a forward's output size follows from (its dy_size is that size)."""
    return [max(0, (o - 1) * st + (k - 1) * d + 1 - b - size) for size, o, st, k, d, b in
            zip(case.x_size, case.dy_size, case.strides, case.kernel, case.dilations, case.effective_pads)]  # fmt: skip


def _forward_pads(case: Case) -> list[int]:
    """F.pad's list for x: (pads_begin, an end that reaches every window), last axis first."""
    return [p for b, e in reversed(list(zip(case.effective_pads, _pads_end(case)))) for p in (b, e)]


def oracles(case: Case, *inputs: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The results to check an operator against: the float64 reference, and PyTorch's where it
    is installed (the README's test command runs without it)."""
    return [("reference", expected(case, *inputs))] + ([("PyTorch", torch_result(case, *inputs))] if torch is not None else [])


def torch_result(case: Case, *inputs: np.ndarray) -> np.ndarray:
    """PyTorch autograd, float64, in the operator's layout. conv: ``conv{n}d_weight`` on x padded
    with (pads_begin, pads_end); data: the gradient of ``sum(conv{n}d(pad(x), W) * diff_dst)``
    with respect to x; deconv: ``conv_transpose{n}d`` (no padding) cropped to diff_dst's window
    ``[pb, pb + S_dst)`` (zero-extended), loss ``sum(y * diff_dst)``."""
    nd, fn = case.rank, torch.nn.functional
    if case.op == FORWARD_OP:
        x, w, *rest = inputs
        xt = torch.from_numpy(_ncx(case, x).copy())
        wt = torch.from_numpy(reference.from_weights_format(w.astype(np.float64), case.weights_format).copy())
        bt = torch.from_numpy(rest[0].astype(np.float64)) if case.bias else None
        y = getattr(fn, f"conv{nd}d")(fn.pad(xt, _forward_pads(case)), wt, bt, stride=case.strides, dilation=case.dilations, groups=case.groups)
        y = torch.from_numpy(reference.to_data_format(y.numpy(), case.data_format))
        src1 = iter(rest[case.bias :])
        for alg, alpha, beta, how in case.post_ops:
            y = _torch_post_op(y, alg, alpha, beta, None if how is None else torch.from_numpy(next(src1).astype(np.float64)))
        return y.numpy()
    if case.op in DATA_OPS:
        dy, w = inputs
        dyt = torch.from_numpy(_ncx(case, dy).copy())
        wt = torch.from_numpy(reference.from_weights_format(w.astype(np.float64), case.weights_format).copy())
        xt = torch.zeros((case.batch, case.x_channels, *case.x_size), dtype=torch.float64, requires_grad=True)
        y = getattr(fn, f"conv{nd}d")(fn.pad(xt, _forward_pads(case)), wt, stride=case.strides, dilation=case.dilations, groups=case.groups)
        (y * dyt).sum().backward()
        return reference.to_data_format(xt.grad.numpy(), case.data_format)
    xt, dyt = (torch.from_numpy(_ncx(case, a).copy()) for a in inputs)
    if case.op != "deconv":
        weight_fn = getattr(torch.nn.grad, f"conv{nd}d_weight")
        shape = (case.dy_channels, case.x_channels // case.groups, *case.kernel)
        w = weight_fn(fn.pad(xt, _forward_pads(case)), shape, dyt, stride=case.strides, padding=0, dilation=case.dilations, groups=case.groups)
        return reference.to_weights_format(w.numpy(), case.weights_format)
    weight = torch.zeros((case.x_channels, case.dy_channels // case.groups, *case.kernel), dtype=torch.float64, requires_grad=True)
    y = getattr(fn, f"conv_transpose{nd}d")(xt, weight, stride=case.strides, dilation=case.dilations, groups=case.groups)
    full = y.shape[2:]
    extend = [p for ax in reversed(range(nd)) for p in (0, max(0, case.effective_pads[ax] + case.dy_size[ax] - full[ax]))]
    window = (slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(case.effective_pads, case.dy_size))
    (fn.pad(y, extend)[window] * dyt).sum().backward()
    return reference.to_weights_format(weight.grad.numpy(), case.weights_format)


def _torch_post_op(y, alg: str, alpha: float, beta: float, src1):
    """One of oneDNN's post-ops in PyTorch's own operators (an oracle independent of the reference's)."""
    fn = torch.nn.functional
    if src1 is not None:
        return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum, "min": torch.minimum}[alg](y, src1)
    return {
        "relu": lambda: fn.leaky_relu(y, alpha),
        "clip": lambda: torch.clamp(y, alpha, beta),
        "linear": lambda: alpha * y + beta,
        "logistic": lambda: torch.sigmoid(y),
        "swish": lambda: y * torch.sigmoid(alpha * y),
        "tanh": lambda: torch.tanh(y),
    }[alg]()


_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def _window_magnitudes(x: np.ndarray, pads, th: int, tw: int) -> np.ndarray:
    """``(N, C, TH, TW, 4, 4)``: ``|B^T| |d| |B|`` of each 2x2 tile's 4x4 window ``d`` of ``x (N, C, H, W)``
    padded by ``pads`` (top, bottom, left, right), 0 outside it."""
    n, c, h, wd = x.shape
    pt, _, pl, _ = pads
    padded = np.zeros((n, c, 2 * th + 2, 2 * tw + 2))
    padded[:, :, pt : pt + h, pl : pl + wd] = np.abs(x)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (4, 4), axis=(2, 3))[:, :, ::2, ::2]
    bt = np.abs(_BT)
    return np.einsum("ab,ncijbe,fe->ncijaf", bt, windows, bt)


def winograd_magnitudes(x: np.ndarray, w: np.ndarray, pads) -> np.ndarray:
    """``(N, K, Ho, Wo)``: F(2x2, 3x3) (Lavin and Gray) of ``x (N, C, H, W)`` and ``w (K, C, 3, 3)``
    (``pads``: top, bottom, left, right) with every matrix, input and weight taken by magnitude: per
    output, the sum of the ``|U| |V|`` products it is made of, through ``|A^T|``."""
    n, _, h, wd = x.shape
    pt, pb, pl, pr = pads
    ho, wo = h + pt + pb - 2, wd + pl + pr - 2
    th, tw = -(-ho // 2), -(-wo // 2)
    v = _window_magnitudes(x, pads, th, tw)
    g, at = np.abs(_G), np.abs(_AT)
    u = np.einsum("ab,kcbe,fe->kcaf", g, np.abs(w), g)
    m = np.einsum("ncijaf,kcaf->nkijaf", v, u)
    return np.einsum("ra,nkijaf,sf->nkirjs", at, m, at).reshape(n, -1, 2 * th, 2 * tw)[:, :, :ho, :wo]


def winograd_dw_magnitudes(x: np.ndarray, dy: np.ndarray, pads) -> np.ndarray:
    """``(K, C, 3, 3)``: the weight gradient by F(2x2, 3x3) transposed of ``x (N, C, H, W)`` and
    ``dy (N, K, Ho, Wo)`` (``pads``: top, bottom, left, right) with every matrix, input and gradient
    taken by magnitude: per weight, the sum of the ``|D| |V|`` products it is made of, through ``|G|``."""
    n, k, ho, wo = dy.shape
    th, tw = -(-ho // 2), -(-wo // 2)
    v = _window_magnitudes(x, pads, th, tw)
    tiles = np.zeros((n, k, 2 * th, 2 * tw))
    tiles[:, :, :ho, :wo] = np.abs(dy)
    g, a = np.abs(_G), np.abs(_AT).T
    d = np.einsum("ar,nkirjs,fs->nkijaf", a, tiles.reshape(n, k, th, 2, tw, 2), a)
    return np.einsum("ap,kcaf,fq->kcpq", g, np.einsum("nkijaf,ncijaf->kcaf", d, v), g)


PAIR_PRODUCT_ERROR = 2.0**-7 * (1 + 2.0**-9)
"""The most a product of two operands each rounded once to bf16 (relative 2^-8 each, bf16's unit
roundoff) is off, relative to its magnitude: ``(1 + 2^-8)^2 - 1``."""


def pair_winograd_bound(case: Case, inputs, expected: np.ndarray, kernel) -> np.ndarray:
    """Elementwise allowed error of a forward, dX or dW by F(2x2, 3x3) on bf16 pairs (``winograd-bf16``):
    each product's two operands rounded once to bf16, so each output is off by at most
    :data:`PAIR_PRODUCT_ERROR` of :func:`winograd_magnitudes` (a dX: dy through the weight rotated
    and transposed, the pads ``2 - p``; a dW: :func:`winograd_dw_magnitudes`; the deconvolution's dW
    has no Winograd form), plus the direct kernels' bound (``tools.verify.error_bound``)."""
    (pt, pl), (h, wd), (ho, wo) = case.effective_pads, case.x_size, case.dy_size
    pads = (pt, ho + 2 - h - pt, pl, wo + 2 - wd - pl)
    a = _ncx(case, inputs[0].astype(np.float64))
    if case.op != FORWARD_OP and case.op not in DATA_OPS:
        sums = reference.to_weights_format(winograd_dw_magnitudes(a, _ncx(case, inputs[1]), pads), case.weights_format)
    else:
        w = reference.from_weights_format(inputs[1].astype(np.float64), case.weights_format)
        if case.op in DATA_OPS:
            w, pads = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3), tuple(2 - p for p in pads)
        sums = reference.to_data_format(winograd_magnitudes(a, w, pads), case.data_format)
    return PAIR_PRODUCT_ERROR * sums + error_bound(kernel.params, expected, kernel.output.dtype)


def check(result: np.ndarray, expected: np.ndarray, kernel, what: str):
    """Every element within the bound of fp32 sums rounded once to the result's type."""
    assert result.shape == expected.shape, f"{what}: shape {result.shape} != {expected.shape}"
    error = np.abs(result.astype(np.float64) - expected)
    ratio = error / error_bound(kernel.params, expected, kernel.output.dtype)
    assert ratio.max() <= 1.0, f"{what}: max error {error.max():.3g} = {ratio.max():.3g} x the bound"


@dataclass(frozen=True)
class DspCase:
    """One call of DeconvGradFilter: its 18 ``params`` and type (float32 or float16)."""

    params: tuple
    dtype: str = "float32"

    @property
    def dy_shape(self) -> tuple:
        return tuple(self.params[4:8])

    @property
    def x_shape(self) -> tuple:
        return tuple(self.params[0:4])

    def name(self) -> str:
        return "dsp-" + "-".join(map(str, self.params[:17])) + f"-{self.dtype}"

    def call(self):
        dy = te.placeholder(self.dy_shape, self.dtype, name="dy")
        x = te.placeholder(self.x_shape, self.dtype, name="x")
        return dsp.deconv_grad_filter(dy, x, list(self.params), self.dtype)

    def arrays(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        return (rng.uniform(-1, 1, self.dy_shape).astype(self.dtype), rng.uniform(-1, 1, self.x_shape).astype(self.dtype))

    def expected(self, dy: np.ndarray, x: np.ndarray) -> np.ndarray:
        return reference.deconv_grad_filter(dy, x, self.params)


def dsp_params(batch, in_hw, in_c, out_hw, out_c, k, s, pad, d, group, workspace=0) -> list:
    """DeconvGradFilter's 18 params from named parts."""
    return [batch, *in_hw, in_c, batch, *out_hw, out_c, *k, *s, *pad, *d, group, workspace]


def stages_named(result: te.Tensor, prefix: str) -> list[te.Tensor]:
    """The stages of the TE graph computing ``result`` whose names start with ``prefix`` (a mad and
    its live-tap regions' copies: ``dx_cc_0_0``, ``conv_cc``, ``conv_cc_0_1``, ...), each once."""
    found, pending, seen = [], [result], set()
    while pending:
        tensor = pending.pop()
        if tensor.op.name in seen:
            continue
        seen.add(tensor.op.name)
        found += [tensor] if tensor.op.name.startswith(prefix) else []
        pending += list(tensor.op.input_tensors)
    return found
