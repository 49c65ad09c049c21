"""NumPy oracle for cugemm8: quantisation, references, accumulation models, bounds.

CPU only.  This package imports NumPy and ml_dtypes and nothing else (never
CuPy), so every test can use it on a machine without a GPU.

The GEMM that cugemm8 computes (DeepSeek-V3 fine-grained scaling, "1D2D")::

    D[m, n] = sum_kb  SFA[m, kb] * SFB[n // 128, kb] * sum_{k in kb} A[m, k] * B[n, k]

- ``A`` is ``[m, k]`` and ``B`` is ``[n, k]``, both e4m3fn payloads stored as
  ``uint8`` bit patterns (K-major, "NT").
- ``SFA`` is float32 ``[m, ceil(k/128)]``: one scale per token per 128 K
  ("1x128", per-token).
- ``SFB`` is float32 ``[ceil(n/128), ceil(k/128)]``: one scale per 128x128
  block of B.
- ``D`` is bfloat16 ``[m, n]``.

Sources
-------
- Quantisation recipe: DeepGEMM ``tests/test_core.py`` (``per_token_cast_to_fp8``
  and ``per_block_cast_to_fp8``; later ``deep_gemm/utils/math.py``): amax over
  1x128 / 128x128 groups, clamped to >= 1e-4, scale = amax / 448.
- Promotion every N_C = 128 K elements into FP32 on the CUDA cores:
  DeepSeek-V3 technical report, section 3.3 ("Increasing accumulation
  precision") and section 3.5.2 (Hopper FP8 tensor cores keep about 14 bits).
- Accuracy metric ``calc_diff``: DeepGEMM ``tests/test_core.py``.
- Tensor-core numerics used by :func:`error_bound` and the ``"hopper"``
  model: measured for this module on an H200 (CUDA 13, cuBLASLt FP8 with
  fast accumulation, i.e. WGMMA without promotion), see
  :func:`tensor_core_partial_sums`.

Conventions: shapes are written ``[m, k]``; ``kb = ceil(k / 128)``,
``nb = ceil(n / 128)``.  Every function is deterministic and vectorised (one
matrix product per 128-K block or per 32-K WGMMA step, never a Python loop
over elements).

Modules (every public name is re-exported here: use ``cugemm8.reference.<name>``)
--------------------------------------------------------------------------------
- ``quant``: e4m3fn encode / decode and the two quantisers
  (:func:`per_token_cast_to_fp8`, :func:`per_block_cast_to_fp8`);
- ``gemm``: dequantisation and the float64 references of the three GEMMs
  (:func:`ref_gemm_nt`, :func:`ref_gemm_contiguous`, :func:`ref_gemm_masked`);
- ``layout``: the contiguous layout's ``m_indices`` (:func:`make_m_indices`);
- ``promotion``: the bit-exact tensor-core model and the promoted /
  unpromoted accumulation models;
- ``bound``: the per-element error bound (:func:`error_bound`);
- ``metrics``: comparison helpers (:func:`calc_diff`, :func:`round_to_bf16`, ...);
- ``data``: block-varied test data (:func:`block_varied_normal`).
"""
from __future__ import annotations

from ._common import BLOCK_K, E4M3_MAX, MMA_K, TENSOR_CORE_MANTISSA_BITS
from .bound import error_bound
from .data import block_varied_normal
from .gemm import (dequantize_lhs, dequantize_rhs, masked_valid_rows, ref_gemm_contiguous,
                   ref_gemm_masked, ref_gemm_nt)
from .layout import make_m_indices
from .metrics import bf16_ulp_error, calc_diff, max_rel_error_rows, round_to_bf16
from .promotion import (promoted_accumulation_model, tensor_core_partial_sums,
                        unpromoted_accumulation_model)
from .quant import e4m3_to_float, float_to_e4m3, per_block_cast_to_fp8, per_token_cast_to_fp8
from .training import (cast_transpose_block_fp8, error_bound_1d1d, per_token_cast_to_fp8_t,
                       promoted_accumulation_model_1d1d, ref_gemm_1d1d, ref_k_grouped_gemm,
                       ref_linear_backward)
from . import _common, promotion, quant

# The other names of the single-module reference (cugemm8.quant uses the
# first two, the tests a few of the private helpers), still importable from
# here; not part of __all__.
MIN_AMAX_FLOOR = quant.MIN_AMAX_FLOOR
check_quant_options = quant.check_quant_options
_ceil_pow2 = quant._ceil_pow2
_scale_from_amax = quant._scale_from_amax
_fma_f32 = promotion._fma_f32
_fp32_scale_products = promotion._fp32_scale_products
_hopper_k32_step = promotion._hopper_k32_step
_as_bits = _common._as_bits
_as_scales = _common._as_scales
_ceil_div = _common._ceil_div
_check_gemm_2d = _common._check_gemm_2d
_check_pair_lhs = _common._check_pair_lhs
_check_pair_rhs = _common._check_pair_rhs
_e4m3_exponent = _common._e4m3_exponent
_round_to_bits = _common._round_to_bits
_to_float32 = _common._to_float32

__all__ = [
    "E4M3_MAX",
    "BLOCK_K",
    "MMA_K",
    "TENSOR_CORE_MANTISSA_BITS",
    "e4m3_to_float",
    "float_to_e4m3",
    "per_token_cast_to_fp8",
    "per_block_cast_to_fp8",
    "dequantize_lhs",
    "dequantize_rhs",
    "ref_gemm_nt",
    "ref_gemm_contiguous",
    "ref_gemm_masked",
    "masked_valid_rows",
    "tensor_core_partial_sums",
    "promoted_accumulation_model",
    "unpromoted_accumulation_model",
    "error_bound",
    "round_to_bf16",
    "calc_diff",
    "bf16_ulp_error",
    "max_rel_error_rows",
    "block_varied_normal",
    "make_m_indices",
    "per_token_cast_to_fp8_t",
    "cast_transpose_block_fp8",
    "ref_gemm_1d1d",
    "ref_k_grouped_gemm",
    "promoted_accumulation_model_1d1d",
    "error_bound_1d1d",
    "ref_linear_backward",
]
