"""NumPy oracle for cugemm8: quantisation, references, accumulation models, bounds.

CPU only.  This module imports NumPy and ml_dtypes and nothing else (never
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
"""
from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

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
]

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


# ---------------------------------------------------------------------------
# e4m3fn encode / decode
# ---------------------------------------------------------------------------

def e4m3_to_float(bits) -> np.ndarray:
    """Decode e4m3fn bit patterns to float32.

    Parameters
    ----------
    bits : array_like of uint8 (or ``ml_dtypes.float8_e4m3fn``), any shape
        OCP FP8 E4M3FN encodings: 1 sign, 4 exponent (bias 7), 3 mantissa
        bits; ``0x7F`` / ``0xFF`` are NaN; there is no Inf.

    Returns
    -------
    numpy.ndarray of float32, same shape.  Exact (every e4m3fn value is a
    float32 value).

    Raises
    ------
    TypeError
        If ``bits`` is not uint8 / float8_e4m3fn.

    Notes
    -----
    Decoding goes through a ``ml_dtypes.float8_e4m3fn`` view of the bytes.
    """
    b = _as_bits(bits, "bits")
    return b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def float_to_e4m3(x) -> np.ndarray:
    """Encode real values as e4m3fn bit patterns, saturating finite overflow.

    Rules (the GPU quantiser must match them bit for bit):

    1. the input is converted to float32 first (so a finite float64 beyond
       float32's range becomes +-Inf here, and then NaN by rule 4);
    2. finite values are clipped to [-448, 448], then rounded to the nearest
       e4m3fn value, ties to even (``ml_dtypes`` cast).  Values below half
       the smallest subnormal (|x| <= 2^-10) become a signed zero; the sign of
       zero is kept (-0.0 encodes as 0x80);
    3. NaN encodes as NaN with its sign kept: 0x7F, or 0xFF for negative NaN;
    4. +Inf and -Inf encode as NaN (0x7F / 0xFF).  e4m3fn has no Inf; mapping
       Inf to NaN rather than to +-448 keeps a non-finite input visible in the
       GEMM output instead of silently turning it into a large finite value.

    Plain casts differ from this: ``ml_dtypes`` turns 465 into NaN
    (jax-ml/ml_dtypes#260) and eager PyTorch turns anything >= 464 into NaN
    (pytorch/ao#1912; jax-ml/ml_dtypes#260, #400).

    Parameters
    ----------
    x : array_like of real numbers, any shape.

    Returns
    -------
    numpy.ndarray of uint8, same shape.

    Raises
    ------
    TypeError
        For non-real input (complex, object, strings).
    """
    x32 = _to_float32(x)
    clipped = np.clip(x32, np.float32(-E4M3_MAX), np.float32(E4M3_MAX))
    with np.errstate(invalid="ignore", over="ignore"):
        bits = clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).copy()
    nonfinite = ~np.isfinite(x32)
    if np.any(nonfinite):
        nan_bits = np.where(np.signbit(x32), np.uint8(0xFF), np.uint8(0x7F))
        bits = np.where(nonfinite, nan_bits, bits).astype(np.uint8)
    return bits


# ---------------------------------------------------------------------------
# Quantisation
# ---------------------------------------------------------------------------

#: Smallest accepted ``min_amax``: every scale is then a normal float32
#: (>= 2^-126), which the GPU quantisers' exact division relies on.
MIN_AMAX_FLOOR = 448.0 * 2.0 ** -126          # = 7 * 2^-120, exact in float32


def check_quant_options(min_amax, pow2_scale) -> np.float32:
    """Validate the quantisers' options (shared by this reference and the GPU
    quantisers, so both accept exactly the same values).

    Returns ``float32(min_amax)``.

    Raises:
        TypeError: ``pow2_scale`` is not a bool, or ``min_amax`` is not a
            real number (bools are rejected).
        ValueError: ``min_amax`` is not finite and positive, overflows
            float32, or is below ``MIN_AMAX_FLOOR`` (448 * 2^-126).
    """
    if not isinstance(pow2_scale, (bool, np.bool_)):
        raise TypeError(f"pow2_scale must be a bool, got {type(pow2_scale).__name__}")
    if isinstance(min_amax, (bool, np.bool_)) or not isinstance(min_amax, numbers.Real):
        raise TypeError(f"min_amax must be a real number, got {type(min_amax).__name__}")
    value = float(min_amax)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"min_amax must be finite and > 0, got {min_amax!r}")
    with np.errstate(over="ignore"):
        f32 = np.float32(value)
    if not np.isfinite(f32):
        raise ValueError(f"min_amax = {min_amax!r} overflows float32")
    if not f32 >= np.float32(MIN_AMAX_FLOOR):
        raise ValueError(f"min_amax = {min_amax!r} is below {MIN_AMAX_FLOOR:.6g} (448 * 2^-126): "
                         f"min_amax / 448 must be a normal float32 so every scale is")
    return f32



