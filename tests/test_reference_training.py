"""CPU tests of the FP8-training half of the NumPy oracle (issue 21):
:mod:`cugemm8.reference.training` (the transposing quantisers, the 1D1D and
k-grouped references, the 1D1D promotion model and error bound, and the
float64 backward of a linear layer).

Example-based tests first, then hypothesis properties (same settings as
test_properties.py).  Every function is reached through ``cugemm8.reference``.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from cugemm8 import reference as R

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
seeds = st.integers(0, 2**32 - 1)
#: Awkward sizes of the quantised dimension: tails of 1, 127 and 129 elements.
AWKWARD = (1, 127, 128, 129, 300)


def _data(seed, shape, kind="normal", decade=0):
    """Fresh random float32 data, non-zero unless ``kind="sparse"``."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(shape)
    elif kind == "positive":
        x = rng.uniform(2.0 ** -10, 1, shape)
    elif kind == "block_varied":
        x = R.block_varied_normal(rng, shape, spread=3).astype(np.float64)
    elif kind == "wide":
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)
    else:  # "sparse"
        x = rng.standard_normal(shape) * (rng.uniform(0, 1, shape) < 0.1)
    with np.errstate(over="ignore"):
        return (x * 10.0 ** decade).astype(np.float32)


def _wgrad_operands(seed, m, n, k, kind="normal", decade=0):
    """The 1D1D operands of a wgrad GEMM: dy [k tokens, m], x [k tokens, n],
    both quantised 1x128 along the tokens (A = dy.T, B = x.T)."""
    a, sa = R.per_token_cast_to_fp8_t(_data(seed, (k, m), kind, decade))
    b, sb = R.per_token_cast_to_fp8_t(_data(seed + 1, (k, n), kind))
    return a, sa, b, sb


def _assert_bits_equal(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8) if g.dtype == np.uint8 else g.view(np.uint32),
                                      w.view(np.uint8) if w.dtype == np.uint8 else w.view(np.uint32))


