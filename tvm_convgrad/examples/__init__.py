"""The two TBE documentation examples, with only ``tbe`` replaced by ``tvm_convgrad``.

``seed_conv2d_backprop_filter`` defines ``filter_backprop``, ``seed_conv2d_backprop_input``
defines ``input_backprop``; ``tvm-convgrad demo`` builds and checks both.
"""

SEEDS = {
    "conv2d_backprop_filter": ("tvm_convgrad.examples.seed_conv2d_backprop_filter", "filter_backprop"),
    "conv2d_backprop_input": ("tvm_convgrad.examples.seed_conv2d_backprop_input", "input_backprop"),
}