def _scale_from_amax(amax: np.ndarray, min_amax: float, pow2_scale: bool) -> np.ndarray:
    floor = check_quant_options(min_amax, pow2_scale)
    # np.maximum propagates NaN, so a NaN group keeps a NaN scale.
    amax = np.maximum(amax.astype(np.float32), floor)
    scale = (amax / np.float32(E4M3_MAX)).astype(np.float32)
    if pow2_scale:
        scale = _ceil_pow2(scale)
    return scale


def _ceil_pow2(s: np.ndarray) -> np.ndarray:
    """Smallest power of two >= s (float32, s > 0); non-finite values pass."""
    s = np.asarray(s, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        f, e = np.frexp(s)                        # s = f * 2^e, f in [0.5, 1)
        p = np.where(f == np.float32(0.5), s,
                     np.ldexp(np.float32(1.0), e.astype(np.int32)).astype(np.float32))
    return np.where(np.isfinite(s), p, s).astype(np.float32)


def per_token_cast_to_fp8(x, *, min_amax: float = 1e-4, pow2_scale: bool = False):
    """Quantise activations per token and per 128 K ("1x128" scaling).

    Recipe of DeepGEMM ``tests/test_core.py::per_token_cast_to_fp8``, with the
    rounding steps pinned down so that a GPU quantiser can match bit for bit:

    1. ``x`` is converted to float32; each row is split into 1x128 groups
       along K, K zero-padded to a multiple of 128 (padding never changes
       amax);
    2. ``amax = max(|x|)`` over the group, NaN propagating;
       ``amax = max(amax, float32(min_amax))``;
    3. ``scale = amax / 448`` in float32 (IEEE division, RNE);
       with ``pow2_scale`` it is replaced by ``2^ceil(log2(scale))``, the
       smallest power of two >= scale (UE8M0-style, exact);
    4. ``payload = float_to_e4m3(x_f32 / scale_f32)``: a float32 IEEE division
       (RNE) -- not a multiplication by ``448/amax`` -- then the saturating
       e4m3fn cast of :func:`float_to_e4m3`.

    Non-finite input: a NaN in a group makes amax and the scale NaN, so the
    whole group's payload is NaN.  An Inf makes amax and the scale Inf; the
    Inf element encodes as NaN (Inf/Inf) and its finite neighbours as 0, so
    the dequantised group is NaN everywhere (0 * Inf = NaN).  Other groups
    (other rows, other K blocks) are unaffected.  All-zero groups get the
    finite, positive scale ``float32(min_amax)/448`` and zero payload.

    Parameters
    ----------
    x : array_like, real, shape ``[..., m, k]`` (2-D ``[m, k]`` or batched
        ``[g, m, k]``; any leading dims).  Units: whatever the activations are.
    min_amax : float, keyword-only
        Lower clamp of amax (DeepGEMM uses 1e-4).  Must be finite and > 0.
    pow2_scale : bool, keyword-only
        Round each scale up to a power of two.

    Returns
    -------
    a_bits : numpy.ndarray of uint8, shape ``[..., m, k]``
        e4m3fn bit patterns.
    sfa : numpy.ndarray of float32, shape ``[..., m, ceil(k/128)]``
        Dequantisation scales (``x ~= e4m3(a_bits) * sfa``), row-major here;
        the GPU layout (MN-major) is the caller's business.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 dimensions, or ``min_amax`` is invalid.
    TypeError
        If ``x`` is not real-valued.
    """
    x32 = _to_float32(x)
    if x32.ndim < 2:
        raise ValueError(f"x must be [..., m, k] with at least 2 dims, got shape {x32.shape}")
    *lead, m, k = x32.shape
    kb = _ceil_div(k, BLOCK_K)
    pad = kb * BLOCK_K - k
    xp = np.pad(x32, [(0, 0)] * (x32.ndim - 1) + [(0, pad)])
    groups = xp.reshape(*lead, m, kb, BLOCK_K)
    amax = np.max(np.abs(groups), axis=-1)
    scale = _scale_from_amax(amax, min_amax, pow2_scale)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = (groups / scale[..., None]).astype(np.float32)
    bits = float_to_e4m3(q).reshape(*lead, m, kb * BLOCK_K)[..., :k]
    return np.ascontiguousarray(bits), scale


def per_block_cast_to_fp8(w, *, min_amax: float = 1e-4, pow2_scale: bool = False):
    """Quantise weights per 128x128 block.

    Same recipe and rounding rules as :func:`per_token_cast_to_fp8`
    (DeepGEMM ``tests/test_core.py::per_block_cast_to_fp8``), with amax taken
    over each 128 (N) x 128 (K) tile; N and K are zero-padded to multiples of
    128.  A NaN/Inf poisons only its own 128x128 block.

    Parameters
    ----------
    w : array_like, real, shape ``[..., n, k]`` (2-D ``[n, k]`` or batched
        experts ``[g, n, k]``).
    min_amax, pow2_scale : see :func:`per_token_cast_to_fp8`.

    Returns
    -------
    b_bits : numpy.ndarray of uint8, shape ``[..., n, k]``
    sfb : numpy.ndarray of float32, shape ``[..., ceil(n/128), ceil(k/128)]``

    Raises
    ------
    ValueError, TypeError
        As :func:`per_token_cast_to_fp8`.
    """
    w32 = _to_float32(w, "w")
    if w32.ndim < 2:
        raise ValueError(f"w must be [..., n, k] with at least 2 dims, got shape {w32.shape}")
    *lead, n, k = w32.shape
    nb, kb = _ceil_div(n, BLOCK_K), _ceil_div(k, BLOCK_K)
    wp = np.pad(w32, [(0, 0)] * (w32.ndim - 2) + [(0, nb * BLOCK_K - n), (0, kb * BLOCK_K - k)])
    tiles = wp.reshape(*lead, nb, BLOCK_K, kb, BLOCK_K)
    amax = np.max(np.abs(tiles), axis=(-3, -1))
    scale = _scale_from_amax(amax, min_amax, pow2_scale)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = (tiles / scale[..., :, None, :, None]).astype(np.float32)
    bits = float_to_e4m3(q).reshape(*lead, nb * BLOCK_K, kb * BLOCK_K)[..., :n, :k]
    return np.ascontiguousarray(bits), scale


# ---------------------------------------------------------------------------
# Dequantisation and float64 references
# ---------------------------------------------------------------------------

def dequantize_lhs(a_bits, sfa) -> np.ndarray:
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


def dequantize_rhs(b_bits, sfb) -> np.ndarray:
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


def ref_gemm_nt(a_bits, sfa, b_bits, sfb) -> np.ndarray:
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


def ref_gemm_contiguous(a_bits, sfa, b_bits, sfb, m_indices) -> np.ndarray:
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


def masked_valid_rows(masked_m, m_max: int) -> np.ndarray:
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


def ref_gemm_masked(a_bits, sfa, b_bits, sfb, masked_m) -> np.ndarray:
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


# ---------------------------------------------------------------------------
# Tensor-core and promotion models
# ---------------------------------------------------------------------------

def _hopper_k32_step(acc: np.ndarray, a_vals: np.ndarray, b_vals: np.ndarray,
                     mantissa_bits: int) -> np.ndarray:
    """One ``wgmma ... k32 .f32.e4m3.e4m3`` step as measured on an H200.

    ``acc`` float64 ``[m, n]`` (already on the accumulator grid, 0 for a
    cleared accumulator), ``a_vals`` float64 ``[m, c]``, ``b_vals`` ``[n, c]``
    with ``c <= 32`` e4m3 values.  Returns the new accumulator.
    """
    prods = a_vals[:, None, :] * b_vals[None, :, :]              # exact
    ea = _e4m3_exponent(a_vals)
    eb = _e4m3_exponent(b_vals)
    esum = ea[:, None, :] + eb[None, :, :]
    esum = np.where(prods == 0, -(1 << 20), esum)
    e_max = esum.max(axis=-1) if esum.shape[-1] else np.full(acc.shape, -(1 << 20))
    _, e_acc = np.frexp(acc)
    e_acc = np.where(acc == 0, -(1 << 20), e_acc.astype(np.int64) - 1)
    e_align = np.maximum(e_max, e_acc)
    e_align = np.maximum(e_align, -1000)                          # all-zero: any grid works
    grid = np.ldexp(1.0, (e_align - mantissa_bits).astype(np.int32))
    with np.errstate(invalid="ignore", over="ignore"):
        kept = np.trunc(prods / grid[..., None]) * grid[..., None]
        s = np.trunc(acc / grid) * grid + kept.sum(axis=-1)
    return _round_to_bits(s, mantissa_bits, "truncate")


def tensor_core_partial_sums(a_bits, b_bits, *, mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                             model: str = "round") -> np.ndarray:
    """Per-128-K-block partial sums ``sum_{k in kb} A[m,k] * B[n,k]`` (payload units).

    This is what the tensor core hands to each promotion step, before any
    scale is applied.

    Models
    ------
    ``"exact"``
        The exact sum.  In float64 it *is* exact: e4m3 products are multiples
        of 2^-18 below 2^17.7, and 128 of them stay below 2^25, so every
        partial sum fits 53 bits.
    ``"round"`` (default)
        The exact sum rounded to ``mantissa_bits`` fraction bits, ties to even:
        the simple upper-bound model of a short accumulator.
    ``"truncate"``
        The exact sum truncated toward zero to ``mantissa_bits`` fraction bits.
    ``"hopper"``
        Emulation of four ``k32`` WGMMA steps as measured on an H200 (CUDA 13
        driver; FP8 GEMMs with K = 32, 64, 128 through cuBLASLt with fast
        accumulation, i.e. WGMMA with no promotion, compared with exact sums).  Per k32 step: the alignment exponent ``E`` is the
        maximum of the accumulator's exponent and, over the nonzero products,
        ``e(a) + e(b)`` with ``e(v) = max(floor(log2|v|), -6)``; every product
        is *individually* truncated toward zero to a multiple of
        ``2^(E - mantissa_bits)``; the truncated products and the accumulator
        are summed exactly; the sum is truncated toward zero to
        ``mantissa_bits`` fraction bits.  The first step starts from a cleared
        accumulator (``scale-d = 0``).  Costs ``m * n * k`` work and memory
        ``m * n * 32``; meant for small shapes.

        More precisely, per step: ``E = max(e_acc, max_i e(a_i) + e(b_i))``,
        ``grid = 2^(E - mantissa_bits)``; the accumulator *and* every product
        are truncated toward zero to multiples of ``grid`` (the accumulator
        loses bits when the products' exponent is larger); the sum of those is
        exact; the result is truncated toward zero to ``mantissa_bits``
        fraction bits.

        Evidence: with one product 448*448 = 200704 in a k32 step, 1..31 more
        products of 8 in the same step all survive (grid 8 = 2^(16-13)), while
        in the next step (accumulator 200704, exponent 17) every product below
        16 is dropped, one by one (31 products of 15 lose 465);
        200704 - 15 -> 200688 (truncation toward zero).  Against the hardware
        this emulation was bit-exact on 196,608 block sums (K = 32, 64, 128;
        normal, uniform, log-normal, sparse, subnormal, exponent-spread and
        random-code payloads; 0 mismatches).  DeepSeek-V3 report section
        3.5.2 describes the same alignment-and-truncate scheme.

    Parameters
    ----------
    a_bits : uint8 ``[m, k]``; b_bits : uint8 ``[n, k]``
    mantissa_bits : int, keyword-only (default 13)
    model : str, keyword-only

    Returns
    -------
    numpy.ndarray of float64, shape ``[m, n, ceil(k/128)]``.

    Raises
    ------
    ValueError
        For bad shapes or an unknown model.
    """
    a = _as_bits(a_bits, "a_bits")
    b = _as_bits(b_bits, "b_bits")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"expected a_bits [m, k] and b_bits [n, k], got {a.shape} and {b.shape}")
    if model not in ("exact", "round", "truncate", "hopper"):
        raise ValueError(f"unknown tensor-core model {model!r}; use 'exact', 'round', "
                         "'truncate' or 'hopper'")
    if int(mantissa_bits) < 1:
        raise ValueError(f"mantissa_bits must be >= 1, got {mantissa_bits}")
    m, k = a.shape
    n = b.shape[0]
    kb = _ceil_div(k, BLOCK_K)
    av = e4m3_to_float(a).astype(np.float64)
    bv = e4m3_to_float(b).astype(np.float64)
    out = np.empty((m, n, kb), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(kb):
            lo, hi = j * BLOCK_K, min(k, (j + 1) * BLOCK_K)
            if model == "hopper":
                acc = np.zeros((m, n), dtype=np.float64)
                for c in range(lo, hi, MMA_K):
                    acc = _hopper_k32_step(acc, av[:, c:min(hi, c + MMA_K)],
                                           bv[:, c:min(hi, c + MMA_K)], int(mantissa_bits))
                out[:, :, j] = acc
                continue
            p = av[:, lo:hi] @ bv[:, lo:hi].T
            if model == "round":
                p = _round_to_bits(p, int(mantissa_bits), "nearest")
            elif model == "truncate":
                p = _round_to_bits(p, int(mantissa_bits), "truncate")
            out[:, :, j] = p
    return out


def _fp32_scale_products(sfa64: np.ndarray, sfb64: np.ndarray, n: int) -> np.ndarray:
    """``fl32(sfa[m, kb] * sfb[n // 128, kb])`` as float64 ``[m, n, kb]``."""
    sa = sfa64.astype(np.float32)
    sb = np.repeat(sfb64.astype(np.float32), BLOCK_K, axis=0)[:n]          # [n, kb]
    with np.errstate(over="ignore", invalid="ignore"):
        w = sa[:, None, :] * sb[None, :, :]                                 # float32 RNE
    return w.astype(np.float64)


def promoted_accumulation_model(a_bits, sfa, b_bits, sfb, *,
                                mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                                tensor_core: str = "round", k_splits: int = 1,
                                warpgroup_split: bool = False, split_skew: int = 0) -> np.ndarray:
    """Model of the promoted kernel's FP32 accumulator (before BF16 rounding).

    For each 128-K block ``kb`` in increasing order::

        p      = tensor_core_partial_sums(...)[:, :, kb]       # payload units
        w      = fl32(sfa[m, kb] * sfb[n // 128, kb])          # float32 product
        final  = fl32(final + w * p)                           # FFMA, RNE

    starting from ``final = 0`` (DeepSeek-V3 report section 3.3: promotion at
    N_C = 128; DeepGEMM's ``final_accum += scale * accum``, which the compiler
    contracts to FFMA).  The FFMA is emulated exactly (single rounding, via
    float64 round-to-odd) whenever ``w * p`` is exact in float64, i.e. for
    every model but ``"exact"`` (whose partial sums can need 43 bits).  With
    ``tensor_core="hopper"`` the result is therefore a bit-exact prediction
    of a kernel that runs four k32 WGMMAs per block from a cleared
    accumulator and promotes with ``fmaf(sfa*sfb, acc, final)`` in block
    order.  Checked on an H200 against ``cugemm8.gemm_fp8_fp8_bf16_nt``:
    ``round_to_bf16`` of this model equalled the kernel's BF16 output bit for
    bit on all 387,296 outputs compared (shapes 64x128x128 to 200x264x2048
    and 1x2112x7168; random codes, block-varied normal, uniform positive and
    log-normal data; v0.1, whose kernels all summed in block order).

    Kernels that split K sum in another order, which ``k_splits`` and
    ``warpgroup_split`` select (cuda_src/fp8_gemm_1d2d.cuh):

    - ``warpgroup_split`` (every BLOCK_M = 64 kernel): within each CTA's
      share of K, local blocks ``j`` with ``j % 2 == w`` are chained by
      warpgroup ``w`` from zero, then ``final = fl32(chain_0 + chain_1)``;
    - ``k_splits = 2`` (``GemmConfig.num_k_splits``): CTA 0 of the pair
      takes blocks ``[0, nkb/2 + split_skew)`` and CTA 1 the rest (``nkb``
      even), and ``final = fl32(part_0 + part_1)``.  The kernels' skew is
      :func:`cugemm8._config.split_k_skew` (2 with BLOCK_M = 128 and
      ``nkb >= 16``, else 0).

    All additions keep subnormals (``add.rn.f32``).  The split orders have
    not been compared bit for bit on a GPU yet; :func:`error_bound` covers
    every order (its FP32 term bounds any summation tree of ``nkb`` terms).

    Parameters
    ----------
    a_bits, sfa, b_bits, sfb : as :func:`ref_gemm_nt` (2-D only).
    mantissa_bits : int, keyword-only
        Tensor-core accumulator fraction bits (13 on Hopper).
    tensor_core : str, keyword-only
        ``"round"`` (default: the block's exact sum rounded to nearest with
        ``mantissa_bits`` fraction bits), ``"truncate"``, ``"exact"`` or
        ``"hopper"`` (per-k32 emulation; see :func:`tensor_core_partial_sums`).
    k_splits : int, keyword-only
        1 (default) or 2: K split across a CTA pair (see above).
    warpgroup_split : bool, keyword-only
        The BLOCK_M = 64 kernels' even / odd split between two warpgroups.
    split_skew : int, keyword-only
        With ``k_splits = 2``: blocks CTA 0 takes beyond half (even, ``0 <=
        split_skew < nkb/2``).

    Returns
    -------
    numpy.ndarray of float32, shape ``[m, n]``.

    Raises
    ------
    ValueError
        On shape mismatch, unknown model, ``k_splits`` not 1 or 2,
        ``k_splits = 2`` with an odd number of 128-K blocks, or a
        ``split_skew`` that is odd, negative or leaves CTA 1 no block.
    """
    a, sa, b, sb = _check_gemm_2d(a_bits, sfa, b_bits, sfb)
    nkb = _ceil_div(a.shape[1], BLOCK_K)
    if k_splits not in (1, 2) or isinstance(k_splits, bool):
        raise ValueError(f"k_splits must be 1 or 2, got {k_splits!r}")
    if k_splits == 2 and nkb % 2:
        raise ValueError(f"k_splits = 2 needs an even number of 128-K blocks, got {nkb}")
    if (isinstance(split_skew, bool) or not isinstance(split_skew, (int, np.integer))
            or split_skew < 0 or split_skew % 2 or (split_skew and (k_splits != 2 or split_skew >= nkb // 2))):
        raise ValueError(f"split_skew must be an even int in [0, nkb/2) with k_splits = 2 "
                         f"(nkb = {nkb}), got {split_skew!r}")
    p = tensor_core_partial_sums(a, b, mantissa_bits=mantissa_bits, model=tensor_core)
    w = _fp32_scale_products(sa, sb, b.shape[0])

    def chain(blocks):
        final = np.zeros(p.shape[:2], dtype=np.float32)
        for j in blocks:
            final = _fma_f32(w[:, :, j], p[:, :, j], final.astype(np.float64))
        return final

    def add(x, y):
        # float32 addition, round to nearest: the float64 sum rounded to
        # float32 is correctly rounded (53 >= 2 * 24 + 2; S. Figueroa, "When is
        # double rounding innocuous?", SIGNUM 1995), subnormals kept.
        return (x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)

    bounds = [0, nkb] if k_splits == 1 else [0, nkb // 2 + split_skew, nkb]
    total = None
    for r in range(k_splits):
        blocks = list(range(bounds[r], bounds[r + 1]))
        part = add(chain(blocks[0::2]), chain(blocks[1::2])) if warpgroup_split else chain(blocks)
        total = part if total is None else add(total, part)
    return total


def _fma_f32(w: np.ndarray, p: np.ndarray, f: np.ndarray) -> np.ndarray:
    """``float32(w * p + f)`` with a single rounding, given ``w * p`` exact in float64.

    The float64 sum is rounded to odd (TwoSum error term decides the sticky
    bit), and rounding a round-to-odd float64 to float32 (24 <= 53 - 2 bits)
    is the correctly rounded result.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        prod = w * p
        s = prod + f
        bp = s - f
        err = (prod - bp) + (f - (s - bp))
        inexact = np.isfinite(s) & np.isfinite(err) & (err != 0)
        even = (s.view(np.int64) & 1) == 0
        toward = np.where(err > 0, np.inf, -np.inf)
        s = np.where(inexact & even, np.nextafter(s, toward), s)
        return s.astype(np.float32)


def unpromoted_accumulation_model(a_bits, sfa, b_bits, sfb, *,
                                  mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS) -> np.ndarray:
    """Model of a kernel that never promotes: the whole K in one short accumulator.

    A thought model (no real Hopper kernel can apply per-block scales inside
    the tensor core) that carries the measured accumulator behaviour over the
    whole K: for each 32-K step ``c`` (in block ``kb``) the terms are
    ``x_i = w_kb * A[m, i] * B[n, i]`` with ``w_kb = fl32(sfa * sfb)``; with
    ``E = floor(log2(max(|acc|, max_i |x_i|)))`` each term is truncated toward
    zero to a multiple of ``2^(E - mantissa_bits)``, the sum is added to the
    accumulator and the result truncated toward zero to ``mantissa_bits``
    fraction bits (the same alignment-and-truncate rule as the ``"hopper"``
    model of :func:`tensor_core_partial_sums`).  With all-positive data the
    accumulator grows, each step loses up to 33 of its ulps, and the relative
    error grows linearly with K: this is what promotion every 128 K avoids.

    Parameters
    ----------
    a_bits, sfa, b_bits, sfb : as :func:`ref_gemm_nt` (2-D only).
    mantissa_bits : int, keyword-only (default 13).

    Returns
    -------
    numpy.ndarray of float32 ``[m, n]``.  Costs ``m * n * k`` work.
    """
    a, sa, b, sb = _check_gemm_2d(a_bits, sfa, b_bits, sfb)
    m, k = a.shape
    n = b.shape[0]
    av = e4m3_to_float(a).astype(np.float64)
    bv = e4m3_to_float(b).astype(np.float64)
    w = _fp32_scale_products(sa, sb, n)
    acc = np.zeros((m, n), dtype=np.float64)
    mb = int(mantissa_bits)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for c in range(0, k, MMA_K):
            j = c // BLOCK_K
            hi = min(k, c + MMA_K)
            x = av[:, None, c:hi] * bv[None, :, c:hi] * w[:, :, j, None]
            big = np.maximum(np.abs(acc), np.abs(x).max(axis=-1))
            _, e = np.frexp(big)
            e = np.where(big == 0, -1000, e.astype(np.int64) - 1)
            grid = np.ldexp(1.0, np.maximum(e - mb, -1074).astype(np.int32))
            acc = _round_to_bits(acc + (np.trunc(x / grid[..., None]) * grid[..., None]).sum(-1),
                                 mb, "truncate")
    with np.errstate(over="ignore"):
        return acc.astype(np.float32)


# ---------------------------------------------------------------------------
# Error bound
# ---------------------------------------------------------------------------

def error_bound(a_bits, sfa, b_bits, sfb, *, mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                output: str = "bfloat16") -> np.ndarray:
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
    kb_count = _ceil_div(k, BLOCK_K)
    mb = int(mantissa_bits)
    u_tc = 2.0 ** -mb
    av = e4m3_to_float(a).astype(np.float64)
    bv = e4m3_to_float(b).astype(np.float64)
    # Effective magnitudes for the alignment exponent: e4m3 subnormals align as 2^-6.
    amag = np.where(av == 0, 0.0, np.maximum(np.abs(av), 2.0 ** _E4M3_MIN_NORMAL_EXP))
    bmag = np.where(bv == 0, 0.0, np.maximum(np.abs(bv), 2.0 ** _E4M3_MIN_NORMAL_EXP))
    sb_rows = np.repeat(sb, BLOCK_K, axis=0)[:n]                   # [n, kb]

    sum_s_tc = np.zeros((m, n))
    sum_lin = np.zeros((m, n))          # sum (2^-24 s + 2^-150)(|P| + TC)
    q_sum = np.zeros((m, n))
    ref = np.zeros((m, n))
    w_overflow = np.zeros((m, n), dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):
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
            s = np.abs(sa[:, j][:, None] * sb_rows[:, j][None, :])
            w_overflow |= s >= 2.0 ** 128
            mag = np.abs(p_cum) + e
            sum_s_tc += s * e
            sum_lin += (_FP32_U * s + _FP32_ETA) * mag
            q_sum += (s * (1 + _FP32_U) + _FP32_ETA) * mag
            ref += (sa[:, j][:, None] * sb_rows[:, j][None, :]) * p_cum
        nu = kb_count * _FP32_U
        gamma = nu / (1 - nu)
        e32 = sum_s_tc + sum_lin + gamma * q_sum + kb_count * _FP32_ETA
        if output == "bfloat16":
            bound = e32 + _BF16_U * (np.abs(ref) + e32) + _BF16_ETA
            limit = _BF16_OVERFLOW
        else:
            bound = e32
            limit = _FP32_MAX
        over = w_overflow | (q_sum > _FP32_MAX) | (np.abs(ref) + bound >= limit)
        bound = np.where(over & ~np.isnan(bound), np.inf, bound)
    return bound


# ---------------------------------------------------------------------------
# Comparison helpers
# ---------------------------------------------------------------------------

def round_to_bf16(x) -> np.ndarray:
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


def calc_diff(x, y) -> float:
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


def bf16_ulp_error(x, ref) -> np.ndarray:
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


def max_rel_error_rows(x, ref) -> np.ndarray:
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


# ---------------------------------------------------------------------------
# Test data
# ---------------------------------------------------------------------------

def block_varied_normal(rng: np.random.Generator, shape, *, block=(1, BLOCK_K),
                        spread: int = 3) -> np.ndarray:
    """Normal data with each block multiplied by ``2^u``, ``u`` uniform in [-spread, spread].

    "Block-varied data": a scale mis-indexing changes the
    answer by O(1) instead of hiding in noise.  Use ``block=(1, 128)`` for
    activations ``[m, k]`` and ``(128, 128)`` for weights ``[n, k]``; blocks
    tile the last two dims (partial blocks at the edges), leading dims get
    independent exponents.

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : tuple of int, at least 2 dims.
    block : (rows, cols), keyword-only.
    spread : int >= 0, keyword-only.

    Returns
    -------
    numpy.ndarray of float32, ``shape``.  Multiplying by 2^u is exact.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(f"shape must have at least 2 dims, got {shape}")
    br, bc = (int(block[0]), int(block[1]))
    if br < 1 or bc < 1 or int(spread) < 0:
        raise ValueError(f"block must be positive and spread >= 0, got {block}, {spread}")
    *lead, r, c = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    u = rng.integers(-int(spread), int(spread) + 1,
                     size=(*lead, _ceil_div(r, br), _ceil_div(c, bc)))
    u = np.repeat(np.repeat(u, br, axis=-2)[..., :r, :], bc, axis=-1)[..., :c]
    return np.ldexp(x, u.astype(np.int32)).astype(np.float32)


def make_m_indices(group_sizes, alignment: int = BLOCK_K):
    """Build the contiguous grouped layout's ``m_indices``.

    Alignment rule (DeepGEMM README: "the contiguous grouped
    layout needs group starts at multiples of 128"): expert ``i``'s rows start
    at ``offsets[i]``, a multiple of ``alignment``; its ``group_sizes[i]``
    token rows come first and are followed by padding rows (``m_indices =
    -1``) up to the next multiple of ``alignment``.  An expert with 0 rows
    gets no block at all (``offsets[i] == offsets[i+1]``).  Every
    ``alignment``-row block therefore belongs to at most one expert.

    Parameters
    ----------
    group_sizes : sequence of int >= 0, length g.
    alignment : int >= 1 (default 128 = BLOCK_M of the contiguous kernel).

    Returns
    -------
    m_indices : numpy.ndarray of int32, ``[m_sum]`` with
        ``m_sum = sum_i ceil(group_sizes[i] / alignment) * alignment``.
    offsets : numpy.ndarray of int64, ``[g + 1]``; expert ``i`` owns rows
        ``offsets[i] : offsets[i+1]``, its tokens being
        ``offsets[i] : offsets[i] + group_sizes[i]``; ``offsets[g] = m_sum``.

    Raises
    ------
    ValueError
        For negative sizes, non-integer sizes or ``alignment < 1``.
    """
    sizes = np.asarray(group_sizes)
    if sizes.ndim != 1 or (sizes.size and sizes.dtype.kind not in "iu"):
        raise ValueError(f"group_sizes must be a 1-D sequence of integers, got {group_sizes!r}")
    sizes = sizes.astype(np.int64)
    if np.any(sizes < 0):
        raise ValueError(f"group_sizes must be >= 0, got {sizes.tolist()}")
    alignment = int(alignment)
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    padded = -(-sizes // alignment) * alignment
    offsets = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
    m_indices = np.full(int(offsets[-1]), -1, dtype=np.int32)
    for i, (start, size) in enumerate(zip(offsets[:-1], sizes)):
        m_indices[start:start + size] = i
    return m_indices, offsets
