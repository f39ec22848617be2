"""The CUDA rule (:class:`CudaRule`): tensor cores for every GEMM-shaped mad (:mod:`.tensor_core`,
tiles from :mod:`.gemm`), SIMT for the rest (:mod:`.simt`), on a GPU or emulated (:mod:`.lowering`)."""

from .gemm import SHARED_BYTES, GemmConfig, GemmExtents, gemm_config
from .rule import UNITS, CudaConfig, CudaRule, NoAlternative, sm_count, units, with_limits

__all__ = [
    "SHARED_BYTES", "UNITS", "CudaConfig", "CudaRule", "GemmConfig", "GemmExtents", "NoAlternative", "gemm_config", "sm_count", "units",
    "with_limits",
]  # fmt: skip
