"""FP8 training (issue 21), NumPy half: the quantisers, references, promotion
model and error bound of the backward GEMMs of a linear layer, and the float64
backward they are judged against.

A linear layer ``y = x @ w.T`` (``x [tokens, in]``, ``w [out, in]``) runs three
GEMMs in FP8 (DeepSeek-V3 technical report section 3.3.1: Fprop, Dgrad and
Wgrad), each an NT GEMM ``D = A @ B.T`` over a shared dimension K::

    GEMM    result          K       A, quantised by                  B, quantised by
    fprop   y  = x @ w.T    in      x    per_token_cast_to_fp8       w    per_block_cast_to_fp8
    dgrad   dx = dy @ w     out     dy   per_token_cast_to_fp8       w.T  cast_transpose_block_fp8
    wgrad   dw = dy.T @ x   tokens  dy.T per_token_cast_to_fp8_t     x.T  per_token_cast_to_fp8_t

Fprop and dgrad are the 1D2D GEMM of :func:`cugemm8.reference.ref_gemm_nt`.
Wgrad sums over tokens, so both operands are quantised 1x128 along the
tokens ("1D1D", DeepGEMM's ``recipe=(1, 1, 128)``): :func:`ref_gemm_1d1d`;
for MoE experts whose tokens lie in contiguous runs along K, the k-grouped
form :func:`ref_k_grouped_gemm` (DeepGEMM ``k_grouped_fp8_gemm_nt_contiguous``).
The wgrad output is FP32, optionally accumulated onto an FP32 ``c`` (DeepGEMM
copies C into D and its SM90 1D1D kernel adds its result to D with a TMA
reduce-add); :func:`promoted_accumulation_model_1d1d` and
:func:`error_bound_1d1d` are the 1D1D counterparts of
:func:`~cugemm8.reference.promoted_accumulation_model` and
:func:`~cugemm8.reference.error_bound`.  :func:`ref_linear_backward` is the
float64 backward of the unquantised layer (the end-to-end reference).

Sources: DeepSeek-V3 technical report, section 3.3 (FP8 training; 3.3.2:
1x128 activation tiles, 128x128 weight blocks, promotion to FP32 every N_C = 128)
and section 3.5.2 (for the backward pass, activations stored as 1x128 tiles
must be dequantised, transposed and re-quantised as 128x1 tiles); DeepGEMM
(``fp8_gemm_nt`` with ``recipe=(1, 1, 128)``, ``k_grouped_fp8_gemm_nt_contiguous``
and its test generators, ``deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d1d.cuh``).
"""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from ._common import (_FP32_MAX, _FP32_U, BLOCK_K, TENSOR_CORE_MANTISSA_BITS, _as_bits, _as_scales,
                      _ceil_div)
from .bound import _promotion_error_terms
from .gemm import dequantize_lhs
from .promotion import _fma_f32, tensor_core_partial_sums
from .quant import check_bool, per_block_cast_to_fp8, per_token_cast_to_fp8

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Literal

    from numpy.typing import ArrayLike

__all__ = ["per_token_cast_to_fp8_t", "cast_transpose_block_fp8", "ref_gemm_1d1d",
           "ref_k_grouped_gemm", "promoted_accumulation_model_1d1d", "error_bound_1d1d",
           "ref_linear_backward"]

_TENSOR_CORE_MODELS = ("exact", "round", "truncate", "hopper")


# ---------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------

def _check_1x128(bits, sf, bits_name: str, sf_name: str, rows: str):
    """A 2-D payload ``[rows, k]`` and its 1x128 scales ``[rows, ceil(k/128)]``."""
    arr = _as_bits(bits, bits_name)
    s = _as_scales(sf, sf_name)
    if arr.ndim != 2:
        raise ValueError(f"{bits_name} must be 2-D [{rows}, k], got shape {arr.shape}")
    r, k = arr.shape
    want = (r, _ceil_div(k, BLOCK_K))
    if s.shape != want:
        raise ValueError(f"{sf_name} must have shape {want} = [{rows}, ceil(k/128)] for "
                         f"{bits_name} of shape {arr.shape}, got {s.shape}")
    return arr, s


def _check_1d1d(a_bits, sfa, b_bits, sfb):
    a, sa = _check_1x128(a_bits, sfa, "a_bits", "sfa", "m")
    b, sb = _check_1x128(b_bits, sfb, "b_bits", "sfb", "n")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"b_bits must have the K of a_bits: a_bits is {a.shape}, "
                         f"b_bits is {b.shape}")
    return a, sa, b, sb


