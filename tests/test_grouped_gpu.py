"""GPU tests of the grouped GEMMs: contiguous (MoE prefill) and masked (decode)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import cugemm8
from cugemm8 import _config, gemm as _gemm
from tests import gpu_helpers as H

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def expert_weights(cp, rng, g, n, k):
    kb, nb = -(-k // 128), -(-n // 128)
    return H.random_fp8(cp, rng, (g, n, k)), H.random_scales(cp, rng, (g, nb, kb))


# ---------------------------------------------------------------- contiguous

def check_contiguous_layout(cp, rng, idx, g, n, k, *, junk_padding=True, nan_rows=()):
    """Run the contiguous GEMM on random data with host ``m_indices`` ``idx``
    and check every expert's rows against the reference, padding rows (-1)
    for zeros, ``nan_rows`` (layout violations) for NaN, and the guards."""
    m = int(idx.size)
    kb = -(-k // 128)
    a = H.random_fp8(cp, rng, (m, k))
    sfa = H.random_scales(cp, rng, (m, kb))
    if junk_padding and m:
        pad = cp.asarray(idx == -1)
        sfa[pad] = np.float32(3e38)          # junk in padding scales must not leak
    b, sfb = expert_weights(cp, rng, g, n, k)
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, cp.asarray(idx))
    got = H.to_f64(cp, out)
    violating = np.isin(np.arange(m), list(nan_rows))
    for e in range(g):
        rows = np.nonzero((idx == e) & ~violating)[0]
        if rows.size == 0:
            continue
        ref, bound = H.reference_and_bound(cp, a[rows], sfa[rows], b[e], sfb[e])
        H.check_against(cp, out[rows], ref, bound, what=f"expert {e}")
    pad_rows = np.nonzero(idx == -1)[0]
    if pad_rows.size:
        assert bool(cp.all(got[pad_rows] == 0)), "padding rows must be written as zeros"
    for r in nan_rows:
        assert bool(cp.isnan(got[r]).all()), f"row {r} breaks the layout and must be NaN"
    assert H.guards_intact(cp, full, m, n)
    return out


def check_contiguous(cp, rng, sizes, n, k, *, junk_padding=True):
    """check_contiguous_layout on the layout make_contiguous_layout builds from ``sizes``."""
    m_indices, _ = cugemm8.make_contiguous_layout(sizes)
    return check_contiguous_layout(cp, rng, cp.asnumpy(m_indices), len(sizes), n, k,
                                   junk_padding=junk_padding)


@pytest.mark.parametrize("g,m_per,n,k", [(4, 8192, 4096, 7168), (4, 8192, 7168, 2048),
                                         (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)])
def test_contiguous_table(cp, g, m_per, n, k):
    rng = np.random.default_rng(g * m_per + n)
    sizes = [int(m_per * f) for f in rng.uniform(0.7, 1.3, g)]
    check_contiguous(cp, rng, sizes, n, k)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=st.lists(st.sampled_from([0, 1, 5, 127, 128, 129, 200, 256, 300]), min_size=1, max_size=12),
       n=st.sampled_from([256, 520, 2112]), k=st.sampled_from([128, 576, 1040]), seed=st.integers(0, 2 ** 31))
def test_contiguous_sweep(cp, sizes, n, k, seed):
    check_contiguous(cp, np.random.default_rng(seed), sizes, n, k)


# Expert sizes whose boundaries fall at odd multiples of 128 rows, with
# padding, empty experts and a 1-row expert: with BLOCK_M = 256 most tiles
# straddle two experts (or an expert and padding) and need the second pass.
STRADDLING_SIZES = [128, 384, 0, 200, 256, 1, 129, 640]
# B multicast (128x192 / 128x64 c2B) pairs 128-row blocks across those
# boundaries: pairs with one expert share B, the others load their own
# (skipped blocks: test_contiguous_b_multicast_pairs).
CONTIGUOUS_FORCED = [(256, 128, 3, 1, False), (256, 112, 3, 1, False), (256, 128, 3, 2, True),
                     (128, 192, 4, 2, True), (128, 64, 4, 1, False), (64, 32, 8, 1, False),
                     (128, 176, 4, 1, False), (128, 192, 4, 2, False), (128, 64, 4, 2, False)]


@pytest.mark.parametrize("bm,bn,stages,mc,on_a", CONTIGUOUS_FORCED)
@pytest.mark.parametrize("num_sms", [132, 5])
def test_contiguous_forced_configs(cp, bm, bn, stages, mc, on_a, num_sms):
    n, k = 520, 1040
    if mc == 2 and num_sms % 2:
        num_sms -= 1
    cfg = _config.make_config("contiguous", bm, bn, stages, k, num_multicast=mc, multicast_on_a=on_a,
                              num_sms=num_sms)
    assert _config.is_legal(cfg, k=k)[0]
    with _gemm._forced_config(cfg):
        check_contiguous(cp, np.random.default_rng(bm * bn + num_sms), STRADDLING_SIZES, n, k)


@pytest.mark.parametrize("forced", [None, (256, 128, 3), (256, 128, 3, 2, True), (128, 128, 4),
                                    (128, 128, 4, 2, False)])
def test_contiguous_two_pass_edge_layouts(cp, forced):
    # 128-row blocks: [e0, e0 | e1 (+ padding rows), all padding | all
    # padding, e2 (+ a stray e3 row: NaN) | e3, cut short].  With 256-row tiles:
    # a tile with one expert (one pass), an expert then a padding block (pass
    # 1 with expert -1: zeros), a padding block then an expert (pass 0 skips,
    # pass 1 computes), and a last tile whose second block lies past m_sum.
    # With 128-row tiles and B multicast the pairs are (e0, e0): B shared;
    # (e1, padding) and (padding, e2): one side skipped; (e3, past m_sum).
    g, n, k = 4, 520, 576
    blocks = [0, 0, 1, -1, -1, 2, 3]
    idx = np.repeat(np.array(blocks, np.int32), 128)
    idx[2 * 128 + 60: 3 * 128] = -1                 # expert 1 has 60 rows, then padding
    bad = 5 * 128 + 17
    idx[bad] = 3                                    # a layout violation in expert 2's block
    idx = idx[:6 * 128 + 88]                        # the last block is cut short
    cfg = None
    if forced is not None:                          # (BM, BN, stages[, multicast, on A])
        mc, on_a = forced[3:] if len(forced) > 3 else (1, False)
        cfg = _config.make_config("contiguous", *forced[:3], k, num_multicast=mc,
                                  multicast_on_a=on_a, num_sms=132)
    with _gemm._forced_config(cfg):
        check_contiguous_layout(cp, np.random.default_rng(7), idx, g, n, k, junk_padding=False,
                                nan_rows=(bad,))


@pytest.mark.parametrize("forced", [None, (256, 128, 3)])
def test_contiguous_layout_violations_are_nan(cp, forced):
    rng = np.random.default_rng(1)
    n, k = 256, 256
    m_indices, _ = cugemm8.make_contiguous_layout([128, 128])
    m_indices[5] = 1            # a row of expert 1 inside expert 0's block
    m_indices[130] = 7          # an expert id outside [0, g)
    a = H.random_fp8(cp, rng, (256, k))
    sfa = H.random_scales(cp, rng, (256, 2))
    b, sfb = expert_weights(cp, rng, 2, n, k)
    out = cp.empty((256, n), cp.dtype("bfloat16"))
    cfg = None if forced is None else _config.make_config("contiguous", *forced, k, num_sms=132)
    with _gemm._forced_config(cfg):
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, m_indices)
    f = out.astype(cp.float32)
    assert bool(cp.isnan(f[5]).all()) and bool(cp.isnan(f[130]).all())
    assert bool(cp.isfinite(f[:5]).all()) and bool(cp.isfinite(f[131:]).all())


@pytest.mark.parametrize("c2b", [False, True])
def test_contiguous_all_padding_and_empty(cp, c2b):
    # c2b: 128x128 with B multicast on a grid of 4 CTAs, every pair of
    # blocks skipped (9 blocks: the last pair's second block lies past
    # m_sum) with 6 K blocks on 4 stages, so the drained rings wrap.
    rng = np.random.default_rng(2)
    k = 768 if c2b else 256
    cfg = (_config.make_config("contiguous", 128, 128, 4, k, num_multicast=2, multicast_on_a=False, num_sms=4)
           if c2b else None)
    with _gemm._forced_config(cfg):
        check_contiguous(cp, rng, [0, 0, 0], 256, k)
    m = 9 * 128 if c2b else 256
    m_indices = cp.full((m,), -1, cp.int32)
    a = H.random_fp8(cp, rng, (m, k))
    sfa = H.random_scales(cp, rng, (m, k // 128))
    b, sfb = expert_weights(cp, rng, 3, 256, k)
    out, full = H.poisoned_out(cp, m, 256)
    with _gemm._forced_config(cfg):
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, m_indices)
    assert bool(cp.all(out.astype(cp.float32) == 0))
    assert H.guards_intact(cp, full, m, 256)


@pytest.mark.parametrize("bn", [128, 192])
@pytest.mark.parametrize("num_sms", [4, 132])
def test_contiguous_b_multicast_pairs(cp, bn, num_sms):
    # B multicast pairs 128-row blocks: (e0, e0) share B; (e1, padding),
    # (padding, e2) and (invalid id, e2) have one skipped side, whose stages
    # are drained; (e3, e3) share; (padding, padding) both skip; (e1, e1);
    # (e2 cut short, past m_sum).  On 4 CTAs each cluster walks several of
    # these tiles in a row, skipped and computed, with 9 K blocks on 4
    # stages (the rings wrap).
    g, n, k = 4, 520, 1040
    blocks = [0, 0, 1, -1, -1, 2, 9, 2, 3, 3, -1, -1, 1, 1, 2]
    idx = np.repeat(np.array(blocks, np.int32), 128)
    idx = idx[:14 * 128 + 40]                      # the last block is cut short
    invalid = np.arange(6 * 128, 7 * 128)          # every row of the invalid block: NaN
    cfg = _config.make_config("contiguous", 128, bn, 4, k, num_multicast=2, multicast_on_a=False, num_sms=num_sms)
    assert _config.is_legal(cfg, k=k)[0]
    with _gemm._forced_config(cfg):
        check_contiguous_layout(cp, np.random.default_rng(bn + num_sms), idx, g, n, k, junk_padding=True,
                                nan_rows=tuple(invalid))


# ---------------------------------------------------------------- masked

def check_masked(cp, rng, g, m_max, n, k, masked_m, expected_m, *, cfg=None):
    kb = -(-k // 128)
    a = H.random_fp8(cp, rng, (g, m_max, k), nan_free=False)     # padding rows may hold NaN codes
    sfa = H.random_scales(cp, rng, (g, m_max, kb))
    valid = np.zeros((g, m_max), bool)
    for i, v in enumerate(masked_m):
        valid[i, :max(0, min(v, m_max))] = True
    a_np = cp.asnumpy(a)
    a_np[valid] = np.where((a_np[valid] & 0x7F) == 0x7F, 0x7E, a_np[valid])   # valid rows finite
    a = cp.asarray(a_np)
    sfa_np = cp.asnumpy(sfa)
    sfa_np[~valid] = np.float32(np.nan)                                       # junk scales in padding
    sfa = cp.asarray(sfa_np)
    b, sfb = expert_weights(cp, rng, g, n, k)
    out, full = H.poisoned_out(cp, m_max, n, batch=g, guard_rows=0, guard_cols=0)
    mm = cp.asarray(np.asarray(masked_m, np.int32))
    if cfg is None:
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, mm, expected_m)
    else:
        _gemm._launch(cfg, "masked", n, k, g, m_max, m_max, a, cugemm8.get_col_major_tma_aligned_tensor(sfa),
                      b, sfb, out, mm, g)
    bits = out.view(cp.uint16)
    for i in range(g):
        v = max(0, min(masked_m[i], m_max))
        if v:
            ref, bound = H.reference_and_bound(cp, a[i, :v], sfa[i, :v], b[i], sfb[i])
            H.check_against(cp, out[i, :v], ref, bound, what=f"group {i}")
        assert bool(cp.all(bits[i, v:] == H.POISON_BITS)), f"group {i}: rows >= masked_m were written"


@pytest.mark.parametrize("g,m_max,n,k", [(1, 1024, 4096, 7168), (1, 1024, 7168, 2048), (2, 512, 4096, 7168),
                                         (2, 512, 7168, 2048), (4, 256, 4096, 7168), (4, 256, 7168, 2048)])
def test_masked_table(cp, g, m_max, n, k):
    rng = np.random.default_rng(g * m_max + n)
    masked = [int(x) for x in rng.integers(0, m_max + 1, g)]
    check_masked(cp, rng, g, m_max, n, k, masked, max(1, m_max // 2))
    check_masked(cp, rng, g, m_max, n, k, [m_max] * g, m_max)


@pytest.mark.parametrize("num_experts", [510, 512])
@pytest.mark.parametrize("mc", [1, 2])
def test_contiguous_two_pass_every_tile_mixed(cp, num_experts, mc):
    # 128-row experts: every 256-row tile holds two experts, so every tile
    # runs both passes, each with its own expert (hundreds of experts).  With
    # A multicast (the heuristic's choice for this layout since v0.6) the two
    # CTAs of a cluster take two n-blocks of the same 256 rows, in lock-step
    # through both passes.
    n, k = 128 * mc, 256
    cfg = _config.make_config("contiguous", 256, 128, 3, k, num_multicast=mc,
                              multicast_on_a=mc == 2, num_sms=132)
    assert _config.is_legal(cfg, k=k)[0]
    with _gemm._forced_config(cfg):
        check_contiguous(cp, np.random.default_rng(num_experts), [128] * num_experts, n, k)


@pytest.mark.parametrize("bm,bn,stages,k", [(64, 32, 8, 1168), (128, 24, 6, 1168), (128, 24, 6, 2288)])
@pytest.mark.parametrize("num_sms", [132, 4])
def test_contiguous_split_k(cp, bm, bn, stages, k, num_sms):
    # Split K across a CTA pair: padding blocks (skipped by both CTAs of the
    # pair, zeros stored by rank 0) and many tiles per pair (4 CTAs).  K =
    # 2288: 18 K blocks, split 11 / 7 by BLOCK_M = 128 pairs (_config.split_k_skew).
    n = 520
    cfg = _config.make_config("contiguous", bm, bn, stages, k, num_k_splits=2, num_sms=num_sms)
    assert _config.is_legal(cfg, k=k)[0]
    with _gemm._forced_config(cfg):
        check_contiguous(cp, np.random.default_rng(bm * bn + num_sms), STRADDLING_SIZES, n, k)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(g=st.integers(1, 64), m_max=st.sampled_from([1, 20, 64, 127, 128, 129, 200, 256]),
       n=st.sampled_from([256, 520, 2112]), k=st.sampled_from([128, 576, 1040]),
       expected_m=st.integers(1, 4096), data=st.data())
def test_masked_sweep(cp, g, m_max, n, k, expected_m, data):
    masked = data.draw(st.lists(st.sampled_from([0, 1, 63, 64, 65, 127, 128, 129, 200, 256, 10 ** 6, -5]),
                                min_size=g, max_size=g))
    check_masked(cp, np.random.default_rng(data.draw(st.integers(0, 2 ** 31))), g, m_max, n, k,
                 masked, expected_m)


@pytest.mark.parametrize("bm,bn,stages,mc,on_a", [(64, 32, 8, 1, False), (128, 144, 4, 2, True),
                                                  (256, 112, 3, 2, True), (256, 128, 3, 1, False),
                                                  (128, 176, 4, 2, True)])
def test_masked_forced_configs(cp, bm, bn, stages, mc, on_a):
    g, m_max, n, k = 3, 200, 1000, 640
    cfg = _config.make_config("masked", bm, bn, stages, k, num_multicast=mc, multicast_on_a=on_a, num_sms=132)
    assert _config.is_legal(cfg, k=k)[0]
    check_masked(cp, np.random.default_rng(bm + bn), g, m_max, n, k, [200, 0, 77], 100, cfg=cfg)


@pytest.mark.parametrize("bm,bn,stages,k", [(64, 16, 8, 768), (128, 32, 6, 768), (128, 32, 6, 2304)])
def test_masked_split_k(cp, bm, bn, stages, k):
    # Split K across a CTA pair, with an empty group and partial slabs
    # (rows stored one by one by rank 0); K = 2304: 18 K blocks, split 11 / 7
    # by BLOCK_M = 128 pairs.
    g, m_max, n = 3, 200, 1000
    cfg = _config.make_config("masked", bm, bn, stages, k, num_k_splits=2, num_sms=132)
    assert _config.is_legal(cfg, k=k)[0]
    check_masked(cp, np.random.default_rng(bm + bn), g, m_max, n, k, [200, 0, 77], 100, cfg=cfg)


def test_masked_graph_replay_with_new_masked_m(cp):
    rng = np.random.default_rng(9)
    g, m_max, n, k = 4, 256, 4096, 7168
    a = H.random_fp8(cp, rng, (g, m_max, k))
    sfa = cugemm8.get_col_major_tma_aligned_tensor(H.random_scales(cp, rng, (g, m_max, 56)))
    b, sfb = expert_weights(cp, rng, g, n, k)
    masked_m = cp.asarray(np.array([10, 200, 0, 256], np.int32))
    out = cp.zeros((g, m_max, n), cp.dtype("bfloat16"))
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, 128)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, 128)
        graph = stream.end_capture()
    new = [256, 3, 129, 0]
    masked_m[...] = cp.asarray(np.array(new, np.int32))
    out[...] = 0
    cp.cuda.Device().synchronize()      # the updates ran on the legacy stream
    graph.launch(stream)
    stream.synchronize()
    for i, v in enumerate(new):
        if v:
            ref, bound = H.reference_and_bound(cp, a[i, :v], sfa[i, :v], b[i], sfb[i])
            H.check_against(cp, out[i, :v], ref, bound)
        assert bool(cp.all(out[i, v:].astype(cp.float32) == 0))
