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
budget does not, CUDA-graph capture and replay); gemm_fp8's one-kernel
form, which quantises 16-bit x in the kernel, against the bits of the cast
followed by the GEMM on every decode shape and M, awkward K (K_x % 16 != 0),
NaN / Inf / zero / huge / tiny rows, power-of-two scales, capture and
replay, and float32 x (two kernels).
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


# ---------------------------------------------------------------- x quantised in the kernel

DT16 = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _x(cp, rng, m, k, dtype, *, stride_pad=0):
    """Random activations [m, k] of ``dtype`` with per-token magnitudes
    spread over 2^-8 ... 2^8 (so the 1x128 scales differ), as a view with
    ``stride_pad`` extra elements per row."""
    v = rng.standard_normal((m, k)) * np.exp2(rng.integers(-8, 9, size=(m, 1)))
    full = cp.asarray(np.zeros((m, k + stride_pad)).astype(DT16[dtype]))
    full[:, :k] = cp.asarray(v.astype(DT16[dtype]))
    return full[:, :k]


def _cast_then_gemm(cp, x, rhs, *, pow2=False):
    """per_token_cast_to_fp8 followed by gemm_fp8_fp8_bf16_nt, and the
    quantised pair (for the reference)."""
    lhs = cugemm8.per_token_cast_to_fp8(x, pow2_scale=pow2)
    want = cp.empty((x.shape[0], rhs[0].shape[0]), dtype=ml_dtypes.bfloat16)
    cugemm8.gemm_fp8_fp8_bf16_nt(lhs, rhs, want)
    return want, lhs


def _check_one_kernel(cp, x, rhs, *, pow2=False, what=""):
    """gemm_fp8(x, rhs) into a poisoned output with guards, in the
    warp-MMA pick's one-kernel form up to quant.one_kernel_rows (asserted;
    two kernels beyond): bit for bit the cast followed by the GEMM, and
    within the float64 reference's bound of the quantised operands."""
    from cugemm8 import quant
    m, n, kp = x.shape[0], rhs[0].shape[0], rhs[0].shape[1]
    pick = cugemm8.get_gemm_config("normal", m, n, kp)
    twin = _config.quant_a_config(pick, kp, 2, num_sms=cugemm8.get_num_sms())
    one = twin is not None and m <= quant.one_kernel_rows(twin, 2, kp)
    cfg = quant._one_kernel_config(x, n, kp, _gemm)
    assert pick.warp_mma and (cfg == twin if one else cfg is None), f"{what}: {pick} -> {cfg}"
    out, full = H.poisoned_out(cp, m, n)
    assert cugemm8.gemm_fp8(x, rhs, out, pow2_scale=pow2) is out
    assert H.guards_intact(cp, full, m, n), f"{what}: a guard row/column was written"
    want, (a, sfa) = _cast_then_gemm(cp, x, rhs, pow2=pow2)
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16))), f"{what}: bits differ from cast + GEMM"
    ref, bound = H.reference_and_bound(cp, a, cp.ascontiguousarray(sfa), rhs[0], rhs[1])
    H.check_against(cp, out, ref, bound, what=what)
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("n,k", [(2112, 7168), (4096, 7168), (7168, 2048), (32768, 512), (24576, 1536)])
def test_gemm_fp8_one_kernel_bits_equal_cast_then_gemm(cp, n, k, m, dtype):
    """gemm_fp8 on 16-bit activations with the warp-MMA pick (quantising
    them in the GEMM itself, one launch, up to quant.one_kernel_rows; the
    quantiser and the GEMM beyond) gives the bits of per_token_cast_to_fp8
    followed by gemm_fp8_fp8_bf16_nt on every decode shape the pick
    serves."""
    rng = np.random.default_rng(m * 101 + n + k)
    x = _x(cp, rng, m, k, dtype, stride_pad=8 if m % 2 else 0)
    w = cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16))
    _check_one_kernel(cp, x, cugemm8.per_block_cast_to_fp8(w), what=f"{m}x{n}x{k} {dtype}")


