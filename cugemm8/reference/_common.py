"""Constants and small helpers shared by the modules of :mod:`cugemm8.reference`
(input conversion and checks, rounding to a given number of bits)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["E4M3_MAX", "BLOCK_K", "MMA_K", "TENSOR_CORE_MANTISSA_BITS"]


#: Largest finite e4m3fn value (S.1111.110 = 1.75 * 2^8).  e4m3fn has no Inf.
E4M3_MAX = 448.0
#: K extent of one scale granule, and of one promotion interval (N_C).
BLOCK_K = 128
#: K extent of one ``wgmma.mma_async ... k32 .e4m3.e4m3`` instruction.
MMA_K = 32
#: Fraction bits kept by the Hopper FP8 tensor-core accumulator
#: (DeepGEMM issue #176: "13bit mantissa" on H100; SageAttention 2 reports
#: FP22 = 1 sign + 8 exponent + 13 mantissa bits; re-measured on H200).
TENSOR_CORE_MANTISSA_BITS = 13

_E4M3_MIN_NORMAL_EXP = -6          # 2^-6 is the smallest normal e4m3fn value
_FP32_MAX = float(np.finfo(np.float32).max)
_FP32_U = 2.0 ** -24               # unit roundoff of float32 (RNE)
_FP32_ETA = 2.0 ** -150            # half the float32 subnormal spacing
_BF16_U = 2.0 ** -8                # unit roundoff of bfloat16 (8 significant bits)
_BF16_ETA = 2.0 ** -134            # half the bfloat16 subnormal spacing (2^-133)
_BF16_MIN_NORMAL_EXP = -126
_BF16_FRACTION_BITS = 7
#: |x| at or above this rounds to Inf in bfloat16 RNE ((2 - 2^-8) * 2^127).
_BF16_OVERFLOW = (2.0 - 2.0 ** -8) * 2.0 ** 127


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _as_bits(bits, name: str) -> np.ndarray:
    """Return ``bits`` as a uint8 array of e4m3fn bit patterns."""
    arr = np.asarray(bits)
    if arr.dtype == ml_dtypes.float8_e4m3fn:
        return arr.view(np.uint8)
    if arr.dtype != np.uint8:
        raise TypeError(f"{name} must hold e4m3fn bit patterns as uint8 (or "
                        f"ml_dtypes.float8_e4m3fn), got dtype {arr.dtype}")
    return arr


def _to_float32(x, name: str = "x") -> np.ndarray:
    """Convert real input (float, int, bfloat16, float16...) to float32."""
    arr = np.asarray(x)
    kind = arr.dtype.kind
    ok = kind in "fiub" or arr.dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                         ml_dtypes.float8_e5m2)
    if not ok:
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float32)


def _as_scales(s, name: str) -> np.ndarray:
    """Scales as float64 holding float32 values (the GPU stores float32)."""
    arr = np.asarray(s)
    if arr.dtype.kind not in "fiu" and arr.dtype != ml_dtypes.bfloat16:
        raise TypeError(f"{name} must be a real floating array, got dtype {arr.dtype}")
    return arr.astype(np.float32).astype(np.float64)


def _round_to_bits(x: np.ndarray, fraction_bits: int, mode: str,
                   min_exp: int | None = None) -> np.ndarray:
    """Round float64 ``x`` to a binary float with ``fraction_bits`` stored bits.

    ``mode`` is ``"nearest"`` (ties to even) or ``"truncate"`` (toward zero).
    ``min_exp`` (optional) is the exponent of the smallest normal number:
    below it the quantum stays ``2^(min_exp - fraction_bits)`` (subnormals).
    Non-finite values pass through.  No overflow handling (callers do it).
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(x)                      # x = f * 2^e, f in [0.5, 1)
        exp = e.astype(np.int64) - 1            # floor(log2 |x|) for x != 0
        if min_exp is not None:
            exp = np.maximum(exp, min_exp)
        quantum = np.ldexp(1.0, (exp - fraction_bits).astype(np.int32))
        q = x / quantum
        q = np.rint(q) if mode == "nearest" else np.trunc(q)
        out = q * quantum
    out = np.where(np.isfinite(x), out, x)
    return np.where(x == 0, x, out)


def _e4m3_exponent(vals: np.ndarray) -> np.ndarray:
    """Exponent field of e4m3 values as used for alignment: max(floor(log2|v|), -6).

    Zeros get a very small exponent so they never set an alignment maximum.
    """
    _, e = np.frexp(vals)
    exp = np.maximum(e.astype(np.int64) - 1, _E4M3_MIN_NORMAL_EXP)
    return np.where(vals == 0, -(1 << 20), exp)


def _check_pair_lhs(a_bits, sfa):
    a = _as_bits(a_bits, "a_bits")
    s = _as_scales(sfa, "sfa")
    if a.ndim < 2:
        raise ValueError(f"a_bits must be [..., m, k], got shape {a.shape}")
    *lead, m, k = a.shape
    kb = _ceil_div(k, BLOCK_K)
    if s.shape != (*lead, m, kb):
        raise ValueError(f"sfa must have shape {(*lead, m, kb)} = [..., m, ceil(k/128)] "
                         f"for a_bits of shape {a.shape}, got {s.shape}")
    return a, s


def _check_pair_rhs(b_bits, sfb):
    b = _as_bits(b_bits, "b_bits")
    s = _as_scales(sfb, "sfb")
    if b.ndim < 2:
        raise ValueError(f"b_bits must be [..., n, k], got shape {b.shape}")
    *lead, n, k = b.shape
    nb, kb = _ceil_div(n, BLOCK_K), _ceil_div(k, BLOCK_K)
    if s.shape != (*lead, nb, kb):
        raise ValueError(f"sfb must have shape {(*lead, nb, kb)} = "
                         f"[..., ceil(n/128), ceil(k/128)] for b_bits of shape {b.shape}, "
                         f"got {s.shape}")
    return b, s


def _check_gemm_2d(a_bits, sfa, b_bits, sfb):
    a, sa = _check_pair_lhs(a_bits, sfa)
    b, sb = _check_pair_rhs(b_bits, sfb)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"expected 2-D a_bits [m, k] and b_bits [n, k], got shapes "
                         f"{a.shape} and {b.shape}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K mismatch: a_bits is {a.shape}, b_bits is {b.shape}")
    return a, sa, b, sb
