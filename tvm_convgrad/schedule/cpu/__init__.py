"""The CPU rule (:class:`CpuRule`) and its formulations; :mod:`.tiles` sizes their register tiles."""

from .rule import FORMULATIONS, CpuConfig, CpuRule
from .tiles import depthwise_dw_tile, depthwise_dx_tile, dx_tile

__all__ = ["FORMULATIONS", "CpuConfig", "CpuRule", "depthwise_dw_tile", "depthwise_dx_tile", "dx_tile"]
