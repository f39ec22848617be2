"""The one exception type the package raises for bad user input."""

from __future__ import annotations

from typing import Any

__all__ = ["ConvGradError"]


class ConvGradError(ValueError):
    """A parameter of a convolution-gradient operator is invalid.

    Attributes
    ----------
    param : str
        The offending parameter, spelled as the user passed it (``"strides"``,
        ``"para_dict['padding']"``, ``"out_backprop.shape"``, ...).
    value : Any
        The value that was given.
    allowed : str
        What would have been accepted.
    code : str | None
        TBE's error code for the same rule (``"E60024"``...), where TBE has one.
    op : str
        The operator whose input was checked.
    """

    def __init__(self, op: str, param: str, value: Any, allowed: str, code: str | None = None):
        self.op = op
        self.param = param
        self.value = value
        self.allowed = allowed
        self.code = code
        where = f" [TBE {code}]" if code else ""
        super().__init__(f"{op}: {param} = {value!r}: {allowed}{where}")