@pytest.mark.parametrize("k", [16, 1000, 2056, 7000, 7176])
def test_gemm_fp8_one_kernel_awkward_k(cp, k):
    """K_x % 128 != 0 (and % 16 != 0: 1000, 7000, read up to K_x and
    padded with zeros as the cast pads it) under forced warp-MMA configs,
    one slab (each warp its own K blocks) and several (the CTA's warps
    share them), at M up to 8 (several rounds of groups a warp): the form
    that quantises x gives the bits of the cast followed by the same config
    on FP8 A, and the guards hold."""
    from cugemm8 import quant
    n, kp = 520, quant.padded_k(k)
    kb = -(-kp // 128)
    rng = np.random.default_rng(k)
    w = cugemm8.per_block_cast_to_fp8(cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)))
    b_q, sfb = w
    s4, s2 = min(4, kb), min(2, kb)
    for m, (splits, slabs) in zip((1, 5, 8), ((1, 4), (s4, 4 // s4), (s2, 8 // s2))):
        cfg = wm(n, kp, splits, slabs)
        x = _x(cp, rng, m, k, "bfloat16", stride_pad=8)
        a, sfa = cugemm8.per_token_cast_to_fp8(x)
        want = H.launch_forced(cp, cfg, a, cp.ascontiguousarray(sfa), b_q, sfb, m, n, kp)
        out, full = H.poisoned_out(cp, m, n)
        twin = _config.quant_a_config(cfg, kp, 2, num_sms=cugemm8.get_num_sms())
        _gemm._prepare_launch(twin, "normal", n, kp, 1, m, m, x, None, b_q, sfb, out, None, 1,
                              x_dtype="bfloat16")()
        assert H.guards_intact(cp, full, m, n), f"{cfg} k={k}: a guard was written"
        assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16))), f"{cfg} k={k}: bits differ"


def test_gemm_fp8_one_kernel_special_values(cp):
    """A NaN row, an Inf row (Inf and finite values), a zero row, huge
    values (near bf16's maximum) and tiny ones (bf16 subnormals) in one
    batch (the one-kernel form at 6 x 32768 x 512, the CTA's warps sharing
    the groups): bit for bit the cast followed by the GEMM; the NaN and Inf
    stay in their tokens' rows, the zero row gives zeros, the other rows
    are finite."""
    from cugemm8 import quant
    m, n, k = 6, 32768, 512
    rng = np.random.default_rng(5)
    xh = (rng.standard_normal((m, k))).astype(ml_dtypes.bfloat16)
    xh[1, 300] = np.nan
    xh[2, 500] = np.inf
    xh[3] = 0
    xh[4, :128] = (np.clip(rng.standard_normal(128), -1.1, 1.1) * 3e38).astype(ml_dtypes.bfloat16)
    xh[5, 128:256] = (rng.standard_normal(128) * 1e-39).astype(ml_dtypes.bfloat16)
    x = cp.asarray(xh)
    assert quant._one_kernel_config(x, n, k, _gemm) is not None
    w = cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16))
    rhs = cugemm8.per_block_cast_to_fp8(w)
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.gemm_fp8(x, rhs, out)
    assert H.guards_intact(cp, full, m, n)
    want, _ = _cast_then_gemm(cp, x, rhs)
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16)))
    got = H.to_f64(cp, out)
    assert bool(cp.all(cp.isnan(got[1]))) and bool(cp.all(cp.isnan(got[2])))
    assert bool(cp.all(got[3] == 0))
    assert bool(cp.all(cp.isfinite(got[[0, 5]])))      # (row 4's products may pass bf16's range)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_one_kernel_special_values_each_warp_its_own_blocks(cp, dtype):
    """The one-slab form (each warp quantises its own K blocks, then waits
    for its own lanes only) forced at 6 tokens with a NaN row, an Inf row,
    a zero row and a row near the dtype's maximum, bf16 and fp16 x: the
    bits of the cast followed by the same config on FP8 A, guards intact."""
    n, k, m = 520, 2048, 6
    rng = np.random.default_rng(31)
    big = {"bfloat16": 3e38, "float16": 6e4}[dtype]
    xh = rng.standard_normal((m, k)).astype(DT16[dtype])
    xh[1, 300] = np.nan
    xh[2, 1500] = np.inf
    xh[3] = 0
    xh[4, 640:768] = (np.clip(rng.standard_normal(128), -1.05, 1.05) * big).astype(DT16[dtype])
    x = cp.asarray(xh)
    b_q, sfb = cugemm8.per_block_cast_to_fp8(cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)))
    cfg = wm(n, k, 4, 1)
    a, sfa = cugemm8.per_token_cast_to_fp8(x)
    want = H.launch_forced(cp, cfg, a, cp.ascontiguousarray(sfa), b_q, sfb, m, n, k)
    twin = _config.quant_a_config(cfg, k, 2, num_sms=cugemm8.get_num_sms())
    out, full = H.poisoned_out(cp, m, n)
    _gemm._prepare_launch(twin, "normal", n, k, 1, m, m, x, None, b_q, sfb, out, None, 1, x_dtype=dtype)()
    assert H.guards_intact(cp, full, m, n)
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16)))
    got = H.to_f64(cp, out)
    assert bool(cp.all(cp.isnan(got[1]))) and bool(cp.all(cp.isnan(got[2]))) and bool(cp.all(got[3] == 0))


