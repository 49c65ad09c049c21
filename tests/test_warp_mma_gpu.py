"""GPU tests of the warp-MMA decode kernel (``GemmConfig.warp_mma``,
cuda_src/fp8_gemm_warp_mma.cuh: every warp streams its share of B into
registers and multiplies it with m16n8k32 MMAs).  Need a Hopper GPU;
skipped elsewhere.

Each test draws fresh random operands, poisons the output inside guard
rows and columns, and checks every element against the float64 reference
within the promotion bound (tests/gpu_helpers.py), plus the guards and
bit-identical reruns.  Shapes: M = 1 ... 8 on the six DeepSeek-V3 (N, K)
pairs with the heuristic's pick where it is the warp-MMA kernel and a
forced one elsewhere; forced K splits 1 ... 16 and 1 ... 16 slabs per CTA (128-512 threads),
both loops (with and without the early load of B);
tails in N (N % 16 != 0, N = 8, 24, 520: slabs and CTAs past N) and K (K %
128 != 0, K = 16, fewer K blocks than warps of some splits); a NaN row and a
zero row; the public ops (gemm_fp8_fp8_bf16_nt picks it, a reduced SM
budget does not, gemm_fp8 on bf16 gives the bits of the cast followed by
the GEMM, CUDA-graph capture and replay).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cugemm8
from cugemm8 import _config, gemm as _gemm
from cugemm8._shapes import DEEPSEEK_NK
from tests import gpu_helpers as H
from tests.test_reliability_gpu import Capture

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def wm(n, k, splits, slabs):
    """A forced warp-MMA config: ``splits`` warps per 16-row slab, ``slabs`` per CTA."""
    cfg = _config.make_config("normal", 8, 16 * slabs, _config.WARP_MMA_UNROLL, k, num_k_splits=splits,
                              num_sms=-(-n // (16 * slabs)), warp_mma=True)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    return cfg


launch = H.launch_forced


def run_forced(cp, cfg, m, n, k, seed, *, reruns=1):
    """H.run_forced, plus the kernel's other loop (kFlagBBeforeWait: the
    first batch of B loaded before the grid-dependency wait, gemm_fp8's
    fused path; a plain launch here, so the wait returns at once), which
    must give the same bits."""
    a, sfa, b, sfb, out = H.run_forced(cp, cfg, m, n, k, seed, reruns=reruns, rows_too=True)
    flagged, full = H.poisoned_out(cp, m, n)
    _gemm._prepare_launch(cfg, "normal", n, k, 1, m, m, a, cugemm8.get_col_major_tma_aligned_tensor(sfa), b, sfb,
                          flagged, None, 1, _gemm.FLAG_B_BEFORE_WAIT)()
    assert H.guards_intact(cp, full, m, n), f"{cfg}: a guard row/column was written (B before the wait)"
    assert bool(cp.all(out.view(cp.uint16) == flagged.view(cp.uint16))), f"{cfg}: the two loops differ"
    return a, sfa, b, sfb, out


@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", list(DEEPSEEK_NK))
def test_decode_table_warp_mma(cp, m, n, k):
    """The heuristic's warp-MMA pick where it has one (five of the seven
    pairs), else the 2112x7168 pick's form (14 splits, one slab) forced."""
    cfg = _config.select_config("normal", m, n, k)
    if not cfg.warp_mma:                # 7168 x 16384 (B too large), 576 x 7168 (too few slabs)
        cfg = wm(n, k, 14, 1)
    run_forced(cp, cfg, m, n, k, m * 7 + n + k, reruns=1 if m == 1 else 0)


# (K splits, slabs per CTA): 128 ... 512 threads, even and uneven K shares
FORCED = [(1, 4), (1, 16), (2, 2), (4, 1), (4, 4), (7, 1), (8, 1), (8, 2), (14, 1), (16, 1)]


