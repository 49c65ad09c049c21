"""CPU checks of the quantisation kernels (issue 6): no GPU needed.

* ``compile``-marked: every instantiation of ``cuda_src/quant.cuh`` builds
  for sm_90a with NVRTC, with no stack frame, no spills and no ptxas
  warnings; its SASS has no CALL (the division slow path) and no local
  memory traffic.
* Unmarked (NumPy only): the numerical claims the kernels rest on, and the
  kernels' index arithmetic, replayed on the CPU:
  - the float32 -> float64 bit embedding is exact (x * 2^-896);
  - three Newton steps give |Y s - 1| <= 2^-53 (1 + 2^-20) (exact FMA
    emulated with rationals);
  - RN_f32(RN_f64(x * Y)) == RN_f32(x / s) for any Y that close, including
    quotients next to float32 midpoints; same for the scale amax / 448;
  - the integer power-of-two rounding equals the reference's;
  - an emulation of the kernels' arithmetic (integer amax, float64 scale
    and quotient, non-finite path) is bit-identical to
    :mod:`cugemm8.reference` on adversarial data;
  - the per-token and per-block work splits cover every payload byte and
    every scale (and the sfa padding rows) exactly once, never read past k.
"""
from __future__ import annotations

import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from cugemm8 import quant as Q
from cugemm8 import reference as R
from tests.gpu_helpers import assert_payload_equal

f32, f64 = np.float32, np.float64
INV448 = float.fromhex("0x1.2492492492492p-9")      # the kernel's kInv448


# ----------------------------------------------------------------------------
# NVRTC: resources and SASS
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compile_report():
    from cugemm8 import _jit
    return _jit.compile_only("quant.cuh", Q.all_kernel_names(), sass=False)


@pytest.mark.compile
def test_every_instantiation_compiles_without_spills(compile_report):
    rep = compile_report
    assert set(rep.lowered) == set(Q.all_kernel_names())
    assert not rep.warnings, rep.warnings
    for name, mangled in rep.lowered.items():
        res = rep.resources[mangled]
        assert res.stack_frame == 0, (name, res)
        assert res.spill_stores == 0 and res.spill_loads == 0, (name, res)
        # Occupancy budget: per token >= 5 CTAs of 256 threads per SM, per
        # block >= 2 (the whole fp32 tile lives in registers); the
        # transposing casts >= 1 for now (at 128 registers ptxas spilled).
        limit = 64 if "per_token" in name else (255 if "cast_transpose" in name else 128)
        assert res.registers <= limit, (name, res.registers)


@pytest.mark.compile
def test_sass_has_no_calls_or_local_memory(sass_tools):
    from cugemm8 import _jit
    rep = _jit.compile_only("quant.cuh", Q.all_kernel_names(), sass=True)
    funcs = re.split(r"\n\s*Function : ", rep.sass)[1:]
    assert len(funcs) == len(Q.all_kernel_names())
    for body in funcs:
        name = body.split("\n", 1)[0].strip()
        assert not re.search(r"\bCALL\b", body), f"{name}: CALL (division slow path?)"
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name}: local memory"
        assert "F2FP.SATFINITE.E4M3" in body, f"{name}: no e4m3 conversion"
        assert "DMUL" in body, f"{name}: no float64 quotient"


# ----------------------------------------------------------------------------
# Numerics of the exact division scheme
# ----------------------------------------------------------------------------

def _f64_from_words(lo, hi):
    return ((hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)).view(np.float64)


def _embed_f32_scaled(bits):
    bits = bits.astype(np.uint32)
    hi = (bits & np.uint32(0x80000000)) | ((bits & np.uint32(0x7FFFFFFF)) >> np.uint32(3))
    return _f64_from_words(bits << np.uint32(29), hi)


def _embed_normal_rebiased(bits, extra):
    bits = bits.astype(np.uint32)
    hi = (bits >> np.uint32(3)) + np.uint32((896 + extra) << 20)
    return _f64_from_words(bits << np.uint32(29), hi)


