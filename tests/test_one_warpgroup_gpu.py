"""GPU tests of the one-math-warpgroup kernels (``num_math_warpgroups`` = 1,
BLOCK_M = 64: ``str(config)`` carries ``w1``).  Need a Hopper GPU; skipped
elsewhere.

One warpgroup runs every K block of a 64-row tile itself: no split of K
between warpgroups, no reduction through shared memory, any stage count
(odd ones included).  Each test forces such a configuration, draws fresh
random operands, poisons the output inside guard rows and columns, and
checks every element against the float64 reference within the promotion
bound (tests/gpu_helpers.py), plus the guards and bit-identical reruns.
Shapes: every decode M of the benchmark on the six DeepSeek-V3 (N, K)
pairs, awkward N (8, 24, 520: N % BLOCK_N != 0), tails in M, N and K, few
SMs (many tiles per CTA, so the stage phases turn over), odd and even
stage counts, split K across a CTA pair, and both grouped layouts.
"""
from __future__ import annotations

import numpy as np
import pytest

import cugemm8
from cugemm8 import _config, _tune, gemm as _gemm
from cugemm8._shapes import DEEPSEEK_NK
from tests import gpu_helpers as H
from tests.test_grouped_gpu import STRADDLING_SIZES, check_contiguous, check_masked

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def w1(kind, bn, stages, k, *, splits=1, num_sms=132):
    cfg = _config.make_config(kind, 64, bn, stages, k, num_k_splits=splits, num_sms=num_sms,
                              num_math_warpgroups=1)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    assert " w1" in str(cfg)
    return cfg


def run_forced(cp, cfg, m, n, k, seed, *, reruns=1):
    rng = np.random.default_rng(seed)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    sfa_tma = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    outs = []
    for _ in range(1 + reruns):
        out, full = H.poisoned_out(cp, m, n)
        _gemm._launch(cfg, "normal", n, k, 1, m, m, a, sfa_tma, b, sfb, out, None, 1)
        assert H.guards_intact(cp, full, m, n), f"{cfg}: a guard row/column was written"
        outs.append(out)
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, outs[0], ref, bound, what=f"{cfg} m={m} n={n} k={k}")
    for o in outs[1:]:
        assert bool(cp.all(outs[0].view(cp.uint16) == o.view(cp.uint16))), f"{cfg}: rerun differs"


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("n,k", list(DEEPSEEK_NK))
def test_decode_table_one_warpgroup(cp, m, n, k):
    """The decode table's shapes with the one-warpgroup twin of a BLOCK_M =
    64 tile (as many stages as fit; the widest of tune's candidates there)."""
    bn = 128 if k <= 2048 else 64
    cfg = _tune.forced_config("normal", m, n, k, 1, 64, bn, _config.MAX_STAGES, 132, wgs=1)
    assert cfg is not None and cfg.num_math_warpgroups == 1
    run_forced(cp, cfg, m, n, k, m * 7 + n + k, reruns=0)


# (BLOCK_N, stages, K splits): narrow / wide, odd / even stage counts,
# runtime and compile-time B-scale boundaries (24, 56, 120: run-time select;
# 112, 160, 192: instantiated), split K across a pair.
FORCED = [(8, 16, 1), (16, 7, 1), (24, 5, 1), (56, 9, 1), (64, 13, 1), (112, 6, 1), (120, 4, 1),
          (128, 8, 1), (128, 5, 1), (160, 7, 1), (192, 6, 1), (16, 16, 2), (32, 9, 2), (64, 8, 2)]


@pytest.mark.parametrize("bn,stages,splits", FORCED, ids=lambda v: str(v))
@pytest.mark.parametrize("num_sms", [132, 6])
def test_forced_one_warpgroup(cp, bn, stages, splits, num_sms):
    """Tails in M, N and K (333 x 1000 x 1040 = 8 * 128 + 16); split K needs
    an even count of K blocks (1168 = 9 * 128 + 16: ten); 6 SMs give each CTA
    many tiles."""
    m, n = 333, 1000
    k = 1168 if splits == 2 else 1040
    cfg = w1("normal", bn, stages, k, splits=splits, num_sms=num_sms)
    run_forced(cp, cfg, m, n, k, bn * 31 + stages + num_sms)


@pytest.mark.parametrize("m", [1, 5, 17, 63, 64, 65])
@pytest.mark.parametrize("n", [8, 24, 520])
def test_awkward_n_one_warpgroup(cp, m, n):
    k = 7168
    for bn, splits in ((8, 1), (16, 2)):
        cfg = _tune.forced_config("normal", m, n, k, 1, 64, bn, _config.MAX_STAGES, 132,
                                  splits=splits, wgs=1)
        assert cfg is not None
        run_forced(cp, cfg, m, n, k, m + n + bn, reruns=0)


def test_one_block_of_k(cp):
    """K = 128 and K = 16: one K block per tile, the promotion's only step."""
    for k in (128, 16):
        run_forced(cp, w1("normal", 64, 8, k), 100, 520, k, k)


def test_subnormal_partial_sums_one_warpgroup(cp):
    """As tests/test_gemm_gpu.py's split-K case: each K block adds the FP32
    subnormal 2^-133 and the 8 blocks sum to 2^-130 exactly (no flush)."""
    import ml_dtypes
    m, n, k = 130, 256, 1024
    a = cp.full((m, k), 0x38, cp.uint8)
    b = cp.full((n, k), 0x38, cp.uint8)
    sfa = cp.asarray(np.ones((m, k // 128), np.float32))
    sfb = cp.asarray(np.full((n // 128, k // 128), 2.0 ** -140, np.float32))
    for splits in (1, 2):
        cfg = w1("normal", 32, 8, k, splits=splits)
        out, full = H.poisoned_out(cp, m, n)
        _gemm._launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b,
                      sfb, out, None, 1)
        want = np.array(2.0 ** -130, ml_dtypes.bfloat16).view(np.uint16)
        got = cp.asnumpy(out.view(cp.uint16))
        assert np.all(got == want), f"{cfg}: {np.unique(got)[:4]}"
        assert H.guards_intact(cp, full, m, n)


@pytest.mark.parametrize("bn,stages,splits,num_sms,k", [(128, 7, 1, 132, 1168), (32, 9, 1, 4, 1168),
                                                        (32, 8, 2, 4, 1168), (64, 8, 2, 4, 2288)])
def test_contiguous_one_warpgroup(cp, bn, stages, splits, num_sms, k):
    """Padding blocks (-1), experts straddling 64-row tiles' 128-row blocks,
    many tiles per CTA; K = 2288 (18 K blocks): split K with the skewed
    split point (_config.split_k_skew: 11 / 7), skipped tiles between."""
    cfg = w1("contiguous", bn, stages, k, splits=splits, num_sms=num_sms)
    with _gemm._forced_config(cfg):
        check_contiguous(cp, np.random.default_rng(bn + stages), STRADDLING_SIZES, 520, k)


@pytest.mark.parametrize("bn,stages,splits,k,num_sms", [(128, 7, 1, 768, 132), (16, 8, 2, 768, 132),
                                                        (32, 8, 2, 2288, 4)])
def test_masked_one_warpgroup(cp, bn, stages, splits, k, num_sms):
    """An empty group and partial 64-row slabs (row-by-row stores); K = 2288
    on 4 SMs: the skewed split (11 / 7 K blocks), many tiles per CTA."""
    g, m_max, n = 3, 200, 1000
    cfg = w1("masked", bn, stages, k, splits=splits, num_sms=num_sms)
    check_masked(cp, np.random.default_rng(bn), g, m_max, n, k, [200, 0, 77], 100, cfg=cfg)

