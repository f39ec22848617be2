"""Ascend layouts: 5HD (NC1HWC0), FracZ and FracZ with groups, and the TBE result shapes.

This module is the single home of their index maps. Every other module (the TE computes, the
frontends, the tests) calls these functions rather than re-deriving an index.

Layouts (``C0 = 16``, channels padded with zeros to a multiple of 16):

* 5HD activation ``x5[n, c1, h, w, c0] = x[n, c1*16 + c0, h, w]``, shape ``(N, ceil(C,16), H, W, 16)``.
* FracZ weight ``fz[c1*KH*KW + kh*KW + kw, co1, co0, ci0] = w[co1*16 + co0, c1*16 + ci0, kh, kw]``,
  shape ``(ceil(Cin,16)*KH*KW, ceil(Cout,16), 16, 16)``: inside a 16x16 block the row is Cout and
  the column Cin.
* FracZ_g (groups > 1): groups are packed ``multiple`` at a time into ``g_extend`` extended groups
  (see :func:`group_extension`); original group ``G`` goes to extended group ``e = G // multiple``,
  slot ``j = G % multiple``, and its channels to ``j*Cin_g + ci`` / ``j*Cout_g + co`` inside it.
  Shape ``(g_extend*cin1_g*KH*KW, cout1_g, 16, 16)``; entries between different slots are zero.
* dW result of ``conv2d_backprop_filter``: ``(g_extend, cin1_g*KH*KW, 16*cout1_g, 16)``, the same
  memory order as FracZ_g. A 3-D convolution's (FracZ_3D with groups) has ``KD*cin1_g*KH*KW`` rows,
  depth tap outermost: row ``((kd*cin1_g + c1)*KH + kh)*KW + kw``.
* dX result of ``conv2d_backprop_input``: ``(N, ceil(Cin,16), H*W, 16)``, the memory of 5HD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = [
    "C0",
    "ceil_div",
    "largest_divisor",
    "align",
    "GroupExtension",
    "group_extension",
    "fracz_row",
    "split_fracz_row",
    "fracz_g_slot",
    "dw_result_index",
    "shape_5hd",
    "shape_fracz",
    "shape_dw_result",
    "shape_dx_result",
    "nchw_to_5hd",
    "from_5hd",
    "oihw_to_fracz",
    "fracz_to_oihw",
    "dw_result_to_oihw",
    "dx_result_to_nchw",
]

C0 = 16
"""Channels per block: the fp16 cube's K0 = N0."""


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b`` > 0 (TBE's ``ceil``; a negative ``a`` too: floor division)."""
    return (a + b - 1) // b


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (1 at least)."""
    return max(d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0)


def align(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return ceil_div(a, b) * b


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


@dataclass(frozen=True)
class GroupExtension:
    """How the groups of a grouped convolution are packed into 16-channel blocks.

    The two TBE parameter families name the same numbers differently:

    ==============  =====================  ======================================
    field           dW family (``para``)   dX family (``group_dict``)
    ==============  =====================  ======================================
    ``groups``      groups                 groups
    ``cin_g``       Cin_g = cin_ori/groups dx_c_ori (= filter_c_ori)
    ``cout_g``      Cout/groups            dy_c_ori (= filter_batch_ori)
    ``multiple``    mag_factor             multiple_extend
    ``g_extend``    real_g                 g_extend
    ``cin1_g``      cin1_g                 dx_c1_extend
    ``cout1_g``     cout_g / 16            dy_c1_extend
    ==============  =====================  ======================================
    """

    groups: int
    cin_g: int
    cout_g: int
    multiple: int
    g_extend: int
    cin1_g: int
    cout1_g: int

    @property
    def cout_g_padded(self) -> int:
        """Output channels per extended group, a multiple of 16 (TBE's dW ``cout_g``)."""
        return self.cout1_g * C0


def group_extension(cin_g: int, cout_g: int, groups: int) -> GroupExtension:
    """The extension numbers of TBE (``_compute_group_dict`` / ``calculate_group``).

    ``cin_g`` and ``cout_g`` are the per-group channel counts of the forward convolution.
    """
    mag_in = _lcm(cin_g, C0) // cin_g
    mag_out = _lcm(cout_g, C0) // cout_g
    multiple = min(_lcm(mag_in, mag_out), groups)
    return GroupExtension(
        groups=groups,
        cin_g=cin_g,
        cout_g=cout_g,
        multiple=multiple,
        g_extend=ceil_div(groups, multiple),
        cin1_g=ceil_div(multiple * cin_g, C0),
        cout1_g=ceil_div(multiple * cout_g, C0),
    )


# ---------------------------------------------------------------------------------------------
# FracZ row index: written once, works on Python ints and on TE/TIR expressions alike.
# ---------------------------------------------------------------------------------------------


def fracz_row(c1, kh, kw, kernel_h: int, kernel_w: int):
    """Row of FracZ / the dW result for channel block ``c1`` and tap ``(kh, kw)``: C1-major."""
    return (c1 * kernel_h + kh) * kernel_w + kw


def split_fracz_row(row, kernel_h: int, kernel_w: int):
    """Inverse of :func:`fracz_row`: ``(c1, kh, kw)``."""
    return row // (kernel_h * kernel_w), row // kernel_w % kernel_h, row % kernel_w


def fracz_g_slot(co, ci, ext: GroupExtension):
    """Where weight ``(co, ci)`` (output channel, input channel inside its group) lives in an
    extended group: ``(e, c1, col, ci0)`` = extended group, C1 block of its rows, column (Cout
    inside the extended group), lane. Works on ints, numpy arrays and TE expressions."""
    g = co // ext.cout_g
    e, j = g // ext.multiple, g % ext.multiple
    dst_cin = j * ext.cin_g + ci
    return e, dst_cin // C0, j * ext.cout_g + co % ext.cout_g, dst_cin % C0


def dw_result_index(co, ci, kd, kh, kw, ext: GroupExtension, kernel: Sequence[int]):
    """Index in the dW result ``(g_extend, KD*cin1_g*KH*KW, cout_g, 16)`` of the OI(D)HW weight
    ``(co, ci, kd, kh, kw)``; ``kernel = (KD, KH, KW)`` (``KD = 1``, ``kd = 0`` in 2-D)."""
    _, kernel_h, kernel_w = kernel
    e, c1, col, ci0 = fracz_g_slot(co, ci, ext)
    return e, fracz_row(kd * ext.cin1_g + c1, kh, kw, kernel_h, kernel_w), col, ci0


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------


def shape_5hd(n: int, c: int, h: int, w: int) -> tuple[int, int, int, int, int]:
    """5HD shape of an NCHW tensor."""
    return (n, ceil_div(c, C0), h, w, C0)


def shape_fracz(filter_sizes: Sequence[int], groups: int = 1) -> tuple[int, int, int, int]:
    """FracZ(_g) shape of a forward weight ``filter_sizes = (Cout, Cin_g, KH, KW)``."""
    cout, cin_g, kh, kw = filter_sizes
    ext = group_extension(cin_g, cout // groups, groups)
    return (ext.g_extend * ext.cin1_g * kh * kw, ext.cout1_g, C0, C0)


def shape_dw_result(filter_sizes: Sequence[int], groups: int = 1, kernel_d: int = 1) -> tuple[int, int, int, int]:
    """Shape of ``conv2d_backprop_filter``'s result: ``(real_g, cin1_g*KH*KW, cout_g, 16)``
    (``KD*cin1_g*KH*KW`` rows for a 3-D convolution of kernel depth ``kernel_d``)."""
    cout, cin_g, kh, kw = filter_sizes
    ext = group_extension(cin_g, cout // groups, groups)
    return (ext.g_extend, kernel_d * ext.cin1_g * kh * kw, ext.cout_g_padded, C0)


def shape_dx_result(input_sizes: Sequence[int]) -> tuple[int, int, int, int]:
    """Shape of ``conv2d_backprop_input``'s result: ``(N, ceil(Cin,16), H*W, 16)``."""
    n, c, h, w = input_sizes
    return (n, ceil_div(c, C0), h * w, C0)


# ---------------------------------------------------------------------------------------------
# numpy pack / unpack
# ---------------------------------------------------------------------------------------------


def nchw_to_5hd(x: np.ndarray) -> np.ndarray:
    """NCHW -> 5HD ``(N, C1, H, W, 16)``, channels past C zero."""
    n, c, h, w = x.shape
    out = np.zeros((n, ceil_div(c, C0) * C0, h, w), dtype=x.dtype)
    out[:, :c] = x
    return np.ascontiguousarray(out.reshape(n, -1, C0, h, w).transpose(0, 1, 3, 4, 2))


def from_5hd(x5: np.ndarray, channels: int) -> np.ndarray:
    """5HD ``(N, C1, H, W, 16)`` -> NCHW with the first ``channels`` channels."""
    n, c1, h, w, c0 = x5.shape
    return np.ascontiguousarray(x5.transpose(0, 1, 4, 2, 3).reshape(n, c1 * c0, h, w)[:, :channels])


def _fracz_positions(cout: int, cin_g: int, groups: int):
    """Where each weight ``(co, ci)`` lives in FracZ_g.

    Returns ``(ext, block, col1, co0, ci0)``; the last four are ``(Cout, Cin_g)`` int arrays:
    ``block = e*cin1_g + dst_cin//16`` (the C1 part of the row), ``col1 = dst_cout//16``,
    ``co0 = dst_cout%16``, ``ci0 = dst_cin%16``.
    """
    ext = group_extension(cin_g, cout // groups, groups)
    e, c1, col, ci0 = fracz_g_slot(np.arange(cout)[:, None], np.arange(cin_g)[None, :], ext)
    block = e * ext.cin1_g + c1
    return ext, block, np.broadcast_to(col // C0, block.shape), np.broadcast_to(col % C0, block.shape), ci0


def oihw_to_fracz(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """Forward weight OIHW ``(Cout, Cin_g, KH, KW)`` -> FracZ_g, zeros between groups' slots."""
    cout, cin_g, kh, kw = w.shape
    ext, block, col1, co0, ci0 = _fracz_positions(cout, cin_g, groups)
    fz = np.zeros((ext.g_extend * ext.cin1_g, kh, kw, ext.cout1_g, C0, C0), dtype=w.dtype)
    fz[block, :, :, col1, co0, ci0] = w
    return fz.reshape(-1, ext.cout1_g, C0, C0)


def fracz_to_oihw(fz: np.ndarray, filter_sizes: Sequence[int], groups: int = 1) -> np.ndarray:
    """FracZ_g -> OIHW ``(Cout, Cin_g, KH, KW)`` (reads the block diagonal only)."""
    cout, cin_g, kh, kw = filter_sizes
    ext, block, col1, co0, ci0 = _fracz_positions(cout, cin_g, groups)
    fz6 = fz.reshape(ext.g_extend * ext.cin1_g, kh, kw, ext.cout1_g, C0, C0)
    return np.ascontiguousarray(fz6[block, :, :, col1, co0, ci0])


def dw_result_to_oihw(dw: np.ndarray, filter_sizes: Sequence[int], groups: int = 1) -> np.ndarray:
    """``conv2d_backprop_filter``'s result -> OIHW dW (its memory order is FracZ_g)."""
    return fracz_to_oihw(dw.reshape(shape_fracz(filter_sizes, groups)), filter_sizes, groups)


def dx_result_to_nchw(dx: np.ndarray, input_sizes: Sequence[int]) -> np.ndarray:
    """``conv2d_backprop_input``'s result ``(N, C1, H*W, 16)`` -> NCHW ``input_sizes``."""
    n, c, h, w = input_sizes
    return from_5hd(dx.reshape(n, -1, h, w, C0), c)
