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

def _compiled_names():
    """The launchable defaults and every built configuration of the
    transposing casts (tools/perf/sweep_cast_t.py times them)."""
    return list(dict.fromkeys(Q.all_kernel_names() + Q.transpose_variant_names()))


@pytest.fixture(scope="module")
def compile_report():
    from cugemm8 import _jit
    return _jit.compile_only("quant.cuh", _compiled_names(), sass=False)


def _transpose_config_of(name: str):
    """(TransposeConfig, itemsize) of a cast_transpose_kernel name expression."""
    m = re.search(r"cast_transpose_kernel<cugemm8::InDtype::k(\w+), \w+, \w+, (\d+), (\d+), (\d+)>", name)
    assert m, name
    return Q.TransposeConfig(int(m[2]), int(m[3]), int(m[4])), (4 if m[1] == "Float32" else 2)


@pytest.mark.compile
def test_every_instantiation_compiles_without_spills(compile_report):
    rep = compile_report
    assert set(rep.lowered) == set(_compiled_names())
    assert not rep.warnings, rep.warnings
    report = []
    for name, mangled in rep.lowered.items():
        res = rep.resources[mangled]
        assert res.stack_frame == 0, (name, res)
        assert res.spill_stores == 0 and res.spill_loads == 0, (name, res)
        # Occupancy budget: per token >= 5 CTAs of 256 threads per SM, per
        # block >= 2 (the whole fp32 tile lives in registers); the
        # transposing casts: the CTAs per SM their configuration is built for
        # (__launch_bounds__), which shared memory must allow.
        if "cast_transpose" in name:
            cfg, item = _transpose_config_of(name)
            assert 1 <= cfg.ctas_per_sm <= Q._transpose_smem_ctas(cfg, item), name
            limit = 65536 // (Q._THREADS * cfg.ctas_per_sm) // 8 * 8
            assert res.smem_static <= Q._TRANSPOSE_STATIC_SMEM, (name, res.smem_static)
            report.append(f"{name}: {res.registers} registers (cap {limit}), "
                          f"{cfg.smem_bytes(item)} B dynamic + {res.smem_static} B static shared, "
                          f"{cfg.ctas_per_sm} CTAs/SM")
        else:
            limit = 64 if "per_token" in name else 128
        assert res.registers <= limit, (name, res.registers)
    print("\n".join(report))


@pytest.mark.compile
def test_sass_has_no_calls_or_local_memory(sass_tools):
    from cugemm8 import _jit
    names = _compiled_names()
    rep = _jit.compile_only("quant.cuh", names, sass=True)
    funcs = re.split(r"\n\s*Function : ", rep.sass)[1:]
    assert len(funcs) == len(names)
    per_token_16 = {m for e, m in rep.lowered.items() if e.startswith("cugemm8::per_token_cast_kernel<")
                    and "kFloat32" not in e}
    assert len(per_token_16) == 4
    for body in funcs:
        name = body.split("\n", 1)[0].strip()
        assert not re.search(r"\bCALL\b", body), f"{name}: CALL (division slow path?)"
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name}: local memory"
        assert "F2FP.SATFINITE.E4M3" in body, f"{name}: no e4m3 conversion"
        assert "DMUL" in body, f"{name}: no float64 quotient"
        if name in per_token_16:
            # 16-bit x: the float32 quotient too (taken with the default min_amax)
            assert len(re.findall(r"\bFFMA\b", body)) >= 16, f"{name}: no float32 quotient"
        if "cast_transpose" in name:
            # the tile is staged with cp.async, left with 16-byte stores
            assert "LDGSTS" in body and "STG.E.128" in body, f"{name}: no cp.async / 16-byte stores"