@pytest.mark.parametrize("splits,slabs", FORCED, ids=lambda v: str(v))
@pytest.mark.parametrize("m", [1, 5, 8])
def test_forced_warp_mma(cp, splits, slabs, m):
    """Tails in N (1000 = 62.5 slabs of 16) and K (2064 = 16 x 128 + 16:
    17 K blocks, the last one 16 bytes wide, shared unevenly by 2 ... 16
    warps)."""
    n, k = 1000, 2064
    run_forced(cp, wm(n, k, splits, slabs), m, n, k, splits * 31 + slabs + m)


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n", [8, 24, 520])
def test_awkward_n_warp_mma(cp, m, n):
    """N below one slab (8), one and a half slabs (24), and 520 = 32.5 slabs
    at K = 7168, so whole slabs and CTAs lie past N."""
    k = 7168
    for splits, slabs in ((14, 1), (4, 4), (1, 16)):
        run_forced(cp, wm(n, k, splits, slabs), m, n, k, m + n + splits, reruns=0)


def test_short_k_warp_mma(cp):
    """K = 16 (one 16-byte piece of one K block), 128 and 144 (two blocks,
    more warps than blocks is illegal, so 1 and 2 splits)."""
    run_forced(cp, wm(520, 16, 1, 4), 3, 520, 16, 1)
    run_forced(cp, wm(520, 128, 1, 8), 8, 520, 128, 2)
    run_forced(cp, wm(520, 144, 2, 4), 1, 520, 144, 3)
    legal, why = _config.is_legal(_config.make_config("normal", 8, 16, 2, 144, num_k_splits=4, num_sms=1,
                                                      warp_mma=True), k=144)
    assert not legal and "fewer 128-wide K blocks" in why


def test_special_values_warp_mma(cp):
    """A NaN in one token's row stays in that token's output row; a zero
    token row gives zeros; the other rows are unaffected."""
    m, n, k = 6, 520, 1024
    cfg = wm(n, k, 4, 1)
    H.check_special_value_rows(cp, cfg, m, n, k)


def test_public_op_picks_warp_mma_on_the_whole_device(cp):
    """gemm_fp8_fp8_bf16_nt launches the warp-MMA pick at 1 x 2112 x 7168
    and is correct; under a reduced SM budget (set_num_sms) the pick is a
    persistent kernel again."""
    m, n, k = 1, 2112, 7168
    assert cugemm8.get_gemm_config("normal", m, n, k).warp_mma
    rng = np.random.default_rng(11)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, cugemm8.get_col_major_tma_aligned_tensor(sfa)), (b, sfb), out)
    assert H.guards_intact(cp, full, m, n)
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, out, ref, bound, what="public op, warp-MMA pick")
    total = cugemm8.get_num_sms()
    try:
        cugemm8.set_num_sms(total - 4)
        assert not cugemm8.get_gemm_config("normal", m, n, k).warp_mma
    finally:
        cugemm8.set_num_sms(total)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_gemm_fp8_bits_equal_cast_then_gemm(cp, m):
    """gemm_fp8 on bf16 activations (two launches: the warp-MMA pick has no
    one-kernel form) gives the bits of per_token_cast_to_fp8 followed by
    gemm_fp8_fp8_bf16_nt."""
    n, k = 2112, 7168
    assert cugemm8.get_gemm_config("normal", m, n, k).warp_mma
    rng = np.random.default_rng(m)
    x = cp.asarray(rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16))
    w = cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16))
    rhs = cugemm8.per_block_cast_to_fp8(w)
    got = cugemm8.gemm_fp8(x, rhs)
    want = cp.empty((m, n), dtype=ml_dtypes.bfloat16)
    cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(x), rhs, want)
    assert bool(cp.all(got.view(cp.uint16) == want.view(cp.uint16)))


def test_capture_and_replay_warp_mma(cp):
    """The warp-MMA pick captured in a CUDA graph replays to the eager bits
    on new values of the captured operands."""
    m, n, k = 4, 4096, 7168
    assert cugemm8.get_gemm_config("normal", m, n, k).warp_mma
    rng = np.random.default_rng(3)
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    out = cp.empty((m, n), dtype=ml_dtypes.bfloat16)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)          # compile outside the capture
    with Capture(cp) as c:
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    a2, _, _, _ = H.make_operands(cp, np.random.default_rng(4), m, n, k)
    a[...] = a2
    out.view(cp.uint16)[...] = 0x7FC1
    c.replay()
    want = cp.empty_like(out)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), want)
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16)))
