"""Dequantisation and the float64 GEMM references: the normal GEMM and the two
M-grouped layouts (contiguous and masked)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._common import BLOCK_K, _check_pair_lhs, _check_pair_rhs
from .quant import e4m3_to_float

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["dequantize_lhs", "dequantize_rhs", "ref_gemm_nt", "ref_gemm_contiguous",
           "masked_valid_rows", "ref_gemm_masked"]


# ---------------------------------------------------------------------------
# Dequantisation and float64 references
# ---------------------------------------------------------------------------

def dequantize_lhs(a_bits: ArrayLike, sfa: ArrayLike) -> np.ndarray:
    """Dequantise per-token-scaled activations: ``e4m3(a) * sfa`` in float64.

    Parameters
    ----------
    a_bits : uint8 ``[..., m, k]`` e4m3fn bits (any K, not only multiples of 128).
    sfa : real ``[..., m, ceil(k/128)]`` (logical shape; any strides).  Scales
        are rounded to float32 first, as the GPU stores them.

    Returns
    -------
    numpy.ndarray of float64, shape ``[..., m, k]``; element ``[.., i, j]`` is
    ``e4m3(a[.., i, j]) * sfa[.., i, j // 128]``, exact (a 4-bit by 24-bit
    significand product fits float64).  NaN payloads or scales give NaN;
    a 0 payload with an Inf scale gives NaN.

    Raises
    ------
    ValueError
        If the scale shape does not match; TypeError for wrong dtypes.
    """
    a, s = _check_pair_lhs(a_bits, sfa)
    k = a.shape[-1]
    scale = np.repeat(s, BLOCK_K, axis=-1)[..., :k]
    with np.errstate(invalid="ignore", over="ignore"):
        return e4m3_to_float(a).astype(np.float64) * scale


def dequantize_rhs(b_bits: ArrayLike, sfb: ArrayLike) -> np.ndarray:
    """Dequantise per-block-scaled weights: ``e4m3(b) * sfb`` in float64.

    Parameters
    ----------
    b_bits : uint8 ``[..., n, k]`` e4m3fn bits.
    sfb : real ``[..., ceil(n/128), ceil(k/128)]``, rounded to float32 first.

    Returns
    -------
    numpy.ndarray of float64, shape ``[..., n, k]``; element ``[.., i, j]`` is
    ``e4m3(b[.., i, j]) * sfb[.., i // 128, j // 128]`` (exact).

    Raises
    ------
    ValueError
        If the scale shape does not match; TypeError for wrong dtypes.
    """
    b, s = _check_pair_rhs(b_bits, sfb)
    n, k = b.shape[-2:]
    scale = np.repeat(np.repeat(s, BLOCK_K, axis=-2)[..., :n, :], BLOCK_K, axis=-1)[..., :k]
    with np.errstate(invalid="ignore", over="ignore"):
        return e4m3_to_float(b).astype(np.float64) * scale


def ref_gemm_nt(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike) -> np.ndarray:
    """Float64 reference ``dequantize_lhs(a) @ dequantize_rhs(b).T``.

    This is the "kernel-exactness reference": it uses the
    same FP8 bytes and scales the kernel sees.  The only error is float64
    summation (relative ~K * 2^-53 of sum |a||b|), far below any kernel error.

    Parameters
    ----------
    a_bits : uint8 ``[m, k]`` (or ``[g, m, k]``), sfa ``[m, ceil(k/128)]``
    b_bits : uint8 ``[n, k]`` (or ``[g, n, k]``), sfb ``[ceil(n/128), ceil(k/128)]``

    Returns
    -------
    numpy.ndarray of float64, shape ``[m, n]`` (``[g, m, n]`` when batched).

    Raises
    ------
    ValueError
        On shape mismatch (K, scale shapes, batch dims).
    """
    a, _ = _check_pair_lhs(a_bits, sfa)
    b, _ = _check_pair_rhs(b_bits, sfb)
    if a.shape[-1] != b.shape[-1] or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"a_bits {a.shape} and b_bits {b.shape} must agree in K and "
                         "in leading (batch) dims")
    da = dequantize_lhs(a_bits, sfa)
    db = dequantize_rhs(b_bits, sfb)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.matmul(da, np.swapaxes(db, -1, -2))


def ref_gemm_contiguous(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike,
                        m_indices: ArrayLike) -> np.ndarray:
    """Reference for the M-grouped contiguous layout (MoE, one expert per row block).

    Row ``r`` of the output is ``ref_gemm_nt`` of row ``r`` of A with expert
    ``m_indices[r]``'s weights.  Rows with ``m_indices[r] == -1`` (padding) are
    exactly 0 whatever A holds there (NaN included).

    Parameters
    ----------
    a_bits : uint8 ``[m_sum, k]``; sfa ``[m_sum, ceil(k/128)]``
    b_bits : uint8 ``[g, n, k]``; sfb ``[g, ceil(n/128), ceil(k/128)]``
    m_indices : integer ``[m_sum]``, values in ``{-1} U [0, g)``
        (see :func:`make_m_indices`).  The reference does not require the
        128-row alignment; the kernel does.

    Returns
    -------
    numpy.ndarray of float64, shape ``[m_sum, n]``.

    Raises
    ------
    ValueError
        On shape mismatch or an index outside ``{-1} U [0, g)``.
    """
    a, _ = _check_pair_lhs(a_bits, sfa)
    b, _ = _check_pair_rhs(b_bits, sfb)
    idx = np.asarray(m_indices)
    if a.ndim != 2 or b.ndim != 3:
        raise ValueError(f"expected a_bits [m_sum, k] and b_bits [g, n, k], got "
                         f"{a.shape} and {b.shape}")
    if idx.dtype.kind not in "iu" or idx.shape != (a.shape[0],):
        raise ValueError(f"m_indices must be an integer array of shape ({a.shape[0]},), "
                         f"got {idx.dtype} {idx.shape}")
    g, n, k = b.shape
    if k != a.shape[1]:
        raise ValueError(f"K mismatch: a_bits {a.shape}, b_bits {b.shape}")
    bad = (idx < -1) | (idx >= g)
    if np.any(bad):
        raise ValueError(f"m_indices values must be -1 or in [0, {g}); found "
                         f"{np.unique(idx[bad])[:8].tolist()}")
    out = np.zeros((a.shape[0], n), dtype=np.float64)
    sfa = np.asarray(sfa)
    sfb = np.asarray(sfb)
    for e in np.unique(idx[idx >= 0]):
        rows = np.nonzero(idx == e)[0]
        out[rows] = ref_gemm_nt(a[rows], sfa[rows], b[e], sfb[e])
    return out


def masked_valid_rows(masked_m: ArrayLike, m_max: int) -> np.ndarray:
    """Boolean mask ``[g, m_max]`` of the rows a masked grouped GEMM computes.

    Row ``i`` of group ``j`` is valid iff ``i < min(masked_m[j], m_max)``.

    Raises
    ------
    ValueError
        If ``masked_m`` is not a 1-D integer array of values >= 0, or
        ``m_max < 0``.
    """
    mm = np.asarray(masked_m)
    if mm.ndim != 1 or mm.dtype.kind not in "iu":
        raise ValueError(f"masked_m must be a 1-D integer array, got {mm.dtype} {mm.shape}")
    if np.any(mm < 0):
        raise ValueError(f"masked_m must be >= 0, got {mm.tolist()}")
    if int(m_max) < 0:
        raise ValueError(f"m_max must be >= 0, got {m_max}")
    return np.arange(int(m_max))[None, :] < np.minimum(mm, int(m_max))[:, None]


def ref_gemm_masked(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike,
                    masked_m: ArrayLike) -> np.ndarray:
    """Reference for the M-grouped masked layout (decode-time MoE).

    Group ``j`` multiplies its first ``min(masked_m[j], m_max)`` rows of A by
    expert ``j``'s weights; all other rows of the output are exactly 0
    (whatever A holds there, NaN included).

    Parameters
    ----------
    a_bits : uint8 ``[g, m_max, k]``; sfa ``[g, m_max, ceil(k/128)]``
    b_bits : uint8 ``[g, n, k]``; sfb ``[g, ceil(n/128), ceil(k/128)]``
    masked_m : integer ``[g]``, values >= 0 (values > m_max are clipped).

    Returns
    -------
    numpy.ndarray of float64, shape ``[g, m_max, n]``.

    Raises
    ------
    ValueError
        On shape mismatch or negative ``masked_m``.
    """
    a, _ = _check_pair_lhs(a_bits, sfa)
    b, _ = _check_pair_rhs(b_bits, sfb)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"expected a_bits [g, m_max, k] and b_bits [g, n, k], got "
                         f"{a.shape} and {b.shape}")
    g, m_max, _ = a.shape
    valid = masked_valid_rows(masked_m, m_max)
    if valid.shape[0] != g:
        raise ValueError(f"masked_m must have {g} entries, got {valid.shape[0]}")
    n = b.shape[1]
    out = np.zeros((g, m_max, n), dtype=np.float64)
    sfa = np.asarray(sfa)
    sfb = np.asarray(sfb)
    for j in range(g):
        r = int(valid[j].sum())
        if r:
            out[j, :r] = ref_gemm_nt(a[j, :r], sfa[j, :r], b[j], sfb[j])
    return out
