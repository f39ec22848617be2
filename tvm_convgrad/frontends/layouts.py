"""Layout stages between the framework operators' tensors and the dW / dX computes.

A frontend wraps the compute between two kinds of TE stages, each tagged ``layout_adapter``:

* ``as_5hd``: an NCX / NXC activation (spatial rank 1-3) seen as the compute's 5HD input
  ``(N, C1, H, W, 16)`` (rank 1: ``H = 1``) or NDC1HWC0 ``(N, D, C1, H, W, 16)`` (rank 3). The
  schedules inline it into the compute's packing stage, so the framework tensor is read once.
* ``as_fracz``: a framework weight as the FracZ(_g) weight the dX and forward computes read.
* ``data_stage``: a 5HD result (dX, the forward's y) as an activation in the framework layout.
* ``weight_stage``: the compute's result (TBE's FracZ_g(_3D), float32) written in a framework
  weight layout and rounded once to the operator's type. Each output element names the weight
  ``(o, i, k...)`` of the conv view it holds; :func:`tvm_convgrad.layout.dw_result_index` finds it.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from tvm import te, tirx

from .. import layout
from ..dsl.compute.common import masked
from ..dsl.compute.stages import LAYOUT_ADAPTER, LAYOUT_IN_TAG, LAYOUT_OUT_TAG
from ..layout import C0, ceil_div
from ..params.framework import ConvView, weights_index
from ..params.post_ops import PostOp
from .post_ops import apply_post_ops

__all__ = ["as_5hd", "as_fracz", "data_stage", "weight_stage"]


def as_5hd(tensor: te.Tensor, data_format: str, name: str) -> te.Tensor:
    """``tensor`` (NCX or NXC, rank 3-5) as 5HD / NDC1HWC0, channels past C read as 0.

    The stage reads only inside the tensor, and branch-free within a block of 16 channels (the
    branches below are the same for every lane, so they do not keep it from vectorizing):

    * the blocks before the last read their 16 channels as they are (contiguous in NXC);
    * the last, partial block of an NXC pixel reads its 16 lanes contiguously too: the lanes past
      C fall on the next pixel's channels, inside the tensor, and are dropped; but at the
      tensor's last pixel, and for every partial block of NCX (its lanes are channel planes
      apart), the lanes past C read channel C-1 and are masked to 0 (:func:`masked`)."""
    shape = [int(d) for d in tensor.shape]
    channels = shape[1] if data_format == "NCX" else shape[-1]
    spatial = shape[2:] if data_format == "NCX" else shape[1:-1]
    nd = len(spatial)
    lead = (shape[0], spatial[0]) if nd == 3 else (shape[0],)
    plane = (1, *spatial) if nd == 1 else tuple(spatial[-2:])
    blocks = ceil_div(channels, C0)

    def value(*index):
        *head, c1, h, w, c0 = index
        n, depth = head[0], head[1:]
        at = (*depth, w) if nd == 1 else (*depth, h, w)

        def read(c):
            return tensor[(n, c, *at)] if data_format == "NCX" else tensor[(n, *at, c)]

        c = c1 * C0 + c0
        if channels % C0 == 0:
            return read(c)
        last = masked(read(tirx.min(c, channels - 1)), c < channels)
        if data_format == "NXC":  # the 16 lanes from this pixel's block on stay inside the tensor: read them contiguously
            pixel = 0
            for i, extent in zip((n, *at), (shape[0], *spatial)):
                pixel = pixel * extent + i
            pixels = shape[0] * math.prod(spatial)
            near_end = (pixel * channels + (c1 + 1) * C0) > pixels * channels
            last = tirx.if_then_else(near_end, last, tirx.Select(c < channels, read(c), tirx.const(0, tensor.dtype)))
        return last if blocks == 1 else tirx.if_then_else(c1 < blocks - 1, read(c), last)

    return te.compute(
        (*lead, blocks, *plane, C0), value, name=name, tag=LAYOUT_IN_TAG, attrs={LAYOUT_ADAPTER: "in"}
    )


def weight_stage(
    dw: te.Tensor,
    view: ConvView,
    shape: Sequence[int],
    to_oix: Callable[..., tuple],
    dtype: str,
    name: str,
    attrs: dict,
) -> te.Tensor:
    """The weight gradient in a framework layout of ``shape``, in ``dtype``.

    ``to_oix(*index)`` gives ``(o, i, k)`` of the conv view for an output index: ``o`` the
    output channel, ``i`` the input channel inside its group, ``k`` the taps in spatial order
    (1-3 of them). ``attrs`` are the result's (``kernel_name``, ``flops``)."""
    geom = view.geometry()
    ext = geom.group
    kernel = (geom.kd, geom.kh, geom.kw)

    def value(*index):
        o, i, taps = to_oix(*index)
        kd, kh, kw = (0,) * (3 - len(taps)) + tuple(taps)
        return dw[layout.dw_result_index(o, i, kd, kh, kw, ext, kernel)].astype(dtype)

    return te.compute(tuple(shape), value, name=name, tag=LAYOUT_OUT_TAG, attrs={LAYOUT_ADAPTER: "out", **attrs})


