"""The TE computes of the two gradients and the forward convolution (TBE's ``tbe.dsl.compute``), their stages (:mod:`.stages`)
and ``cube_util``."""

from . import cube_util, stages
from .backprop_filter import conv2d_backprop_filter_compute
from .backprop_input import conv2d_backprop_input_compute
from .conv import conv_compute
from .stages import ARGUMENT_STAGES, Formulation, formulation

__all__ = ["ARGUMENT_STAGES", "Formulation", "conv2d_backprop_filter_compute", "conv2d_backprop_input_compute", "conv_compute", "cube_util", "formulation", "stages"]