def _check_c(c, shape: tuple, dims: str) -> np.ndarray:
    """``c`` as float64 holding float32 values (the kernel reads FP32 C)."""
    arr = _as_scales(c, "c")
    if arr.shape != shape:
        raise ValueError(f"c must have shape {shape} = [{dims}], got {arr.shape}")
    return arr


def _check_ks(ks, k_total: int) -> list[int]:
    if isinstance(ks, (str, bytes, Mapping, AbstractSet)) or not isinstance(ks, Iterable):
        raise TypeError(f"ks must be a sequence of ints, one per group, got {type(ks).__name__}")
    if isinstance(ks, np.ndarray) and ks.ndim != 1:
        raise TypeError(f"ks must be a 1-D sequence of ints, got an array of shape {ks.shape}")
    sizes = list(ks)
    for s in sizes:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral):
            raise TypeError(f"ks must hold ints, got {s!r} ({type(s).__name__})")
    sizes = [int(s) for s in sizes]
    if any(s < 0 or s % BLOCK_K for s in sizes):
        raise ValueError(f"ks must hold non-negative multiples of {BLOCK_K} (no 128-token "
                         f"scale block may straddle two groups), got {sizes}")
    if sum(sizes) != k_total:
        raise ValueError(f"ks must sum to the K of a_bits and b_bits ({k_total}), got "
                         f"sum(ks) = {sum(sizes)}")
    return sizes


def _check_tc_args(mantissa_bits, tensor_core=None) -> int:
    if (isinstance(mantissa_bits, (bool, np.bool_)) or not isinstance(mantissa_bits, numbers.Integral)
            or mantissa_bits < 1):
        raise ValueError(f"mantissa_bits must be an int >= 1, got {mantissa_bits!r}")
    if tensor_core is not None and tensor_core not in _TENSOR_CORE_MODELS:
        raise ValueError(f"tensor_core must be one of {_TENSOR_CORE_MODELS}, got {tensor_core!r}")
    return int(mantissa_bits)


def _to_float64(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    ok = arr.dtype.kind in "fiu" or arr.dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                                  ml_dtypes.float8_e5m2)
    if not ok:
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float64)


# ---------------------------------------------------------------------------
# Quantisers for the backward GEMMs
# ---------------------------------------------------------------------------

