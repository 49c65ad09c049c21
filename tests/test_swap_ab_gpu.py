"""GPU tests of the swap-AB decode kernel (``GemmConfig.swap_ab``,
cuda_src/fp8_gemm_swap_ab.cuh: the weights are the WGMMA's 64-row operand,
the tokens its N).  Need a Hopper GPU; skipped elsewhere.

Each test forces a swap-AB configuration, draws fresh random operands,
poisons the output inside guard rows and columns, and checks every element
against the float64 reference within the promotion bound
(tests/gpu_helpers.py), plus the guards and bit-identical reruns.  Shapes:
every decode M up to 32 on the six DeepSeek-V3 (N, K) pairs, token tiles
8-32, weight tiles 64-256, split K over clusters of 1, 2 and 4 (with few
SMs, so one cluster runs many tiles and the exchange's barriers turn over),
tails in M (two token tiles), N (N % BLOCK_N != 0, N = 8, 24, 520) and K
(K % 128 != 0, fewer K blocks than a rank's share), the bits against
the 1D2D kernel with the same K split, and a CTA pair's bits against the
promotion model.
"""
from __future__ import annotations

import pytest

from cugemm8 import _config, _tune
from cugemm8._shapes import DEEPSEEK_NK
from tests import gpu_helpers as H

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def swap(m, n, k, bm, bn, stages, *, splits=1, num_sms=132):
    cfg = _config.swap_ab_config(m, n, k, bm, bn, stages, num_sms, splits)
    assert cfg is not None and cfg.swap_ab, (m, n, k, bm, bn, stages, splits)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    return cfg


launch = H.launch_forced
run_forced = H.run_forced


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 24, 32])
@pytest.mark.parametrize("n,k", list(DEEPSEEK_NK))
def test_decode_table_swap_ab(cp, m, n, k):
    """The decode shapes with the token tile that fits M, 64-row weight
    tiles at long K (split over 2 or 4 CTAs) and wide ones at short K."""
    bm = -(-m // 8) * 8
    if k >= 7168:
        bn, splits = 64, (4 if n <= 2112 else 2 if n <= 4096 else 1)
    else:
        bn, splits = (192 if k == 1536 else 256 if k <= 512 else 64), 1
    cfg = swap(m, n, k, bm, bn, 32, splits=splits)
    run_forced(cp, cfg, m, n, k, m * 7 + n + k, reruns=0)


# (token tile, weight tile, stages, K splits)
FORCED = [(8, 64, 3, 1), (8, 64, 16, 2), (8, 128, 7, 4), (16, 192, 5, 1), (24, 64, 9, 2), (32, 256, 4, 1),
          (32, 128, 6, 4), (16, 64, 32, 1)]


@pytest.mark.parametrize("bm,bn,stages,splits", FORCED, ids=lambda v: str(v))
@pytest.mark.parametrize("num_sms", [132, 4])
def test_forced_swap_ab(cp, bm, bn, stages, splits, num_sms):
    """Tails in M (two token tiles at M = 40 > 32), N (1000 = 15.6 x 64) and
    K (1040 = 8 x 128 + 16: nine K blocks, an uneven split); 4 SMs give each
    CTA (or cluster) many tiles."""
    m, n, k = 40, 1000, 1040
    cfg = swap(m, n, k, bm, bn, stages, splits=splits, num_sms=num_sms)
    run_forced(cp, cfg, m, n, k, bm * 31 + bn + stages + num_sms)


@pytest.mark.parametrize("m", [1, 5, 13, 31])
@pytest.mark.parametrize("n", [8, 24, 520])
def test_awkward_n_swap_ab(cp, m, n):
    """N below one 64-row wave, and N % 64 != 0, at K = 7168."""
    k = 7168
    for bm, bn, splits in ((-(-m // 8) * 8, 64, 4), (32, 128, 2)):
        cfg = swap(m, n, k, bm, bn, 16, splits=splits)
        run_forced(cp, cfg, m, n, k, m + n + bn, reruns=0)


def test_short_k_swap_ab(cp):
    """K = 16 and 128 (one K block), and K = 512 over 4 ranks (one block each)."""
    run_forced(cp, swap(3, 520, 16, 8, 64, 4), 3, 520, 16, 1)
    run_forced(cp, swap(3, 520, 128, 8, 128, 4), 3, 520, 128, 2)
    run_forced(cp, swap(3, 520, 512, 8, 64, 4, splits=4), 3, 520, 512, 3)


# The 1D2D kernel's one-warpgroup pairs skew their split by two K blocks from
# 8 blocks a rank on (_config.split_k_skew, v0.30), the swap-AB kernel splits
# evenly: so the two-way pair is compared at K = 1792 (7 blocks a rank, no
# skew), and the swap-AB pair at K = 7168 against the promotion model with an
# even split below.
@pytest.mark.parametrize("m", [1, 8, 24])
@pytest.mark.parametrize("splits,k", [(1, 7168), (2, 1792)])
def test_bits_equal_1d2d(cp, m, splits, k):
    """The same K split gives the 1D2D kernel's bits: each output element's
    products, WGMMA K block sums (the tensor core's per-element arithmetic
    does not depend on which operand is A), promotion and rank-order
    addition are the same operations in the same order."""
    n = 4096
    ref_cfg = _tune.forced_config("normal", m, n, k, 1, 64, 32, 16, 132, splits=splits, wgs=1)
    assert ref_cfg is not None and not ref_cfg.swap_ab
    assert splits == 1 or _config.split_k_skew(ref_cfg.block_m, k, ref_cfg.num_math_warpgroups) == 0, \
        "the 1D2D pair must split evenly here"
    a, sfa, b, sfb, out = run_forced(cp, swap(m, n, k, -(-m // 8) * 8, 64, 16, splits=splits), m, n, k,
                                     m + splits, reruns=0)
    want = launch(cp, ref_cfg, a, sfa, b, sfb, m, n, k)
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16))), \
        f"swap-AB and {ref_cfg} differ in {int(cp.sum(out.view(cp.uint16) != want.view(cp.uint16)))} elements"


@pytest.mark.parametrize("m,bm", [(8, 8), (24, 24), (40, 16)])
@pytest.mark.parametrize("k", [2048, 7168])
@pytest.mark.parametrize("num_sms", [132, 4])
def test_split_matches_the_promotion_model(cp, m, bm, k, num_sms):
    """A CTA pair splits the K blocks evenly (rank 0 the first half) and rank
    0 adds rank 1's partial tile: bit for bit the promotion model with
    ``k_splits = 2`` and no skew, at 8 blocks a rank (where the 1D2D pair
    would skew) and 28, on operands where the 1D2D pair's skewed split
    (two blocks more for rank 0) gives other bits; M = 40 on 16-token
    tiles runs three token tiles; 4 SMs give each pair many tiles."""
    n = 1000
    cfg = swap(m, n, k, bm, 64, 12, splits=2, num_sms=num_sms)
    H.check_split_against_model(cp, cfg, m, n, k, m * 13 + k + num_sms, k_splits=2,
                                distinct_from={"k_splits": 2, "split_skew": 2})


def test_special_values_swap_ab(cp):
    """A NaN in one token's row stays in that token's output row; a zero
    token row gives zeros; the other rows are unaffected."""
    m, n, k = 6, 520, 1024
    cfg = swap(m, n, k, 8, 64, 8, splits=2)
    H.check_special_value_rows(cp, cfg, m, n, k)
