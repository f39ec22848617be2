"""Helpers shared by the two gradient computes."""

from __future__ import annotations

import math

import tvm
from tvm import te, tirx

from ...layout import C0, ceil_div
from .stages import CONVERT_IN_PLACE

ACC = "float32"
"""Accumulation dtype of the cube: fp16 x fp16 products are exact in fp32."""


REAL_CHANNEL_RUNS = True
"""An fp32 cube GEMM whose reduction channels (dX's Cout, the forward's Cin) are not whole 16-channel
blocks sums its real channels only (:func:`real_channel_run`): the last block's lanes past them are
never read. Where the operand is read in place (a channels-last 1x1) that block was a masked read a
lane at a time with a branch a step, and its FMAs past the channels multiplied zeros (Zen 3, N=32,
channels-last, MobileNetV2's 144 -> 24 1x1 dX on 28x28 71 -> 88 GFLOP/s, 96 -> 24 74 -> 94; N=8
144 -> 24 on 16x16 72 -> 97; 64 -> 8 on 28x28 41 -> 64)."""


def real_channel_run(channels: int, dtype: str, pairs: bool = False) -> int:
    """How many channels a cube mad's lane axis (``co0`` / ``ci0``) steps over where it sums the real
    ``channels`` only: ``gcd(channels, 16)``, the longest run that never crosses a 16-channel block
    (channel ``run_index * run + lane``: block ``channel // 16``, lane ``channel % 16``); 0 where the
    reduction stays whole blocks x 16 lanes: ``channels`` a multiple of 16, ``dtype`` not fp32 (the
    tensor cores' 16-deep fp16 fragments), bf16 pairs (see :data:`REAL_CHANNEL_RUNS`). The caller
    keeps it to one group and 2-D."""
    if not REAL_CHANNEL_RUNS or pairs or dtype != ACC or channels % C0 == 0:
        return 0
    return math.gcd(channels, C0)


def in_place(source: te.Tensor, when: bool = True) -> dict | None:
    """The attributes of a stage that only converts ``source``: ``CONVERT_IN_PLACE`` when
    ``when`` holds and ``source`` is an argument (behind a frontend's layout stage the pack stays,
    so that the mad never reads a framework layout)."""
    return {CONVERT_IN_PLACE: 1} if when and isinstance(source.op, te.PlaceholderOp) else None


def planar_gemm(geom, dtype: str) -> bool:
    """Whether a convolution of ``geom`` on ``dtype`` is one fp32 GEMM per image over its pixels: a
    2-D 1x1 kernel at stride 1 without padding, so that over channel-planar (NCX) tensors every
    operand's pixels lie contiguous (the planar dX, forward and dW formulations start here)."""
    return dtype == ACC and (geom.kh, geom.kw) == (1, 1) and geom.strides == (1, 1) and not any(geom.pads) and geom.depth is None


NEVER = tirx.const(False, "bool")
"""The condition of a padded axis that holds no image data at all (see :func:`inside`)."""


def first_holding(choices, default):
    """The value of the first ``(conds, value)`` of ``choices`` whose conditions all hold, else
    ``default``: a chain of selects, none for a choice without conditions (each pixel of a dX or
    forward result picks its stride phase or live-tap region this way)."""
    value = default
    for conds, here in reversed(list(choices)):
        value = te.if_then_else(tirx.all(*conds), here, value) if conds else here
    return value


def guarded(conds: list, value):
    """``value`` where all ``conds`` hold, else 0; no select at all when nothing needs a guard,
    and no read at all when a condition is :data:`NEVER` (a read that always lies outside its
    tensor would also break the schedules' ``compute_inline`` of a layout stage behind it)."""
    zero = tirx.const(0, str(value.ty))
    if any(c.same_as(NEVER) for c in conds):
        return zero
    return te.if_then_else(tirx.all(*conds), value, zero) if conds else value


def inside(positions, before, size, extent) -> list:
    """Conditions for padded positions (one per axis) to hold image data: an axis of a buffer of
    ``extent`` positions holds the image at ``[before, before + size)``. Only the conditions
    that can fail are returned; ``[NEVER]`` when on some axis every position is padding (the
    reduction reads only padding there: e.g. a 1-wide axis padded on the left whose one output
    window never reaches the image)."""
    conds = []
    for p, b, n, e in zip(positions, before, size, extent):
        if b >= e:
            return [NEVER]
        conds += [p >= b] if b > 0 else []
        conds += [p < b + n] if e > b + n else []
    return conds


def masked(read: tirx.PrimExpr, keep: tirx.PrimExpr) -> tirx.PrimExpr:
    """``read`` where ``keep`` holds, else +0, without a ``Select`` around the read.

    ``Select`` evaluates both operands (a vectorized one loads every lane), and TVM's simplifier
    rewrites its true operand under its condition: an index clamped into the tensor there loses
    its clamp (``min(c, C-1)`` is ``c`` where ``c < C``), and the lanes past the tensor load from
    outside it. Here ``read`` (whose index the caller clamps into the tensor) is ANDed with a
    mask of all-ones or zeros: no condition reaches its index, and no Inf or NaN of the clamped
    element leaks into the lanes dropped."""
    bits = tvm.DataType(read.dtype).bits
    itype = f"int{bits}"
    mask = tirx.Select(keep, tirx.const(-1, itype), tirx.const(0, itype))
    return tirx.reinterpret(read.dtype, tirx.reinterpret(itype, read) & mask)


def channel_lanes(sums: te.Tensor, channels: int):
    """``read(row, block, h, w, c0)``: channel ``block*16 + c0`` of a channel-planar mad's ``sums
    (N, C, H, W)`` as a 5HD result reads it, the lanes past ``channels`` masked and the index
    clamped (branch-free: it vectorizes over ``c0``)."""

    def read(row, block, h, w, c0):
        channel = block * C0 + c0
        if ceil_div(channels, C0) * C0 > channels:
            return masked(sums[row, tirx.min(channel, channels - 1), h, w], channel < channels)
        return sums[row, channel, h, w]

    return read
