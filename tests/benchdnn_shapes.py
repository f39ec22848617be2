"""oneDNN benchdnn's convolution problems (``tests/data/benchdnn_conv/shapes_*``) as calls of the
framework operators.

:func:`parse_descriptor` reads benchdnn's problem descriptor exactly as benchdnn's own parser does
(``str2desc`` in ``conv_aux.cpp``, ``sanitize_desc`` in its ``common.cpp``, ``desc_t`` in
``conv.hpp``; vendored in ``tests/data/benchdnn_conv/parser/`` for reference):

* entries ``g mb ic id ih iw oc od oh ow kd kh kw sd sh sw pd ph pw dd dh dw``, each a prefix and
  a non-negative integer, tried in that order, ``_`` between entries ignored, ``n`` starting the
  name (the rest of the string);
* defaults: ``mb`` 2, strides 1, groups 1 (``has_groups`` when ``g`` is written);
* a spatial axis is present when any of its sizes, kernel or dilation is written, its stride is
  not 1 or its pad is positive; a missing output size is computed
  ``(i - ((k-1)*(d+1)+1) + 2p)/s + 1`` (a missing pad taken as 0), a missing pad with a written
  output ``((o-1)*s - i + (k-1)*(d+1)+1) / 2`` (C division, truncating toward 0);
* rank: depth present -> 3-D (height and width copied from depth when neither is written),
  else height -> 2-D (width copied from height when not written), else 1-D; the absent axes take
  size 1, kernel 1, stride 1, pad 0, dilation 0;
* **dilation is written as d-1** (``dh0`` is an undilated kernel);
* the right pad ``(o-1)*s - i + (k-1)*(d+1)+1 - p``, which may be negative (the last inputs no
  window reaches).

A benchdnn problem is then a oneDNN Graph call (:meth:`Problem.case`): pads_begin the left pads;
pads_end the right pads where they are non-negative, else 0 (Graph's pads are non-negative; the
same sums, since the window never reaches past the input); dilations d+1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from framework_cases import Case

__all__ = ["SHAPES", "BenchdnnError", "Problem", "parse_descriptor", "problems", "shape_files"]

SHAPES = Path(__file__).parent / "data" / "benchdnn_conv"
"""The vendored shape files (with benchdnn's license and parser)."""

_ENTRIES = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw", "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")


class BenchdnnError(ValueError):
    """A descriptor benchdnn's parser rejects (its message says why)."""


@dataclass(frozen=True)
class Problem:
    """One benchdnn convolution problem. Spatial tuples are in (d, h, w) order, trimmed to the
    problem's rank; ``dilation`` as benchdnn writes it (d-1); ``pads_r`` derived."""

    descriptor: str
    name: str
    g: int
    mb: int
    ic: int
    oc: int
    i: tuple[int, ...]
    o: tuple[int, ...]
    k: tuple[int, ...]
    s: tuple[int, ...]
    p: tuple[int, ...]
    p_r: tuple[int, ...]
    dilation: tuple[int, ...]
    has_groups: bool
    where: str = ""  # file:line

    @property
    def rank(self) -> int:
        return len(self.i)

    def weight_macs(self, mb: int | None = None) -> int:
        """Multiply-adds of the weight gradient (= of the forward convolution) at minibatch ``mb``."""
        return (mb or self.mb) * self.oc * (self.ic // self.g) * math.prod(self.k) * math.prod(self.o)

    def case(self, op: str, mb: int, data_format: str = "NXC", weights_format: str | None = None, dtype: str = "float32") -> Case:
        """The problem as a :class:`framework_cases.Case` of ``op`` (``conv_v2``: ConvolutionBackwardWeights,
        ``data``: ConvolutionBackwardData, ``deconv``: ConvTransposeBackwardWeights of the
        transposed problem: its src the convolution's dst, its diff_dst the convolution's src)."""
        pads_end = tuple(max(0, r) for r in self.p_r)
        dilations = tuple(d + 1 for d in self.dilation)
        if op == "deconv":  # x of a deconv Case is src (the conv's dst), dy is diff_dst (the conv's src)
            return Case("deconv", mb, self.oc, self.ic, self.g, self.o, self.i, self.k, self.s, self.p, pads_end, dilations,
                        data_format=data_format, weights_format=weights_format or "XOI", dtype=dtype, effective_pads=self.p,
                        output_padding=tuple(max(0, -r) for r in self.p_r))  # fmt: skip
        return Case(op, mb, self.ic, self.oc, self.g, self.i, self.o, self.k, self.s, self.p, pads_end, dilations,
                    data_format=data_format, weights_format=weights_format or "XIO", dtype=dtype, effective_pads=self.p)  # fmt: skip


def _c_div(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def parse_descriptor(text: str, where: str = "") -> Problem:
    """A problem from benchdnn's descriptor syntax, as ``str2desc`` reads it; raises
    :class:`BenchdnnError` where benchdnn's parser fails."""
    v = {key: 0 for key in _ENTRIES}
    v.update(g=-1, mb=2, sd=1, sh=1, sw=1, pd=-1, ph=-1, pw=-1)
    name, s = "", text
    while s:
        matched = False
        for key in _ENTRIES:  # one pass tries every entry in order, as CASE_N does
            if s.startswith(key):
                m = re.match(r"[+-]?\d+", s[len(key) :])
                if m is None:
                    raise BenchdnnError(f"no value for `{key}` in `{text}`")
                value = int(m.group())
                if value < 0:
                    raise BenchdnnError(f"`{key}` must be positive in `{text}`")
                v[key], s, matched = value, s[len(key) + m.end() :], True
        if s.startswith("n"):
            name = s[1:].strip('"')
            break
        if s.startswith("_"):
            s = s[1:]
        elif not matched:
            raise BenchdnnError(f"unrecognized pattern in `{text}` from `{s}`")
    has_groups = v["g"] >= 0
    if has_groups and v["g"] <= 0:
        raise BenchdnnError(f"`g` was not specified or set to 0 in `{text}`")
    v["g"] = v["g"] if has_groups else 1
    for key in ("ic", "oc", "sd", "sh", "sw"):
        if v[key] <= 0:
            raise BenchdnnError(f"`{key}` was not specified or set to 0 in `{text}`")
    for a in "dhw":
        present = (v[f"i{a}"] | v[f"k{a}"] | v[f"o{a}"] | v[f"d{a}"]) != 0 or v[f"s{a}"] != 1 or v[f"p{a}"] >= 1
        if not present:
            continue
        for key in (f"i{a}", f"k{a}"):
            if v[key] <= 0:
                raise BenchdnnError(f"`{key}` was not specified or set to 0 in `{text}`")
        i, k, st, d = v[f"i{a}"], v[f"k{a}"], v[f"s{a}"], v[f"d{a}"]
        if not v[f"o{a}"]:
            v[f"p{a}"] = max(v[f"p{a}"], 0)
            v[f"o{a}"] = _c_div(i - ((k - 1) * (d + 1) + 1) + 2 * v[f"p{a}"], st) + 1
            if v[f"o{a}"] <= 0:
                raise BenchdnnError(f"`o{a}` deduced as {v[f'o{a}']} in `{text}`")
        elif v[f"p{a}"] < 0:
            v[f"p{a}"] = _c_div((v[f"o{a}"] - 1) * st - i + ((k - 1) * (d + 1) + 1), 2)
    # sanitize_desc: the rank from which output sizes are set, the missing axes filled
    fields = ("o", "i", "k", "s", "p", "d")
    no_d, no_h, no_w = (v[f"o{a}"] == 0 for a in "dhw")
    ndims = 5 - no_d - (no_d and no_h) - (no_d and no_h and no_w)
    if ndims <= 2:
        raise BenchdnnError(f"the problem must have at least one spatial dimension in `{text}`")
    if ndims == 5:
        if no_h and no_w:
            for f in fields:
                v[f"{f}h"] = v[f"{f}w"] = v[f"{f}d"]
        elif no_h or no_w:
            raise BenchdnnError(f"either all `h` and `w` dimensions or none of them in `{text}`")
    elif ndims == 4 and no_w:
        for f in fields:
            v[f"{f}w"] = v[f"{f}h"]
    axes = "dhw"[5 - ndims :]

    def spatial(f: str) -> tuple[int, ...]:
        return tuple(v[f"{f}{a}"] for a in axes)

    o, i, k, st, p, d = (spatial(f) for f in fields)
    p_r = tuple((oo - 1) * ss - ii + ((kk - 1) * (dd + 1) + 1) - pp for ii, oo, kk, ss, pp, dd in zip(i, o, k, st, p, d))
    return Problem(text, name, v["g"], v["mb"], v["ic"], v["oc"], i, o, k, st, p, p_r, d, has_groups, where)


def shape_files() -> list[Path]:
    """The vendored shape files, sorted by name."""
    return sorted(SHAPES.glob("shapes_*"))


def problems(path: Path) -> list[Problem]:
    """The problems of a shape file in order: benchdnn's batch syntax (``#`` to the end of a line a
    comment, whitespace-separated tokens, ``--`` options), each descriptor parsed."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for token in line.split("#", 1)[0].split():
            if not token.startswith("--"):
                out.append(parse_descriptor(token, f"{path.name}:{number}"))
    return out
