"""Helpers shared by the two gradient computes."""

from __future__ import annotations

from tvm import te, tirx

from .stages import CONVERT_IN_PLACE

ACC = "float32"
"""Accumulation dtype of the cube: fp16 x fp16 products are exact in fp32."""


def in_place(source: te.Tensor, when: bool = True) -> dict | None:
    """The attributes of a stage that only converts ``source``: ``CONVERT_IN_PLACE`` when
    ``when`` holds and ``source`` is an argument (behind a frontend's layout stage the pack stays,
    so that the mad never reads a framework layout)."""
    return {CONVERT_IN_PLACE: 1} if when and isinstance(source.op, te.PlaceholderOp) else None


NEVER = tirx.const(False, "bool")
"""The condition of a padded axis that holds no image data at all (see :func:`inside`)."""


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
