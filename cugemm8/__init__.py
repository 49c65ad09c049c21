"""cugemm8: FP8 GEMMs for NVIDIA Hopper (sm_90a) with DeepSeek-V3 fine-grained
scaling, on CuPy.  Importable without a GPU; device work raises
:class:`DeviceError` naming what is missing.  Typed (PEP 561, ``py.typed``);
the NumPy oracle :mod:`cugemm8.reference` and :func:`get_gemm_config` with
``num_sms`` given need no GPU.
"""
from ._config import GemmConfig
from ._config_1d1d import Gemm1d1dConfig
from ._device import DeviceError
from ._device import get_num_sms
from ._device import set_num_sms
from ._launch import get_pdl
from ._launch import set_pdl
from .gemm import gemm_fp8_fp8_bf16_nt
from .gemm import get_gemm_config
from .gemm import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from .gemm import m_grouped_gemm_fp8_fp8_bf16_nt_masked
from .gemm import reload_tuned_configs
from .gemm_1d1d import fp8_gemm_nt
from .gemm_1d1d import get_gemm_1d1d_config
from .gemm_1d1d import k_grouped_fp8_gemm_nt_contiguous
from .layout import get_col_major_tma_aligned_tensor
from .layout import get_m_alignment_for_contiguous_layout
from .layout import make_contiguous_layout
from .quant import gemm_fp8
from .quant import gemm_fp8_workspace_bytes
from .quant import cast_transpose_block_fp8
from .quant import per_block_cast_to_fp8
from .quant import per_token_cast_to_fp8
from .quant import per_token_cast_to_fp8_t
from . import interop
from . import reference

__version__ = "0.37.0"

__all__ = [
    "DeviceError", "Gemm1d1dConfig", "GemmConfig", "cast_transpose_block_fp8", "fp8_gemm_nt", "gemm_fp8", "gemm_fp8_fp8_bf16_nt",
    "gemm_fp8_workspace_bytes", "get_col_major_tma_aligned_tensor", "get_gemm_1d1d_config", "get_gemm_config",
    "get_m_alignment_for_contiguous_layout", "get_num_sms", "get_pdl", "interop",
    "k_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked", "make_contiguous_layout", "per_block_cast_to_fp8",
    "per_token_cast_to_fp8", "per_token_cast_to_fp8_t", "reference", "reload_tuned_configs", "set_num_sms", "set_pdl",
]