@pytest.mark.compile
def test_quotient_check_kernel_compiles(sass_tools):
    """cuda_src/quant_check.cuh (the GPU test of the float32 quotient on
    every 16-bit input) builds for both dtypes: no spills, no calls, no
    flush-to-zero arithmetic, the float32 quotient's FMAs beside the float64
    path it is checked against."""
    from cugemm8 import _jit
    names = [f"cugemm8::quotient_check_kernel<cugemm8::InDtype::{d}>" for d in ("kBFloat16", "kFloat16")]
    rep = _jit.compile_only("quant_check.cuh", names, sass=True)
    assert set(rep.lowered) == set(names) and not rep.warnings, rep.warnings
    for res in rep.resources.values():
        assert res.stack_frame == 0 and res.spill_stores == 0 and res.spill_loads == 0, res
    funcs = re.split(r"\n\s*Function : ", rep.sass)[1:]
    assert len(funcs) == 2
    for body in funcs:
        assert not re.search(r"\bCALL\b", body) and "FTZ" not in body
        assert "FFMA" in body and "DMUL" in body and "F2FP.SATFINITE.E4M3" in body


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


def _rn_f32(v: Fraction) -> f32:
    """An exact rational rounded to float32 once (RNE, subnormals kept; the
    value is finite and inside float32's range here)."""
    if v == 0:
        return f32(0.0)
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1                                   # 2^e <= a < 2^(e + 1)
    lsb = Fraction(2) ** (max(e, -126) - 23)
    n, rem = divmod(a / lsb, 1)
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    out = f32(float(n * lsb))                    # exact: n <= 2^24
    return -out if v < 0 else out


