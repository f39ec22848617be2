"""Every validation rule raises ConvGradError naming the parameter (and TBE's code, where TBE has one).

Each case changes one thing in a valid call; the test checks the error's ``param`` and ``code``
and that the message carries the offending value.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import te

from tvm_convgrad import ConvGradError, build, dsl
from tvm_convgrad.dsl.compute import cube_util
from tvm_convgrad.frontends.tbe_ops import conv2d_backprop_filter_d, conv2d_backprop_input_d
from tvm_convgrad.tvm import placeholder

# --------------------------------------------------------------------------------------------
# conv2d_backprop_filter: x (2, 32, 9, 9), dy (2, 32, 4, 4), 3x3 stride 2.
# --------------------------------------------------------------------------------------------


def dw(x=(2, 2, 9, 9, 16), dy=(2, 2, 4, 4, 16), filter_sizes=(32, 32, 3, 3), x_dtype="float16", dy_dtype="float16", para=None, **overrides):
    para_dict = {"strides": [2, 2], **overrides} if para is None else para
    fmap = placeholder(x, name="fmap", dtype=x_dtype) if isinstance(x, tuple) else x
    grads = placeholder(dy, name="dy", dtype=dy_dtype) if isinstance(dy, tuple) else dy
    return dsl.conv2d_backprop_filter(fmap, grads, filter_sizes, para_dict)


DW_RULES = [
    ("input_x", None, lambda: dw(x=np.zeros((2, 2, 9, 9, 16), "float16"))),
    ("out_backprop", None, lambda: dw(dy=[2, 2, 4, 4, 16])),
    ("para_dict", None, lambda: dw(para=[("strides", [2, 2])])),
    ("para_dict['stride']", None, lambda: dw(stride=[2, 2])),
    ("para_dict['is_binary_flag']", None, lambda: dw(is_binary_flag=True)),
    ("para_dict['correct_range_flag']", None, lambda: dw(correct_range_flag=True)),
    ("out_backprop.dtype", "E60038", lambda: dw(dy_dtype="float32")),
    ("input_x.dtype", "E60005", lambda: dw(x_dtype="float32", dy_dtype="float32")),
    ("para_dict['res_dtype']", "E60005", lambda: dw(res_dtype="int32")),
    ("para_dict['kernel_name']", None, lambda: dw(kernel_name="1st-kernel")),
    ("para_dict['kernel_name']", None, lambda: dw(kernel_name=7)),
    ("filter_sizes", "E64003", lambda: dw(filter_sizes=(32, 32, 3))),
    ("filter_sizes", "E64004", lambda: dw(filter_sizes=(32, 32, 3.0, 3))),
    ("filter_sizes", "E64004", lambda: dw(filter_sizes=(0, 32, 3, 3))),
    ("filter_sizes", "E64004", lambda: dw(filter_sizes=32)),
    ("para_dict['strides']", "E64003", lambda: dw(strides=[2])),
    ("para_dict['strides']", "E64004", lambda: dw(strides=[0, 2])),
    ("para_dict['padding']", "E64004", lambda: dw(padding=[0, 0, -1, 0])),
    ("para_dict['dilations']", "E64003", lambda: dw(dilations=[1, 1, 1])),
    ("para_dict['groups']", "E64004", lambda: dw(groups=0)),
    ("para_dict['groups']", "E64004", lambda: dw(groups=True)),
    ("input_x.shape", "E64003", lambda: dw(x=(2, 2, 9, 9))),
    ("out_backprop.shape", "E64003", lambda: dw(dy=(2, 2, 4, 4, 16, 1))),
    ("input_x.shape", None, lambda: dw(x=(te.var("n"), 2, 9, 9, 16))),
    ("out_backprop.shape[4]", "E64002", lambda: dw(dy=(2, 4, 4, 4, 8))),
    ("input_x.shape[4]", "E64002", lambda: dw(x=(2, 1, 9, 9, 32))),
    ("out_backprop.shape[1]", "E64002", lambda: dw(dy=(2, 3, 4, 4, 16))),
    ("input_x.shape[1]", "E64002", lambda: dw(x=(2, 1, 9, 9, 16))),
    ("out_backprop.shape[0]", "E64002", lambda: dw(dy=(3, 2, 4, 4, 16))),
    ("para_dict['dilations']", "E60023", lambda: dw(dilations=[2, 1, 1, 1])),
    ("para_dict['dilations'][2]", "E64001", lambda: dw(dilations=[1, 1, 256, 1])),
    ("para_dict['groups']", "E60108", lambda: dw(filter_sizes=(32, 10, 3, 3), groups=3)),
    ("filter_sizes[2]", "E60014", lambda: dw(filter_sizes=(32, 32, 11, 3))),
    ("filter_sizes[3]", "E60015", lambda: dw(filter_sizes=(32, 32, 3, 11))),
    ("out_backprop.shape[2]", "E60024", lambda: dw(dy=(2, 2, 5, 4, 16))),
    ("out_backprop.shape[3]", "E60025", lambda: dw(dy=(2, 2, 4, 3, 16))),
    # KH > 255, stride > 63, pad > 255 need dilation 1 (TBE's DMA mode).
    ("filter_sizes[2]", "E64001", lambda: dw(x=(1, 1, 520, 1, 16), dy=(1, 1, 10, 1, 16), filter_sizes=(16, 16, 256, 1), strides=[1, 1], dilations=[1, 1, 2, 1])),
    ("para_dict['strides'][0]", "E64001", lambda: dw(x=(1, 1, 9, 9, 16), dy=(1, 1, 1, 7, 16), filter_sizes=(16, 16, 3, 3), strides=[64, 1], dilations=[1, 1, 2, 1])),
    ("para_dict['padding'][0]", "E64001", lambda: dw(x=(1, 1, 9, 9, 16), dy=(1, 1, 261, 7, 16), filter_sizes=(16, 16, 3, 3), strides=[1, 1], padding=[256, 0, 0, 0], dilations=[1, 1, 2, 1])),
    ("input_x.shape[2]", "E64001", lambda: dw(x=(1, 1, 200_001, 1, 16), dy=(1, 1, 200_001, 1, 16), filter_sizes=(16, 16, 1, 1), strides=[1, 1])),
    ("out_backprop.shape", "E60020", lambda: dw(x=(2**59, 1, 1, 1, 16), dy=(2**59, 1, 1, 1, 16), filter_sizes=(16, 16, 1, 1), strides=[1, 1])),
]  # fmt: skip

# --------------------------------------------------------------------------------------------
# conv2d_backprop_input: FracZ (18, 2, 16, 16), dy (2, 32, 4, 4) -> dX (2, 32, 9, 9), 3x3 stride 2.
# --------------------------------------------------------------------------------------------


def dx(filters=(18, 2, 16, 16), dy=(2, 2, 4, 4, 16), filter_sizes=(32, 32, 3, 3), input_sizes=(2, 32, 9, 9), w_dtype="float16", dy_dtype="float16", para=None, drop=(), **overrides):
    para_dict = {"strides": [2, 2], "padding": [0, 0, 0, 0], "dilations": [1, 1, 1, 1], **overrides} if para is None else para
    for key in drop:
        del para_dict[key]
    weight = placeholder(filters, name="filters", dtype=w_dtype) if isinstance(filters, tuple) else filters
    grads = placeholder(dy, name="dy", dtype=dy_dtype) if isinstance(dy, tuple) else dy
    return dsl.conv2d_backprop_input(weight, grads, filter_sizes, input_sizes, para_dict)


GROUP_DICT = cube_util.calculate_group([32, 32, 3, 3], 1)

DX_RULES = [
    ("filters", None, lambda: dx(filters="filters")),
    ("out_backprop", None, lambda: dx(dy=None)),
    ("para_dict", None, lambda: dx(para="strides=2")),
    ("para_dict['groups']", None, lambda: dx(groups=1)),
    ("para_dict['strides']", None, lambda: dx(drop=("strides",))),
    ("para_dict['dilations']", None, lambda: dx(drop=("dilations",))),
    ("para_dict['binary_mode']", None, lambda: dx(binary_mode=True)),
    ("para_dict['correct_range_flag']", None, lambda: dx(correct_range_flag=True)),
    ("para_dict['pooling_mode']", None, lambda: dx(pooling_mode="AVG")),
    ("filters.dtype", "E60011", lambda: dx(w_dtype="float32", dy_dtype="float32")),
    ("out_backprop.dtype", "E60011", lambda: dx(dy_dtype="float32")),
    ("out_backprop.dtype", "E65002", lambda: dx(w_dtype="int8")),
    ("filters.dtype", None, lambda: dx(w_dtype="int8", dy_dtype="int8")),
    ("para_dict['res_dtype']", "E60011", lambda: dx(res_dtype="int32")),
    ("para_dict['kernel_name']", None, lambda: dx(kernel_name="dx kernel")),
    ("filters.shape", "E65003", lambda: dx(filters=(18, 2, 16, 16, 1))),
    ("out_backprop.shape", "E65003", lambda: dx(dy=(2, 2, 4, 4))),
    ("filter_sizes", "E60006", lambda: dx(filter_sizes=(32, 32, 3))),
    ("filter_sizes", "E65001", lambda: dx(filter_sizes=(32, 32, "3", 3))),
    ("filter_sizes", "E60114", lambda: dx(filter_sizes=(32, 32, 0, 3))),
    ("input_sizes", "E60006", lambda: dx(input_sizes=(2, 32, 9))),
    ("para_dict['strides']", "E60006", lambda: dx(strides=[2])),
    ("para_dict['strides']", "E60114", lambda: dx(strides=[0, 2])),
    ("para_dict['padding']", "E60114", lambda: dx(padding=[-1, 0, 0, 0])),
    ("para_dict['dilations']", "E60006", lambda: dx(dilations=[1, 1, 1])),
    ("para_dict['offset_w']", "E65004", lambda: dx(offset_w=0)),
    ("para_dict['offset_x']", "E65001", lambda: dx(offset_x=1.5)),
    ("para_dict['offset_x']", None, lambda: dx(offset_x=3)),
    ("para_dict['group_dict']", None, lambda: dx(group_dict=[1])),
    ("para_dict['group_dict']['g_extend']", None, lambda: dx(group_dict={k: v for k, v in GROUP_DICT.items() if k != "g_extend"})),
    ("para_dict['group_dict']['mag']", None, lambda: dx(group_dict={**GROUP_DICT, "mag": 1})),
    ("para_dict['group_dict']['groups']", "E60114", lambda: dx(group_dict={**GROUP_DICT, "groups": 0})),
    ("para_dict['group_dict']['dx_c1_extend']", "E65007", lambda: dx(group_dict={**GROUP_DICT, "dx_c1_extend": 3})),
    ("para_dict['group_dict']['filter_ori_format']", "E65007", lambda: dx(group_dict={**GROUP_DICT, "filter_ori_format": "ND"})),
    ("input_sizes[1]", "E60108", lambda: dx(input_sizes=(2, 40, 9, 9))),
    ("input_sizes[1]", "E65007", lambda: dx(group_dict={**GROUP_DICT, "groups": 2})),
    ("filter_sizes[0]", "E60108", lambda: dx(filter_sizes=(31, 16, 3, 3))),
    ("para_dict['tensor_bias']", None, lambda: dx(tensor_bias=np.zeros(32, "float16"))),
    ("para_dict['tensor_bias'].shape", "E60011", lambda: dx(tensor_bias=placeholder((5,), name="b", dtype="float16"))),
    ("para_dict['tensor_bias'].dtype", "E60011", lambda: dx(tensor_bias=placeholder((32,), name="b", dtype="int32"))),
    ("out_backprop.shape[4]", "E65007", lambda: dx(dy=(2, 4, 4, 4, 8))),
    ("out_backprop.shape[1]", "E65007", lambda: dx(dy=(2, 3, 4, 4, 16))),
    ("filters.shape", "E65007", lambda: dx(filters=(18, 2, 16, 8))),
    ("filters.shape[1]", "E65007", lambda: dx(filters=(18, 3, 16, 16))),
    ("filters.shape[0]", "E65007", lambda: dx(filters=(17, 2, 16, 16))),
    ("filter_sizes[2]", "E65005", lambda: dx(filters=(66, 2, 16, 16), filter_sizes=(32, 32, 11, 3))),
    ("filter_sizes[3]", "E65005", lambda: dx(filters=(66, 2, 16, 16), filter_sizes=(32, 32, 3, 11))),
    ("para_dict['dilations']", "E60023", lambda: dx(dilations=[1, 2, 1, 1])),
    ("para_dict['dilations'][2]", "E60011", lambda: dx(filters=(6, 2, 16, 16), filter_sizes=(32, 32, 1, 3), dilations=[1, 1, 256, 1])),
    ("out_backprop.shape[0]", "E65007", lambda: dx(dy=(1, 2, 4, 4, 16))),
    ("out_backprop.shape[2]", "E65007", lambda: dx(dy=(2, 2, 3, 4, 16))),
    ("out_backprop.shape[3]", "E65007", lambda: dx(dy=(2, 2, 4, 5, 16))),
    ("input_sizes[2]", "E60011", lambda: dx(filters=(1, 1, 16, 16), dy=(1, 1, 200_001, 1, 16), filter_sizes=(16, 16, 1, 1), input_sizes=(1, 16, 200_001, 1), strides=[1, 1])),
    ("input_sizes[3]", "E60011", lambda: dx(filters=(1, 1, 16, 16), dy=(1, 1, 2, 4097, 16), filter_sizes=(16, 16, 1, 1), input_sizes=(1, 16, 2, 4097), strides=[1, 1])),
    ("out_backprop.shape[3]", "E60011", lambda: dx(filters=(1, 1, 16, 16), dy=(1, 1, 2, 1366, 16), filter_sizes=(16, 16, 1, 1), input_sizes=(1, 16, 2, 4096), strides=[1, 3])),
    ("input_sizes", "E60020", lambda: dx(filters=(1, 1, 16, 16), dy=(2**59, 1, 1, 1, 16), filter_sizes=(16, 16, 1, 1), input_sizes=(2**59, 16, 1, 1), strides=[1, 1])),
]  # fmt: skip

# --------------------------------------------------------------------------------------------
# Operator level (Conv2DBackpropFilterD / Conv2DBackpropInputD), build, cube_util.
# --------------------------------------------------------------------------------------------


def T(shape, fmt="NCHW", dtype="float16"):  # noqa: N802
    return {"ori_shape": shape, "ori_format": fmt, "dtype": dtype}


def dw_op(x=T((2, 32, 9, 9)), y=T((32, 32, 3, 3), dtype="float32"), filter_size=(32, 32, 3, 3), **kw):
    args = {"strides": (1, 1, 2, 2), "pads": (0, 0, 0, 0), **kw}
    return conv2d_backprop_filter_d(x, T((2, 32, 4, 4)), y, filter_size, **args)


def dx_op(input_size=(2, 32, 9, 9), **kw):
    args = {"strides": (1, 1, 2, 2), "pads": "VALID", **kw}
    return conv2d_backprop_input_d(T((32, 32, 3, 3)), T((2, 32, 4, 4)), T((2, 32, 9, 9)), input_size, **args)


def _foreign_result():
    a = te.placeholder((4, 16), "float16", name="a")
    return te.compute((4, 16), lambda i, j: a[i, j] * 2, name="twice")


def _valid_dw():
    return dw()


OTHER_RULES = [
    ("data_format", None, lambda: dw_op(data_format="NCDHW")),
    ("x", None, lambda: dw_op(x=[2, 32, 9, 9])),
    ("x['ori_format']", None, lambda: dw_op(x={"ori_shape": (2, 32, 9, 9), "dtype": "float16"})),
    ("x['ori_shape']", "E60107", lambda: dw_op(x=T((2, 32, 9, 1_000_001)))),
    ("x['ori_shape']", "E60107", lambda: dw_op(x=T((2, 32, 9, 9.5)))),
    ("dilations", "E60107", lambda: dw_op(dilations=(1, 1, 1))),
    ("groups", "E60108", lambda: dw_op(groups=0)),
    ("y['dtype']", None, lambda: dw_op(y=T((32, 32, 3, 3), dtype="float16"))),
    ("pads", "E60021", lambda: dx_op(pads="same")),
    ("input_size", "E60107", lambda: dx_op(input_size=(2, 32, 9, "9"))),
    ("tensors", None, lambda: build(42)),
    ("tensors", None, lambda: build([])),
    ("tensors", None, lambda: build([_valid_dw()])),
    ("tensors", None, lambda: build(_foreign_result())),
    ("target", None, lambda: build(_valid_dw(), target="opencl")),
    ("target", None, lambda: build(_valid_dw(), target={"kind": "c"})),
    ("target", None, lambda: build(_valid_dw(), target={"kind": "no-such-kind"})),
    ("target", None, lambda: build(_valid_dw(), target="llvm -mcpu=znver4")),
    ("w_shape_nchw", None, lambda: cube_util.calculate_group([32, 32, 3], 1)),
    ("groups", "E60108", lambda: cube_util.calculate_group([32, 32, 3, 3], 3)),
    ("c0_size_k", None, lambda: cube_util.calculate_group([32, 32, 3, 3], 1, c0_size_k=32)),
    ("filter_ori_format", None, lambda: cube_util.calculate_group([32, 32, 3, 3], 1, filter_ori_format="NC1HWC0")),
    ("groups", "E60108", lambda: cube_util.calculate_group_dw([32, 32, 3, 3], 0)),
]  # fmt: skip


def _params(rules):
    return [pytest.param(param, code, make, id=f"{i:02d}-{param}") for i, (param, code, make) in enumerate(rules)]


@pytest.mark.parametrize("param, code, make", _params(DW_RULES) + _params(DX_RULES) + _params(OTHER_RULES))
def test_rule(param, code, make):
    with pytest.raises(ConvGradError) as err:
        make()
    assert err.value.param == param, str(err.value)
    assert err.value.code == code, str(err.value)
    assert isinstance(err.value, ValueError)
    assert param in str(err.value) and repr(err.value.value) in str(err.value)


def test_valid_baselines_pass():
    """The calls the rules start from are valid, so each rule's error is its own."""
    assert tuple(int(d) for d in dw().shape) == (1, 18, 32, 16)
    assert tuple(int(d) for d in dx().shape) == (2, 2, 81, 16)
    assert tuple(int(d) for d in dx(group_dict=GROUP_DICT).shape) == (2, 2, 81, 16)
    assert dw_op().convgrad_params.geom.pads == (0, 0, 0, 0)
    assert dx_op().convgrad_params.geom.input_sizes == (2, 32, 9, 9)


