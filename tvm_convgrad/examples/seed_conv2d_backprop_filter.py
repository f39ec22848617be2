# The TBE documentation example of conv2d_backprop_filter, with `tbe` replaced by `tvm_convgrad`.
from tvm_convgrad import tvm
from tvm_convgrad import dsl

out_backprop_shape = (1, 1, 7, 7, 16)
out_backprop_dtype = "float16"
fmap_shape = (1, 1, 7, 7, 16)
fmap_dtype = "float16"
filter_sizes = (16, 16, 1, 1)

out_backprop = tvm.placeholder(out_backprop_shape, name="out_backprop", dtype=out_backprop_dtype)
fmap = tvm.placeholder(fmap_shape, name="fmap", dtype=fmap_dtype)

strides = [1, 1]
padding = [0, 0, 0, 0]
dilations = [1, 1, 1, 1]
groups = 1
res_dtype = "float32"
kernel_name = "conv2d_backprop_filter_dx_1_1_7_7_16_dy_1_1_7_7_16_dw_16_16_1_1_s_1_1_p_SAME"

para_dict = {
    "strides": strides,
    "padding": padding,
    "dilations": dilations,
    "groups": groups,
    "res_dtype": res_dtype,
    "kernel_name": kernel_name
}

filter_backprop = dsl.conv2d_backprop_filter(
    input_x=fmap,
    out_backprop=out_backprop,
    filter_sizes=filter_sizes,
    para_dict=para_dict
)
