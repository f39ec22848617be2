"""The TE computes of the two gradients (TBE's ``tbe.dsl.compute``) and ``cube_util``."""

from . import cube_util
from .backprop_filter import conv2d_backprop_filter_compute
from .backprop_input import conv2d_backprop_input_compute

__all__ = ["ARGUMENT_STAGES", "FORMULATIONS", "cube_util", "conv2d_backprop_filter_compute", "conv2d_backprop_input_compute", "formulation"]

ARGUMENT_STAGES = {
    "conv2d_backprop_filterdw_ddr": (("fmap_l1", "fmap_dw", "dw_cc"), ("grads_2_matrix", "grads_dw", "dw_cc_t", "dw_dw")),
    "conv2d_backprop_input": (("w_col", "w_t", "w_dw"), ("dy_pad", "dy_rows", "dy_dw"), ("c_ddr",)),  # filters, dy, bias
}
"""Result tag -> per input in TBE argument order, the stages (of either formulation) that read it."""

FORMULATIONS = {
    "dw_cc_t": "cout-lanes",  # dW, few input channels: Cout on the lanes
    "dw_cc": "cube",  # dW: 16x16 blocks, Cin on the lanes
    "dx_cc_": "cube",  # dX: one 16x16-block mad per stride phase
    "dx_px_": "pixel-lanes",  # dX, few input channels: output columns on the lanes
    "dw_dw": "depthwise",  # dW, one input channel per group: channels on the lanes
    "dx_dw_": "depthwise",  # dX, one input channel per group: one mad per stride phase
}
"""Mad stage name (prefix) -> the formulation it belongs to (see each compute's docstring)."""


def formulation(stage_names) -> str | None:
    """The formulation of a gradient from the names of its stages (None if it has no known mad)."""
    names = list(stage_names)
    for prefix, kind in FORMULATIONS.items():
        if any(name == prefix or (prefix.endswith("_") and name.startswith(prefix)) for name in names):
            return kind
    return None