def _quotient_f32_replayed(x: f32, s: f32) -> f32:
    """quant.cuh's quotient_f32 with exact arithmetic and one rounding per
    operation: y = RN(1 / s), q0 = RN(x y), r = RN(x - s q0), RN(q0 + r y),
    x's sign copied on."""
    y = f32(1) / s                               # IEEE float32 division: RN(1 / s)
    q0 = _rn_f32(Fraction(float(x)) * Fraction(float(y)))
    r = _rn_f32(Fraction(float(x)) - Fraction(float(s)) * Fraction(float(q0)))
    q = _rn_f32(Fraction(float(q0)) + Fraction(float(r)) * Fraction(float(y)))
    return (np.array([q], f32).view(np.uint32) | (np.array([x], f32).view(np.uint32) & np.uint32(1 << 31))).view(f32)[0]


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
def test_float32_quotient_replayed_on_16_bit_inputs(dtype):
    """A CPU replay of the float32 quotient on a sample of its domain (the
    GPU test test_quant_gpu.py::test_float32_quotient_is_exact_on_every_16_bit_input
    checks every input): 16-bit amax with its cast scale (plain and pow2),
    |x| <= amax, the edges (x = +-amax, +-0, subnormal x).  The quotient's
    bits equal IEEE division's at and above 2^-10, its e4m3 byte
    everywhere."""
    rng = np.random.default_rng(7)
    finite = 0x7F80 if dtype is ml_dtypes.bfloat16 else 0x7C00
    pairs = []
    # 0x3F83 (bf16 1.0234375): x = amax gives the quotient 448 (1 + 2^-23).
    # bf16 0x38F6 with x = 0x001F (a float32 subnormal): the remainder
    # underflows and the quotient (about 2^-120) differs from IEEE division
    # in the last place; its byte does not.
    for amax_bits in np.concatenate([rng.integers(1, finite, 40), [1, 0x0080, 0x3C00, 0x3F83, finite - 1]]):
        xs = rng.integers(0, amax_bits + 1, 24)
        pairs += [(int(amax_bits), int(b)) for b in np.concatenate([xs, [0, 1, 2, amax_bits, amax_bits - 1]])]
    if dtype is ml_dtypes.bfloat16:
        pairs.append((0x38F6, 0x001F))
    checked = last_place = 0
    for amax_bits, mag in pairs:
        amax = np.array([amax_bits], np.uint16).view(dtype).astype(f32)
        for pow2 in (False, True):
            s = R.quant._scale_from_amax(amax, 1e-4, pow2)[0]
            for sign in (0, 0x8000):
                x = np.array([mag | sign], np.uint16).view(dtype).astype(f32)[0]
                want = x / s                     # IEEE float32 division
                got = _quotient_f32_replayed(x, s)
                case = (dtype, amax_bits, hex(mag | sign), pow2, got, want)
                # Below 2^-10 (where the remainder may underflow, outside
                # Markstein's theorem) the last place may differ; the e4m3
                # byte (a signed zero there) may not.
                if abs(want) >= f32(2.0 ** -10):
                    assert got.view(np.uint32) == want.view(np.uint32), case
                last_place += int(got.view(np.uint32) != want.view(np.uint32))
                assert R.float_to_e4m3(np.array([got]))[0] == R.float_to_e4m3(np.array([want]))[0], case
                checked += 1
    assert checked == len(pairs) * 4
    if dtype is ml_dtypes.bfloat16:
        assert last_place > 0                    # the underflow case above is reached


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
def test_division_by_448_replayed_on_16_bit_amax(dtype):
    """quant.cuh's div448_f32 (the in-kernel forms' scale: quotient_f32
    with s = 448 and y = RN_f32(1 / 448)) replayed with exact rationals
    (_quotient_f32_replayed) on every finite amax of the dtype, clamped to the
    default min_amax as the kernels clamp it: IEEE float32 division's bits
    (the reference's formula and, by the test below, the casts' float64
    product's) on all of them.  The GPU check (quant_check.cuh) compares
    the kernels' own function with the cast's on the same domain."""
    y = f32(1) / f32(448)
    from cugemm8 import _jit
    src = (_jit.cuda_src_dir() / "quant.cuh").read_text()
    literal = re.search(r"constexpr float kRcp448 = (0x[0-9a-fA-Fp.+-]+)f;", src).group(1)
    assert float.fromhex(literal) == float(y)                  # the kernel's constant is RN_f32(1 / 448)
    bits = np.arange(0, 0x8000, dtype=np.uint16)
    amax = bits.view(dtype).astype(f32)
    amax = np.unique(np.maximum(amax[np.isfinite(amax)], f32(Q._DEFAULT_MIN_AMAX)))
    for a in amax:
        q = _quotient_f32_replayed(a, f32(448))
        assert q.view(np.uint32) == (a / f32(448)).view(np.uint32), (dtype, float(a))


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
    assert len(names) == len(set(names)) == 28     # 4 kinds x 3 dtypes x pow2, + the one-round 16-bit casts
    assert Q.kernel_name("transpose_column", "float32", False) == \
        "cugemm8::cast_transpose_kernel<cugemm8::InDtype::kFloat32, false, true, 64, 1, 4>"
    assert Q.kernel_name("transpose_block", "bfloat16", True, Q.TransposeConfig(128, 1, 4)) == \
        "cugemm8::cast_transpose_kernel<cugemm8::InDtype::kBFloat16, true, false, 128, 1, 4>"
    with pytest.raises(ValueError, match="not one of the built"):
        Q.kernel_name("transpose_block", "float32", False, Q.TransposeConfig(64, 2, 3))
    with pytest.raises(ValueError, match="transposing casts only"):
        Q.kernel_name("per_token", "float32", False, Q.TransposeConfig(64, 2, 3))
    variants = Q.transpose_variant_names()
    assert len(variants) == len(set(variants)) and set(variants) >= {
        n for n in names if "cast_transpose" in n}
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


