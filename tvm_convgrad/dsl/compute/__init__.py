"""The TE computes of the two gradients (TBE's ``tbe.dsl.compute``) and ``cube_util``."""

from . import cube_util
from .backprop_filter import conv2d_backprop_filter_compute
from .backprop_input import conv2d_backprop_input_compute

__all__ = ["ARGUMENT_STAGES", "cube_util", "conv2d_backprop_filter_compute", "conv2d_backprop_input_compute"]

ARGUMENT_STAGES = {
    "conv2d_backprop_filterdw_ddr": (("fmap_l1", "dw_cc"), ("grads_2_matrix", "dw_cc_t")),  # input_x, out_backprop
    "conv2d_backprop_input": (("w_col", "w_t"), ("dy_pad", "dy_rows"), ("c_ddr",)),  # filters, out_backprop, bias
}
"""Result tag -> per input in TBE argument order, the stages (of either formulation) that read it."""
