"""Rule helpers: each check raises :class:`ConvGradError` naming parameter, value, allowed range."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConvGradError
from ..layout import C0, align

__all__ = ["Rules", "is_int"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


class Rules:
    """Raises :class:`ConvGradError` for one operator, with that operator's TBE codes."""

    def __init__(self, op: str, codes: Mapping[str, str | None]):
        self.op = op
        self.codes = codes

    def fail(self, param: str, value: Any, allowed: str, code: str | None = None):
        raise ConvGradError(self.op, param, value, allowed, code)

    def tensor(self, param: str, value: Any):
        from tvm import te

        if not isinstance(value, te.Tensor):
            self.fail(param, type(value).__name__, "must be a tvm.te.Tensor (a te.placeholder)")
        return value

    def sequence(self, param: str, value: Any, length: int) -> tuple:
        if not isinstance(value, (list, tuple)):
            self.fail(param, value, f"must be a list or tuple of {length} ints", self.codes["type"])
        if len(value) != length:
            self.fail(param, value, f"must have exactly {length} elements, got {len(value)}", self.codes["length"])
        return tuple(value)

    def ints(self, param: str, value: Any, length: int, lo: int) -> tuple[int, ...]:
        seq = self.sequence(param, value, length)
        for v in seq:
            if not is_int(v):
                self.fail(param, value, f"every element must be an int, got {type(v).__name__}", self.codes["type"])
        if any(v < lo for v in seq):
            bound = "positive" if lo == 1 else f">= {lo}"
            self.fail(param, value, f"every element must be {bound}", self.codes["value"])
        return tuple(int(v) for v in seq)

    def int_value(self, param: str, value: Any, lo: int) -> int:
        if not is_int(value) or value < lo:
            self.fail(param, value, f"must be an int >= {lo}", self.codes["value"])
        return int(value)

    def in_range(self, param: str, value: int, lo: int, hi: int, code: str | None, what: str = ""):
        if not lo <= value <= hi:
            self.fail(param, value, f"{what}must be in [{lo}, {hi}]", code)

    def static_shape(self, param: str, tensor, rank: int, code: str | None) -> tuple[int, ...]:
        from tvm import tirx

        dims = list(tensor.shape)
        if len(dims) != rank:
            self.fail(param, tuple(dims), f"must have rank {rank}, got rank {len(dims)}", code)
        shape = []
        for d in dims:
            if not isinstance(d, tirx.IntImm):
                self.fail(param, tuple(dims), "must be static: dynamic (symbolic) shapes are not supported")
            shape.append(int(d))
        if any(d < 1 for d in shape):
            self.fail(param, tuple(shape), "every dimension must be positive", code)
        return tuple(shape)

    def choice(self, param: str, value: Any, allowed: Sequence[str], code: str | None) -> str:
        if value not in allowed:
            self.fail(param, value, f"must be one of {list(allowed)}", code)
        return value

    def kernel_name(self, param: str, value: Any) -> str:
        if not isinstance(value, str) or not _IDENTIFIER.match(value):
            self.fail(param, value, "must be a C identifier ([A-Za-z_][A-Za-z0-9_]*): it names the compiled function")
        return value

    def keys(self, param: str, value: Any, known: Sequence[str], required: Sequence[str] = ()) -> dict:
        if not isinstance(value, dict):
            self.fail(param, type(value).__name__, "must be a dict")
        unknown = sorted(set(value) - set(known))
        if unknown:
            self.fail(f"{param}[{unknown[0]!r}]", value[unknown[0]], f"is not a key of {param}; known keys: {sorted(known)}")
        for key in required:
            if key not in value:
                self.fail(f"{param}[{key!r}]", None, "is required")
        return value

    def channel_bias(self, param: str, bias: Any, channels: int, what: str, shape_code: str | None, dtype_code: str | None):
        """A bias tensor of ``channels`` (``what``: Cin, Cout) entries, or its 16-aligned length, float16 or float32."""
        self.tensor(param, bias)
        (length,) = self.static_shape(f"{param}.shape", bias, 1, shape_code)
        if length not in (channels, align(channels, C0)):
            self.fail(f"{param}.shape", (length,), f"must be ({what},) = ({channels},) or (align({what},16),) = ({align(channels, C0)},)", shape_code)
        self.choice(f"{param}.dtype", str(bias.dtype), ("float16", "float32"), dtype_code)

    def flag_off(self, param: str, value: Any, what: str):
        if value:
            self.fail(param, value, f"must be False: {what} is not supported")
