"""GPU tests of the normal GEMM (need a Hopper GPU; skipped elsewhere).

Every test draws fresh random inputs, poisons the output (NaN bits) inside a
buffer with guard rows and columns, and checks each element against the
float64 reference of the dequantised operands within the promotion bound
(tests/gpu_helpers.py), plus the guards and bit-identical reruns.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import cugemm8
from cugemm8 import _config, gemm as _gemm
from cugemm8._shapes import DEEPSEEK_NK
from tests import gpu_helpers as H

pytestmark = pytest.mark.gpu

NK_TABLE = list(DEEPSEEK_NK)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def run_checked(cp, a, sfa, b, sfb, *, what="", rerun=True, sfa_for_call=None):
    m, n = a.shape[0], b.shape[0]
    out, full = H.poisoned_out(cp, m, n)
    lhs_sfa = sfa if sfa_for_call is None else sfa_for_call
    cugemm8.gemm_fp8_fp8_bf16_nt((a, lhs_sfa), (b, sfb), out)
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, out, ref, bound, what=what)
    assert H.guards_intact(cp, full, m, n), f"{what}: a guard row/column was written"
    if rerun:
        out2, _ = H.poisoned_out(cp, m, n)
        cugemm8.gemm_fp8_fp8_bf16_nt((a, lhs_sfa), (b, sfb), out2)
        assert bool(cp.all(out.view(cp.uint16) == out2.view(cp.uint16))), f"{what}: rerun not bit-identical"
    return out, ref


@pytest.mark.parametrize("m", [1, 64, 128, 4096])
@pytest.mark.parametrize("n,k", NK_TABLE)
def test_deepseek_table(cp, m, n, k):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    sfa_tma = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    run_checked(cp, a, sfa, b, sfb, what=f"m={m} n={n} k={k}", sfa_for_call=sfa_tma)


DECODE_MS = [1, 2, 4, 8, 16, 32, 64, 128]


@pytest.mark.parametrize("m", DECODE_MS)
@pytest.mark.parametrize("n,k", NK_TABLE[:6])
def test_decode_table(cp, m, n, k):
    """Every decode batch size of the benchmark (issue 18) on the six
    DeepSeek-V3 weight shapes, with the configs the heuristic picks there
    (A boxes of M rows below one tile)."""
    rng = np.random.default_rng(m * 104729 + n * 7 + k)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    run_checked(cp, a, sfa, b, sfb, what=f"m={m} n={n} k={k}",
                sfa_for_call=cugemm8.get_col_major_tma_aligned_tensor(sfa))


# The one-warpgroup split-K twin (_config._split_k_one_wg_twin) through the
# public op beyond the decode table: M = 65 and 100 (tails in the second
# m-block), N = 1536 (96 CTAs), K = 4096 and 16384 (11 stages).
@pytest.mark.parametrize("m,n,k", [(65, 2112, 4096), (100, 1536, 16384), (128, 2048, 7168)])
def test_split_k_one_wg_twin(cp, m, n, k):
    cfg = cugemm8.get_gemm_config("normal", m, n, k)
    assert cfg.block_m == 64 and cfg.num_math_warpgroups == 1 and cfg.num_k_splits == 2, cfg
    check_pick_through_the_op(cp, cfg, m, n, k, seed=m * 31 + n + k)


def check_pick_through_the_op(cp, cfg, m, n, k, *, seed):
    """Fresh operands from ``seed`` through the public op (the heuristic's
    ``cfg``), checked as run_checked does (poisoned output, guards, the
    reference and its bound, a bit-identical rerun)."""
    a, sfa, b, sfb = H.make_operands(cp, np.random.default_rng(seed), m, n, k)
    run_checked(cp, a, sfa, b, sfb, what=f"{cfg} m={m} n={n} k={k}",
                sfa_for_call=cugemm8.get_col_major_tma_aligned_tensor(sfa))


# The 128-row split-K twin of a 64-row one-warpgroup pick
# (_config._split_k_m128_twin) through the public op beyond the decode
# table's 128x4096x7168: M = 121 (the 128-row tile's last rows empty),
# N = 4224 (132 CTAs), K = 8192 (32 K blocks a rank, skewed 34 / 30).
@pytest.mark.parametrize("m,n,k", [(121, 4096, 8192), (128, 4224, 7168)])
def test_split_k_m128_twin(cp, m, n, k):
    cfg = cugemm8.get_gemm_config("normal", m, n, k)
    assert cfg.block_m == 128 and cfg.block_n == 64 and cfg.num_k_splits == 2, cfg
    check_pick_through_the_op(cp, cfg, m, n, k, seed=m * 37 + n + k)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 17, 32, 63])
@pytest.mark.parametrize("n", [8, 24, 520])
@pytest.mark.parametrize("k", [1040, 7168])
def test_decode_awkward_n(cp, m, n, k):
    rng = np.random.default_rng(m * 31 + n + k)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    run_checked(cp, a, sfa, b, sfb, what=f"m={m} n={n} k={k}")


# Small-M boxes under every tile family: (BLOCK_M, BLOCK_N, stages, multicast,
# multicast on A, K splits), each at M below, at and just past one tile.
SMALL_M_FORCED = [(64, 32, 8, 1, False, 1), (64, 32, 8, 1, False, 2), (128, 64, 6, 1, False, 2),
                  (128, 128, 5, 2, True, 1), (128, 192, 4, 2, False, 1), (256, 128, 3, 1, False, 1),
                  (64, 16, 8, 2, True, 1)]


@pytest.mark.parametrize("tile", SMALL_M_FORCED, ids=lambda t: "-".join(map(str, t)))
@pytest.mark.parametrize("m", [1, 3, 37, 100, 200, 257])
def test_small_m_boxes_forced(cp, tile, m):
    bm, bn, stages, mc, on_a, splits = tile
    n, k = 1000, 2048
    cfg = _config.make_config("normal", bm, bn, stages, k, num_multicast=mc, multicast_on_a=on_a,
                              num_k_splits=splits, num_sms=132)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    rng = np.random.default_rng(m + bm + bn)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    out, full = H.poisoned_out(cp, m, n)
    # Stale, NaN-filled shared memory must never reach a stored row: run a
    # NaN-heavy GEMM first on the same config, then the real one.
    junk_a = cp.full((bm, k), 0x7F, dtype=cp.uint8)
    junk_out = cp.empty((bm, n), dtype=cp.dtype("bfloat16"))
    sfa_tma = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    _gemm._launch(cfg, "normal", n, k, 1, bm, bm, junk_a,
                  cugemm8.get_col_major_tma_aligned_tensor(cp.ones((bm, k // 128), cp.float32)), b, sfb,
                  junk_out, None, 1)
    _gemm._launch(cfg, "normal", n, k, 1, m, m, a, sfa_tma, b, sfb, out, None, 1)
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, out, ref, bound, what=f"{cfg} m={m}")
    assert H.guards_intact(cp, full, m, n)


@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (128, 4096, 7168), (256, 7168, 2048), (1, 576, 7168)])
def test_against_unquantised_product(cp, m, n, k):
    """DeepGEMM's end-to-end criterion: calc_diff < 1e-3 against the float64
    product of the unquantised inputs (quantised by cugemm8.reference)."""
    from cugemm8 import reference as R
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    a, sfa = R.per_token_cast_to_fp8(x)
    b, sfb = R.per_block_cast_to_fp8(w)
    out = cp.empty((m, n), dtype=cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((cp.asarray(a), cp.asarray(sfa)), (cp.asarray(b), cp.asarray(sfb)), out)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert H.calc_diff(cp, out, cp.asarray(exact)) < 1e-3
    # The same through the library's GPU quantisers: bit-identical operands,
    # the MN-major sfa passed as returned, the same output bits
    a_g, sfa_g = cugemm8.per_token_cast_to_fp8(cp.asarray(x))
    b_g, sfb_g = cugemm8.per_block_cast_to_fp8(cp.asarray(w))
    assert np.array_equal(a_g.get(), a) and np.array_equal(b_g.get(), b)
    assert np.array_equal(sfa_g.get(), sfa) and np.array_equal(sfb_g.get(), sfb)
    out_g = cp.empty((m, n), dtype=cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((a_g, sfa_g), (b_g, sfb_g), out_g)
    assert bool(cp.all(out_g.view(cp.uint16) == out.view(cp.uint16)))
    # cross-check the GPU reference with the NumPy one on this shape
    ref_np = R.ref_gemm_nt(a, sfa, b, sfb)
    ref_gpu, _ = H.reference_and_bound(cp, cp.asarray(a), cp.asarray(sfa), cp.asarray(b), cp.asarray(sfb))
    np.testing.assert_allclose(cp.asnumpy(ref_gpu), ref_np, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 700),
       n=st.sampled_from([8, 16, 24, 40, 136, 264, 520, 1032, 2112]),
       k=st.sampled_from([16, 48, 128, 144, 256, 576, 1040, 1152]),
       seed=st.integers(0, 2 ** 31))
def test_lattice_sweep(cp, m, n, k, seed):
    rng = np.random.default_rng(seed)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    run_checked(cp, a, sfa, b, sfb, what=f"m={m} n={n} k={k}", rerun=False)


# Forced configurations: every tile family, multicast side and phantom case,
# on a shape whose M, N and K all leave tails.
FORCED = [
    (64, 16, 6, 1, False), (64, 56, 8, 1, False), (64, 192, 4, 1, False),
    (128, 112, 5, 1, False), (128, 136, 4, 1, False), (128, 144, 4, 1, False), (128, 160, 4, 1, False),
    (128, 176, 4, 1, False), (128, 176, 4, 2, True), (64, 176, 4, 1, False),
    (128, 192, 4, 2, True), (128, 128, 5, 2, False), (256, 128, 3, 2, True), (256, 128, 3, 2, False),
    (256, 112, 3, 1, False), (128, 8, 6, 2, True), (64, 24, 6, 2, False),
]


@pytest.mark.parametrize("bm,bn,stages,mc,on_a", FORCED)
@pytest.mark.parametrize("num_sms", [132, 7])
def test_forced_configs(cp, bm, bn, stages, mc, on_a, num_sms):
    m, n, k = 333, 1000, 1040        # tails in M, N (vs BLOCK_N) and K (1040 = 8*128 + 16)
    if mc == 2 and num_sms % 2:
        num_sms -= 1
    cfg = _config.make_config("normal", bm, bn, stages, k, num_multicast=mc, multicast_on_a=on_a,
                              num_sms=num_sms)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    rng = np.random.default_rng(bm * bn + stages)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    out, full = H.poisoned_out(cp, m, n)
    _gemm._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb,
                  out, None, 1)
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, out, ref, bound, what=str(cfg))
    assert H.guards_intact(cp, full, m, n)


# BLOCK_N = 176: a tile touches up to three 128-row blocks of B scales
# (_config.sfb_tile_rows).  n = 1424 puts tiles at all 8 offsets n0 % 128
# (0, 48, 96, 16, 64, 112, 32, 80; three rows at 96 and 112) plus a 16-column
# tail tile in the last block; n = 504 ends inside a three-row tile (n0 = 352)
# whose third row is past the last block of B scales (staged as zeros, read
# by no stored column).  The output must equal the Hopper promotion model
# bit for bit (the kernel promotes in block order from cleared
# accumulators), so a scale read from a neighbouring row cannot hide inside
# the error bound; with 6 SMs each CTA runs many tiles of different offsets.
THREE_ROW_TILES = [(128, 176, 4, 1, False), (128, 176, 4, 2, True), (128, 176, 4, 2, False)]


@pytest.mark.parametrize("bm,bn,stages,mc,on_a", THREE_ROW_TILES)
@pytest.mark.parametrize("m,n,k", [(130, 1424, 1040), (77, 504, 1040)])   # n: a multiple of 8 (the op's rule)
@pytest.mark.parametrize("num_sms", [132, 6])
def test_three_scale_row_tiles_match_the_promotion_model(cp, bm, bn, stages, mc, on_a, m, n, k, num_sms):
    from cugemm8 import reference as R
    assert _config.sfb_tile_rows(bn) == 3
    cfg = _config.make_config("normal", bm, bn, stages, k, num_multicast=mc, multicast_on_a=on_a,
                              num_sms=num_sms)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    rng = np.random.default_rng(m * n + mc + num_sms)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    out, full = H.poisoned_out(cp, m, n)
    _gemm._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb,
                  out, None, 1)
    assert H.guards_intact(cp, full, m, n), f"{cfg}: a guard row/column was written"
    model = R.promoted_accumulation_model(cp.asnumpy(a), cp.asnumpy(sfa), cp.asnumpy(b), cp.asnumpy(sfb),
                                          tensor_core="hopper")
    want = R.round_to_bf16(model).view(np.uint16)
    got = cp.asnumpy(out.view(cp.uint16))
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{cfg} m={m} n={n}: {len(bad)} outputs differ from the model, first at "
                           f"{tuple(bad[0])} (column block {bad[0][1] // 128}, tile {bad[0][1] // bn})")


# Split K across a CTA pair (num_k_splits = 2): both intra-CTA forms
# (BLOCK_M 64 splits K again between its warpgroups), narrow and wide tiles,
# 66 pairs (a few tiles each; 128x64 has 48 tiles, at most one per pair) and
# 3 pairs (6 CTAs: many tiles each, the exchange barriers' phases turn
# over).  K = 1168 = 9 * 128 + 16: ten K blocks, five per CTA, the last one
# partial; K = 256: one block per CTA, so with BLOCK_M = 64 the second
# warpgroup has none and hands zeros to the first.  K = 2288 = 17 * 128 +
# 112: 18 K blocks, the last partial; BLOCK_M = 128 pairs split them 11 / 7
# (_config.split_k_skew), BLOCK_M = 64 pairs 9 / 9 (odd per CTA).
SPLIT_K_FORCED = [(64, 16, 8, 1168), (64, 32, 16, 1168), (64, 120, 4, 1168), (128, 32, 8, 1168),
                  (128, 64, 6, 1168), (64, 32, 8, 256), (128, 32, 8, 2288), (128, 64, 6, 2288),
                  (64, 32, 16, 2288)]


@pytest.mark.parametrize("bm,bn,stages,k", SPLIT_K_FORCED)
@pytest.mark.parametrize("num_sms", [132, 6])
def test_forced_split_k_configs(cp, bm, bn, stages, k, num_sms):
    m, n = 333, 1000
    cfg = _config.make_config("normal", bm, bn, stages, k, num_k_splits=2, num_sms=num_sms)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    # Poisoned, guarded output; within the bound of the float64 reference; and,
    # since the pair always adds rank 1's partial tile to rank 0's, a rerun
    # is bit-identical.
    H.run_forced(cp, cfg, m, n, k, bm * bn + stages + num_sms, reruns=1)


# Split K across a cluster of four (num_k_splits = 4): the partial tiles meet
# as a tree, (p0 + p1) + (p2 + p3), and the output must equal the Hopper
# promotion model in that order bit for bit (a partial tile added twice,
# dropped, or read before it landed cannot hide inside the error bound).
# Both BLOCK_M (64 on one and on two math warpgroups, where each CTA splits
# its quarter again between the warpgroups), narrow and wide tiles; 30
# clusters (one tile each at most) and 1-3 clusters (many tiles each: rank
# 0's exchange barrier completes twice per tile, so its phases and the
# other ranks' turn over many times).  K = 1936 = 15 * 128 + 16: 16 K blocks,
# four per CTA, the last one partial; K = 512: one block per CTA.
SPLIT_K4_FORCED = [(128, 64, 6, 2, 200, 1000, 1936), (64, 64, 8, 1, 77, 1000, 1936),
                   (64, 64, 8, 2, 77, 1000, 1936), (64, 24, 16, 1, 5, 520, 7168),
                   (128, 128, 3, 2, 130, 520, 1936), (64, 32, 8, 2, 33, 1000, 512),
                   (128, 24, 10, 2, 128, 576, 7168)]


@pytest.mark.parametrize("bm,bn,stages,wgs,m,n,k", SPLIT_K4_FORCED)
@pytest.mark.parametrize("num_sms", [120, 12, 4])
def test_split_k4_matches_the_promotion_model(cp, bm, bn, stages, wgs, m, n, k, num_sms):
    cfg = _config.make_config("normal", bm, bn, stages, k, num_k_splits=4, num_sms=num_sms,
                              num_math_warpgroups=wgs)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    H.check_split_against_model(cp, cfg, m, n, k, m * n + bm + wgs + num_sms, k_splits=4,
                                warpgroup_split=bm == 64 and wgs == 2)


# Split K across a CTA pair with the skewed split point (_config.split_k_skew:
# BLOCK_M = 128 and one math warpgroup at BLOCK_M = 64, each rank >= 8 K
# blocks): rank 0 sums blocks [0, nkb/2 + 2), rank 1 the rest, and the output
# must equal the promotion model with that split bit for bit (a block summed
# by both ranks, by neither, or a rank-1 count taken from rank 0 cannot hide
# inside the error bound).  One warpgroup: the pipelined K loop (BLOCK_N <=
# 96: 32 and 64, its run-time trip count) and the unrolled one (112);
# BLOCK_M = 64 on two warpgroups keeps an even split; K = 2288: 18 K blocks
# (11 / 7 when skewed, the last partial), 7168: 56 (30 / 26); 132 CTAs and 6
# (many tiles per CTA, so stage and exchange phases turn over).
SPLIT_K_SKEW_FORCED = [(64, 32, 8, 1, 2288), (64, 64, 8, 1, 2288), (64, 112, 6, 1, 2288),
                       (64, 64, 12, 1, 7168), (64, 32, 8, 2, 2288), (128, 32, 8, 2, 2288)]


@pytest.mark.parametrize("bm,bn,stages,wgs,k", SPLIT_K_SKEW_FORCED)
@pytest.mark.parametrize("num_sms", [132, 6])
def test_split_k_skew_matches_the_promotion_model(cp, bm, bn, stages, wgs, k, num_sms):
    m, n = 130, 1000
    cfg = _config.make_config("normal", bm, bn, stages, k, num_k_splits=2, num_sms=num_sms,
                              num_math_warpgroups=wgs)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    skew = _config.split_k_skew(bm, k, wgs)
    assert skew == (0 if bm == 64 and wgs == 2 else 2)
    H.check_split_against_model(cp, cfg, m, n, k, bm * bn + wgs + k + num_sms, k_splits=2, split_skew=skew,
                                warpgroup_split=bm == 64 and wgs == 2)


# The narrow-N weights where select_config takes the four-way split-K twin
# (_config._split_k4_twin; tests/test_config.py pins which picks), through
# the public op at every decode M; with
# the whole device M <= 8 runs the warp-MMA kernel, so a budget of 128 SMs
# (cugemm8.set_num_sms) runs the TMA picks there too.
@pytest.mark.parametrize("m", DECODE_MS + [100])
@pytest.mark.parametrize("n,k", [(576, 7168), (256, 7168), (1024, 7168), (1536, 7168), (576, 16384)])
@pytest.mark.parametrize("budget", [None, 128])
def test_split_k4_picks(cp, m, n, k, budget):
    num_sms = cugemm8.get_num_sms()
    try:
        if budget is not None:
            cugemm8.set_num_sms(budget)
        cfg = cugemm8.get_gemm_config("normal", m, n, k)
        rng = np.random.default_rng(m * 131 + n + k)
        a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
        run_checked(cp, a, sfa, b, sfb, what=f"{cfg} m={m} n={n} k={k}",
                    sfa_for_call=cugemm8.get_col_major_tma_aligned_tensor(sfa))
    finally:
        cugemm8.set_num_sms(num_sms)


def test_split_k4_clusters_are_all_resident(cp):
    """The four-way grid's clusters all fit at once on this device
    (cuOccupancyMaxActiveClusters), as :func:`_config.split_k4_max_ctas`
    assumes for the twin rule (a grid past it runs a second wave)."""
    from cuda.bindings import driver as d
    from cugemm8 import _jit
    num_sms = cugemm8.get_num_sms()
    for m, n, k in [(64, 576, 7168), (128, 576, 7168), (64, 1536, 7168)]:
        cfg = cugemm8.get_gemm_config("normal", m, n, k)
        assert cfg.num_k_splits == 4 and cfg.num_sms <= _config.split_k4_max_ctas(num_sms), str(cfg)
        name = _gemm._kernel_name(cfg, n, k, 0, 1)
        kern = _jit.get_kernel(_gemm._header_of(name), name, max_dynamic_smem=cfg.smem_bytes)
        lc = d.CUlaunchConfig()
        lc.gridDimX, lc.gridDimY, lc.gridDimZ = cfg.num_sms, 1, 1
        lc.blockDimX, lc.blockDimY, lc.blockDimZ = 128 * (cfg.num_math_warpgroups + 1), 1, 1
        lc.sharedMemBytes = cfg.smem_bytes
        lc.numAttrs = 0
        err, clusters = d.cuOccupancyMaxActiveClusters(d.CUfunction(kern.kernel.ptr), lc)
        assert err == d.CUresult.CUDA_SUCCESS, err
        assert cfg.num_sms <= 4 * clusters, f"{cfg}: {clusters} clusters of 4 resident"


@pytest.mark.parametrize("bm,bn,stages,splits", [(64, 32, 8, 1), (64, 32, 8, 2), (128, 32, 8, 2),
                                                  (128, 64, 6, 1), (64, 32, 8, 4), (128, 32, 8, 4)])
def test_split_k_keeps_subnormal_partial_sums(cp, bm, bn, stages, splits):
    """A = B = 1.0, SFA = 1, SFB = 2^-140: each 128-K block adds 128 * 2^-140 =
    2^-133, an FP32 subnormal, and the 8 blocks sum to 2^-130, exact in FP32
    and in BF16.  The split-K reductions (BLOCK_M = 64 inside a CTA; K across
    a CTA pair) add subnormal partial sums: a flush-to-zero add (v0.2-v0.5)
    gives 0.  Bits are compared on the host (CuPy's kernels flush too)."""
    import ml_dtypes
    m, n, k = 130, 256, 1024
    a = cp.full((m, k), 0x38, cp.uint8)                 # e4m3 1.0
    b = cp.full((n, k), 0x38, cp.uint8)
    sfa = cp.asarray(np.ones((m, k // 128), np.float32))
    sfb = cp.asarray(np.full((n // 128, k // 128), 2.0 ** -140, np.float32))
    cfg = _config.make_config("normal", bm, bn, stages, k, num_k_splits=splits, num_sms=132)
    assert _config.is_legal(cfg, k=k)[0]
    out, full = H.poisoned_out(cp, m, n)
    _gemm._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb,
                  out, None, 1)
    want = np.array(2.0 ** -130, ml_dtypes.bfloat16).view(np.uint16)
    got = cp.asnumpy(out.view(cp.uint16))
    assert np.all(got == want), f"{cfg}: {np.unique(got)[:4]} instead of 0x{int(want):04x}"
    assert H.guards_intact(cp, full, m, n)


def test_m_zero_launches_nothing(cp):
    a = cp.zeros((0, 7168), cp.uint8)
    sfa = cp.zeros((0, 56), cp.float32)
    b = cp.ones((4096, 7168), cp.uint8)
    sfb = cp.ones((32, 56), cp.float32)
    out = cp.zeros((0, 4096), cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)   # adversarial.md item 3


@pytest.mark.parametrize("k", [128, 384, 640, 1152, 1664, 7232])
def test_odd_k_block_counts(cp, k):
    """adversarial.md item 1: odd numbers of K blocks and a half-full last block."""
    rng = np.random.default_rng(k)
    a, sfa, b, sfb = H.make_operands(cp, rng, 128, 7168, k)
    run_checked(cp, a, sfa, b, sfb, what=f"k={k}", rerun=False)


@pytest.mark.parametrize("n,k", [(7168, 2048), (2112, 7168)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 7, 63, 65, 127, 129, 133])
def test_small_odd_m_constant_rows(cp, m, n, k):
    """adversarial.md item 2: row i of X is (i+1)/16, so Y[i] = (i+1)/16 * rowsum(W)."""
    rng = np.random.default_rng(m)
    kb, nb = -(-k // 128), -(-n // 128)
    # payload 0x38 = 1.0 in e4m3; scale (i+1)/16 per row gives X[i, :] = (i+1)/16
    a = cp.full((m, k), 0x38, cp.uint8)
    sfa = cp.asarray(np.repeat(((np.arange(m) + 1) / 16).astype(np.float32)[:, None], kb, axis=1))
    b = H.random_fp8(cp, rng, (n, k))
    sfb = H.random_scales(cp, rng, (nb, kb))
    out, ref = run_checked(cp, a, sfa, b, sfb, what=f"m={m}")
    # rows are multiples of row 0 (no swaps): Y[i] / Y[0] == i + 1 within bf16 rounding
    got = H.to_f64(cp, out)
    ratio = got / got[:1]
    want = cp.arange(1, m + 1, dtype=cp.float64)[:, None]
    mask = cp.abs(got[:1]) > 1e-3 * cp.abs(got[:1]).max()
    assert bool(cp.all(cp.where(mask, cp.abs(ratio - want) <= want * 2 ** -6, True)))


def test_zero_rows_and_zero_scales(cp):
    """adversarial.md item 8: all-zero rows/blocks with scale 0 give exact 0, never NaN."""
    rng = np.random.default_rng(8)
    m, n, k = 8, 256, 256
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    a[3] = 0
    sfa[3] = 0
    a[5, 128:] = 0
    sfa[5, 1] = 0
    out, ref = run_checked(cp, a, sfa, b, sfb)
    assert bool(cp.all(out[3].astype(cp.float32) == 0))
    assert not bool(cp.isnan(out.astype(cp.float32)).any())


def test_saturated_payloads_stay_finite(cp):
    """adversarial.md item 9: payloads at +-448 everywhere, large scales; finite output."""
    m, n, k = 64, 512, 7168
    a = cp.full((m, k), 0x7E, cp.uint8)          # +448
    b = cp.full((n, k), 0xFE, cp.uint8)          # -448
    sfa = cp.full((m, 56), 1e-3, cp.float32)
    sfb = cp.full((4, 56), 1e-3, cp.float32)
    out, ref = run_checked(cp, a, sfa, b, sfb)
    assert bool(cp.all(cp.isfinite(out.astype(cp.float32))))


@pytest.mark.parametrize("tiny", [1e-23, 1e-38, 1e-40])
def test_tiny_scales(cp, tiny):
    """adversarial.md item 10: tiny / subnormal block scales give the right tiny
    magnitude (subnormals are not flushed), never NaN, neighbours unaffected."""
    rng = np.random.default_rng(10)
    m, n, k = 128, 512, 512
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    sfa[:] = 1.0
    sfb[1, :] = tiny          # one tiny 128-row block among normal ones
    out, ref = run_checked(cp, a, sfa, b, sfb)
    assert not bool(cp.isnan(out.astype(cp.float32)).any())


def test_scale_orientation_by_strides(cp):
    """adversarial.md item 12: token-major and K-major sfa with the same logical
    values give the same, exactly known answer."""
    m, k, n = 3, 512, 256
    a = cp.full((m, k), 0x38, cp.uint8)
    b = cp.full((n, k), 0x38, cp.uint8)
    s = np.array([[1 + i + 10 * j for j in range(4)] for i in range(m)], np.float32)
    sfb = cp.ones((2, 4), cp.float32)
    expect = 128 * s.sum(axis=1)                       # Y[m, n] = 128 * sum_b s[m, b]
    k_major = cp.asarray(s)                            # strides (16, 4)
    tok_major = cp.asarray(np.ascontiguousarray(s.T)).T  # strides (4, 12)
    for sfa in (k_major, tok_major):
        out = cp.empty((m, n), cp.dtype("bfloat16"))
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
        got = cp.asnumpy(out.astype(cp.float32))
        np.testing.assert_array_equal(got, np.repeat(expect[:, None], n, axis=1).astype(np.float32))


def test_padded_strides_same_bits(cp):
    """adversarial.md item 15: a padded row stride gives the same bits as a copy."""
    rng = np.random.default_rng(15)
    m, n, k = 96, 512, 7168
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    a_pad = cp.zeros((m, k + 16), cp.uint8)[:, :k]
    a_pad[...] = a
    b_pad = cp.zeros((n, k + 16), cp.uint8)[:, :k]
    b_pad[...] = b
    o1 = cp.empty((m, n), cp.dtype("bfloat16"))
    o2 = cp.empty((m, n), cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), o1)
    cugemm8.gemm_fp8_fp8_bf16_nt((a_pad, sfa), (b_pad, sfb), o2)
    assert bool(cp.all(o1.view(cp.uint16) == o2.view(cp.uint16)))


def test_misaligned_and_column_major_rejected(cp):
    m, n, k = 64, 256, 7168
    buf = cp.zeros(m * k + 16, cp.uint8)
    a_mis = buf[1:1 + m * k].reshape(m, k)
    b = cp.zeros((n, k), cp.uint8)
    sfa = cp.ones((m, 56), cp.float32)
    sfb = cp.ones((2, 56), cp.float32)
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    with pytest.raises(ValueError, match="16-byte aligned"):
        cugemm8.gemm_fp8_fp8_bf16_nt((a_mis, sfa), (b, sfb), out)
    z = cp.zeros((k, m), cp.uint8)
    with pytest.raises(ValueError, match="K-major"):
        cugemm8.gemm_fp8_fp8_bf16_nt((z.T, sfa), (b, sfb), out)


def test_nan_rows_stay_in_their_row(cp):
    rng = np.random.default_rng(5)
    m, n, k = 200, 512, 1024
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    a[17, 300] = 0x7F          # NaN payload
    sfa[150, 2] = float("inf")
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    f = out.astype(cp.float32)
    bad_rows = set(np.nonzero(cp.asnumpy(~cp.isfinite(f).all(axis=1)))[0].tolist())
    assert bad_rows <= {17, 150} and 17 in bad_rows
    keep = np.setdiff1d(np.arange(m), [17, 150])
    ref, bound = H.reference_and_bound(cp, a[keep], sfa[keep], b, sfb)
    H.check_against(cp, out[keep], ref, bound)


def test_two_streams_concurrently(cp):
    rng = np.random.default_rng(2)
    ops = [H.make_operands(cp, rng, 512, 2112, 7168) for _ in range(2)]
    outs = [cp.empty((512, 2112), cp.dtype("bfloat16")) for _ in range(2)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    for _ in range(5):
        for s, (a, sfa, b, sfb), o in zip(streams, ops, outs):
            with s:
                cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), o)
    for s in streams:
        s.synchronize()
    for (a, sfa, b, sfb), o in zip(ops, outs):
        ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
        H.check_against(cp, o, ref, bound)


def test_cuda_graph_replay_with_new_contents(cp):
    rng = np.random.default_rng(3)
    m, n, k = 256, 4096, 7168
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)   # compile outside capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
        graph = stream.end_capture()
    a2, sfa2, b2, sfb2 = H.make_operands(cp, rng, m, n, k)
    a[...] = a2
    sfa[...] = sfa2
    cp.cuda.Device().synchronize()      # the updates ran on the legacy stream
    graph.launch(stream)
    stream.synchronize()
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, out, ref, bound)


def test_set_num_sms(cp):
    rng = np.random.default_rng(4)
    a, sfa, b, sfb = H.make_operands(cp, rng, 1024, 2112, 2048)
    total = cugemm8.get_num_sms()
    try:
        for sms in (1, 33, 66):
            cugemm8.set_num_sms(sms)
            assert cugemm8.get_num_sms() == sms
            assert cugemm8.get_gemm_config("normal", 1024, 2112, 2048).num_sms <= sms
            run_checked(cp, a, sfa, b, sfb, what=f"sms={sms}", rerun=False)
    finally:
        cugemm8.set_num_sms(total)
    with pytest.raises(ValueError):
        cugemm8.set_num_sms(total + 1)
