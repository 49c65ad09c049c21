"""The tensor-core and promotion models: the Hopper FP8 tensor core's
per-k32-step alignment and truncation (bit-exact against an H200), the
promoted FP32 accumulation of the kernels (in each kernel's summation order),
and the unpromoted thought model."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._common import (BLOCK_K, MMA_K, TENSOR_CORE_MANTISSA_BITS, _as_bits, _ceil_div,
                      _check_gemm_2d, _e4m3_exponent, _round_to_bits)
from .quant import e4m3_to_float

if TYPE_CHECKING:
    from typing import Literal

    from numpy.typing import ArrayLike

__all__ = ["tensor_core_partial_sums", "promoted_accumulation_model",
           "unpromoted_accumulation_model"]


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


def tensor_core_partial_sums(a_bits: ArrayLike, b_bits: ArrayLike, *,
                             mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                             model: Literal["exact", "round", "truncate", "hopper"] = "round"
                             ) -> np.ndarray:
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


def promoted_accumulation_model(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike,
                                sfb: ArrayLike, *,
                                mantissa_bits: int = TENSOR_CORE_MANTISSA_BITS,
                                tensor_core: Literal["exact", "round", "truncate", "hopper"] = "round",
                                k_splits: int = 1,
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

    - ``warpgroup_split`` (BLOCK_M = 64 on two math warpgroups): within each CTA's
      share of K, local blocks ``j`` with ``j % 2 == w`` are chained by
      warpgroup ``w`` from zero, then ``final = fl32(chain_0 + chain_1)``;
    - ``k_splits = 2`` (``GemmConfig.num_k_splits``): CTA 0 of the pair
      takes blocks ``[0, nkb/2 + split_skew)`` and CTA 1 the rest (``nkb``
      even), and ``final = fl32(part_0 + part_1)``.  The kernels' skew is
      :func:`cugemm8._config.split_k_skew` (2 with BLOCK_M = 128 or one
      math warpgroup and ``nkb >= 16``, else 0);
    - ``k_splits = 4``: CTA ``r`` of the cluster takes blocks
      ``[r, r + 1) * nkb/4`` (``nkb`` a multiple of 4, no skew) and the
      partial tiles meet as a tree, ``final = fl32(fl32(part_0 + part_1) +
      fl32(part_2 + part_3))`` (ranks 1 and 3 send to 0 and 2, then 2 to 0).

    All additions keep subnormals (``add.rn.f32``).  Each order is compared
    bit for bit with the kernels on the H200: the four-way tree
    (tests/test_gemm_gpu.py::test_split_k4_matches_the_promotion_model), the
    two-way split with and without the skew and the warpgroup order
    (``test_split_k_skew_matches_the_promotion_model``), and the swap-AB
    kernel's even two-way split
    (tests/test_swap_ab_gpu.py::test_split_matches_the_promotion_model).
    :func:`error_bound` covers every order (its FP32 term bounds any
    summation tree of ``nkb`` terms).

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
        1 (default), 2 or 4: K split across a cluster of CTAs (see above).
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
        On shape mismatch, unknown model, ``k_splits`` not 1, 2 or 4, a
        number of 128-K blocks that is not a multiple of ``k_splits``, or a
        ``split_skew`` that is odd, negative, leaves CTA 1 no block or is
        given with ``k_splits`` other than 2.
    """
    a, sa, b, sb = _check_gemm_2d(a_bits, sfa, b_bits, sfb)
    nkb = _ceil_div(a.shape[1], BLOCK_K)
    if k_splits not in (1, 2, 4) or isinstance(k_splits, bool):
        raise ValueError(f"k_splits must be 1, 2 or 4, got {k_splits!r}")
    if nkb % k_splits:
        raise ValueError(f"k_splits = {k_splits} needs a multiple of {k_splits} 128-K blocks, got {nkb}")
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

    if k_splits == 2:
        bounds = [0, nkb // 2 + split_skew, nkb]
    else:
        bounds = [r * nkb // k_splits for r in range(k_splits + 1)]
    parts = []
    for r in range(k_splits):
        blocks = list(range(bounds[r], bounds[r + 1]))
        parts.append(add(chain(blocks[0::2]), chain(blocks[1::2])) if warpgroup_split else chain(blocks))
    # Pairwise: rank 2r + 1's tile into rank 2r's, then (four) rank 2's into 0's.
    while len(parts) > 1:
        parts = [add(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


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


def unpromoted_accumulation_model(a_bits: ArrayLike, sfa: ArrayLike, b_bits: ArrayLike,
                                  sfb: ArrayLike, *,
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
