"""Property-based tests (hypothesis) of the NumPy oracle :mod:`cugemm8.reference`.

CPU only.  Each property states what every later GPU test relies on: the
quantisation error, the scale shapes and values, NaN containment, exactness
of the float64 reference, the grouped references, the contiguous layout, and
the error bound (valid for the promoted models, violated by the unpromoted
one at long K).  Tests derived from adversarial.md name their item.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from cugemm8 import reference as R

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])

seeds = st.integers(0, 2**32 - 1)
#: K values: any size, with the K lattice of the kernels over-represented.
ks = st.one_of(st.integers(1, 700), st.sampled_from([16, 80, 128, 256, 384, 592, 640, 1152]))
ms = st.one_of(st.integers(1, 40), st.sampled_from([1, 7, 65, 129]))
#: log10 of a data magnitude: the scales then span about 1e-38 ... 1e30.
decades = st.integers(-36, 30)


def _data(seed, shape, decade, kind):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(shape)
    elif kind == "positive":
        x = rng.uniform(0, 1, shape)
    elif kind == "block_varied":
        x = R.block_varied_normal(rng, shape, spread=3).astype(np.float64)
    elif kind == "wide":
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)
    else:  # "sparse": mostly zero, some all-zero rows
        x = rng.standard_normal(shape) * (rng.uniform(0, 1, shape) < 0.1)
        x[..., ::3, :] = 0
    with np.errstate(over="ignore"):
        return (x * 10.0 ** decade).astype(np.float32)


kinds = st.sampled_from(["normal", "positive", "block_varied", "wide", "sparse"])


def _group_scale(s, k):
    """Broadcast [..., m, kb] scales to [..., m, k]."""
    return np.repeat(s.astype(np.float64), R.BLOCK_K, axis=-1)[..., :k]


def _check_roundtrip(x, bits, scale_full):
    """|dequant - x| <= half an e4m3 step at the block's scale.

    Normals (|x/scale| >= 2^-6): relative 2^-4 of the element (3 mantissa
    bits); subnormals: absolute 2^-10 * scale.  A factor (1 + 2^-20) covers
    the float32 rounding of x / scale.
    """
    x64 = x.astype(np.float64)
    deq = R.e4m3_to_float(bits).astype(np.float64) * scale_full
    err = np.abs(deq - x64)
    q = np.abs(x64) / scale_full
    normal = q >= 2.0 ** -6
    tol = np.where(normal, 2.0 ** -4 * np.abs(x64), 2.0 ** -10 * scale_full) * (1 + 2.0 ** -20)
    assert np.all(err <= tol), (np.max(err / np.maximum(tol, 1e-300)))


# ---------------------------------------------------------------------------
# quantisation
# ---------------------------------------------------------------------------

@settings(max_examples=200, **SETTINGS)
@given(seed=seeds, m=ms, k=ks, decade=decades, kind=kinds, pow2=st.booleans())
@example(seed=0, m=1, k=128, decade=0, kind="normal", pow2=False)
@example(seed=1, m=3, k=80, decade=0, kind="normal", pow2=False)
@example(seed=2, m=2, k=592, decade=0, kind="block_varied", pow2=True)
@example(seed=3, m=9, k=256, decade=0, kind="sparse", pow2=False)       # adversarial #8
@example(seed=4, m=4, k=300, decade=-36, kind="normal", pow2=False)     # adversarial #10
@example(seed=5, m=4, k=300, decade=30, kind="wide", pow2=True)
def test_per_token_roundtrip_and_scales(seed, m, k, decade, kind, pow2):
    x = _data(seed, (m, k), decade, kind)
    assume(np.all(np.isfinite(x)))
    bits, sfa = R.per_token_cast_to_fp8(x, pow2_scale=pow2)
    kb = -(-k // 128)
    assert bits.shape == (m, k) and bits.dtype == np.uint8
    assert sfa.shape == (m, kb) and sfa.dtype == np.float32
    assert np.all(np.isfinite(sfa)) and np.all(sfa > 0)
    _check_roundtrip(x, bits, _group_scale(sfa, k))
    # the scale is exactly the recipe's: float32(max(amax, 1e-4)) / 448, or its ceil-pow2
    xp = np.pad(np.abs(x), [(0, 0), (0, kb * 128 - k)]).reshape(m, kb, 128)
    plain = np.maximum(xp.max(-1), np.float32(1e-4)) / np.float32(448)
    if pow2:
        mant, _ = np.frexp(sfa)
        assert np.all(mant == 0.5) and np.all(sfa >= plain) and np.all(sfa < 2 * plain)
    else:
        np.testing.assert_array_equal(sfa, plain.astype(np.float32))
        # each group with amax >= min_amax reaches +-448 exactly
        hit = np.abs(R.e4m3_to_float(bits)).astype(np.float64)
        hit = np.pad(hit, [(0, 0), (0, kb * 128 - k)]).reshape(m, kb, 128).max(-1)
        live = xp.max(-1) >= np.float32(1e-4)
        assert np.all(hit[live] == 448.0)
    # all-zero groups: finite positive min_amax / 448 (adversarial #8)
    zero = xp.max(-1) == 0
    if not pow2:
        assert np.all(sfa[zero] == np.float32(np.float32(1e-4) / np.float32(448)))


@settings(max_examples=100, **SETTINGS)
@given(seed=seeds, n=st.integers(1, 300), k=ks, decade=decades, kind=kinds, pow2=st.booleans(),
       batch=st.sampled_from([None, 1, 3]))
@example(seed=0, n=128, k=128, decade=0, kind="normal", pow2=False, batch=None)
@example(seed=1, n=129, k=80, decade=0, kind="block_varied", pow2=False, batch=2)
@example(seed=2, n=7, k=592, decade=-38, kind="normal", pow2=True, batch=None)  # adversarial #10
def test_per_block_roundtrip_and_scales(seed, n, k, decade, kind, pow2, batch):
    shape = (n, k) if batch is None else (batch, n, k)
    w = _data(seed, shape, decade, kind)
    assume(np.all(np.isfinite(w)))
    bits, sfb = R.per_block_cast_to_fp8(w, pow2_scale=pow2)
    nb, kb = -(-n // 128), -(-k // 128)
    assert bits.shape == shape and sfb.shape == shape[:-2] + (nb, kb)
    assert np.all(np.isfinite(sfb)) and np.all(sfb > 0)
    full = np.repeat(np.repeat(sfb.astype(np.float64), 128, -2)[..., :n, :], 128, -1)[..., :k]
    _check_roundtrip(w, bits, full)
    if pow2:
        mant, _ = np.frexp(sfb)
        assert np.all(mant == 0.5)
    # consistency with the per-token quantiser on a single 128-row block row
    if batch is None and n <= 128 and not pow2:
        col_amax = np.abs(w).max(axis=0, initial=0)
        col_amax = np.pad(col_amax, (0, kb * 128 - k)).reshape(kb, 128).max(-1)
        np.testing.assert_array_equal(
            sfb[0], (np.maximum(col_amax, np.float32(1e-4)) / np.float32(448)).astype(np.float32))


@settings(max_examples=100, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 12), k=ks, pos=st.floats(0, 1, exclude_max=True),
       row=st.floats(0, 1, exclude_max=True), poison=st.sampled_from([np.nan, np.inf, -np.inf, -np.nan]))
@example(seed=0, m=1, k=80, pos=0.5, row=0.0, poison=np.nan)
def test_non_finite_input_stays_in_its_group(seed, m, k, pos, row, poison):
    # adversarial #9: genuine NaN/Inf inputs propagate only within their own row (group)
    x = _data(seed, (m, k), 0, "normal")
    i, j = int(row * m), int(pos * k)
    clean_bits, clean_s = R.per_token_cast_to_fp8(x)
    x[i, j] = poison
    bits, sfa = R.per_token_cast_to_fp8(x)
    g = j // 128
    assert not np.isfinite(sfa[i, g])
    other = np.ones(sfa.shape, bool)
    other[i, g] = False
    np.testing.assert_array_equal(sfa[other], clean_s[other])
    cols = np.zeros(x.shape, bool)
    cols[i, g * 128:(g + 1) * 128] = True
    np.testing.assert_array_equal(bits[~cols], clean_bits[~cols])
    deq = R.dequantize_lhs(bits, sfa)
    assert np.all(np.isnan(deq[cols])) and np.all(np.isfinite(deq[~cols]))
    # and in the GEMM: only row i is non-finite
    b, sb = R.per_block_cast_to_fp8(_data(seed + 1, (5, k), 0, "normal"))
    y = R.ref_gemm_nt(bits, sfa, b, sb)
    assert np.all(np.isnan(y[i])) and np.all(np.isfinite(np.delete(y, i, axis=0)))


@settings(max_examples=100, **SETTINGS)
@given(x=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=64))
@example(x=[449.0, 470.0, 1e4, -500.0, 3e38])                             # adversarial #9
def test_float_to_e4m3_saturates_and_rounds_to_nearest(x):
    x = np.array(x, np.float32)
    bits = R.float_to_e4m3(x)
    got = R.e4m3_to_float(bits).astype(np.float64)
    finite = np.isfinite(x)
    assert np.all(np.isnan(got[~finite]))
    assert np.all(np.isfinite(got[finite]))                               # never NaN from finite input
    xf = np.clip(x[finite].astype(np.float64), -448, 448)
    # nearest: no finite e4m3 value is strictly closer than the chosen one
    table = R.e4m3_to_float(np.arange(256, dtype=np.uint8)).astype(np.float64)
    table = table[np.isfinite(table)]
    best = np.min(np.abs(table[None, :] - xf[:, None]), axis=1)
    assert np.all(np.abs(got[finite] - xf) == best)
    assert np.all(np.signbit(got[finite]) == np.signbit(x[finite]))


# ---------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------

@settings(max_examples=150, **SETTINGS)
@given(seed=seeds, m=ms, n=st.integers(1, 300), k=ks, emax=st.integers(0, 8))
@example(seed=0, m=1, n=1, k=128, emax=0)
@example(seed=1, m=7, n=129, k=80, emax=8)
@example(seed=2, m=65, n=8, k=592, emax=8)
@example(seed=6, m=7, n=108, k=1152, emax=8)
def test_ref_gemm_nt_exact_on_representable_inputs(seed, m, n, k, emax):
    """Integer payloads |v| <= 16 and power-of-two scales 2^[-emax, emax]: the
    float64 reference equals an int64 matmul exactly.  Every partial sum is a
    multiple of 2^(-2 emax) below 2^(8 + 2 emax) * k, i.e. fits
    8 + 4 emax + log2(k) <= 51 bits for emax <= 8, k <= 1152."""
    rng = np.random.default_rng(seed)
    kb, nb = -(-k // 128), -(-n // 128)
    ai, bi = rng.integers(-16, 17, (m, k)), rng.integers(-16, 17, (n, k))
    ea, eb = rng.integers(-emax, emax + 1, (m, kb)), rng.integers(-emax, emax + 1, (nb, kb))
    a = R.float_to_e4m3(ai.astype(np.float64))
    b = R.float_to_e4m3(bi.astype(np.float64))
    sfa = np.ldexp(np.float32(1), ea).astype(np.float32)
    sfb = np.ldexp(np.float32(1), eb).astype(np.float32)
    want = np.zeros((m, n), np.int64)
    for j in range(kb):
        sl = slice(j * 128, min(k, (j + 1) * 128))
        dot = ai[:, sl] @ bi[:, sl].T
        want += dot * (2 ** (ea[:, j] + emax))[:, None] * (2 ** (eb[np.arange(n) // 128, j] + emax))[None, :]
    got = R.ref_gemm_nt(a, sfa, b, sfb) * 2.0 ** (2 * emax)
    np.testing.assert_array_equal(got, want.astype(np.float64))


@settings(max_examples=60, **SETTINGS)
@given(seed=seeds, sizes=st.lists(st.integers(0, 200), min_size=1, max_size=5), k=ks,
       n=st.integers(1, 140), align=st.sampled_from([1, 4, 64, 128]))
@example(seed=0, sizes=[0, 0], k=128, n=8, align=128)                    # adversarial #3
@example(seed=1, sizes=[1, 0, 129], k=80, n=136, align=128)
def test_contiguous_reference_agrees_with_per_group(seed, sizes, k, n, align):
    rng = np.random.default_rng(seed)
    mi, off = R.make_m_indices(sizes, alignment=align)
    g = len(sizes)
    x = rng.standard_normal((mi.size, k)).astype(np.float32)
    x[mi == -1] = np.nan                      # padding never poisons valid rows
    a, sa = R.per_token_cast_to_fp8(x)
    b, sb = R.per_block_cast_to_fp8(R.block_varied_normal(rng, (g, n, k), block=(128, 128)))
    out = R.ref_gemm_contiguous(a, sa, b, sb, mi)
    assert out.shape == (mi.size, n)
    assert np.all(out[mi == -1] == 0)
    for e in range(g):
        rows = slice(off[e], off[e] + sizes[e])
        np.testing.assert_array_equal(out[rows], R.ref_gemm_nt(a[rows], sa[rows], b[e], sb[e]))
    assert np.all(np.isfinite(out))


@settings(max_examples=60, **SETTINGS)
@given(seed=seeds, g=st.integers(1, 4), m_max=st.integers(0, 70), k=ks, n=st.integers(1, 140),
       data=st.data())
@example(seed=0, g=2, m_max=64, k=128, n=8, data=None)
def test_masked_reference_agrees_with_per_group(seed, g, m_max, k, n, data):
    rng = np.random.default_rng(seed)
    if data is None:
        masked_m = np.array([0, 100][:g])
    else:
        masked_m = np.array(data.draw(st.lists(st.integers(0, 90), min_size=g, max_size=g)))
    x = rng.standard_normal((g, m_max, k)).astype(np.float32)
    valid = R.masked_valid_rows(masked_m, m_max)
    x[~valid] = np.inf                         # rows past masked_m never poison valid rows
    a, sa = R.per_token_cast_to_fp8(x)
    b, sb = R.per_block_cast_to_fp8(rng.standard_normal((g, n, k)))
    out = R.ref_gemm_masked(a, sa, b, sb, masked_m)
    assert out.shape == (g, m_max, n)
    assert np.all(out[~valid] == 0) and np.all(np.isfinite(out))
    for j in range(g):
        r = min(int(masked_m[j]), m_max)
        assert valid[j].sum() == r and np.all(valid[j, :r])
        if r:
            np.testing.assert_array_equal(out[j, :r], R.ref_gemm_nt(a[j, :r], sa[j, :r], b[j], sb[j]))


@settings(max_examples=150, **SETTINGS)
@given(sizes=st.lists(st.integers(0, 600), max_size=12), align=st.integers(1, 256))
@example(sizes=[], align=128)
@example(sizes=[0, 128, 129, 1], align=128)
def test_make_m_indices_invariants(sizes, align):
    mi, off = R.make_m_indices(sizes, alignment=align)
    g = len(sizes)
    assert mi.dtype == np.int32 and off.shape == (g + 1,)
    assert off[0] == 0 and off[-1] == mi.size
    assert mi.size == sum(-(-s // align) * align for s in sizes)
    assert np.all(off % align == 0) and np.all(np.diff(off) >= 0)
    for e, s in enumerate(sizes):
        assert np.all(mi[off[e]:off[e] + s] == e)
        assert np.all(mi[off[e] + s:off[e + 1]] == -1)
        assert np.sum(mi == e) == s
        assert (off[e + 1] == off[e]) == (s == 0)
    # every aligned block belongs to at most one expert
    if mi.size:
        blocks = mi.reshape(-1, align)
        for blk in blocks:
            ids = set(blk[blk >= 0].tolist())
            assert len(ids) <= 1 and blk[0] >= 0    # a block starts with a token


# ---------------------------------------------------------------------------
# accumulation models and the error bound
# ---------------------------------------------------------------------------

@settings(max_examples=150, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 12), n=st.integers(1, 140), k=ks, kind=kinds,
       tc=st.sampled_from(["round", "truncate", "hopper", "exact"]), decade=st.integers(-10, 10))
@example(seed=0, m=1, n=1, k=128, kind="positive", tc="hopper", decade=0)
@example(seed=1, m=3, n=136, k=80, kind="block_varied", tc="hopper", decade=0)
@example(seed=2, m=2, n=9, k=592, kind="wide", tc="hopper", decade=0)
@example(seed=3, m=4, n=5, k=300, kind="sparse", tc="round", decade=0)      # adversarial #8
def test_promoted_models_within_error_bound(seed, m, n, k, kind, tc, decade):
    a, sa = R.per_token_cast_to_fp8(_data(seed, (m, k), decade, kind))
    b, sb = R.per_block_cast_to_fp8(_data(seed + 1, (n, k), 0, kind))
    ref = R.ref_gemm_nt(a, sa, b, sb)
    bound = R.error_bound(a, sa, b, sb)
    assert np.all(np.isfinite(bound)) and np.all(bound > 0)
    y32 = R.promoted_accumulation_model(a, sa, b, sb, tensor_core=tc)
    assert y32.dtype == np.float32 and y32.shape == (m, n)
    y = R.round_to_bf16(y32).astype(np.float64)
    assert np.all(np.abs(y - ref) <= bound)
    b32 = R.error_bound(a, sa, b, sb, output="float32")
    assert np.all(np.abs(y32.astype(np.float64) - ref) <= b32)


@settings(max_examples=80, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 8), n=st.integers(1, 40), kb=st.integers(1, 12),
       kind=kinds, k_splits=st.sampled_from([1, 2, 4]), warpgroup_split=st.booleans(),
       skew=st.sampled_from([0, 2]), decade=st.integers(-10, 10))
def test_split_k_orders_within_error_bound(seed, m, n, kb, kind, k_splits, warpgroup_split, skew, decade):
    # the kernels' split-K summation orders (BLOCK_M = 64 warpgroups, CTA
    # pairs, with or without the skewed split point of BLOCK_M = 128 and
    # one-warpgroup pairs,
    # clusters of four as a tree)
    k = 128 * (-(-kb // k_splits) * k_splits)
    skew = skew if k_splits == 2 and k // 128 // 2 > skew else 0
    a, sa = R.per_token_cast_to_fp8(_data(seed, (m, k), decade, kind))
    b, sb = R.per_block_cast_to_fp8(_data(seed + 1, (n, k), 0, kind))
    ref = R.ref_gemm_nt(a, sa, b, sb)
    y32 = R.promoted_accumulation_model(a, sa, b, sb, tensor_core="hopper", k_splits=k_splits,
                                        warpgroup_split=warpgroup_split, split_skew=skew)
    assert np.all(np.abs(y32.astype(np.float64) - ref) <= R.error_bound(a, sa, b, sb, output="float32"))
    y = R.round_to_bf16(y32).astype(np.float64)
    assert np.all(np.abs(y - ref) <= R.error_bound(a, sa, b, sb))


@settings(max_examples=40, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 24), n=st.integers(1, 24),
       kb=st.sampled_from([1, 2, 8, 32, 57, 128]), kind=st.sampled_from(["positive", "normal", "wide"]))
@example(seed=0, m=24, n=24, kb=128, kind="positive")
def test_promotion_within_bound_up_to_k16384(seed, m, n, kb, kind):
    # invariants: accumulation accuracy at long K with all-positive data
    k = 128 * kb
    a, sa = R.per_token_cast_to_fp8(_data(seed, (m, k), 0, kind))
    b, sb = R.per_block_cast_to_fp8(_data(seed + 1, (n, k), 0, kind))
    ref = R.ref_gemm_nt(a, sa, b, sb)
    bound = R.error_bound(a, sa, b, sb)
    for tc in ("round", "hopper"):
        y = R.round_to_bf16(R.promoted_accumulation_model(a, sa, b, sb, tensor_core=tc))
        assert np.all(np.abs(y.astype(np.float64) - ref) <= bound), tc


@settings(max_examples=10, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 8), n=st.integers(1, 8))
@example(seed=0, m=1, n=1)
def test_unpromoted_exceeds_bound_at_k16384_on_positive_data(seed, m, n):
    k = 16384
    a, sa = R.per_token_cast_to_fp8(_data(seed, (m, k), 0, "positive"))
    b, sb = R.per_block_cast_to_fp8(_data(seed + 1, (n, k), 0, "positive"))
    ref = R.ref_gemm_nt(a, sa, b, sb)
    bound = R.error_bound(a, sa, b, sb)
    u = R.round_to_bf16(R.unpromoted_accumulation_model(a, sa, b, sb)).astype(np.float64)
    assert np.all(np.abs(u - ref) > bound)


@st.composite
def adversarial_blocks(draw):
    """Payload patterns that stress the alignment truncation: a few large
    products next to many small ones of one sign, arbitrary codes, zeros."""
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    m, n = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    k = draw(st.sampled_from([32, 64, 96, 128, 160, 256]))
    style = draw(st.sampled_from(["codes", "big+small", "big+small-same-sign", "subnormal"]))
    if style == "codes":
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        b = rng.integers(0, 256, (n, k), dtype=np.uint8)
        a[(a & 0x7F) == 0x7F] = 0
        b[(b & 0x7F) == 0x7F] = 0
        return a, b
    if style == "subnormal":
        av = rng.integers(-7, 8, (m, k)) * 2.0 ** -9
        bv = rng.integers(-7, 8, (n, k)) * 2.0 ** -9
        av[:, rng.integers(0, k)] = 448.0
    else:
        small = 2.0 ** draw(st.integers(-9, 4))
        av = rng.uniform(1, 2, (m, k)) * small
        bv = rng.uniform(1, 2, (n, k))
        if style == "big+small":
            bv *= rng.choice([-1, 1], (n, k))
        else:
            bv *= draw(st.sampled_from([-1, 1]))
        big = rng.integers(0, k, size=draw(st.integers(1, 4)))
        av[:, big], bv[:, big] = 448.0, 448.0
    return R.float_to_e4m3(av), R.float_to_e4m3(bv)


@settings(max_examples=200, **SETTINGS)
@given(blocks=adversarial_blocks(), scale_exp=st.integers(-60, 60))
def test_error_bound_covers_hopper_model_on_adversarial_blocks(blocks, scale_exp):
    a, b = blocks
    m, k = a.shape
    n = b.shape[0]
    kb, nb = -(-k // 128), -(-n // 128)
    sfa = np.full((m, kb), 2.0 ** scale_exp, np.float32)
    sfb = np.full((nb, kb), 1.5, np.float32)
    ref = R.ref_gemm_nt(a, sfa, b, sfb)
    bound = R.error_bound(a, sfa, b, sfb, output="float32")
    y = R.promoted_accumulation_model(a, sfa, b, sfb, tensor_core="hopper").astype(np.float64)
    finite = np.isfinite(bound)
    assert np.all(np.abs(y - ref)[finite] <= bound[finite])
    # the block-level tensor-core error alone, in payload units
    exact = R.tensor_core_partial_sums(a, b, model="exact")
    hop = R.tensor_core_partial_sums(a, b, model="hopper")
    tc_bound = R.error_bound(a, np.ones((m, kb), np.float32), b, np.ones((nb, kb), np.float32),
                             output="float32")
    assert np.all(np.abs(hop - exact).sum(-1) <= tc_bound)


@settings(max_examples=120, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 4), k=st.sampled_from([128, 256, 300]),
       ea=st.integers(-38, 30), eb=st.integers(-38, 30))
@example(seed=0, m=2, k=256, ea=-38, eb=-2)              # adversarial #10: scales near FP32 min
@example(seed=0, m=2, k=256, ea=-23, eb=-23)             # product underflows FP32
@example(seed=0, m=2, k=256, ea=30, eb=30)               # product overflows FP32
def test_scales_spanning_1e_38_to_1e30(seed, m, k, ea, eb):
    # adversarial #10: tiny / huge scales never give NaN; the bound stays valid
    rng = np.random.default_rng(seed)
    a = R.float_to_e4m3(rng.uniform(-448, 448, (m, k)))
    b = R.float_to_e4m3(rng.uniform(-448, 448, (8, k)))
    kb = -(-k // 128)
    sfa = np.full((m, kb), 10.0 ** ea, np.float32)
    sfb = np.full((1, kb), 10.0 ** eb, np.float32)
    ref = R.ref_gemm_nt(a, sfa, b, sfb)
    assert np.all(np.isfinite(ref))
    bound = R.error_bound(a, sfa, b, sfb)
    assert not np.any(np.isnan(bound))
    y32 = R.promoted_accumulation_model(a, sfa, b, sfb)
    y = R.round_to_bf16(y32).astype(np.float64)
    finite = np.isfinite(bound)
    assert np.all(np.abs(y - ref)[finite] <= bound[finite])
    if np.all(finite):
        assert np.all(np.isfinite(y))


# ---------------------------------------------------------------------------
# comparison helpers
# ---------------------------------------------------------------------------

@settings(max_examples=100, **SETTINGS)
@given(x=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50))
def test_round_to_bf16_is_within_half_an_ulp(x):
    x = np.array(x, np.float64)
    r = R.round_to_bf16(x).astype(np.float64)
    ok = np.abs(x) < (2 - 2.0 ** -8) * 2.0 ** 127
    assert np.all(np.isinf(r[~ok]))
    assert np.all(R.bf16_ulp_error(r[ok], x[ok]) <= 0.5 + 1e-12)
    # agrees with a float32 -> bf16 cast wherever x is a float32 value
    x32 = x[ok].astype(np.float32)
    with np.errstate(over="ignore"):
        same = x32.astype(np.float64) == x[ok]
    np.testing.assert_array_equal(r[ok][same], x32[same].astype(ml_dtypes.bfloat16).astype(np.float64))


@settings(max_examples=100, **SETTINGS)
@given(seed=seeds, size=st.integers(1, 300), noise=st.floats(0, 1))
def test_calc_diff_properties(seed, size, noise):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size)
    y = x + noise * rng.standard_normal(size)
    d = R.calc_diff(x, y)
    assert -1e-12 <= d <= 2 + 1e-12
    assert d == R.calc_diff(y, x)
    assert abs(R.calc_diff(x, x)) < 1e-12
    rel = np.linalg.norm(x - y) / np.linalg.norm(x)
    if noise == 0:
        assert d == 0.0 or abs(d) < 1e-15
    # for small errors calc_diff ~ rel^2 / 2 (so 1e-3 allows ~4.5% relative error)
    if 0 < rel < 0.1:
        assert d <= rel ** 2 + 1e-15


@settings(max_examples=50, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 30), n=st.integers(1, 30), bad=st.floats(1e-6, 10))
def test_max_rel_error_rows_flags_the_bad_row(seed, m, n, bad):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((m, n)) + 3.0
    x = ref.copy()
    i = int(rng.integers(0, m))
    x[i, int(rng.integers(0, n))] += bad * np.abs(ref[i]).max()
    r = R.max_rel_error_rows(x, ref)
    assert r.shape == (m,)
    assert r[i] == np.max(r) and r[i] > 0
    assert np.all(np.delete(r, i) == 0)


@settings(max_examples=150, **SETTINGS)
@given(w=st.floats(width=32, allow_nan=False, allow_infinity=False),
       p=st.integers(-(2**14), 2**14), pe=st.integers(-30, 30),
       f=st.floats(width=32, allow_nan=False, allow_infinity=False), cancel=st.booleans())
def test_promotion_ffma_is_a_single_rounding(w, p, pe, f, cancel):
    """The promotion FFMA of the models rounds once (float64 round-to-odd),
    checked against exact rational arithmetic."""
    from fractions import Fraction
    from cugemm8.reference import _fma_f32
    pv = float(p) * 2.0 ** pe                                   # <= 15 significant bits
    if cancel:
        with np.errstate(over="ignore"):
            f = float(np.float32(-w * pv * (1 + 2.0 ** -20)))
    assume(np.isfinite(f) and abs(w * pv) < 1e38)
    got = _fma_f32(np.array([float(w)]), np.array([pv]), np.array([float(f)]))[0]
    exact = Fraction(float(w)) * Fraction(pv) + Fraction(float(f))
    with np.errstate(over="ignore"):
        c = np.float32(float(exact))
        cands = [c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))]
    cands = [v for v in cands if np.isfinite(v)]
    assume(cands)
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - exact),
                                     int(np.array([v], np.float32).view(np.int32)[0]) & 1))
    assert got == best
