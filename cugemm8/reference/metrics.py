"""Comparison helpers: one-step BF16 rounding, DeepGEMM's ``calc_diff``, BF16
ulp errors and per-row relative errors."""
from __future__ import annotations

from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from ._common import _BF16_FRACTION_BITS, _BF16_MIN_NORMAL_EXP, _round_to_bits

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["round_to_bf16", "calc_diff", "bf16_ulp_error", "max_rel_error_rows"]


# ---------------------------------------------------------------------------
# Comparison helpers
# ---------------------------------------------------------------------------

def round_to_bf16(x: ArrayLike) -> np.ndarray:
    """Round real values to bfloat16, round-to-nearest-even, in one step.

    ``ml_dtypes``' float64 -> bfloat16 cast goes through float32 and can
    double-round (1 + 2^-8 + 2^-30 becomes 1.0 instead of 1 + 2^-7); this
    function rounds the float64 value directly (subnormals below 2^-126 on
    the 2^-133 grid; values at or above (2 - 2^-8) * 2^127 become Inf), which
    matches the GPU's ``__float2bfloat16_rn`` for float32 inputs.

    Parameters
    ----------
    x : array_like of real numbers, any shape.

    Returns
    -------
    numpy.ndarray of ``ml_dtypes.bfloat16``, same shape.
    """
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub" and arr.dtype != ml_dtypes.bfloat16:
        raise TypeError(f"x must be real, got dtype {arr.dtype}")
    x64 = arr.astype(np.float64)
    r = _round_to_bits(x64, _BF16_FRACTION_BITS, "nearest", min_exp=_BF16_MIN_NORMAL_EXP)
    r = np.where(np.isfinite(r) & (np.abs(r) >= 2.0 ** 128), np.copysign(np.inf, r), r)
    return r.astype(ml_dtypes.bfloat16)


def calc_diff(x: ArrayLike, y: ArrayLike) -> float:
    """DeepGEMM's global similarity error ``1 - 2 sum(x y) / sum(x^2 + y^2)``.

    Computed in float64 (DeepGEMM ``tests/test_core.py``; the newest version
    returns 0 when the denominator is 0, as here).  About half the squared
    relative Frobenius error for small errors: ``< 1e-3`` allows ~4.5%
    relative error, so pair it with per-element and per-row checks.

    Returns
    -------
    float.  NaN if any input is NaN.
    """
    x64 = np.asarray(x).astype(np.float64)
    y64 = np.asarray(y).astype(np.float64)
    if x64.shape != y64.shape:
        raise ValueError(f"shape mismatch: {x64.shape} vs {y64.shape}")
    denom = float(np.sum(x64 * x64 + y64 * y64))
    if denom == 0.0:
        return 0.0
    return float(1.0 - 2.0 * float(np.sum(x64 * y64)) / denom)


def bf16_ulp_error(x: ArrayLike, ref: ArrayLike) -> np.ndarray:
    """``|x - ref|`` in units of the BF16 ulp of ``ref``.

    ``ulp(ref) = 2^(floor(log2|ref|) - 7)``, with ``floor(log2|ref|)`` floored
    at -126 (smallest normal) so that ``ulp >= 2^-133`` (also for ``ref = 0``).
    A correctly rounded BF16 result has ``bf16_ulp_error <= 0.5``.

    Returns
    -------
    numpy.ndarray of float64 with the broadcast shape.
    """
    x64 = np.asarray(x).astype(np.float64)
    r64 = np.asarray(ref).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(r64)
        exp = np.maximum(e.astype(np.int64) - 1, _BF16_MIN_NORMAL_EXP)
        exp = np.where(r64 == 0, _BF16_MIN_NORMAL_EXP, exp)
        ulp = np.ldexp(1.0, (exp - _BF16_FRACTION_BITS).astype(np.int32))
        return np.abs(x64 - r64) / ulp


def max_rel_error_rows(x: ArrayLike, ref: ArrayLike) -> np.ndarray:
    """Per-row ``max_n |x - ref| / max_n |ref|`` (a global metric hides bad rows).

    Parameters
    ----------
    x, ref : array_like ``[..., m, n]``.

    Returns
    -------
    numpy.ndarray of float64 ``[..., m]``.  A row whose reference is all zero
    gives 0 if ``x`` is all zero there, else Inf.  NaN propagates.
    """
    x64 = np.asarray(x).astype(np.float64)
    r64 = np.asarray(ref).astype(np.float64)
    if x64.shape != r64.shape or x64.ndim < 2:
        raise ValueError(f"x and ref must have the same shape [..., m, n], got "
                         f"{x64.shape} and {r64.shape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.max(np.abs(x64 - r64), axis=-1, initial=0.0)
        den = np.max(np.abs(r64), axis=-1, initial=0.0)
        out = np.where(den > 0, err / np.where(den > 0, den, 1.0),
                       np.where(err == 0, 0.0, np.inf))
    return np.where(np.isnan(err) | np.isnan(den), np.nan, out)
