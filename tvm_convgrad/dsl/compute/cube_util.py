"""TBE's ``cube_util`` helpers for grouped convolutions (``tbe.dsl.compute.cube_util``).

``calculate_group`` builds the ``group_dict`` that ``conv2d_backprop_input`` takes in its
``para_dict``, with the formulas of the TBE documentation::

    from tvm_convgrad.dsl.compute import cube_util
    group_dict = cube_util.calculate_group(w_shape_nchw=(Cout, Cin_g, KH, KW), groups=g)
"""

from __future__ import annotations

from typing import Any, Sequence

from ...errors import ConvGradError
from ...layout import C0, group_extension
from ...params import FILTER_ORI_FORMATS, group_dict_of

__all__ = ["GroupDictKeys", "calculate_group", "calculate_group_dw"]


class GroupDictKeys:
    """The key names of a dX ``group_dict`` (TBE ``cube_util.GroupDictKeys``)."""

    groups = "groups"
    g_extend = "g_extend"
    multiple_extend = "multiple_extend"
    dx_c1_extend = "dx_c1_extend"
    dy_c1_extend = "dy_c1_extend"
    dx_c_ori = "dx_c_ori"
    dy_c_ori = "dy_c_ori"
    filter_batch_ori = "filter_batch_ori"
    filter_c_ori = "filter_c_ori"
    filter_ori_format = "filter_ori_format"


def _check(op: str, w_shape_nchw: Sequence[int], groups: int, c0_size: int, c0_size_k: int):
    if not isinstance(w_shape_nchw, (list, tuple)) or len(w_shape_nchw) != 4 or not all(
        isinstance(d, int) and d > 0 for d in w_shape_nchw
    ):
        raise ConvGradError(op, "w_shape_nchw", w_shape_nchw, "must be 4 positive ints (Cout, Cin_g, KH, KW)")
    if not isinstance(groups, int) or groups < 1 or w_shape_nchw[0] % groups:
        raise ConvGradError(op, "groups", groups, f"must be a positive int dividing Cout = {w_shape_nchw[0]}", "E60108")
    for name, value in (("c0_size", c0_size), ("c0_size_k", c0_size_k)):
        if value != C0:
            raise ConvGradError(op, name, value, f"must be {C0} (float16 cube blocks)")


def calculate_group(
    w_shape_nchw: Sequence[int],
    groups: int,
    c0_size: int = C0,
    c0_size_k: int = C0,
    filter_ori_format: str = "NCHW",
) -> dict[str, Any]:
    """dX ``group_dict`` for a forward weight of NCHW shape ``(Cout, Cin_g, KH, KW)``.

    ``dx_c_ori = Cin_g``, ``dy_c_ori = Cout/groups``, ``multiple_extend = min(lcm(lcm(Cin_g,16)/Cin_g,
    lcm(dy_c_ori,16)/dy_c_ori), groups)``, ``g_extend = ceil(groups/multiple_extend)``,
    ``dx_c1_extend = ceil(multiple_extend*Cin_g/16)``, ``dy_c1_extend = ceil(multiple_extend*dy_c_ori/16)``.
    """
    _check("cube_util.calculate_group", w_shape_nchw, groups, c0_size, c0_size_k)
    if filter_ori_format not in FILTER_ORI_FORMATS:
        raise ConvGradError("cube_util.calculate_group", "filter_ori_format", filter_ori_format, f"must be one of {list(FILTER_ORI_FORMATS)}")
    cout, cin_g = w_shape_nchw[:2]
    return group_dict_of(group_extension(cin_g, cout // groups, groups), filter_ori_format)


def calculate_group_dw(w_shape_nchw: Sequence[int], groups: int) -> dict[str, int]:
    """The dW family's group numbers (TBE ``_compute_group_dict``): ``real_g``, ``mag_factor``,
    ``cin1_g``, ``cout_g`` (channels, a multiple of 16), ``cin_ori``, ``cout_ori``."""
    _check("cube_util.calculate_group_dw", w_shape_nchw, groups, C0, C0)
    cout, cin_g = w_shape_nchw[:2]
    ext = group_extension(cin_g, cout // groups, groups)
    return {
        "real_g": ext.g_extend,
        "mag_factor": ext.multiple,
        "cin1_g": ext.cin1_g,
        "cout_g": ext.cout_g_padded,
        "cin_ori": cin_g * groups,
        "cout_ori": cout,
    }
