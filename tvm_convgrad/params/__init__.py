"""Validated, normalised attributes of the two convolution gradients.

Every accepted input form ends up here as one frozen :class:`ConvGradParams`, and every
validation rule of the package lives in this package: each raises :class:`ConvGradError` naming
the parameter, the value, what is allowed and TBE's error code. Nothing downstream (compute,
schedules, TVM) ever sees an invalid parameter set.

* :mod:`.tbe_dsl`: the DSL functions' rules (``para_dict``; spec §2.3, §3.3).
* :mod:`.tbe_op`: the TBE operators' rules (ori shapes/formats, SAME/VALID pads).
"""

from .geometry import FILTER_OP, FORWARD_OP, INPUT_OP, ConvGeometry, ConvGradParams, DepthAxis, out_size
from .tbe_dsl import (
    FILTER_ORI_FORMATS,
    GROUP_DICT_KEYS,
    check_group_dict,
    filter_grad_params,
    group_dict_of,
    input_grad_params,
)
from .tbe_op import OpArgs, filter_op_args, input_op_args

__all__ = [
    "FILTER_OP",
    "FORWARD_OP",
    "INPUT_OP",
    "FILTER_ORI_FORMATS",
    "GROUP_DICT_KEYS",
    "ConvGeometry",
    "ConvGradParams",
    "DepthAxis",
    "OpArgs",
    "check_group_dict",
    "filter_grad_params",
    "filter_op_args",
    "group_dict_of",
    "input_grad_params",
    "input_op_args",
    "out_size",
]