def test_f32_bit_embedding_is_exact():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([bits, np.arange(0, 1 << 12, dtype=np.uint32),            # subnormals
                           np.arange(0, 1 << 12, dtype=np.uint32) | np.uint32(1 << 31),
                           np.array([0x007FFFFF, 0x00800000, 0x7F7FFFFF], np.uint32)])
    x = bits.view(np.float32)
    bits = bits[np.isfinite(x)]
    x = bits.view(np.float32)
    emb = _embed_f32_scaled(bits)
    want = x.astype(np.float64) * 2.0 ** -896            # exact: x has <= 24 bits
    assert np.array_equal(emb.view(np.uint64), want.view(np.uint64))
    pos = bits[(bits > 0x007FFFFF) & (bits < 0x7F800000)]
    for extra in (0, 896):
        got = _embed_normal_rebiased(pos, extra)
        assert np.array_equal(got, pos.view(np.float32).astype(np.float64) * 2.0 ** extra)


def _fma(a, b, c):
    """Exactly rounded float64 fused multiply-add."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def test_newton_reciprocal_error_bound():
    """The kernel's scaled_reciprocal, replayed with exact FMAs, from starts up
    to 4 float32 ulps off (rcp.approx.f32 is documented at 1 ulp)."""
    rng = np.random.default_rng(1)
    scales = [2.0 ** -126, 2.0 ** 120, 1.0, 1.5, float(np.nextafter(f32(2), f32(0))),
              float(f32(1e-4) / f32(448))]
    scales += [float(f32(2.0 ** e * m)) for e, m in zip(rng.integers(-126, 120, 400),
                                                          rng.uniform(1, 2, 400))]
    worst = 0.0
    for s in scales:
        s32 = f32(s)
        y0 = f32(1) / s32
        for _ in range(int(rng.integers(-4, 5))):
            y0 = np.nextafter(y0, f32(np.inf), dtype=f32)
        s_scaled = float(s32) * 2.0 ** -896
        y = float(y0) * 2.0 ** 896
        for _ in range(3):
            y = _fma(y, _fma(-s_scaled, y, 1.0), y)
        err = abs(Fraction(y) * Fraction(s_scaled) - 1)
        worst = max(worst, float(err / Fraction(2) ** -53))
    assert worst <= 1 + 2.0 ** -20, worst


def _quotient_cases(rng, n):
    s = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-126, 120, n)).astype(f32)
    s = s[np.isfinite(s) & (s >= f32(2.0 ** -126))]
    n = s.size
    half = n // 2
    # Hard half: quotients next to float32 midpoints in [2^-12, 2^9].
    qe = rng.integers(-12, 9, half)
    mid = (2 * rng.integers(2**23, 2**24, half) + 1).astype(f64) * 2.0 ** (qe - 24).astype(f64)
    with np.errstate(over="ignore"):
        x_hard = (mid * s[:half].astype(f64)).astype(f32)
    x_rand = (rng.standard_normal(n - half) * 2.0 ** rng.integers(-150, 30, n - half)).astype(f32)
    x = np.concatenate([x_hard, x_rand]) * np.where(rng.random(n) < 0.5, f32(-1), f32(1))
    ok = np.isfinite(x) & (np.abs(x.astype(f64) / s.astype(f64)) < 2.0 ** 20)
    return x[ok], s[ok]


def test_float64_quotient_rounds_like_float32_division():
    rng = np.random.default_rng(2)
    x, s = _quotient_cases(rng, 400_000)
    ref = x / s                                               # IEEE float32 division
    y = 1.0 / s.astype(f64)
    normal = np.abs(ref) >= f32(2.0 ** -126)
    for yv in (y, np.nextafter(y, np.inf), np.nextafter(y, 0)):   # |Y s - 1| up to ~2^-52
        got = (x.astype(f64) * yv).astype(f32)
        assert np.array_equal(got[normal].view(np.uint32), ref[normal].view(np.uint32))
        # Below 2^-126 only the e4m3 result matters: the same signed zero.
        assert np.array_equal(R.float_to_e4m3(got[~normal]), R.float_to_e4m3(ref[~normal]))


def test_float64_scale_equals_float32_division_by_448():
    rng = np.random.default_rng(3)
    mant = (np.arange(2**23, 2**24, dtype=np.int64).astype(f64) * 2.0 ** -23).astype(f32)
    amax = [mant * f32(2.0 ** e) for e in (-117, -60, 0, 1, 9, 100, 127)]
    amax.append((rng.uniform(1, 2, 500_000) * 2.0 ** rng.integers(-117, 128, 500_000)).astype(f32))
    amax = np.concatenate(amax)
    amax = amax[np.isfinite(amax) & (amax >= f32(Q.MIN_AMAX_FLOOR))]
    got = (_embed_normal_rebiased(amax.view(np.uint32), 0) * INV448).astype(f32)
    want = amax / f32(448)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert float(f32(Q.MIN_AMAX_FLOOR)) == Q.MIN_AMAX_FLOOR
    assert f32(Q.MIN_AMAX_FLOOR) / f32(448) == f32(2.0 ** -126)      # smallest scale is normal


def _round_up_pow2_bits(b):
    """numpy replay of quant::round_up_pow2_bits."""
    b = b.astype(np.uint32)
    exp, mant = b >> np.uint32(23), b & np.uint32(0x7FFFFF)
    normal_up = (exp + np.uint32(1)) << np.uint32(23)
    # subnormal: next power of two of the significand
    nbits = np.floor(np.log2(np.maximum(mant, 1).astype(f64))).astype(np.uint32) + np.uint32(1)
    is_pow2 = (mant & (mant - np.uint32(1))) == 0
    sub_up = np.where(is_pow2, mant, np.uint32(1) << nbits)
    out = np.where(exp != 0, normal_up, sub_up)
    return np.where((exp == 0xFF) | (mant == 0), b, out).astype(np.uint32)


def test_pow2_rounding_matches_reference():
    rng = np.random.default_rng(4)
    bits = rng.integers(1, 0x7F800000, 300_000, dtype=np.uint64).astype(np.uint32)
    edge = np.array([1, 2, 3, 0x7FFFFF, 0x400000, 0x400001, 0x800000, 0x800001, 0x3F800000,
                     0x3F800001, 0x3FFFFFFF, 0x7EFFFFFF, 0x7F000000, 0x7F800000, 0x7FC00000],
                    np.uint32)
    bits = np.concatenate([bits, edge])
    bits = bits[(bits < 0x7F000000) | (bits >= 0x7F800000)]   # the kernel never sees >= 2^127
    got = _round_up_pow2_bits(bits).view(np.float32)
    want = R._ceil_pow2(bits.view(np.float32))
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


# ----------------------------------------------------------------------------
# Emulation of the kernels' arithmetic, against the reference
# ----------------------------------------------------------------------------

_BITS_VIEW = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def _to_f32_bits(abs_bits, dtype_name):
    if dtype_name == "float32":
        return abs_bits.astype(np.uint32)
    if dtype_name == "bfloat16":
        return abs_bits.astype(np.uint32) << np.uint32(16)
    return abs_bits.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


def emulate_cast(x, block, *, min_amax=1e-4, pow2_scale=False, rng=None):
    """The kernels' numerics in NumPy: ``x`` [..., r, k] of float32/float16/
    bfloat16, ``block`` = (1, 128) per token or (128, 128) per block.

    Integer amax on the input's own |x| bit patterns, float64 scale, a float64
    reciprocal perturbed by +-1 ulp (any Y within the Newton bound must give
    the same bits), the non-finite path's integer rule.
    """
    rng = rng or np.random.default_rng(0)
    name = x.dtype.name
    bits = x.view(_BITS_VIEW[name])
    sign_mask = 0x7FFFFFFF if name == "float32" else 0x7FFF
    absb = bits & bits.dtype.type(sign_mask)
    *lead, r, k = x.shape
    br, bc = block
    nr, nc = -(-r // br), -(-k // bc)
    pad = [(0, 0)] * len(lead) + [(0, nr * br - r), (0, nc * bc - k)]
    tiles = np.pad(absb, pad).reshape(*lead, nr, br, nc, bc)
    amax = _to_f32_bits(tiles.max(axis=(-3, -1)), name)
    min_bits = np.float32(min_amax).view(np.uint32)
    amax = np.where(amax < min_bits, min_bits, amax).astype(np.uint32)
    finite = amax < 0x7F800000
    with np.errstate(invalid="ignore", over="ignore"):
        scale64 = _embed_normal_rebiased(np.where(finite, amax, min_bits), 0) * INV448
    scale_bits = np.where(finite, scale64.astype(f32).view(np.uint32), amax)
    if pow2_scale:
        scale_bits = _round_up_pow2_bits(scale_bits)
    scale = scale_bits.view(np.float32)

    full = np.repeat(np.repeat(scale, br, axis=-2)[..., :r, :], bc, axis=-1)[..., :k]
    x32_bits = _to_f32_bits(bits, name)                 # signed, exact
    x32 = x32_bits.view(np.float32)
    y = np.where(np.isfinite(full), 1.0 / np.where(np.isfinite(full), full, 1).astype(f64), 0.0)
    y = np.where(rng.random(y.shape) < 0.5, np.nextafter(y, np.inf), np.nextafter(y, 0))
    with np.errstate(invalid="ignore", over="ignore"):
        q = (_embed_f32_scaled(x32_bits) * (y * 2.0 ** 896)).astype(f32)
    payload = R.float_to_e4m3(q)
    # Non-finite scale: NaN where the scale is NaN or x is +-Inf, else signed zero.
    nonfin = ~np.isfinite(full)
    nan_pos = np.isnan(full) | ~np.isfinite(x32)
    special = np.where(nan_pos, np.uint8(0x7F), np.where(np.signbit(x32), np.uint8(0x80), np.uint8(0)))
    payload = np.where(nonfin, special, payload).astype(np.uint8)
    return payload, scale


def assert_scales_equal(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    bad = (nan_g != nan_w) | (~nan_w & (got.view(np.uint32) != want.view(np.uint32)))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{int(bad.sum())} scale mismatches; first at {idx}: "
                             f"got {got[idx]!r}, want {want[idx]!r}")


def adversarial_input(rng, shape, dtype):
    """Normal data across magnitudes, plus saturation values, zero groups
    (with -0), fp32 subnormals, NaN and +-Inf in a few places."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape[:-1] + (1,))
    flat = x.reshape(-1, shape[-1])
    rows = flat.shape[0]
    if shape[-1] >= 5:
        flat[0, :5] = [449, 470, 1e4, -500, 3e38 if dtype == np.float32 else 6e4]
    if rows > 2:
        flat[1, :] = 0.0
        flat[1, ::7] = -0.0
    if rows > 3:
        flat[2, :] = rng.standard_normal(shape[-1]) * 2.0 ** -140       # subnormal in fp32
    if rows > 5:
        flat[4, rng.integers(shape[-1])] = np.nan
        flat[5, rng.integers(shape[-1])] = np.inf
        flat[5, rng.integers(shape[-1])] = -np.inf
    with np.errstate(over="ignore"):
        return flat.reshape(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("min_amax", [1e-4, Q.MIN_AMAX_FLOOR])
def test_emulated_kernel_numerics_match_reference(dtype, pow2, min_amax):
    rng = np.random.default_rng(hash((np.dtype(dtype).name, pow2, min_amax)) % 2**32)
    for shape in [(9, 400), (3, 7, 144), (130, 272), (2, 129, 128)]:
        x = adversarial_input(rng, shape, dtype)
        for block, ref_fn in (((1, 128), R.per_token_cast_to_fp8), ((128, 128), R.per_block_cast_to_fp8)):
            got_p, got_s = emulate_cast(x, block, min_amax=min_amax, pow2_scale=pow2, rng=rng)
            with np.errstate(all="ignore"):
                want_p, want_s = ref_fn(x, min_amax=min_amax, pow2_scale=pow2)
            assert_scales_equal(got_s, want_s)
            assert_payload_equal(got_p, want_p)


# ----------------------------------------------------------------------------
# Work split and index arithmetic of the kernels
# ----------------------------------------------------------------------------

def _replay_per_token(g, m, k, vec, tasks_per_row, per_task):
    """Replay per_token_cast_kernel's index math; returns write counts."""
    chunk_elems, lanes_per_group, unroll = 32 * vec, 128 // vec, Q._UNROLL
    ng, m_pad = -(-k // 128), -(-m // 4) * 4
    payload = np.zeros((g, m, k), np.int64)
    sfa = np.zeros((g, ng, m_pad), np.int64)
    lane = np.arange(32)
    for task in range(g * m * tasks_per_row):
        row, first = task // tasks_per_row, (task % tasks_per_row) * per_task
        b, i = row // m, row % m
        for c0 in range(0, per_task, unroll):
            if (first + c0) * chunk_elems >= k:
                break
            for u in range(unroll):
                chunk = first + c0 + u
                col = chunk * chunk_elems + lane * vec
                chunk_valid = c0 + u < per_task
                loaded = chunk_valid & (col < k)
                assert np.all(col[loaded] + vec <= k)            # loads stay inside the row
                group = col // 128
                # a group's lanes are one aligned run of lanes_per_group lanes
                assert np.all(group == chunk * chunk_elems // 128 + lane // lanes_per_group)
                if chunk_valid:
                    for l0 in range(0, 32, lanes_per_group):
                        if group[l0] < ng:
                            sfa[b, group[l0], i] += 1
                            if i == m - 1:
                                for p in range(1, 4):
                                    if i + p < m_pad:
                                        sfa[b, group[l0], i + p] += 1
                for l in lane[loaded]:
                    payload[b, i, col[l]:col[l] + vec] += 1
    return payload, sfa


@pytest.mark.parametrize("g,m,k", [(1, 1, 16), (1, 5, 128), (2, 3, 144), (1, 7, 1024),
                                   (3, 4, 400), (1, 130, 2048), (2, 9, 7168)])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_per_token_split_covers_everything_once(g, m, k, itemsize):
    vec = 16 // itemsize
    splits = {Q._per_token_split(g * m, k, itemsize, 132), Q._per_token_split(g * m, k, itemsize, 1)}
    chunks = -(-k // (32 * vec))
    splits |= {(-(-chunks // p), p) for p in (1, 2, 3, 4, 5, 8)}
    for tasks_per_row, per_task in splits:
        assert tasks_per_row * per_task >= chunks
        payload, sfa = _replay_per_token(g, m, k, vec, tasks_per_row, per_task)
        assert np.all(payload == 1), (tasks_per_row, per_task)
        assert np.all(sfa == 1), (tasks_per_row, per_task)       # scales and padding rows


def test_per_token_split_heuristic():
    assert Q._per_token_split(4096, 7168, 2, 132) == (7, 4)      # prefill: 4 chunks per warp
    assert Q._per_token_split(128, 7168, 2, 132) == (28, 1)      # decode: spread over the GPU
    # Measured on the H200 (benches/RESULTS.md v0.7): 2 chunks per warp at
    # 256 rows, 4 from 384 rows up
    assert Q._per_token_split(256, 7168, 2, 132) == (14, 2)
    assert Q._per_token_split(384, 7168, 2, 132) == (7, 4)
    assert Q._per_token_split(1024, 7168, 2, 132) == (7, 4)
    for rows in (1, 7, 64, 300, 5000):
        for k in (16, 128, 1024, 7168, 16384):
            for item in (2, 4):
                t, p = Q._per_token_split(rows, k, item, 132)
                assert p in (1, 2, 4) and t * p >= -(-k // (32 * 16 // item))


@pytest.mark.parametrize("n,k", [(1, 16), (128, 128), (130, 144), (300, 400), (257, 1024)])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_per_block_threads_cover_each_tile_once(n, k, itemsize):
    vec = 16 // itemsize
    vecs_per_row = 128 // vec
    iters = 128 * vecs_per_row // Q._THREADS
    row_step = Q._THREADS // vecs_per_row
    count = np.zeros((n, k), np.int64)
    for nb in range(-(-n // 128)):
        for kb in range(-(-k // 128)):
            t = np.arange(Q._THREADS)
            col = kb * 128 + (t % vecs_per_row) * vec
            r0 = nb * 128 + t // vecs_per_row
            for it in range(iters):
                r = r0 + it * row_step
                ok = (col < k) & (r < n)
                assert np.all(col[ok] + vec <= k)
                for rr, cc in zip(r[ok], col[ok]):
                    count[rr, cc:cc + vec] += 1
    assert np.all(count == 1)


def test_kernel_names():
    names = Q.all_kernel_names()
    assert len(names) == len(set(names)) == 24
    assert Q.kernel_name("transpose_column", "float32", False) == \
        "cugemm8::cast_transpose_kernel<cugemm8::InDtype::kFloat32, false, true>"
    assert Q.kernel_name("per_token", "bfloat16", True) == \
        "cugemm8::per_token_cast_kernel<cugemm8::InDtype::kBFloat16, true>"
    with pytest.raises(ValueError):
        Q.kernel_name("per_row", "float32", False)


def test_option_validation():
    assert Q.check_quant_options(1e-4, False) == np.float32(1e-4)
    assert Q.check_quant_options(Q.MIN_AMAX_FLOOR, np.bool_(True)) == np.float32(Q.MIN_AMAX_FLOOR)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-40, Q.MIN_AMAX_FLOOR * 0.99, 1e39):
        with pytest.raises(ValueError, match="min_amax"):
            Q.check_quant_options(bad, False)
    for bad in ("1e-4", None, True, 1j):
        with pytest.raises(TypeError, match="min_amax"):
            Q.check_quant_options(bad, False)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="pow2_scale"):
            Q.check_quant_options(1e-4, bad)


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 15), (16, 17), (129, 130), (257, 16), (17, 257), (300, 400)])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("per_column,mn_major", [(True, False), (True, True), (False, False)])
def test_cast_transpose_covers_each_element_and_output_once(rows, cols, itemsize, per_column, mn_major,
                                                            monkeypatch):
    """cast_transpose_kernel's index math (cuda_src/quant.cuh), replayed:
    every input element is loaded once, within the 16-byte-padded row; every
    shared-memory word of the transposed tile is written once before the
    barrier; every payload byte of [cols, r_pad] (padding included) and
    every scale is written exactly once, and nothing outside.  The scale
    strides are the host's (quant._launch_cast_transpose), in both per-column
    layouts; the MN-major buffer's padding channels are written (zero) too."""
    threads, group = Q._THREADS, 128
    vec = 16 // itemsize
    vecs_per_row = group // vec
    quads_per_pass = threads // vecs_per_row
    passes = group // (4 * quads_per_pass)
    cols_pad, r_pad = Q.padded_k(cols), Q.padded_k(rows)
    rb, cb = -(-rows // group), -(-cols // group)
    loads = np.zeros((rows, cols_pad), np.int64)
    out = np.zeros((cols, r_pad), np.int64)
    sf = np.zeros((cols, rb) if per_column else (cb, rb), np.int64)
    g = 3 if rows * cols > 1000 else 2               # batches: the scale's batch stride too
    if per_column:
        sf_batch, strides = _cast_transpose_scale_strides(monkeypatch, rows, cols, mn_major)
        sf_flat = np.zeros(g * sf_batch, np.int64)
        _, col_stride, block_stride, sf_cols = strides
    t = np.arange(threads)
    c_local, quad = (t % vecs_per_row) * vec, t // vecs_per_row
    for r_blk in range(rb):
        for c_blk in range(cb):
            col = c_blk * group + c_local
            smem = np.zeros((group, group // 4), np.int64)          # [column, word row]
            for p in range(passes):
                for i in range(4):
                    r = r_blk * group + 4 * (quad + p * quads_per_pass) + i
                    ok = (col < cols) & (r < rows)
                    assert np.all(col[ok] + vec <= cols_pad)      # whole loads inside the padded row
                    for rr, cc in zip(r[ok], col[ok]):
                        loads[rr, cc:cc + vec] += 1
                for j in range(vec):
                    np.add.at(smem, (c_local + j, quad + p * quads_per_pass), 1)
            assert np.all(smem == 1)
            if per_column:
                for j in range(vec):
                    sel = (quad == 0) & (col + j < sf_cols)
                    for b in range(g):
                        np.add.at(sf_flat, b * sf_batch + (col[sel] + j) * col_stride + r_blk * block_stride, 1)
                    real = sel & (col + j < cols)
                    np.add.at(sf, (col[real] + j, r_blk), 1)
            else:
                sf[c_blk, r_blk] += 1
            e = np.arange(group * 8)                                 # the store loop's pieces
            c, piece = e // 8, e % 8
            keep = (c_blk * group + c < cols) & (r_blk * group + piece * 16 < r_pad)
            for cc, pc in zip(c[keep], piece[keep]):
                start = r_blk * group + pc * 16
                assert start + 16 <= r_pad                                 # inside the row
                out[c_blk * group + cc, start:start + 16] += 1
    assert np.all(loads[:, :cols] == 1)
    assert np.all(out == 1) and np.all(sf == 1)
    if per_column:
        assert np.all(sf_flat == 1)            # the whole buffer (padding channels included), once


def _cast_transpose_scale_strides(monkeypatch, rows, cols, mn_major):
    """(buffer elements per batch, the kernel's (batch, column, block,
    sf_cols) scale arguments) as the host packs them."""
    captured = {}

    class _Kern:
        def __call__(self, grid, block, args, shared_mem=0):
            captured["args"] = args

    class _X:
        shape, strides, itemsize, ndim = (1, rows, cols), (rows * cols * 2, cols * 2, 2), 2, 3
        dtype = np.dtype(np.float16)

    import cugemm8._jit as J
    monkeypatch.setattr(J, "get_kernel", lambda header, name, **kw: _Kern())
    Q._launch_cast_transpose(_X(), None, None, rows, cols, np.float32(1e-4), False, True, mn_major)
    batch, col_stride, block_stride, sf_cols = (int(v) for v in captured["args"][-4:])
    rb = -(-rows // 128)
    assert batch == (rb * Q.tma_aligned_size(cols) if mn_major else cols * rb)
    assert sf_cols == (Q.tma_aligned_size(cols) if mn_major else cols)
    return batch, (batch, col_stride, block_stride, sf_cols)
