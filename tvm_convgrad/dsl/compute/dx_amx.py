"""dX's AMX tile plan: each stride phase one GEMM over flat pixel rows of 16 (an AMX-BF16 target's).

An AMX tile multiply ``tdpbf16ps C, A, B`` adds ``A (16 rows x k bf16 pairs) . B (k pair rows x 16)``
into a 16 x 16 fp32 tile ``C``, and ``tileloadd`` reads a tile's rows at any constant stride.
dX on the tiles takes ``C`` = 16 output pixels x 16 input channels, ``A`` = those pixels' dy at one
tap (bf16 pairs of Cout, :mod:`.pairs`), ``B`` = that tap's weights (pairs of Cout x 16 Cin):

=============================  ==================================================  ===================================
stage (``uint32`` pairs)       shape                                               value
=============================  ==================================================  ===================================
``dy_amx``                     ``(N, g_extend, L, cout1_g*8)``                     dy padded as the phases read it
                                                                                   (``DyWindow``), its ``Hy x Wy``
                                                                                   positions flat, a group's Cout pairs
                                                                                   innermost; zero past ``Hy*Wy``
``w_amx``                      ``(C1x, KH, KW, cout1_g*8, 16)``                    the weights with the taps turned
                                                                                   (``[.., KH-1-kh, KW-1-kw, ..]``)
``dx_amx_{rh}_{rw}``           ``(N, C1x, Q, 16)`` fp32                             one phase on flat pixels
=============================  ==================================================  ===================================

A phase's output ``(j, i)`` is flat pixel ``q = j*Wy + i``: its tap ``(t_h, t_w)`` (the phase's
taps counted from the last, so that dy's position grows with the tap) reads dy's flat position
``q + origin + t_h*dy_step_h*Wy + t_w*dy_step_w``: for every tap, 16 consecutive ``q`` are 16
rows of ``dy_amx`` at one stride, one ``tileloadd``. The columns ``i >= count`` of a flat row
(``Wy`` minus the phase's width) and the pixels past the last up to a multiple of 16 are computed
and never read (3x3 at pad 1: 3% of a 56x56 map, 23% of a 7x7); no pixel tile is partial, and
``L`` (dy's flat length) holds every position any tile reads. The result (``c_ddr``) reads each
pixel from its phase at ``j*Wy + i``. Every phase keeps all its taps (no live-tap regions: a tile
multiply costs the same with zeros in it).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te

from ... import layout
from ...layout import C0
from ...params import ConvGradParams
from .common import guarded
from .pairs import pair, pair_dot
from .phases import AxisPhase, DyWindow, phase_stage_name
from .stages import AMX_STEPS, DX_AMX, DY_AMX, FORMULATION, MAD_TAG, PHASE_AXES, W_AMX, Formulation

__all__ = ["AMX_TILE_ROWS", "PAIRED_TILES_FROM", "AmxPhase", "amx_phases"]

AMX_TILE_ROWS = 16
"""Pixels of one ``C`` tile (an AMX tile's 16 rows)."""
PAIRED_TILES_FROM = 8
"""A phase of at least this many pixel tiles computes an even number of them (at most one more)."""


@dataclass(frozen=True)
class AmxPhase:
    """Where one phase's flat pixels read ``dy_amx`` and ``w_amx``: pixel ``q``, tap ``(t_h, t_w)``
    reads dy at ``q + origin + t_h*dy_h + t_w*dy_w`` and the weights at turned tap
    ``(turned_h + t_h*tap_h, turned_w + t_w*tap_w)``; ``pixels`` flat pixels (a multiple of 16)."""

    rows: AxisPhase
    cols: AxisPhase
    window: DyWindow
    kh: int
    kw: int

    @property
    def pitch(self) -> int:
        """``Wy``: dy's flat row."""
        return self.window.shape[1]

    @property
    def origin(self) -> int:
        """dy's flat position of pixel 0 at tap ``(0, 0)`` (the phase's last tap)."""
        ph, pw = self.rows, self.cols
        return ph.dy_index(0, ph.taps - 1, self.window.top) * self.pitch + pw.dy_index(0, pw.taps - 1, self.window.left)

    @property
    def dy_h(self) -> int:
        return self.rows.dy_step * self.pitch

    @property
    def dy_w(self) -> int:
        return self.cols.dy_step

    @property
    def turned_h(self) -> int:
        """``KH-1-kh`` of the phase's last row tap."""
        return self.kh - 1 - self.rows.tap(self.rows.taps - 1)

    @property
    def turned_w(self) -> int:
        return self.kw - 1 - self.cols.tap(self.cols.taps - 1)

    @property
    def pixels(self) -> int:
        """Flat pixels computed: up to the last output, rounded up to whole tiles, and to an even
        number of them from :data:`PAIRED_TILES_FROM` on (the schedule takes two at a time)."""
        tiles = -(-((self.rows.count - 1) * self.pitch + self.cols.count) // AMX_TILE_ROWS)
        return (tiles + (tiles % 2 and tiles >= PAIRED_TILES_FROM)) * AMX_TILE_ROWS

    @property
    def reach(self) -> int:
        """One past dy's last flat position a tile of this phase reads."""
        return self.origin + self.pixels + (self.rows.taps - 1) * self.dy_h + (self.cols.taps - 1) * self.dy_w

    def flat(self, j, i):
        """The flat pixel of output ``(j, i)`` of the phase."""
        return j * self.pitch + i


def amx_phases(filters: te.Tensor, dy: te.Tensor, params: ConvGradParams, grid, window: DyWindow):
    """One ``dx_amx`` mad per stride phase of ``grid`` (see the module docstring), from the FracZ(_g)
    ``filters`` and 5HD ``dy`` (bf16). Returns ``[(ph, pw, mad)]`` and the result's read
    ``(mad, n, c1, j, i, c0)``, as :func:`.backprop_input._cube_phases`."""
    g = params.geom
    ext = g.group
    top, left = window.top, window.left
    hy, wy = window.shape
    c1_dy = ext.g_extend * ext.cout1_g
    pairs = ext.cout1_g * C0 // 2
    phases = [AmxPhase(ph, pw, window, g.kh, g.kw) for ph, pw in grid]
    length = max([hy * wy] + [p.reach for p in phases])
    # (every phase's origin is >= 0: the window pads dy as far as any tap reaches)

    def dy_value(n, e, f, co):  # dy's channel co of group e at flat position f, 0 in the padding
        c1, y, x = e * ext.cout1_g + co // C0, f // wy, f % wy
        conds = ([c1 < g.c1_y] if c1_dy > g.c1_y else []) + ([f < hy * wy] if length > hy * wy else []) + window.conds(y, x)
        return guarded(conds, dy[n, c1, y - top, x - left, co % C0].astype(dy.dtype))

    def w_value(c1, turned_h, turned_w, co, ci0):
        return filters[layout.fracz_row(c1, g.kh - 1 - turned_h, g.kw - 1 - turned_w, g.kh, g.kw), co // C0, co % C0, ci0]

    dy_amx = te.compute((g.batch, ext.g_extend, length, pairs), lambda n, e, f, p: pair(dy_value(n, e, f, 2 * p), dy_value(n, e, f, 2 * p + 1)),
                        name=DY_AMX, tag=DY_AMX)  # fmt: skip
    w_amx = te.compute((g.c1_x, g.kh, g.kw, pairs, C0), lambda c1, th, tw, p, ci0: pair(w_value(c1, th, tw, 2 * p, ci0), w_value(c1, th, tw, 2 * p + 1, ci0)),
                       name=W_AMX, tag=W_AMX)  # fmt: skip

    def phase_mad(phase: AmxPhase) -> te.Tensor:
        t_h = te.reduce_axis((0, phase.rows.taps), name="t_h")
        t_w = te.reduce_axis((0, phase.cols.taps), name="t_w")
        p = te.reduce_axis((0, pairs), name="p")

        def mad(n, c1, q, c0):
            dy_at = dy_amx[n, c1 // ext.cin1_g, q + phase.origin + t_h * phase.dy_h + t_w * phase.dy_w, p]
            w_at = w_amx[c1, phase.turned_h + t_h * phase.rows.tap_step, phase.turned_w + t_w * phase.cols.tap_step, p, c0]
            return te.sum(pair_dot(w_at, dy_at), axis=[t_h, t_w, p])

        return te.compute((g.batch, g.c1_x, phase.pixels, C0), mad, name=phase_stage_name(phase.rows, phase.cols, DX_AMX), tag=MAD_TAG,
                          attrs={FORMULATION: Formulation.CUBE_DX_AMX.value, PHASE_AXES: [*g.strides, g.h, g.w],
                                 AMX_STEPS: [phase.dy_h, phase.dy_w, phase.rows.tap_step, phase.cols.tap_step, int(ext.g_extend > 1)]})  # fmt: skip

    found = [(phase.rows, phase.cols, phase_mad(phase)) for phase in phases]
    flat = {mad.op.name: phase for phase, (_, _, mad) in zip(phases, found)}
    return found, lambda mad, n, c1, j, i, c0: mad[n, c1, flat[mad.op.name].flat(j, i), c0]