def per_token_cast_to_fp8_t(x: ArrayLike, *, min_amax: float = 1e-4, pow2_scale: bool = False,
                            mn_major: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Quantise ``x [m, k]`` 1x128 along the token dimension m, returned transposed.

    **Definition**: ``per_token_cast_to_fp8_t(x)`` equals
    ``per_token_cast_to_fp8(x.T)`` bit for bit (payload and scales); it is
    computed that way (``swapaxes`` of the last two dims for batched ``x``),
    so every recipe step, rounding rule and NaN/Inf rule of
    :func:`~cugemm8.reference.per_token_cast_to_fp8` applies unchanged.
    Each scale granule is 128 consecutive tokens of one channel: the "128x1
    tiles" into which DeepSeek-V3 (technical report section 3.5.2)
    re-quantises activations for the backward pass.  When m is not a
    multiple of 128, the last granule of each channel holds the ``m % 128``
    remaining tokens, zero-padded (padding never changes amax), exactly as
    :func:`~cugemm8.reference.per_token_cast_to_fp8` treats a K tail.

    This is the operand quantiser of the wgrad GEMM ``dw = dy.T @ x``, which
    sums over tokens: ``A = per_token_cast_to_fp8_t(dy)`` (``[out, tokens]``)
    and ``B = per_token_cast_to_fp8_t(x)`` (``[in, tokens]``), then
    :func:`ref_gemm_1d1d`.  It is *not* the transpose of the forward cast
    ``per_token_cast_to_fp8(x)``, whose granules lie along the channels.

    Parameters
    ----------
    x : array_like, real, shape ``[..., m, k]``: tokens x channels (activations
        ``x [tokens, in]`` or output gradients ``dy [tokens, out]``; any
        leading dims).
    min_amax, pow2_scale : keyword-only; see
        :func:`~cugemm8.reference.per_token_cast_to_fp8` (defaults 1e-4, False).
    mn_major : keyword-only bool, accepted for parity with
        :func:`cugemm8.per_token_cast_to_fp8_t` (code can switch between the
        two); it changes nothing here: the values are the same, and a NumPy
        array carries no TMA layout.

    Returns
    -------
    bits : numpy.ndarray of uint8, shape ``[..., k, m]``, C-contiguous
        e4m3fn bit patterns of ``x`` transposed: K-major (contiguous along
        tokens) for a GEMM that reduces over m.
    sf : numpy.ndarray of float32, shape ``[..., k, ceil(m/128)]``
        ``sf[c, mb]`` dequantises tokens ``128 mb ... 128 mb + 127`` of
        channel ``c`` (``x.T ~= e4m3(bits) * sf`` per granule).

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 dimensions, or ``min_amax`` is invalid.
    TypeError
        If ``x`` is not real-valued, ``min_amax`` is not a real number, or
        ``pow2_scale`` or ``mn_major`` is not a bool.
    """
    check_bool("mn_major", mn_major)
    arr = np.asarray(x)
    if arr.ndim < 2:
        raise ValueError(f"x must be [..., m, k] with at least 2 dims, got shape {arr.shape}")
    return per_token_cast_to_fp8(np.swapaxes(arr, -1, -2), min_amax=min_amax, pow2_scale=pow2_scale)


def cast_transpose_block_fp8(w: ArrayLike, *, min_amax: float = 1e-4, pow2_scale: bool = False
                             ) -> tuple[np.ndarray, np.ndarray]:
    """Quantise weights ``w [n, k]`` per 128x128 block and return them transposed (dgrad).

    **Definition**: ``(wt_bits, sft)`` is ``per_block_cast_to_fp8(w)`` with
    both the payload and the scale grid transposed (last two dims), bit for
    bit; it is computed that way.  It also equals
    ``per_block_cast_to_fp8(w.T)`` bit for bit (tested): a 128x128 tile's
    amax, and the division of each element by its tile's scale, do not
    depend on the tile's orientation.  So the 128x128 scales of W simply
    transpose for dgrad and the weights need no second quantisation
    (DeepSeek-V3 technical report section 3.3.2: weights quantised per
    128x128 block), unlike the 1x128 activations
    (:func:`per_token_cast_to_fp8_t`).

    The dgrad GEMM ``dx = dy @ w`` is the NT GEMM
    ``ref_gemm_nt(*per_token_cast_to_fp8(dy), *cast_transpose_block_fp8(w))``
    with ``B = w.T`` (``[in, out]``, K = out).

    Parameters
    ----------
    w : array_like, real, shape ``[..., n, k]`` (a linear layer's weight
        ``[out, in]``, or experts ``[g, out, in]``).
    min_amax, pow2_scale : keyword-only; see
        :func:`~cugemm8.reference.per_token_cast_to_fp8`.

    Returns
    -------
    wt_bits : numpy.ndarray of uint8, shape ``[..., k, n]``, C-contiguous
        e4m3fn bits of ``w.T``.
    sft : numpy.ndarray of float32, shape ``[..., ceil(k/128), ceil(n/128)]``
        ``sft[kb, nb] = sfb[nb, kb]`` of ``per_block_cast_to_fp8(w)``: the
        SFB of ``w.T`` as the B operand of an NT GEMM.

    Raises
    ------
    ValueError, TypeError
        As :func:`~cugemm8.reference.per_block_cast_to_fp8` (fewer than 2
        dims, invalid ``min_amax``; non-real ``w``).
    """
    bits, sf = per_block_cast_to_fp8(w, min_amax=min_amax, pow2_scale=pow2_scale)
    return (np.ascontiguousarray(np.swapaxes(bits, -1, -2)),
            np.ascontiguousarray(np.swapaxes(sf, -1, -2)))


# ---------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------

def ref_gemm_1d1d(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike,
                  c: ArrayLike | None = None) -> np.ndarray:
    """Float64 reference of the 1D1D GEMM (both operands scaled 1x128 along K)::

        D[m, n] = c[m, n] + sum_kb SFA[m, kb] * SFB[n, kb] * sum_{k in kb} A[m, k] * B[n, k]

    (``c`` term only when given).  This is the wgrad GEMM: K is the token
    dimension, ``A = dy.T`` and ``B = x.T`` quantised with
    :func:`per_token_cast_to_fp8_t`; DeepGEMM runs it as ``fp8_gemm_nt``
    with ``recipe=(1, 1, 128)`` and FP32 output.  Computed as
    ``c + dequant(A) @ dequant(B).T`` in float64 from the same FP8 bytes
    and scales a kernel sees: the only error is float64 summation.

    Parameters
    ----------
    a_bits : uint8 ``[m, k]`` e4m3fn bits (or ``ml_dtypes.float8_e4m3fn``),
        any K.
    sfa : real ``[m, ceil(k/128)]``: one scale per row per 128 K, rounded to
        float32 first (logical shape; any strides).
    b_bits : uint8 ``[n, k]``.
    sfb : real ``[n, ceil(k/128)]``: one scale per row of B per 128 K (not
        per 128x128 block as in :func:`~cugemm8.reference.ref_gemm_nt`).
    c : real ``[m, n]``, optional: the FP32 accumulator input (rounded to
        float32 first, as the kernel reads FP32).

    Returns
    -------
    numpy.ndarray of float64, shape ``[m, n]``, in the units of the data.

    Raises
    ------
    TypeError
        ``a_bits``/``b_bits`` not uint8 / float8_e4m3fn, or ``sfa``/``sfb``/``c``
        not real (the message names the argument).
    ValueError
        ``a_bits``/``b_bits`` not 2-D, ``sfa``/``sfb`` of the wrong shape,
        ``b_bits`` with another K than ``a_bits``, or ``c`` not ``[m, n]``.
    """
    a, sa, b, sb = _check_1d1d(a_bits, sfa, b_bits, sfb)
    c64 = None if c is None else _check_c(c, (a.shape[0], b.shape[0]), "m, n")
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.matmul(dequantize_lhs(a, sa), dequantize_lhs(b, sb).T)
        return d if c64 is None else c64 + d


def ref_k_grouped_gemm(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike,
                       ks: Sequence[int], c: ArrayLike | None = None) -> np.ndarray:
    """Float64 reference of the k-grouped contiguous 1D1D GEMM (MoE wgrad).

    Semantics of DeepGEMM's ``k_grouped_fp8_gemm_nt_contiguous`` (recipe
    ``(1, 1, 128)``, FP32 output): ``g = len(ks)`` groups (experts) share
    one long K dimension (tokens), group ``e`` owning the contiguous run
    ``off_e : off_e + ks[e]`` with ``off_e = sum(ks[:e])``; each group's
    output is the 1D1D product over its own tokens only::

        D[e] = c[e] + ref_gemm_1d1d(A[:, run_e], SFA[:, run_e / 128], B[:, run_e], SFB[:, run_e / 128])

    (``c[e]`` only when ``c`` is given).  An empty group (``ks[e] == 0``)
    gives exactly ``c[e]`` (zeros without ``c``).  DeepGEMM's SM90 entry
    point requires ``c`` (it copies C into D and adds onto it); here ``c``
    is optional.  Every ``ks[e]`` is a
    multiple of 128, so no 128-token scale granule straddles two groups and
    quantising the whole ``[m, sum ks]`` tensor with
    :func:`per_token_cast_to_fp8_t` equals quantising each group apart.

    Layout: this reference takes the *logical* matrices ``A [m, sum ks]``
    and ``B [n, sum ks]`` (row-major here).  DeepGEMM's SM90 kernel reads
    K-major operands stored group by group (group ``e``'s ``[m, ks[e]]``
    block contiguous at element offset ``m * off_e``) and its scales as
    ``[sum(ks)/128, m]`` in memory (the transpose of SFA below); converting
    to and from that buffer is the caller's business.

    Parameters
    ----------
    a_bits : uint8 ``[m, K]`` e4m3fn bits, ``K = sum(ks)``.
    sfa : real ``[m, K/128]`` (1x128 along K, rounded to float32).
    b_bits : uint8 ``[n, K]``.
    sfb : real ``[n, K/128]``.
    ks : sequence of int, length g (list, tuple, range or 1-D integer
        array): tokens per group, each a non-negative multiple of 128
        (zero allowed), summing to K.
    c : real ``[g, m, n]``, optional (rounded to float32).

    Returns
    -------
    numpy.ndarray of float64, shape ``[g, m, n]``.

    Raises
    ------
    TypeError
        Wrong dtypes (as :func:`ref_gemm_1d1d`), ``ks`` not an ordered
        sequence or holding non-ints (bools and floats included).
    ValueError
        Shapes as :func:`ref_gemm_1d1d` (``c`` must be ``[g, m, n]``), or
        ``ks`` with an entry that is negative or not a multiple of 128, or
        not summing to K (the message names ``ks``).
    """
    a, sa, b, sb = _check_1d1d(a_bits, sfa, b_bits, sfb)
    sizes = _check_ks(ks, a.shape[1])
    g, m, n = len(sizes), a.shape[0], b.shape[0]
    c64 = None if c is None else _check_c(c, (g, m, n), "g, m, n")
    out = np.zeros((g, m, n)) if c64 is None else c64.copy()
    off = 0
    for e, size in enumerate(sizes):
        if size:
            run, sf_run = slice(off, off + size), slice(off // BLOCK_K, (off + size) // BLOCK_K)
            out[e] = ref_gemm_1d1d(a[:, run], sa[:, sf_run], b[:, run], sb[:, sf_run],
                                   None if c64 is None else c64[e])
        off += size
    return out


def ref_linear_backward(x: ArrayLike, w: ArrayLike, dy: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Float64 reference of the backward GEMMs of a linear layer ``y = x @ w.T``.

    Returns ``dx = dy @ w`` (dgrad) and ``dw = dy.T @ x`` (wgrad), computed
    in float64 from the unquantised inputs; with the forward ``x @ w.T``
    (fprop) these are the three GEMMs that DeepSeek-V3 (technical report
    section 3.3.1) runs in FP8.  This is the end-to-end reference of the FP8
    backward: compare ``ref_gemm_nt(*per_token_cast_to_fp8(dy),
    *cast_transpose_block_fp8(w))`` with ``dx`` and
    ``ref_gemm_1d1d(*per_token_cast_to_fp8_t(dy), *per_token_cast_to_fp8_t(x))``
    with ``dw`` through :func:`~cugemm8.reference.calc_diff`.

    Parameters
    ----------
    x : real ``[tokens, in]`` (flatten any batch dims into tokens).
    w : real ``[out, in]``.
    dy : real ``[tokens, out]``: the gradient of the loss with respect to y.

    Returns
    -------
    dx : numpy.ndarray of float64, ``[tokens, in]``.
    dw : numpy.ndarray of float64, ``[out, in]``.

    Raises
    ------
    TypeError
        If ``x``, ``w`` or ``dy`` is not real-valued.
    ValueError
        If one is not 2-D, ``w`` has another ``in`` than ``x``, or ``dy`` is
        not ``[tokens, out]``.
    """
    x64, w64, dy64 = _to_float64(x, "x"), _to_float64(w, "w"), _to_float64(dy, "dy")
    for name, arr, dims in (("x", x64, "tokens, in"), ("w", w64, "out, in"), ("dy", dy64, "tokens, out")):
        if arr.ndim != 2:
            raise ValueError(f"{name} must be 2-D [{dims}], got shape {arr.shape}")
    if w64.shape[1] != x64.shape[1]:
        raise ValueError(f"w must be [out, in] with in = {x64.shape[1]} (x is {x64.shape}), "
                         f"got {w64.shape}")
    if dy64.shape != (x64.shape[0], w64.shape[0]):
        raise ValueError(f"dy must have shape {(x64.shape[0], w64.shape[0])} = [tokens, out] for x "
                         f"{x64.shape} and w {w64.shape}, got {dy64.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        return dy64 @ w64, dy64.T @ x64


# ---------------------------------------------------------------------------
# Promotion model and error bound
# ---------------------------------------------------------------------------

def _fp32_scale_products_1d1d(sa64: np.ndarray, sb64: np.ndarray) -> np.ndarray:
    """``fl32(sfa[m, kb] * sfb[n, kb])`` as float64 ``[m, n, kb]``."""
    sa = sa64.astype(np.float32)
    sb = sb64.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        w = sa[:, None, :] * sb[None, :, :]                                 # float32 RNE
    return w.astype(np.float64)


def promoted_accumulation_model_1d1d(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike,
                                     sfb: ArrayLike, c: ArrayLike | None = None, *,
                                     mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                                     tensor_core: Literal["exact", "round", "truncate", "hopper"] = "round"
                                     ) -> np.ndarray:
    """Model of a promoted Hopper 1D1D kernel's FP32 output (wgrad).

    The float32 operations, in this order.  For each 128-K block ``kb`` in
    increasing order::

        p    = tensor_core_partial_sums(...)[:, :, kb]     # payload units
        w    = fl32(sfa[m, kb] * sfb[n, kb])               # FMUL, RNE
        acc  = fl32(acc + w * p)                           # FFMA, RNE (one rounding)

    starting from ``acc = 0``; then the output is::

        d = acc                                            # c is None
        d = fl32(c + acc)                                  # FADD, RNE, with c

    No BF16 rounding: the output is FP32.  This is
    :func:`~cugemm8.reference.promoted_accumulation_model` (DeepSeek-V3
    technical report section 3.3: promotion into FP32 every N_C = 128 K)
    with the scale product taken per output element, ``sfa[m] * sfb[n]``,
    instead of per 128 columns: DeepGEMM's SM90 1D1D kernel promotes with
    ``final_accum += scale_a * scale_b * accum`` (the scale product rounded
    first, then one FFMA) and adds its result to D = C at the end.  The
    partial sums ``p`` come from
    :func:`~cugemm8.reference.tensor_core_partial_sums` (its ``"hopper"``
    model is the per-k32 emulation measured on an H200).  The FFMA is
    emulated with a single rounding whenever ``w * p`` is exact in
    float64, i.e. for every tensor-core model but ``"exact"`` (whose
    partial sums can need 43 bits).  The final FADD is correctly rounded
    (the float64 sum of two float32 values rounded to float32: double
    rounding is innocuous since 53 >= 2 * 24 + 2; S. Figueroa, "When is
    double rounding innocuous?", SIGNUM 1995), subnormals kept, as a
    register ``add.rn.f32`` computes it; whether DeepGEMM's TMA reduce-add
    keeps FP32 subnormals has not been checked.

    The order is the block order of one CTA from a cleared accumulator.
    Split-K or warpgroup-split orders (see
    :func:`~cugemm8.reference.promoted_accumulation_model`) are not
    modelled; :func:`error_bound_1d1d` covers any summation order.

    Parameters
    ----------
    a_bits, sfa, b_bits, sfb : as :func:`ref_gemm_1d1d` (``[m, k]``,
        ``[m, ceil(k/128)]``, ``[n, k]``, ``[n, ceil(k/128)]``).
    c : real ``[m, n]``, optional; rounded to float32 first.
    mantissa_bits : int >= 1, keyword-only
        Tensor-core accumulator fraction bits (13 on Hopper).
    tensor_core : {"round", "truncate", "exact", "hopper"}, keyword-only
        The tensor-core model of :func:`~cugemm8.reference.tensor_core_partial_sums`
        (default ``"round"``).

    Returns
    -------
    numpy.ndarray of float32, shape ``[m, n]``.

    Raises
    ------
    TypeError, ValueError
        As :func:`ref_gemm_1d1d`; ValueError also for an unknown
        ``tensor_core`` or ``mantissa_bits`` < 1.
    """
    a, sa, b, sb = _check_1d1d(a_bits, sfa, b_bits, sfb)
    mb = _check_tc_args(mantissa_bits, tensor_core)
    m, n = a.shape[0], b.shape[0]
    c64 = None if c is None else _check_c(c, (m, n), "m, n")
    p = tensor_core_partial_sums(a, b, mantissa_bits=mb, model=tensor_core)
    w = _fp32_scale_products_1d1d(sa, sb)
    acc = np.zeros((m, n), dtype=np.float32)
    for j in range(p.shape[2]):
        acc = _fma_f32(w[:, :, j], p[:, :, j], acc.astype(np.float64))
    if c64 is None:
        return acc
    with np.errstate(over="ignore", invalid="ignore"):
        return (c64 + acc.astype(np.float64)).astype(np.float32)


def error_bound_1d1d(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike, sfb: ArrayLike,
                     c: ArrayLike | None = None, *,
                     mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS) -> np.ndarray:
    """Per-element bound ``B`` with ``|kernel - ref_gemm_1d1d| <= B`` for a correct 1D1D kernel.

    "Correct kernel": per 128-K block, four k32 WGMMA steps from a cleared
    accumulator; promotion ``acc = FFMA(fl32(sfa[m]*sfb[n]), tc, acc)`` in
    FP32 (IEEE, subnormals kept) in any order of the blocks; FP32 output,
    with ``c`` the final ``fl32(c + acc)`` (see
    :func:`promoted_accumulation_model_1d1d`).  Same derivation as
    :func:`~cugemm8.reference.error_bound` (units: ``p`` = payload
    products ``A[m,k]*B[n,k]``, exact), with ``s = sfa[m, kb] * sfb[n, kb]``
    per output element:

    1. **Tensor core, per block kb** (payloads only, so unchanged): with
       ``G_j = 2^-mb max(|acc_{j-1}|, MA_j MB_j)`` the alignment grid of
       k32 step ``j`` (``MA_j``, ``MB_j`` the row's max over the step of
       ``max(|v|, 2^-6)`` over nonzero ``v``) and ``t_j`` truncated addends
       (``c_j`` products, plus the accumulator after the first step)::

           e_j = e_{j-1} + t_j G_j + 2^-mb (|P_{<=j}| + e_{j-1} + t_j G_j)

       and ``TC_kb = e_4 >= |acc_kb - P_kb|`` (the measured Hopper rule of
       :func:`~cugemm8.reference.tensor_core_partial_sums`, ``"hopper"``;
       it also bounds the ``"round"``/``"truncate"`` models).

    2. **Scale product**: ``|fl32(s) - s| <= 2^-24 |s| + 2^-150``.

    3. **FP32 accumulation** of ``nkb`` FFMAs (recursive summation, Higham,
       *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section
       4.2; ``gamma_n = n u / (1 - n u)``, ``u = 2^-24``), with
       ``Q = sum_kb (s (1 + 2^-24) + 2^-150)(|P_kb| + TC_kb)``::

           E32 = sum_kb s TC_kb + sum_kb (2^-24 s + 2^-150)(|P_kb| + TC_kb)
                 + gamma_nkb Q + nkb 2^-150

    4. **Output**: FP32, so no BF16 rounding term.  With ``c`` (float32),
       one more FP32 rounding, of ``c + acc``:
       ``|fl32(c + acc) - (c + acc)| <= 2^-24 |c + acc|`` with no absolute
       term (``c`` and ``acc`` are multiples of 2^-149, so is their sum,
       and every such value below 2^-126 is an exact float32 subnormal),
       and ``|c + acc| <= |c + ref| + E32``::

           B = E32                                      (c is None)
           B = E32 + 2^-24 (|c + ref| + E32)            (with c)

       with ``ref = sum_kb s P_kb``, i.e. ``c + ref`` = :func:`ref_gemm_1d1d`.

    Overflow: ``B = +inf`` where ``fl32(sfa*sfb)`` may overflow for a block
    (``s >= 2^128``), where ``Q`` exceeds the float32 range, or where the
    output may round to Inf (``|c + ref| + B`` beyond the largest FP32).
    Compare only where ``B`` is finite.  NaN/Inf inputs (payloads, scales,
    ``c``) make ``B`` NaN for the affected elements.  For
    :func:`ref_k_grouped_gemm`, apply the bound to each group's slices.

    Parameters
    ----------
    a_bits, sfa, b_bits, sfb, c : as :func:`ref_gemm_1d1d`.
    mantissa_bits : int >= 1, keyword-only
        Tensor-core accumulator fraction bits (13 on Hopper).

    Returns
    -------
    numpy.ndarray of float64, shape ``[m, n]``, in the units of the output.

    Raises
    ------
    TypeError, ValueError
        As :func:`ref_gemm_1d1d`; ValueError also for ``mantissa_bits`` < 1.
    """
    a, sa, b, sb = _check_1d1d(a_bits, sfa, b_bits, sfb)
    mb = _check_tc_args(mantissa_bits)
    m, k = a.shape
    n = b.shape[0]
    c64 = None if c is None else _check_c(c, (m, n), "m, n")
    with np.errstate(invalid="ignore", over="ignore"):
        e32, ref, q_sum, w_overflow = _promotion_error_terms(
            a, b, lambda j: sa[:, j][:, None] * sb[:, j][None, :], mb)
        if c64 is None:
            total = ref
            bound = e32
        else:
            total = c64 + ref
            bound = e32 + _FP32_U * (np.abs(total) + e32)
        over = w_overflow | (q_sum > _FP32_MAX) | (np.abs(total) + bound >= _FP32_MAX)
        bound = np.where(over & ~np.isnan(bound), np.inf, bound)
    return bound