# ---------------------------------------------------------------------------
# the transposing quantisers
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("m", AWKWARD)
@pytest.mark.parametrize("k", (1, 129, 300))
@pytest.mark.parametrize("pow2", [False, True])
def test_per_token_cast_t_is_the_cast_of_the_transpose(m, k, pow2):
    x = _data(1000 * m + k, (m, k), "block_varied")
    bits, sf = R.per_token_cast_to_fp8_t(x, pow2_scale=pow2)
    assert bits.shape == (k, m) and bits.dtype == np.uint8 and bits.flags.c_contiguous
    assert sf.shape == (k, -(-m // 128)) and sf.dtype == np.float32
    _assert_bits_equal((bits, sf), R.per_token_cast_to_fp8(x.T, pow2_scale=pow2))
    _assert_bits_equal((bits, sf), R.per_token_cast_to_fp8(np.ascontiguousarray(x.T), pow2_scale=pow2))


def test_per_token_cast_t_token_tail_and_options():
    # m = 129: channel c's second granule holds token 128 only (zero-padded).
    x = _data(7, (129, 5), "normal")
    bits, sf = R.per_token_cast_to_fp8_t(x, min_amax=1e-3)
    amax = np.maximum(np.abs(x[128]), np.float32(1e-3))
    np.testing.assert_array_equal(sf[:, 1], (amax / np.float32(448)).astype(np.float32))
    np.testing.assert_array_equal(sf[:, 0], (np.abs(x[:128]).max(0) / np.float32(448)).astype(np.float32))
    assert np.all(np.abs(R.e4m3_to_float(bits[:, 128])) == 448)
    # batched [g, m, k] -> [g, k, m]; empty token dimension
    xb = _data(8, (2, 130, 3))
    _assert_bits_equal(R.per_token_cast_to_fp8_t(xb), R.per_token_cast_to_fp8(np.swapaxes(xb, -1, -2)))
    b0, s0 = R.per_token_cast_to_fp8_t(np.zeros((0, 4), np.float32))
    assert b0.shape == (4, 0) and s0.shape == (4, 0)
    # NaN stays in its 128x1 granule (channel 2, tokens 128..255)
    xn = _data(9, (300, 4))
    xn[200, 2] = np.nan
    _, sn = R.per_token_cast_to_fp8_t(xn)
    assert np.isnan(sn[2, 1]) and np.sum(np.isnan(sn)) == 1


def test_per_token_cast_t_takes_mn_major_for_parity():
    # The GPU op's layout option: accepted (a bool) and without effect on the values.
    x = _data(11, (200, 6))
    _assert_bits_equal(R.per_token_cast_to_fp8_t(x, mn_major=True), R.per_token_cast_to_fp8_t(x))
    _assert_bits_equal(R.per_token_cast_to_fp8_t(x, mn_major=np.bool_(False)), R.per_token_cast_to_fp8_t(x))
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="mn_major"):
            R.per_token_cast_to_fp8_t(x, mn_major=bad)


def test_per_token_cast_t_is_not_the_transposed_forward_cast():
    # DeepSeek-V3 section 3.5.2: the 1x128 forward tiles must be re-quantised
    # as 128x1 tiles for wgrad; transposing the forward cast is not that.
    x = _data(10, (256, 256), "block_varied")
    fwd_bits, fwd_sf = R.per_token_cast_to_fp8(x)
    bits, sf = R.per_token_cast_to_fp8_t(x)
    assert fwd_sf.shape == (256, 2) and sf.shape == (256, 2)
    assert not np.array_equal(bits, fwd_bits.T)


@pytest.mark.parametrize("shape", [(1, 1), (127, 129), (129, 300), (300, 127), (256, 384), (1, 300),
                                   (2, 130, 300)])
@pytest.mark.parametrize("pow2", [False, True])
def test_cast_transpose_block_is_the_transposed_block_cast(shape, pow2):
    w = _data(sum(shape), shape, "block_varied")
    wt, sft = R.cast_transpose_block_fp8(w, pow2_scale=pow2)
    bits, sfb = R.per_block_cast_to_fp8(w, pow2_scale=pow2)
    *lead, n, k = shape
    assert wt.shape == (*lead, k, n) and wt.flags.c_contiguous and sft.flags.c_contiguous
    assert sft.shape == (*lead, -(-k // 128), -(-n // 128)) and sft.dtype == np.float32
    _assert_bits_equal((wt, sft), (np.swapaxes(bits, -1, -2), np.swapaxes(sfb, -1, -2)))
    # 128x128 block quantisation commutes with transposition (no requantisation for dgrad)
    _assert_bits_equal((wt, sft), R.per_block_cast_to_fp8(np.swapaxes(w, -1, -2), pow2_scale=pow2))


# ---------------------------------------------------------------------------
# ref_gemm_1d1d
# ---------------------------------------------------------------------------

def test_ref_gemm_1d1d_equals_the_dequantised_product():
    m, n, k = 5, 7, 300
    a, sa, b, sb = _wgrad_operands(11, m, n, k, "block_varied")
    kb = -(-k // 128)
    da = R.e4m3_to_float(a).astype(np.float64) * np.repeat(sa.astype(np.float64), 128, 1)[:, :k]
    db = R.e4m3_to_float(b).astype(np.float64) * np.repeat(sb.astype(np.float64), 128, 1)[:, :k]
    got = R.ref_gemm_1d1d(a, sa, b, sb)
    assert got.dtype == np.float64 and got.shape == (m, n)
    tol = 1e-13 * (np.abs(da) @ np.abs(db).T)
    assert np.all(np.abs(got - da @ db.T) <= tol)
    # the per-block formula sum_kb SFA[m,kb] SFB[n,kb] sum_{k in kb} A B
    av, bv = R.e4m3_to_float(a).astype(np.float64), R.e4m3_to_float(b).astype(np.float64)
    blocks = sum(sa[:, j, None].astype(np.float64) * sb[None, :, j].astype(np.float64)
                 * (av[:, j * 128:(j + 1) * 128] @ bv[:, j * 128:(j + 1) * 128].T) for j in range(kb))
    assert np.all(np.abs(got - blocks) <= tol)
    c = _data(12, (m, n)) * 8
    np.testing.assert_array_equal(R.ref_gemm_1d1d(a, sa, b, sb, c), c.astype(np.float64) + got)
    # c is read as float32
    c64 = c.astype(np.float64) * (1 + 2.0 ** -40)
    np.testing.assert_array_equal(R.ref_gemm_1d1d(a, sa, b, sb, c64), R.ref_gemm_1d1d(a, sa, b, sb, c))


def test_1d1d_is_1d2d_with_one_row_blocks():
    """A single row of B is one 128-row block: column j of every 1D1D function
    is the 1D2D function of B's row j with its own scales (bit for bit for the
    model and the bound, whose float64 partial sums are exact)."""
    m, n, k = 6, 5, 592
    a, sa, b, sb = _wgrad_operands(13, m, n, k, "wide")
    ref = R.ref_gemm_1d1d(a, sa, b, sb)
    bound = R.error_bound_1d1d(a, sa, b, sb)
    models = {tc: R.promoted_accumulation_model_1d1d(a, sa, b, sb, tensor_core=tc)
              for tc in ("round", "truncate", "hopper", "exact")}
    for j in range(n):
        bj, sbj = b[j:j + 1], sb[j:j + 1]
        np.testing.assert_allclose(ref[:, j], R.ref_gemm_nt(a, sa, bj, sbj)[:, 0], rtol=1e-13)
        np.testing.assert_array_equal(bound[:, j],
                                      R.error_bound(a, sa, bj, sbj, output="float32")[:, 0])
        for tc, y in models.items():
            np.testing.assert_array_equal(
                y[:, j], R.promoted_accumulation_model(a, sa, bj, sbj, tensor_core=tc)[:, 0])


@settings(max_examples=60, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 20), n=st.integers(1, 20), k=st.integers(1, 700),
       emax=st.integers(0, 8))
@example(seed=0, m=1, n=1, k=1, emax=0)
@example(seed=1, m=3, n=129, k=129, emax=8)
def test_ref_gemm_1d1d_exact_on_representable_inputs(seed, m, n, k, emax):
    """Integer payloads |v| <= 16, power-of-two scales 2^[-emax, emax]: exact
    against an int64 computation (partial sums fit 8 + 4 emax + log2(k) <= 51
    bits)."""
    rng = np.random.default_rng(seed)
    kb = -(-k // 128)
    ai, bi = rng.integers(-16, 17, (m, k)), rng.integers(-16, 17, (n, k))
    ea, eb = rng.integers(-emax, emax + 1, (m, kb)), rng.integers(-emax, emax + 1, (n, kb))
    a, b = R.float_to_e4m3(ai.astype(np.float64)), R.float_to_e4m3(bi.astype(np.float64))
    sfa = np.ldexp(np.float32(1), ea).astype(np.float32)
    sfb = np.ldexp(np.float32(1), eb).astype(np.float32)
    want = np.zeros((m, n), np.int64)
    for j in range(kb):
        sl = slice(j * 128, (j + 1) * 128)
        want += (ai[:, sl] @ bi[:, sl].T) * (2 ** (ea[:, j] + emax))[:, None] * (2 ** (eb[:, j] + emax))[None, :]
    got = R.ref_gemm_1d1d(a, sfa, b, sfb) * 2.0 ** (2 * emax)
    np.testing.assert_array_equal(got, want.astype(np.float64))


# ---------------------------------------------------------------------------
# promotion model, c accumulation, error bound
# ---------------------------------------------------------------------------

def test_long_k_all_positive_promotion_within_bound_and_unpromoted_not():
    # K = 16384 tokens, all positive: the wgrad case where promotion every
    # 128 K matters.  The unpromoted thought model is the 1D2D one applied to
    # each row of B (a row of B is one block with its own scale).
    m, n, k = 8, 8, 16384
    a, sa, b, sb = _wgrad_operands(14, m, n, k, "positive")
    ref = R.ref_gemm_1d1d(a, sa, b, sb)
    bound = R.error_bound_1d1d(a, sa, b, sb)
    assert np.all(np.isfinite(bound)) and np.all(bound < 0.01 * ref)
    for tc in ("round", "hopper"):
        y = R.promoted_accumulation_model_1d1d(a, sa, b, sb, tensor_core=tc)
        assert y.dtype == np.float32
        assert np.all(np.abs(y.astype(np.float64) - ref) <= bound), tc
    u = np.concatenate([R.unpromoted_accumulation_model(a, sa, b[j:j + 1], sb[j:j + 1])
                        for j in range(n)], axis=1).astype(np.float64)
    assert np.all(np.abs(u - ref) > bound)
    assert np.all(u < ref)                        # truncation toward zero loses mass
    # with c: the bound still holds
    c = (_data(15, (m, n)) * ref).astype(np.float32)
    yc = R.promoted_accumulation_model_1d1d(a, sa, b, sb, c, tensor_core="hopper").astype(np.float64)
    assert np.all(np.abs(yc - R.ref_gemm_1d1d(a, sa, b, sb, c)) <= R.error_bound_1d1d(a, sa, b, sb, c))


@pytest.mark.parametrize("c_kind", ["normal", "cancel", "huge", "subnormal", "zero"])
@pytest.mark.parametrize("tc", ["round", "hopper"])
def test_c_accumulation_is_one_fp32_add(c_kind, tc):
    m, n, k = 4, 9, 384
    a, sa, b, sb = _wgrad_operands(16, m, n, k)
    y = R.promoted_accumulation_model_1d1d(a, sa, b, sb, tensor_core=tc)
    rng = np.random.default_rng(17)
    if c_kind == "normal":
        c = (rng.standard_normal((m, n)) * np.abs(y).max()).astype(np.float32)
    elif c_kind == "cancel":                       # c = -model (+ 1 ulp here and there)
        c = -y
        c[::2] = np.nextafter(c[::2], np.float32(np.inf))
    elif c_kind == "huge":
        c = (rng.standard_normal((m, n)) * 2.0 ** 40).astype(np.float32)
    elif c_kind == "subnormal":
        c = (rng.integers(-2 ** 20, 2 ** 20, (m, n)) * 2.0 ** -149).astype(np.float32)
    else:
        c = np.zeros((m, n), np.float32)
    yc = R.promoted_accumulation_model_1d1d(a, sa, b, sb, c, tensor_core=tc)
    assert yc.dtype == np.float32 and yc.shape == (m, n)
    want = c + y                                   # NumPy float32 add: IEEE RNE
    np.testing.assert_array_equal(yc.view(np.uint32), want.view(np.uint32))
    bound = R.error_bound_1d1d(a, sa, b, sb, c)
    assert np.all(np.abs(yc.astype(np.float64) - R.ref_gemm_1d1d(a, sa, b, sb, c)) <= bound)
    if c_kind == "zero":                           # one FP32 rounding more than without c
        b0 = R.error_bound_1d1d(a, sa, b, sb)
        np.testing.assert_allclose(bound, b0 + 2.0 ** -24 * (np.abs(R.ref_gemm_1d1d(a, sa, b, sb)) + b0),
                                   rtol=1e-12)


def test_subnormal_partial_sums_are_kept():
    # every block adds 2^-133 (subnormal): 8 blocks give 2^-130 exactly; with c
    # = 2^-149 one more subnormal ulp, exactly (no flush to zero)
    a = np.full((3, 1024), 0x38, np.uint8)        # 1.0
    b = np.full((4, 1024), 0x38, np.uint8)
    sa = np.ones((3, 8), np.float32)
    sb = np.full((4, 8), 2.0 ** -140, np.float32)
    y = R.promoted_accumulation_model_1d1d(a, sa, b, sb, tensor_core="hopper")
    assert np.all(y == np.float32(2.0 ** -130))
    yc = R.promoted_accumulation_model_1d1d(a, sa, b, sb, np.full((3, 4), 2.0 ** -149, np.float32))
    assert np.all(yc.astype(np.float64) == 2.0 ** -130 + 2.0 ** -149)


def test_error_bound_1d1d_overflow_and_nan():
    a = R.float_to_e4m3(np.full((2, 128), 448.0))
    b = R.float_to_e4m3(np.full((3, 128), 448.0))
    big = np.full((2, 1), 1e30, np.float32)
    assert np.all(np.isinf(R.error_bound_1d1d(a, big, b, np.full((3, 1), 1e30, np.float32))))
    one_a, one_b = np.ones((2, 1), np.float32), np.ones((3, 1), np.float32)
    c = np.zeros((2, 3), np.float32)
    c[0, 0] = np.finfo(np.float32).max             # c + ref may round to Inf
    c[1, 2] = np.nan
    bd = R.error_bound_1d1d(a, one_a, b, one_b, c)
    assert np.isinf(bd[0, 0]) and np.isnan(bd[1, 2])
    finite = np.ones((2, 3), bool)
    finite[0, 0] = finite[1, 2] = False
    assert np.all(np.isfinite(bd[finite]))


@settings(max_examples=60, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 12), n=st.integers(1, 40),
       k=st.one_of(st.integers(1, 700), st.sampled_from([128, 256, 640, 1152])),
       kind=st.sampled_from(["normal", "positive", "block_varied", "wide", "sparse"]),
       tc=st.sampled_from(["round", "truncate", "hopper", "exact"]), decade=st.integers(-10, 10),
       with_c=st.booleans())
@example(seed=0, m=1, n=1, k=1, kind="positive", tc="hopper", decade=0, with_c=False)
@example(seed=1, m=3, n=33, k=129, kind="block_varied", tc="hopper", decade=0, with_c=True)
@example(seed=2, m=12, n=40, k=1152, kind="positive", tc="hopper", decade=0, with_c=True)
def test_promoted_model_1d1d_within_error_bound(seed, m, n, k, kind, tc, decade, with_c):
    a, sa, b, sb = _wgrad_operands(seed, m, n, k, kind, decade)
    c = None
    if with_c:
        scale = np.abs(R.ref_gemm_1d1d(a, sa, b, sb)).max() + 1.0
        c = (_data(seed + 2, (m, n)) * scale).astype(np.float32)
    ref = R.ref_gemm_1d1d(a, sa, b, sb, c)
    bound = R.error_bound_1d1d(a, sa, b, sb, c)
    assert bound.shape == (m, n) and np.all(np.isfinite(bound)) and np.all(bound >= 0)
    y = R.promoted_accumulation_model_1d1d(a, sa, b, sb, c, tensor_core=tc)
    assert y.dtype == np.float32 and y.shape == (m, n)
    assert np.all(np.abs(y.astype(np.float64) - ref) <= bound)


@settings(max_examples=15, **SETTINGS)
@given(seed=seeds, m=st.integers(1, 6), n=st.integers(1, 6),
       kb=st.sampled_from([8, 32, 57, 128]))
@example(seed=0, m=6, n=6, kb=128)
def test_promotion_1d1d_within_bound_up_to_k16384_positive(seed, m, n, kb):
    a, sa, b, sb = _wgrad_operands(seed, m, n, 128 * kb, "positive")
    ref = R.ref_gemm_1d1d(a, sa, b, sb)
    y = R.promoted_accumulation_model_1d1d(a, sa, b, sb, tensor_core="hopper").astype(np.float64)
    assert np.all(np.abs(y - ref) <= R.error_bound_1d1d(a, sa, b, sb))


# ---------------------------------------------------------------------------
# k-grouped (MoE wgrad)
# ---------------------------------------------------------------------------

def test_k_grouped_empty_groups_give_c():
    ks = [0, 128, 0, 384, 256, 0]
    m, n, k_total = 5, 7, sum(ks)
    a, sa, b, sb = _wgrad_operands(18, m, n, k_total, "block_varied")
    c = _data(19, (len(ks), m, n)) * 16
    out = R.ref_k_grouped_gemm(a, sa, b, sb, ks, c)
    assert out.shape == (len(ks), m, n) and out.dtype == np.float64
    no_c = R.ref_k_grouped_gemm(a, sa, b, sb, np.array(ks))
    off = 0
    for e, size in enumerate(ks):
        if size == 0:
            np.testing.assert_array_equal(out[e], c[e].astype(np.float64))
            assert np.all(no_c[e] == 0)
        else:
            run, sf_run = slice(off, off + size), slice(off // 128, (off + size) // 128)
            np.testing.assert_array_equal(out[e], R.ref_gemm_1d1d(a[:, run], sa[:, sf_run], b[:, run],
                                                                  sb[:, sf_run], c[e]))
            np.testing.assert_array_equal(no_c[e], R.ref_gemm_1d1d(a[:, run], sa[:, sf_run], b[:, run],
                                                                   sb[:, sf_run]))
        off += size
    # all groups empty, K = 0; no group at all
    a0, sa0 = np.zeros((m, 0), np.uint8), np.zeros((m, 0), np.float32)
    b0, sb0 = np.zeros((n, 0), np.uint8), np.zeros((n, 0), np.float32)
    np.testing.assert_array_equal(R.ref_k_grouped_gemm(a0, sa0, b0, sb0, [0, 0], c[:2]),
                                  c[:2].astype(np.float64))
    assert R.ref_k_grouped_gemm(a0, sa0, b0, sb0, []).shape == (0, m, n)


@settings(max_examples=30, **SETTINGS)
@given(seed=seeds, blocks=st.lists(st.integers(0, 3), min_size=1, max_size=5),
       m=st.integers(1, 9), n=st.integers(1, 9), with_c=st.booleans())
@example(seed=0, blocks=[0], m=1, n=1, with_c=True)
@example(seed=1, blocks=[2, 0, 1], m=3, n=4, with_c=False)
def test_k_grouped_is_per_expert_wgrad(seed, blocks, m, n, with_c):
    """MoE wgrad: expert e's tokens are a contiguous run of ks[e] rows of dy
    [tokens, out = m] and x [tokens, in = n].  Quantising the whole token
    dimension equals quantising each expert apart (the runs are 128-aligned),
    and D[e] is expert e's dw = dy_e.T @ x_e up to the FP8 error."""
    ks = [128 * b for b in blocks]
    t = sum(ks)
    dy, x = _data(seed, (t, m)), _data(seed + 1, (t, n))
    a, sa = R.per_token_cast_to_fp8_t(dy)
    b, sb = R.per_token_cast_to_fp8_t(x)
    c = _data(seed + 2, (len(ks), m, n)) if with_c else None
    out = R.ref_k_grouped_gemm(a, sa, b, sb, ks, c)
    off = 0
    for e, size in enumerate(ks):
        rows = slice(off, off + size)
        ae, sae = R.per_token_cast_to_fp8_t(dy[rows])
        be, sbe = R.per_token_cast_to_fp8_t(x[rows])
        np.testing.assert_array_equal(ae, a[:, rows])
        np.testing.assert_array_equal(sae, sa[:, off // 128:(off + size) // 128])
        np.testing.assert_array_equal(out[e], R.ref_gemm_1d1d(ae, sae, be, sbe, None if c is None else c[e]))
        _, dw = R.ref_linear_backward(x[rows], np.zeros((m, n)), dy[rows])
        want = dw + (0 if c is None else c[e].astype(np.float64))
        # FP8 error, elementwise and rigorous: with da = dequant - dy_e.T and
        # db = dequant - x_e.T, |A'B'^T - AB^T| <= |da||B|^T + |A||db|^T + |da||db|^T
        ta, tb = np.abs(dy[rows].T.astype(np.float64)), np.abs(x[rows].T.astype(np.float64))
        da = np.abs(R.dequantize_lhs(ae, sae) - dy[rows].T)
        db = np.abs(R.dequantize_lhs(be, sbe) - x[rows].T)
        tol = (da @ tb.T + ta @ db.T + da @ db.T) * (1 + 1e-9) + 1e-12 * (ta @ tb.T)
        assert np.all(np.abs(out[e] - want) <= tol)
        if size == 0:
            np.testing.assert_array_equal(out[e], want)
        off += size


# ---------------------------------------------------------------------------
# the float64 backward of a linear layer, and the FP8 pipeline against it
# ---------------------------------------------------------------------------

def test_ref_linear_backward_formulas_and_dtypes():
    rng = np.random.default_rng(20)
    tokens, d_in, d_out = 9, 13, 11
    x = rng.standard_normal((tokens, d_in))
    w = rng.standard_normal((d_out, d_in))
    dy = rng.standard_normal((tokens, d_out))
    dx, dw = R.ref_linear_backward(x, w, dy)
    assert dx.shape == (tokens, d_in) and dw.shape == (d_out, d_in)
    assert dx.dtype == np.float64 and dw.dtype == np.float64
    np.testing.assert_array_equal(dx, dy @ w)
    np.testing.assert_array_equal(dw, dy.T @ x)
    # they are the gradients of L(x, w) = sum(dy * (x @ w.T)), which is linear in each
    h = rng.standard_normal(x.shape)
    lin = np.sum(dy * ((x + h) @ w.T)) - np.sum(dy * (x @ w.T))
    assert lin == pytest.approx(np.sum(dx * h), rel=1e-12)
    hw = rng.standard_normal(w.shape)
    lin_w = np.sum(dy * (x @ (w + hw).T)) - np.sum(dy * (x @ w.T))
    assert lin_w == pytest.approx(np.sum(dw * hw), rel=1e-12)
    # bfloat16 / float32 / int inputs are converted to float64, not rounded to float32
    x16 = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(R.ref_linear_backward(x16, w, dy)[1], dy.T @ x16.astype(np.float64))
    np.testing.assert_array_equal(R.ref_linear_backward(x.astype(np.int32), w, dy)[1],
                                  dy.T @ x.astype(np.int32).astype(np.float64))


@pytest.mark.parametrize("tokens,d_in,d_out", [(256, 384, 256), (300, 129, 200), (129, 256, 127)])
def test_fp8_backward_matches_the_float64_backward(tokens, d_in, d_out):
    rng = np.random.default_rng(tokens + d_in + d_out)
    x = R.block_varied_normal(rng, (tokens, d_in))
    w = R.block_varied_normal(rng, (d_out, d_in), block=(128, 128))
    dy = R.block_varied_normal(rng, (tokens, d_out))
    dx, dw = R.ref_linear_backward(x, w, dy)
    # fprop: 1D2D, K = in
    y = R.ref_gemm_nt(*R.per_token_cast_to_fp8(x), *R.per_block_cast_to_fp8(w))
    assert R.calc_diff(y, x.astype(np.float64) @ w.astype(np.float64).T) < 1e-3
    # dgrad: 1D2D, K = out, B = w.T with the transposed 128x128 scales
    dx8 = R.ref_gemm_nt(*R.per_token_cast_to_fp8(dy), *R.cast_transpose_block_fp8(w))
    assert dx8.shape == dx.shape and R.calc_diff(dx8, dx) < 1e-3
    # wgrad: 1D1D, K = tokens
    dw8 = R.ref_gemm_1d1d(*R.per_token_cast_to_fp8_t(dy), *R.per_token_cast_to_fp8_t(x))
    assert dw8.shape == dw.shape and R.calc_diff(dw8, dw) < 1e-3
    # and the promotion model of the wgrad kernel stays within its bound
    ops = (*R.per_token_cast_to_fp8_t(dy), *R.per_token_cast_to_fp8_t(x))
    model = R.promoted_accumulation_model_1d1d(*ops).astype(np.float64)
    assert np.all(np.abs(model - dw8) <= R.error_bound_1d1d(*ops))


# ---------------------------------------------------------------------------
# argument validation: documented error type, argument named in the message
# ---------------------------------------------------------------------------

def _ops(m=3, n=4, k=256):
    return (np.zeros((m, k), np.uint8), np.ones((m, -(-k // 128)), np.float32),
            np.zeros((n, k), np.uint8), np.ones((n, -(-k // 128)), np.float32))


GEMM_1D1D = {
    "ref_gemm_1d1d": lambda a, sa, b, sb, c=None: R.ref_gemm_1d1d(a, sa, b, sb, c),
    "promoted_accumulation_model_1d1d":
        lambda a, sa, b, sb, c=None: R.promoted_accumulation_model_1d1d(a, sa, b, sb, c),
    "error_bound_1d1d": lambda a, sa, b, sb, c=None: R.error_bound_1d1d(a, sa, b, sb, c),
    "ref_k_grouped_gemm":
        lambda a, sa, b, sb, c=None: R.ref_k_grouped_gemm(
            a, sa, b, sb, [a.shape[-1]] if a.ndim == 2 and a.shape[-1] % 128 == 0 else [256],
            None if c is None else np.asarray(c)[None]),
}


@pytest.mark.parametrize("fn", GEMM_1D1D, ids=list(GEMM_1D1D))
def test_1d1d_argument_errors_name_the_argument(fn):
    f = GEMM_1D1D[fn]
    a, sa, b, sb = _ops()
    assert f(a, sa, b, sb) is not None
    cases = [
        (TypeError, "a_bits", (a.astype(np.int16), sa, b, sb)),
        (TypeError, "b_bits", (a, sa, b.astype(np.float32), sb)),
        (TypeError, "sfa", (a, sa.astype(np.complex64), b, sb)),
        (TypeError, "sfb", (a, sa, b, np.array([["x", "y"]] * 4))),
        (ValueError, "a_bits", (a[0], sa[0], b, sb)),
        (ValueError, "b_bits", (a, sa, b[None], sb[None])),
        (ValueError, "sfa", (a, sa[:, :1], b, sb)),
        (ValueError, "sfa", (a, sa.T, b, sb)),
        (ValueError, "sfb", (a, sa, b, sb[:3])),
        (ValueError, "b_bits", (a, sa, b[:, :128], sb[:, :1])),
    ]
    for exc, name, args in cases:
        with pytest.raises(exc, match=name):
            f(*args)
    with pytest.raises(ValueError, match="c must have shape"):
        f(a, sa, b, sb, np.zeros((4, 3), np.float32))
    with pytest.raises(TypeError, match="^c must"):
        f(a, sa, b, sb, np.zeros((3, 4), np.complex64))


def test_ks_errors_name_ks():
    a, sa, b, sb = _ops(k=384)
    for bad in ([100, 284], [-128, 512], [128, 128], [384, 0, 128], [1, 383]):
        with pytest.raises(ValueError, match="ks"):
            R.ref_k_grouped_gemm(a, sa, b, sb, bad)
    for bad in ([128.0, 256], [True, 383], ["384"], 384, None, {384: 1}, {384}, "384",
                np.array([[128, 256]]), np.array(384)):
        with pytest.raises(TypeError, match="ks"):
            R.ref_k_grouped_gemm(a, sa, b, sb, bad)
    with pytest.raises(ValueError, match="c must have shape"):        # c is [g, m, n]
        R.ref_k_grouped_gemm(a, sa, b, sb, [128, 256], np.zeros((3, 4), np.float32))
    assert R.ref_k_grouped_gemm(a, sa, b, sb, range(0, 384, 128)).shape == (3, 3, 4)


def test_model_and_bound_option_errors():
    a, sa, b, sb = _ops()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="mantissa_bits"):
            R.promoted_accumulation_model_1d1d(a, sa, b, sb, mantissa_bits=bad)
        with pytest.raises(ValueError, match="mantissa_bits"):
            R.error_bound_1d1d(a, sa, b, sb, mantissa_bits=bad)
    with pytest.raises(ValueError, match="tensor_core"):
        R.promoted_accumulation_model_1d1d(a, sa, b, sb, tensor_core="fast")


def test_quantiser_and_backward_argument_errors():
    for f in (R.per_token_cast_to_fp8_t, R.cast_transpose_block_fp8):
        name = "x" if f is R.per_token_cast_to_fp8_t else "w"
        with pytest.raises(ValueError, match=f"^{name} must"):
            f(np.ones(128, np.float32))
        with pytest.raises(TypeError, match=name):
            f(np.ones((2, 128), np.complex64))
        with pytest.raises(ValueError, match="min_amax"):
            f(np.ones((2, 128), np.float32), min_amax=0.0)
        with pytest.raises(TypeError, match="pow2_scale"):
            f(np.ones((2, 128), np.float32), pow2_scale=1)
    x, w, dy = np.ones((4, 3)), np.ones((5, 3)), np.ones((4, 5))
    assert [v.shape for v in R.ref_linear_backward(x, w, dy)] == [(4, 3), (5, 3)]
    cases = [
        (ValueError, "x", (x[0], w, dy)), (ValueError, "w", (x, w[0], dy)),
        (ValueError, "dy", (x, w, dy[0])), (ValueError, "w", (x, w[:, :2], dy)),
        (ValueError, "dy", (x, w, dy[:3])), (ValueError, "dy", (x, w, dy[:, :4])),
        (TypeError, "x", (x.astype(np.complex128), w, dy)),
        (TypeError, "w", (x, np.array([["a"] * 3] * 5), dy)),
        (TypeError, "dy", (x, w, dy.astype(object))),
    ]
    for exc, name, args in cases:
        with pytest.raises(exc, match=f"^{name} must"):
            R.ref_linear_backward(*args)
