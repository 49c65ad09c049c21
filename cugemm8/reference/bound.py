"""The per-element error bound of a correct promoted kernel against
:func:`cugemm8.reference.ref_gemm_nt`."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._common import (_BF16_ETA, _BF16_OVERFLOW, _BF16_U, _E4M3_MIN_NORMAL_EXP, _FP32_ETA,
                      _FP32_MAX, _FP32_U, BLOCK_K, MMA_K, TENSOR_CORE_MANTISSA_BITS, _ceil_div,
                      _check_gemm_2d)
from .quant import e4m3_to_float

if TYPE_CHECKING:
    from typing import Literal

    from numpy.typing import ArrayLike

__all__ = ["error_bound"]


# ---------------------------------------------------------------------------
# Error bound
# ---------------------------------------------------------------------------

def error_bound(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike, *,
                mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                output: Literal["bfloat16", "float32"] = "bfloat16") -> np.ndarray:
    """Per-element bound ``B`` with ``|kernel - ref_gemm_nt| <= B`` for a correct kernel.

    "Correct kernel": per 128-K block, four k32 WGMMA steps from a cleared
    accumulator; promotion ``final = FFMA(fl32(sfa*sfb), acc, final)`` in FP32
    (IEEE, subnormals kept); final rounding to BF16 (RNE) or FP32 output.

    Derivation (units: ``p`` = payload products ``A[m,k]*B[n,k]``, exact).

    1. **Tensor core, per block kb.**  Within the block, step ``j`` (32 K,
       ``c_j`` valid K values) adds its products to the accumulator.  Under
       the measured Hopper rule (see :func:`tensor_core_partial_sums`,
       ``"hopper"``) every product, and the incoming accumulator, is
       truncated on a grid ``G_j = 2^(E_j - mb)`` with
       ``2^E_j <= max(|acc_{j-1}|, max_i 2^(e(a_i)+e(b_i)))``, then the sum is
       truncated to ``mb`` fraction bits.  Hence
       ``G_j <= 2^-mb * max(|acc_{j-1}|, MA_j * MB_j)`` where ``MA_j`` is the
       row's max over the step of ``max(|a|, 2^-6)`` (nonzero ``a``) and
       ``MB_j`` likewise for B, and, with ``t_j = c_j + 1`` truncated addends
       (``c_j`` for the first step, whose accumulator is cleared)::

           e_j = e_{j-1} + t_j * G_j + 2^-mb * (|P_{<=j}| + e_{j-1} + t_j * G_j)
           |acc_j| <= |P_{<=j}| + e_j

       with ``P_{<=j}`` the exact partial sum (computed exactly in float64)
       and ``G_j`` evaluated with ``|acc_{j-1}| <= |P_{<=j-1}| + e_{j-1}``.
       ``TC_kb = e_4`` bounds ``|acc_kb - P_kb|``.  It also bounds the simple
       ``"round"``/``"truncate"`` models (one rounding of at most
       ``2^-mb |P_kb|``).

       Why not ``2^-mb * sum |A||B|``: on the H200 the k=128 tensor-core error
       reached 13x that on uniform positive data and 40x on log-normal data
       (individually truncated products add up); the per-step grid form
       above was never exceeded (max observed ratio about 0.3 of it; the
       whole bound, against cugemm8's kernel up to K = 16384: at most 0.45).

    2. **Scale product.** ``w = fl32(s)`` with ``s = sfa*sfb`` (exact in
       float64): ``|w - s| <= 2^-24 |s| + 2^-150`` (2^-150: float32 subnormal
       half-spacing).

    3. **FP32 accumulation** of ``nkb`` FFMAs (recursive summation, Higham,
       *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section
       4.2): error ``<= gamma_nkb * sum_kb |w acc_kb| + nkb * 2^-150`` with
       ``gamma_n = n u / (1 - n u)``, ``u = 2^-24``.  With ``Q = sum_kb
       (s (1 + 2^-24) + 2^-150)(|P_kb| + TC_kb) >= sum |w acc|``::

           E32 = sum_kb s TC_kb + sum_kb (2^-24 s + 2^-150)(|P_kb| + TC_kb)
                 + gamma_nkb Q + nkb 2^-150

    4. **BF16 rounding** (RNE, 8 significant bits): ``|bf16(y) - y| <= 2^-8 |y|
       + 2^-134`` (half an ulp is at most 2^-8 of the value for normals, since
       the ulp of ``y in [2^e, 2^(e+1))`` is ``2^(e-7)``; 2^-134 is half the
       BF16 subnormal spacing 2^-133), with ``|y| <= |ref| + E32``::

           B = E32 + 2^-8 (|ref| + E32) + 2^-134          (output="bfloat16")
           B = E32                                         (output="float32")

    Overflow: ``B = +inf`` where ``fl32(sfa*sfb)`` may overflow for a block
    (``s >= 2^128``), where ``Q`` exceeds the float32 range, or where the
    output may round to Inf (``|ref| + B`` beyond the largest BF16/FP32).  There
    the kernel may return Inf or NaN; compare only where ``B`` is finite.
    NaN/Inf inputs make ``B`` NaN for the affected elements.

    Parameters
    ----------
    a_bits, sfa, b_bits, sfb : as :func:`ref_gemm_nt` (2-D only).
    mantissa_bits : int, keyword-only
        Tensor-core accumulator fraction bits (13 on Hopper).
    output : {"bfloat16", "float32"}, keyword-only

    Returns
    -------
    numpy.ndarray of float64, shape ``[m, n]``, in the units of the output.

    Raises
    ------
    ValueError
        On shape mismatch or unknown ``output``.
    """
    if output not in ("bfloat16", "float32"):
        raise ValueError(f"output must be 'bfloat16' or 'float32', got {output!r}")
    a, sa, b, sb = _check_gemm_2d(a_bits, sfa, b_bits, sfb)
    m, k = a.shape
    n = b.shape[0]
    mb = int(mantissa_bits)
    sb_rows = np.repeat(sb, BLOCK_K, axis=0)[:n]                   # [n, kb]
    with np.errstate(invalid="ignore", over="ignore"):
        e32, ref, q_sum, w_overflow = _promotion_error_terms(
            a, b, lambda j: sa[:, j][:, None] * sb_rows[:, j][None, :], mb)
        if output == "bfloat16":
            bound = e32 + _BF16_U * (np.abs(ref) + e32) + _BF16_ETA
            limit = _BF16_OVERFLOW
        else:
            bound = e32
            limit = _FP32_MAX
        over = w_overflow | (q_sum > _FP32_MAX) | (np.abs(ref) + bound >= limit)
        bound = np.where(over & ~np.isnan(bound), np.inf, bound)
    return bound


def _promotion_error_terms(a: np.ndarray, b: np.ndarray, block_scales, mantissa_bits: int):
    """Steps 1-3 of :func:`error_bound` for e4m3 payloads ``a`` [m, k] and
    ``b`` [n, k], whatever the scale layout: ``block_scales(j)`` gives the
    signed float64 ``[m, n]`` scale products ``s`` of K block ``j``.

    Returns ``(E32, ref, Q, w_overflow)``: the FP32-accumulation error bound
    before the output rounding, the exact scaled sum ``sum_kb s P_kb``, the
    magnitude sum ``Q`` and where ``fl32(s)`` may overflow.  Call under
    ``np.errstate(invalid="ignore", over="ignore")``.  Shared with the 1D1D
    bound (:func:`cugemm8.reference.error_bound_1d1d`).
    """
    m, k = a.shape
    n = b.shape[0]
    kb_count = _ceil_div(k, BLOCK_K)
    u_tc = 2.0 ** -mantissa_bits
    av = e4m3_to_float(a).astype(np.float64)
    bv = e4m3_to_float(b).astype(np.float64)
    # Effective magnitudes for the alignment exponent: e4m3 subnormals align as 2^-6.
    amag = np.where(av == 0, 0.0, np.maximum(np.abs(av), 2.0 ** _E4M3_MIN_NORMAL_EXP))
    bmag = np.where(bv == 0, 0.0, np.maximum(np.abs(bv), 2.0 ** _E4M3_MIN_NORMAL_EXP))
    sum_s_tc = np.zeros((m, n))
    sum_lin = np.zeros((m, n))          # sum (2^-24 s + 2^-150)(|P| + TC)
    q_sum = np.zeros((m, n))
    ref = np.zeros((m, n))
    w_overflow = np.zeros((m, n), dtype=bool)
    for j in range(kb_count):
        lo, hi = j * BLOCK_K, min(k, (j + 1) * BLOCK_K)
        p_cum = np.zeros((m, n))
        e = np.zeros((m, n))
        for c in range(lo, hi, MMA_K):
            ce = min(hi, c + MMA_K)
            acc_mag = np.abs(p_cum) + e
            p_cum = p_cum + av[:, c:ce] @ bv[:, c:ce].T
            ma = amag[:, c:ce].max(axis=1)
            mbm = bmag[:, c:ce].max(axis=1)
            grid = u_tc * np.maximum(acc_mag, ma[:, None] * mbm[None, :])
            step = (ce - c + (c > lo)) * grid        # products, and the accumulator
            e = e + step + u_tc * (np.abs(p_cum) + e + step)
        s_signed = block_scales(j)
        s = np.abs(s_signed)
        w_overflow |= s >= 2.0 ** 128
        mag = np.abs(p_cum) + e
        sum_s_tc += s * e
        sum_lin += (_FP32_U * s + _FP32_ETA) * mag
        q_sum += (s * (1 + _FP32_U) + _FP32_ETA) * mag
        ref += s_signed * p_cum
    nu = kb_count * _FP32_U
    gamma = nu / (1 - nu)
    e32 = sum_s_tc + sum_lin + gamma * q_sum + kb_count * _FP32_ETA
    return e32, ref, q_sum, w_overflow
