"""Operator-level frontends that map other input forms onto the gradient computes.

* :mod:`.tbe_ops`: TBE's operators ``Conv2DBackpropFilterD`` / ``Conv2DBackpropInputD``.
* :mod:`.onednn`: oneDNN Graph's ``ConvolutionBackpropFilters`` (``ConvolutionBackwardWeights``) and
  ``ConvTransposeBackwardWeights``, spatial rank 1-3, f32 / f16 / bf16.
* :mod:`.dsp`: the DSP library's ``DeconvGradFilter`` (``fp_`` / ``hp_deconv_grad_filter``).

Each returns the result ``te.Tensor`` of the package's compute (wrapped in layout stages,
:mod:`.layouts`), ready for :func:`tvm_convgrad.build`.
"""

from . import dsp, onednn, tbe_ops

__all__ = ["dsp", "onednn", "tbe_ops"]
