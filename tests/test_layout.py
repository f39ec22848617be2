"""5HD / FracZ / FracZ_g packing against loops written from the spec's index maps (§1.2-§1.4)."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_convgrad import layout
from tvm_convgrad.dsl.compute import cube_util

RNG = np.random.default_rng(7)


def test_5hd_round_trip_and_zero_pad_channels():
    x = RNG.standard_normal((2, 21, 3, 5))
    x5 = layout.nchw_to_5hd(x)
    assert x5.shape == layout.shape_5hd(2, 21, 3, 5) == (2, 2, 3, 5, 16)
    for n, c, h, w in np.ndindex(x.shape):
        assert x5[n, c // 16, h, w, c % 16] == x[n, c, h, w]
    assert not x5[:, 1, :, :, 5:].any()
    np.testing.assert_array_equal(layout.from_5hd(x5, 21), x)


def _fracz_by_loops(w: np.ndarray, groups: int) -> np.ndarray:
    """FracZ_g from the GOLD index map of spec §1.4, one element at a time."""
    cout, cin_g, kh_n, kw_n = w.shape
    cout_g = cout // groups
    mag0 = np.lcm(cin_g, 16) // cin_g
    mag1 = np.lcm(cout_g, 16) // cout_g
    mag = min(np.lcm(mag0, mag1), groups)
    real_g = -(-groups // mag)
    cin1_g = -(-mag * cin_g // 16)
    cout_pad = -(-mag * cout_g // 16) * 16
    fz = np.zeros((real_g * cin1_g * kh_n * kw_n, cout_pad // 16, 16, 16))
    for g in range(groups):
        e, j = divmod(g, mag)
        for co in range(cout_g):
            for ci in range(cin_g):
                dst_cin, dst_cout = j * cin_g + ci, j * cout_g + co
                for kh in range(kh_n):
                    for kw in range(kw_n):
                        row = e * cin1_g * kh_n * kw_n + (dst_cin // 16) * kh_n * kw_n + kh * kw_n + kw
                        fz[row, dst_cout // 16, dst_cout % 16, dst_cin % 16] = w[g * cout_g + co, ci, kh, kw]
    return fz


GROUPED = [  # (Cout, Cin_g, KH, KW, groups): plain, mag capped by groups, mag 2 of 3 groups, mag 4, depthwise, 19
    (40, 21, 2, 3, 1), (12, 4, 3, 1, 3), (48, 24, 1, 2, 3), (128, 4, 1, 1, 16), (24, 1, 3, 3, 24), (38, 2, 2, 2, 19),
]  # fmt: skip


@pytest.mark.parametrize("cout, cin_g, kh, kw, groups", GROUPED)
def test_fracz_matches_the_spec_index_map(cout, cin_g, kh, kw, groups):
    w = RNG.standard_normal((cout, cin_g, kh, kw))
    fz = layout.oihw_to_fracz(w, groups)
    np.testing.assert_array_equal(fz, _fracz_by_loops(w, groups))
    assert fz.shape == layout.shape_fracz((cout, cin_g, kh, kw), groups)
    np.testing.assert_array_equal(layout.fracz_to_oihw(fz, (cout, cin_g, kh, kw), groups), w)
    dw = fz.reshape(layout.shape_dw_result((cout, cin_g, kh, kw), groups))  # same memory order
    np.testing.assert_array_equal(layout.dw_result_to_oihw(dw, (cout, cin_g, kh, kw), groups), w)


@pytest.mark.parametrize(
    "cin_g, cout_g, groups, expected",  # (g_extend, multiple, cin1_g, cout1_g)
    [(4, 8, 16, (4, 4, 1, 2)), (160, 40, 3, (2, 2, 20, 5)), (2, 1, 19, (2, 16, 2, 1)), (1, 1, 56, (4, 16, 1, 1)), (24, 24, 3, (2, 2, 3, 3)), (4, 4, 3, (1, 3, 1, 1))],
)  # fmt: skip
def test_group_extension(cin_g, cout_g, groups, expected):
    """Numbers from tbe_cases.md (lines 402, 112, 979, 995) and spec §6.4 / §7."""
    ext = layout.group_extension(cin_g, cout_g, groups)
    assert (ext.g_extend, ext.multiple, ext.cin1_g, ext.cout1_g) == expected
    gd = cube_util.calculate_group([cout_g * groups, cin_g, 1, 1], groups)
    assert (gd["g_extend"], gd["multiple_extend"], gd["dx_c1_extend"], gd["dy_c1_extend"]) == expected
    dw = cube_util.calculate_group_dw([cout_g * groups, cin_g, 1, 1], groups)
    assert (dw["real_g"], dw["mag_factor"], dw["cin1_g"], dw["cout_g"]) == (*expected[:3], 16 * expected[3])


def test_seed_group_dict_formula():
    """The group_dict of the seed example (groups = 1) is what calculate_group computes."""
    assert cube_util.calculate_group((16, 16, 1, 1), 1) == {
        "groups": 1, "g_extend": 1, "multiple_extend": 1, "dx_c1_extend": 1, "dy_c1_extend": 1,
        "dx_c_ori": 16, "dy_c_ori": 16, "filter_batch_ori": 16, "filter_c_ori": 16, "filter_ori_format": "NCHW",
    }  # fmt: skip
    assert cube_util.GroupDictKeys.dx_c1_extend == "dx_c1_extend"


def test_fracz_row_round_trip():
    for c1, kh, kw in np.ndindex(3, 4, 5):
        row = layout.fracz_row(c1, kh, kw, 4, 5)
        assert row == (c1 * 4 + kh) * 5 + kw
        assert layout.split_fracz_row(row, 4, 5) == (c1, kh, kw)


def test_dx_result_is_5hd_memory():
    dx = RNG.standard_normal((2, 20, 3, 4))
    packed = layout.nchw_to_5hd(dx).reshape(layout.shape_dx_result((2, 20, 3, 4)))
    assert packed.shape == (2, 2, 12, 16)
    np.testing.assert_array_equal(layout.dx_result_to_nchw(packed, (2, 20, 3, 4)), dx)