def _launch_capture(monkeypatch, g, rows, cols, itemsize, per_column, mn_major=False, config=None,
                    num_sms=132):
    """What quant._launch_cast_transpose hands the kernel for an input
    [g, rows, padded_k(cols)] of ``itemsize``-byte elements (kernel stubbed,
    ``num_sms`` SMs): name, grid, block, dynamic shared memory, arguments."""
    captured = {}

    class _Kern:
        def __call__(self, grid, block, args, shared_mem=0):
            captured.update(grid=grid, block=block, args=args, smem=shared_mem)

    cols_pad, item = Q.padded_k(cols), itemsize

    class _X:
        shape, itemsize, ndim = (g, rows, cols_pad), item, 3
        strides = (rows * cols_pad * item, cols_pad * item, item)
        dtype = np.dtype(np.float32 if item == 4 else np.float16)

    import cugemm8._jit as J

    def get_kernel(header, name, **kw):
        captured.update(name=name, kw=kw)
        return _Kern()
    monkeypatch.setattr(J, "get_kernel", get_kernel)
    monkeypatch.setattr(Q._device, "get_num_sms", lambda device_id=None: num_sms)
    Q._launch_cast_transpose(_X(), None, None, rows, cols, np.float32(1e-4), False, per_column, mn_major,
                             config=config)
    return captured