def test_tbe_dma_mode_lifts_the_dw_limits_with_dilation_1():
    """KH > 255 and stride > 63 are accepted when the dilations are 1, as in TBE's DMA mode."""
    result = dw(x=(1, 1, 310, 70, 16), dy=(1, 1, 11, 2, 16), filter_sizes=(16, 16, 300, 3), strides=[1, 64])
    assert result.convgrad_params.geom.kh == 300


def test_conv1d_lifts_the_dx_width_limit():
    result = dx(filters=(1, 1, 16, 16), dy=(1, 1, 1, 5000, 16), filter_sizes=(16, 16, 1, 1), input_sizes=(1, 16, 1, 5000), strides=[1, 1])
    assert result.convgrad_params.geom.w == 5000


def test_kernel_call_checks_its_arguments():
    kernel = build(dw())
    x = np.zeros((2, 2, 9, 9, 16), "float16")
    dy = np.zeros((2, 2, 4, 4, 16), "float16")
    with pytest.raises(ConvGradError) as err:
        kernel(x)
    assert err.value.param == "inputs"
    with pytest.raises(ConvGradError) as err:
        kernel(x[:1], dy)
    assert err.value.param == "argument 0 (fmap)"
    with pytest.raises(ConvGradError) as err:
        kernel(x, dy.astype("float32"))
    assert err.value.param == "argument 1 (dy)"
