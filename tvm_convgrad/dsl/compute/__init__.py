"""The TE computes of the two gradients (TBE's ``tbe.dsl.compute``) and ``cube_util``."""

from . import cube_util
from .backprop_filter import conv2d_backprop_filter_compute
from .backprop_input import conv2d_backprop_input_compute

__all__ = ["cube_util", "conv2d_backprop_filter_compute", "conv2d_backprop_input_compute"]