def _replay_cast_transpose(cap, itemsize: int, per_column: bool):
    """cast_transpose_kernel (cuda_src/quant.cuh), replayed from the launch
    arguments the host packs: every CTA's ring of cp.async groups, each
    thread's 16-byte copies into the swizzled tile and each lane's column
    reads, with every word carrying the identity of the input word it holds.

    Asserts on the way: a slot is refilled only after its tile was cast, a
    tile is cast only once its group is complete (cp.async.wait_group
    count), no real copy is pending at exit; every 16-byte slot of a tile is
    written once per fill; each lane reads exactly the input words it
    believes it reads (zeros past ``rows`` and past ``cols``); the 8 lanes a
    column's butterfly reduces hold its 128 rows; the cp.async quarter
    warps and the column reads hit 32 distinct banks; stores stay inside
    the padded output rows.  Returns the counts (input words loaded, payload
    bytes written, scale slots written)."""
    cfg, item = _transpose_config_of(cap["name"])
    assert item == itemsize and cap["block"] == (Q._THREADS,)
    assert cap["smem"] == cfg.smem_bytes(item) == cap["kw"]["max_dynamic_smem"]
    (rows, cols, r_pad, r_blocks, c_tiles, num_tiles, _bs, _rs, _min, sf_batch, sf_col, sf_block,
     sf_cols) = (cap["args"][3:])
    rows, cols, r_pad, r_blocks, c_tiles, num_tiles = (int(v) for v in (rows, cols, r_pad, r_blocks, c_tiles,
                                                                      num_tiles))
    sf_batch, sf_col, sf_block, sf_cols = map(int, (sf_batch, sf_col, sf_block, sf_cols))
    grid = cap["grid"][0]
    tile_cols, stages = cfg.tile_cols, cfg.stages
    row_bytes, vec = tile_cols * item, 16 // item
    pieces = row_bytes // 16
    load_rows = Q._THREADS // pieces
    passes, tasks, cpw = 128 // load_rows, pieces // 8, 4 // item
    g = num_tiles // (r_blocks * c_tiles)
    assert g * r_blocks * c_tiles == num_tiles and c_tiles == -(-cols // tile_cols)
    assert r_blocks == -(-rows // 128) and r_pad == Q.padded_k(rows)
    cols_pad = Q.padded_k(cols)
    wpr = cols_pad * item // 4                         # words per (padded) input row
    loaded = np.zeros((g, rows, wpr), np.int64)
    out = np.zeros((g, cols, r_pad), np.int64)
    sf_flat = np.zeros(g * sf_batch if per_column else g * c_tiles * r_blocks, np.int64)
    smem = np.zeros((stages, 128 * row_bytes // 4), np.int64)
    t = np.arange(Q._THREADS)
    ld_piece, ld_row = t % pieces, t // pieces
    lane, warp = t % 32, t // 32
    k, wsub = lane % 8, lane // 8

    def coords(tile):
        cb, rest = tile % c_tiles, tile // c_tiles
        return rest // r_blocks, rest % r_blocks, cb

    def issue(tile, stage):
        b, rb, cb = coords(tile)
        col = cb * tile_cols + ld_piece * vec
        slots = np.zeros(128 * pieces, np.int64)
        for p in range(passes):
            r = ld_row + p * load_rows
            gr = rb * 128 + r
            ok = (col < cols) & (gr < rows)
            assert np.all(col[ok] + vec <= cols_pad)               # inside the padded row
            dst = r * row_bytes + 16 * (ld_piece ^ ((r >> 4) & 7))
            quarter = ((dst // 16) % 8).reshape(-1, 8)               # 8 lanes: 8 distinct 16-byte bank groups
            assert np.all(np.sort(quarter, axis=1) == np.arange(8))
            np.add.at(slots, dst // 16, 1)
            for j in range(4):
                wcol = col * item // 4 + j
                smem[stage, dst // 4 + j] = np.where(ok, 1 + (b * rows + gr) * wpr + wcol, 0)
                np.add.at(loaded, (b, gr[ok], wcol[ok]), 1)
        assert np.all(slots == 1)

    def cast(tile, stage):
        b, rb, cb = coords(tile)
        row0 = rb * 128 + 16 * k
        valid = np.clip(rows - row0, 0, 16)
        for tt in range(tasks):
            piece = warp * tasks + tt
            wcol = (cb * tile_cols * item + 16 * piece + 4 * wsub) // 4
            piece_col = cb * tile_cols + piece * vec
            for i in range(16):
                addr = 16 * k * row_bytes + 16 * (piece ^ k) + 4 * wsub + i * row_bytes
                banks = ((addr // 4) % 32).reshape(-1, 32)
                assert np.all(np.sort(banks, axis=1) == np.arange(32))
                gr = row0 + i
                want = np.where((gr < rows) & (piece_col < cols), 1 + (b * rows + gr) * wpr + wcol, 0)
                assert np.array_equal(smem[stage, addr // 4], want)
            # the butterfly partners (lane ^ 1, 2, 4) hold the same word, rows 16 k'
            for off in (1, 2, 4):
                assert np.array_equal(wsub[lane ^ off], wsub)
            c_word = cb * tile_cols + (4 * piece + wsub) * cpw
            assert np.array_equal(c_word * item // 4, wcol)
            for h in range(cpw):
                c = c_word + h
                if per_column:
                    sel = (k == 0) & (c < sf_cols)
                    np.add.at(sf_flat, b * sf_batch + c[sel] * sf_col + rb * sf_block, 1)
                st = (valid > 0) & (c < cols)
                assert np.all(row0[st] + 16 <= r_pad)
                for rr in range(16):
                    np.add.at(out, (b, c[st], row0[st] + rr), 1)
        if not per_column:
            sf_flat[(b * c_tiles + cb) * r_blocks + rb] += 1

    for cta in range(grid):
        mine = list(range(cta, num_tiles, grid))
        groups, slot, done = [], [None] * stages, set()

        def commit(tile, stage):
            if tile < num_tiles:
                assert slot[stage] is None or slot[stage] in done, "slot refilled before its tile was cast"
                slot[stage] = tile
                issue(tile, stage)
            groups.append(tile if tile < num_tiles else None)

        for s_ in range(stages - 1):
            commit(cta + s_ * grid, s_)
        stage = 0
        for tile in mine:
            if stages == 1:
                commit(tile, 0)
            pending = stages - 2 if stages >= 2 else 0
            assert tile in groups[:len(groups) - pending], "cast before its copies completed"
            assert slot[stage] == tile
            if stages >= 2:
                commit(tile + (stages - 1) * grid, (stage + stages - 1) % stages)
            cast(tile, stage)
            done.add(tile)
            stage = (stage + 1) % stages
        assert done == set(mine) and all(gr_ is None or gr_ in done for gr_ in groups)
    return loaded, out, sf_flat, (sf_batch, sf_col, sf_block, sf_cols), cols * item


def _all_configs(itemsize, per_column):
    kind = "transpose_column" if per_column else "transpose_block"
    return Q.transpose_configs(kind, "float32" if itemsize == 4 else "bfloat16")


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 15), (16, 17), (129, 130), (257, 16), (17, 257), (300, 400)])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("per_column,mn_major", [(True, False), (True, True), (False, False)])
def test_cast_transpose_covers_each_element_and_output_once(rows, cols, itemsize, per_column, mn_major,
                                                            monkeypatch):
    """Every built configuration, in each grid form: balanced and full on
    one SM (several tiles per CTA: the ring wraps) and one CTA per tile:
    every input word of the
    [rows, cols] region is loaded once (16-byte pieces inside the padded
    row), every payload byte of [cols, r_pad] (padding included) and every
    scale written exactly once, nothing outside (the replay's own checks in
    _replay_cast_transpose).  The scale strides are the host's, in both
    per-column layouts; the MN-major buffer's padding channels are written
    (zero) too."""
    g = 3 if rows * cols > 1000 else 2               # batches: the scale's batch stride too
    rb = -(-rows // 128)
    for cfg in _all_configs(itemsize, per_column):
        for grid, num_sms in (("balanced", 1), ("full", 1), ("tiles", 132)):
            cap = _launch_capture(monkeypatch, g, rows, cols, itemsize, per_column, mn_major,
                                  cfg._replace(grid=grid), num_sms)
            tiles = g * rb * -(-cols // cfg.tile_cols)
            assert cap["grid"] == (cfg._replace(grid=grid).grid_size(tiles, num_sms),)
            loaded, out, sf_flat, strides, row_bytes = _replay_cast_transpose(cap, itemsize, per_column)
            assert loaded.max() == 1 and np.all(loaded[..., :-(-row_bytes // 4)] == 1), cfg
            assert np.all(out == 1), cfg
            assert np.all(sf_flat == 1), cfg      # the whole buffer (padding channels included), once
            if per_column:
                sf_batch, col_stride, block_stride, sf_cols = strides
                assert sf_batch == (rb * Q.tma_aligned_size(cols) if mn_major else cols * rb)
                assert sf_cols == (Q.tma_aligned_size(cols) if mn_major else cols)
                if mn_major:
                    assert (col_stride, block_stride) == (1, Q.tma_aligned_size(cols))
                else:
                    assert (col_stride, block_stride) == (rb, 1)


def test_cast_transpose_launch_geometry(monkeypatch):
    """The default configurations and the persistent grid (up to ctas_per_sm
    CTAs per SM, as few CTAs as keep the rounds of tiles, for the non-default
    forms); the host's shared-memory count of
    CTAs per SM is the kernel's kSmemCtas; a config that is not built is
    refused."""
    for dt, item in (("bfloat16", 2), ("float16", 2), ("float32", 4)):
        for kind in ("transpose_column", "transpose_block"):
            cfgs = Q.transpose_configs(kind, dt)
            for cfg in cfgs:
                assert 1 <= cfg.ctas_per_sm <= Q._transpose_smem_ctas(cfg, item), (kind, dt, cfg)
                assert cfg.ctas_per_sm * Q._THREADS <= 2048
    # the defaults: the sweep's fastest (benches/RESULTS.md v0.13): one tile per CTA, one CTA per tile
    assert Q.transpose_configs("transpose_column", "bfloat16")[0] == (128, 1, 4, "tiles")
    assert Q.transpose_configs("transpose_column", "float32")[0] == (64, 1, 4, "tiles")
    assert Q.transpose_configs("transpose_block", "bfloat16")[0] == (128, 1, 4, "tiles")
    assert Q.transpose_configs("transpose_block", "float32")[0] == (128, 1, 3, "balanced")
    # one round of the default's tiles (<= 4 x SMs), 16-bit per column: the
    # one-round configuration (benches/RESULTS.md v0.23); it is built and warmed
    one = Q.ONE_ROUND_TRANSPOSE_CONFIG
    assert one in Q.transpose_configs("transpose_column", "bfloat16")
    for dt in ("bfloat16", "float16"):
        assert Q.select_transpose_config("transpose_column", dt, 512, 132) == one      # [4096, 2048]
        assert Q.select_transpose_config("transpose_column", dt, 528, 132) == one
        assert Q.select_transpose_config("transpose_column", dt, 529, 132)[:3] == (128, 1, 4)
        assert Q.select_transpose_config("transpose_column", dt, 1024, 132)[:3] == (128, 1, 4)  # [4096, 4096]
        assert Q.select_transpose_config("transpose_column", dt, 8, 2) == one          # set_num_sms(2)
        assert Q.kernel_name("transpose_column", dt, False, one) in Q.all_kernel_names()
    assert Q.select_transpose_config("transpose_column", "float32", 64, 132)[:3] == (64, 1, 4)
    assert Q.select_transpose_config("transpose_block", "bfloat16", 64, 132)[:3] == (128, 1, 4)
    with pytest.raises(ValueError, match="kind"):
        Q.select_transpose_config("per_token", "bfloat16", 64, 132)
    cfg = Q.TransposeConfig(128, 2, 3)
    # [4096, 7168] bf16: 1792 tiles, 5 rounds of <= 396 CTAs -> 359 CTAs of 5 (three of 4);
    # float32 (64-column tiles): 3584 tiles, 10 rounds -> 359; [4096, 2048]: 512 tiles, 2 rounds -> 256
    assert [cfg.grid_size(t, 132) for t in (1792, 3584, 512, 396, 397, 5)] == [359, 359, 256, 396, 199, 5]
    assert cfg._replace(grid="full").grid_size(1792, 132) == 396
    assert cfg._replace(grid="tiles").grid_size(1792, 132) == 1792
    for tiles in range(1, 3000, 7):
        full, bal = cfg._replace(grid="full").grid_size(tiles, 132), cfg.grid_size(tiles, 132)
        assert bal <= full and -(-tiles // bal) == -(-tiles // full)     # same rounds, fewer CTAs
    assert Q._transpose_smem_ctas(Q.TransposeConfig(128, 2, 3), 2) == 3       # (64 KB + 128 B + 1 KB) x 3
    assert Q._transpose_smem_ctas(Q.TransposeConfig(128, 1, 4), 2) == 6
    cap = _launch_capture(monkeypatch, 1, 4096, 7168, 2, True)              # the default: a CTA per tile
    assert cap["grid"] == (1792,) and cap["smem"] == 32768 and cap["kw"]["smem_carveout"] == 100
    assert int(cap["args"][8]) == 32 * 56                                  # tiles
    cap = _launch_capture(monkeypatch, 1, 4096, 7168, 4, True)
    assert cap["grid"] == (3584,) and int(cap["args"][8]) == 32 * 112     # float32: 64-column tiles
    cap = _launch_capture(monkeypatch, 1, 4096, 7168, 2, True, config=Q.TransposeConfig(128, 2, 3))
    assert cap["grid"] == (359,) and cap["smem"] == 65536                   # persistent, balanced
    cap = _launch_capture(monkeypatch, 1, 200, 100, 2, False, num_sms=132)
    assert cap["grid"] == (2,)                                              # never more CTAs than tiles
    with pytest.raises(ValueError, match="not one of the built"):
        _launch_capture(monkeypatch, 1, 200, 100, 2, False, config=Q.TransposeConfig(64, 2, 6))
    with pytest.raises(ValueError, match="grid must be one of"):
        _launch_capture(monkeypatch, 1, 200, 100, 2, False, config=Q.TransposeConfig(128, 2, 3, "wide"))
