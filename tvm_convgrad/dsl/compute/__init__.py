"""The TE computes of the two gradients (TBE's ``tbe.dsl.compute``) and ``cube_util``."""

from . import cube_util
from .backprop_filter import conv2d_backprop_filter_compute
from .backprop_input import conv2d_backprop_input_compute

__all__ = ["ARGUMENT_STAGES", "cube_util", "conv2d_backprop_filter_compute", "conv2d_backprop_input_compute"]

ARGUMENT_STAGES = {
    "conv2d_backprop_filterdw_ddr": ("fmap_l1", "grads_2_matrix"),  # input_x, out_backprop
    "conv2d_backprop_input": ("w_col", "dy_pad", "c_ddr"),  # filters, out_backprop, tensor_bias
}
"""Result tag -> the stages that read the inputs, in TBE argument order (each reads one input)."""