def as_fracz(weights: te.Tensor, view: ConvView, weights_format: str, name: str) -> te.Tensor:
    """The forward weight (``weights_format`` OIX ``(O, I, *K)``, XIO ``(*K, I, O)`` or OXI ``(O, *K, I)``) as the dX
    compute's FracZ_g ``(KD*g_extend*cin1_g*KH*KW, cout1_g, 16, 16)``: entry ``[row, co1, co0,
    ci0]`` holds the weight of extended group ``e``'s column ``co1*16 + co0`` (slot ``j``, output
    channel ``(e*multiple + j)*cout_g + col % cout_g``) and input lane ``c1*16 + ci0`` of that slot,
    0 where column and lane are in different slots or past the channels. Indices are clamped
    into the tensor and the entries off the weights masked to 0 (:func:`masked`): never a read
    outside the tensor."""
    geom = view.geometry()
    ext = geom.group
    kernel_h, kernel_w = geom.kh, geom.kw
    rank = view.rank

    def value(row, co1, co0, ci0):
        block, kh, kw = layout.split_fracz_row(row, kernel_h, kernel_w)
        kd, c1 = (block // geom.c1_x, block % geom.c1_x) if rank == 3 else (0, block)
        e, lane = c1 // ext.cin1_g, (c1 % ext.cin1_g) * C0 + ci0  # lane: input channel inside the extended group
        col = co1 * C0 + co0
        conds = []
        if ext.multiple == 1:
            slot, co, ci = 0, e * ext.cout_g + col, lane
            conds += [col < ext.cout_g] if ext.cout1_g * C0 > ext.cout_g else []
            conds += [lane < ext.cin_g] if ext.cin1_g * C0 > ext.cin_g else []
        else:
            slot = col // ext.cout_g
            co, ci = (e * ext.multiple + slot) * ext.cout_g + col % ext.cout_g, lane % ext.cin_g
            conds += [slot == lane // ext.cin_g, slot < ext.multiple]
            conds += [e * ext.multiple + slot < ext.groups] if ext.g_extend * ext.multiple > ext.groups else []
        co = tirx.min(co, view.cout - 1) if conds else co
        ci = tirx.min(ci, ext.cin_g - 1) if conds else ci
        taps = ((kd, kh, kw), (kh, kw), (kw,))[3 - rank]
        read = weights[weights_index(weights_format, co, ci, taps)]
        return masked(read, tirx.all(*conds)) if conds else read

    shape = (geom.kd * geom.c1_x * kernel_h * kernel_w, ext.cout1_g, C0, C0)
    return te.compute(shape, value, name=name, tag=LAYOUT_IN_TAG, attrs={LAYOUT_ADAPTER: "in"})


def data_stage(result: te.Tensor, view: ConvView, shape: Sequence[int], data_format: str, dtype: str, name: str, attrs: dict,
               post_ops: Sequence[PostOp] = ()) -> te.Tensor:  # fmt: skip
    """A compute's 5HD result ``(N*D, C1, H*W, 16)`` or ``(N*D, C1, H, W, 16)`` (dX; the forward's
    with the output's D, H, W) as an activation of ``shape`` in ``data_format`` (NCX / NXC, spatial rank 1-3, the same
    D, H, W), in ``dtype``, each value through ``post_ops`` (at its own index) before it is rounded
    to ``dtype``. ``attrs`` are the result's."""
    rank = view.rank
    spatial_shape = tuple(shape[2:]) if data_format == "NCX" else tuple(shape[1:-1])
    planes, width = (spatial_shape[0] if rank == 3 else 1), spatial_shape[-1]

    def value(*index):
        n, c, spatial = (index[0], index[1], index[2:]) if data_format == "NCX" else (index[0], index[-1], index[1:-1])
        d, h, w = (0,) * (3 - rank) + tuple(spatial)
        row = n * planes + d if rank == 3 else n
        if len(result.shape) == 5:  # (N*D, C1, H, W, 16)
            sums = result[row, c // C0, h, w, c % C0]
        else:
            sums = result[row, c // C0, h * width + w, c % C0]
        return (apply_post_ops(post_ops, sums, index) if post_ops else sums).astype(dtype)

    return te.compute(tuple(shape), value, name=name, tag=LAYOUT_OUT_TAG, attrs={LAYOUT_ADAPTER: "out", **attrs})