def test_gemm_fp8_rows_of_partial_16_byte_pieces_take_two_kernels(cp):
    """x [1, 1001] bf16 (2002-byte rows): the warp-MMA kernel's 16-byte
    loads would pass the row's end, so gemm_fp8 takes the quantiser and the
    GEMM; the bits are still the cast's followed by the GEMM."""
    from cugemm8 import quant
    m, n, k = 1, 2112, 1001
    rng = np.random.default_rng(1001)
    x = cp.asarray(rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16))
    rhs = cugemm8.per_block_cast_to_fp8(cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)))
    assert cugemm8.get_gemm_config("normal", m, n, quant.padded_k(k)).warp_mma
    assert quant._one_kernel_config(x, n, quant.padded_k(k), _gemm) is None
    got = cugemm8.gemm_fp8(x, rhs)
    want, _ = _cast_then_gemm(cp, x, rhs)
    assert bool(cp.all(got.view(cp.uint16) == want.view(cp.uint16)))


@pytest.mark.parametrize("m", [1, 6])
def test_gemm_fp8_one_kernel_pow2_scale(cp, m):
    """pow2_scale=True: the kernel's power-of-two activation scales are the
    cast's (bits of the cast with pow2_scale followed by the GEMM)."""
    n, k = 32768, 512
    rng = np.random.default_rng(70 + m)
    x = _x(cp, rng, m, k, "bfloat16")
    rhs = cugemm8.per_block_cast_to_fp8(cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)))
    _check_one_kernel(cp, x, rhs, pow2=True, what=f"pow2 m={m}")


def test_gemm_fp8_float32_x_takes_two_kernels(cp):
    """float32 activations with the warp-MMA pick: the quantiser and the
    GEMM (no one-kernel form), still the cast's bits."""
    from cugemm8 import quant
    m, n, k = 4, 2112, 7168
    rng = np.random.default_rng(9)
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    assert quant._one_kernel_config(x, n, k, _gemm) is None
    rhs = cugemm8.per_block_cast_to_fp8(cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)))
    got = cugemm8.gemm_fp8(x, rhs)
    want, _ = _cast_then_gemm(cp, x, rhs)
    assert bool(cp.all(got.view(cp.uint16) == want.view(cp.uint16)))


def test_gemm_fp8_one_kernel_capture_and_replay(cp):
    """The one-kernel form captured in a CUDA graph without a workspace
    replays to the eager bits on new activations."""
    from cugemm8 import quant
    m, n, k = 1, 4096, 7168
    rng = np.random.default_rng(12)
    x = _x(cp, rng, m, k, "bfloat16")
    rhs = cugemm8.per_block_cast_to_fp8(cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)))
    out = cp.empty((m, n), dtype=ml_dtypes.bfloat16)
    assert quant._one_kernel_config(x, n, k, _gemm) is not None
    cugemm8.gemm_fp8(x, rhs, out)                       # compile outside the capture
    with Capture(cp) as c:
        cugemm8.gemm_fp8(x, rhs, out)
    x[...] = _x(cp, np.random.default_rng(13), m, k, "bfloat16")
    out.view(cp.uint16)[...] = 0x7FC1
    c.replay()
    want, _ = _cast_then_gemm(cp, x, rhs)
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16)))


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
