"""e4m3fn encoding and decoding, and the DeepSeek-V3 quantisers (1x128 per
token, 128x128 per block) with every rounding step pinned down, so that the
GPU quantisers can match them bit for bit."""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from ._common import BLOCK_K, E4M3_MAX, _as_bits, _ceil_div, _to_float32

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["e4m3_to_float", "float_to_e4m3", "per_token_cast_to_fp8", "per_block_cast_to_fp8",
           "check_quant_options", "MIN_AMAX_FLOOR"]


# ---------------------------------------------------------------------------
# e4m3fn encode / decode
# ---------------------------------------------------------------------------

def e4m3_to_float(bits: ArrayLike) -> np.ndarray:
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


def float_to_e4m3(x: ArrayLike) -> np.ndarray:
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


def check_bool(name: str, value: object) -> None:
    """``TypeError`` naming ``name`` unless ``value`` is a bool (Python's or
    NumPy's): the quantisers' flag rule, shared by this reference and the
    GPU quantisers."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_quant_options(min_amax: float, pow2_scale: bool) -> np.float32:
    """Validate the quantisers' options (shared by this reference and the GPU
    quantisers, so both accept exactly the same values).

    Returns ``float32(min_amax)``.

    Raises:
        TypeError: ``pow2_scale`` is not a bool, or ``min_amax`` is not a
            real number (bools are rejected).
        ValueError: ``min_amax`` is not finite and positive, overflows
            float32, or is below ``MIN_AMAX_FLOOR`` (448 * 2^-126).
    """
    check_bool("pow2_scale", pow2_scale)
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


def per_token_cast_to_fp8(x: ArrayLike, *, min_amax: float = 1e-4, pow2_scale: bool = False
                          ) -> tuple[np.ndarray, np.ndarray]:
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


def per_block_cast_to_fp8(w: ArrayLike, *, min_amax: float = 1e-4, pow2_scale: bool = False
                          ) -> tuple[np.ndarray, np.ndarray]:
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
