"""GPU tests of the quantisation kernels (issue 6): bit-exact agreement with
:mod:`cugemm8.reference`.

Every comparison is bit for bit on payloads and scales, except that NaN
payloads (0x7F / 0xFF) and NaN scales compare as NaN: the kernels write the
canonical NaN, NumPy propagates NaN signs and payloads.

Covered: hypothesis-drawn shapes (m and n 1..300, k a multiple of 16 up to
1024, g 1..3 or 2-D) and magnitudes (data scaled by 2^u, u in [-40, 40]
(fp16: [-14, 4])), every input dtype, pow2 scales, several min_amax;
saturation literals (adversarial.md item 9), fp32 subnormal inputs, all-zero
groups (item 8), NaN / Inf containment, non-contiguous views (item 15), the
sfa layout contract (padding rows written, MN-major strides), every
per-token work split, outputs fully written (poisoned buffers), streams,
determinism, argument validation, empty inputs and the gemm_fp8 one-call
path.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from cugemm8 import quant as Q
from cugemm8 import reference as R
from cugemm8.layout import get_col_major_tma_aligned_tensor, is_tma_aligned_mn_major
from tests.gpu_helpers import assert_payload_equal

pytestmark = pytest.mark.gpu

SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
#: Magnitude exponents u (data * 2^u) that keep each dtype finite and mostly normal.
U_RANGE = {"float32": (-40, 40), "bfloat16": (-40, 40), "float16": (-14, 4)}


def _cp():
    import cupy
    return cupy


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

def assert_scales_equal(got, want, what="scales"):
    got, want = np.asarray(got), np.asarray(want, dtype=np.float32)
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    bad = (nan_g != nan_w) | (~nan_w & (got.view(np.uint32) != want.view(np.uint32)))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ; first at {idx}: "
                             f"got {got[idx]!r}, want {want[idx]!r}")


def make_data(rng, shape, dtype_name, u, kind):
    """Host array of ``dtype_name``: random data times 2^u, of a given kind."""
    if kind == "normal":
        x = rng.standard_normal(shape)
    elif kind == "block_varied":            # each 1x128 / 128x128 block times 2^[-3, 3]
        x = R.block_varied_normal(rng, shape, block=(1, 128), spread=3).astype(np.float64)
    elif kind == "wide":                    # per-element magnitudes over 2^[-8, 8]
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 9, shape)
    elif kind == "sparse":                  # mostly zero, whole zero rows, -0.0
        x = rng.standard_normal(shape) * (rng.random(shape) < 0.1)
        x[..., ::3, :] = 0.0
        x[..., 1::5, ::3] = -0.0
    else:                                   # "ties": values on e4m3 midpoints after scaling
        x = rng.integers(-480, 481, shape) / 32.0
    x = x * 2.0 ** u
    with np.errstate(over="ignore"):
        return x.astype(DTYPES[dtype_name])


def sfa_buffer(sfa, m_pad):
    """The full [..., kb, m_pad] buffer behind an MN-major sfa view."""
    cp = _cp()
    kb = sfa.shape[-1]
    if sfa.ndim == 2:
        return cp.ndarray((kb, m_pad), np.float32, memptr=sfa.data, strides=(4 * m_pad, 4))
    g = sfa.shape[0]
    return cp.ndarray((g, kb, m_pad), np.float32, memptr=sfa.data,
                      strides=(4 * m_pad * kb, 4 * m_pad, 4))


def check_sfa_layout(sfa, shape_x):
    *lead, m, k = shape_x
    kb, m_pad = -(-k // 128), -(-m // 4) * 4
    assert sfa.dtype == np.float32
    assert sfa.shape == (*lead, m, kb)
    if len(lead) == 0:
        assert sfa.strides == (4, 4 * m_pad)
    else:
        assert sfa.strides == (4 * m_pad * kb, 4, 4 * m_pad)
    assert sfa.data.ptr % 16 == 0
    assert is_tma_aligned_mn_major(sfa)
    assert get_col_major_tma_aligned_tensor(sfa) is sfa
    if m_pad > m and kb:
        pad = sfa_buffer(sfa, m_pad)[..., m:].get()
        assert np.all(pad.view(np.uint32) == 0), "sfa padding rows must hold 0.0"


def run_token(x_host, **kw):
    cp = _cp()
    a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x_host), **kw)
    return a, sfa


def compare_token(x_host, a, sfa, **kw):
    with np.errstate(all="ignore"):
        want_a, want_s = R.per_token_cast_to_fp8(x_host, **kw)
    assert a.flags.c_contiguous
    check_sfa_layout(sfa, x_host.shape)
    assert_scales_equal(sfa.get(), want_s, "sfa")
    assert_payload_equal(a.get(), want_a, "a")


def compare_block(w_host, b, sfb, **kw):
    with np.errstate(all="ignore"):
        want_b, want_s = R.per_block_cast_to_fp8(w_host, **kw)
    assert b.flags.c_contiguous and sfb.flags.c_contiguous
    assert_scales_equal(sfb.get(), want_s, "sfb")
    assert_payload_equal(b.get(), want_b, "b")


# ----------------------------------------------------------------------------
# Properties: bit-exact against the reference
# ----------------------------------------------------------------------------

ks = st.one_of(st.integers(1, 64).map(lambda i: 16 * i), st.sampled_from([16, 128, 144, 256, 1024]))
rows = st.one_of(st.integers(1, 300), st.sampled_from([1, 2, 3, 4, 5, 127, 128, 129, 256]))
batches = st.sampled_from([None, 1, 2, 3])
dtype_names = st.sampled_from(list(DTYPES))
kinds = st.sampled_from(["normal", "block_varied", "wide", "sparse", "ties"])
min_amaxes = st.sampled_from([1e-4, 1e-10, Q.MIN_AMAX_FLOOR, 0.5])


@settings(max_examples=40, **SETTINGS)
@given(dtype_name=dtype_names, g=batches, m=rows, k=ks, frac=st.floats(0, 1), kind=kinds,
       pow2=st.booleans(), min_amax=min_amaxes, seed=st.integers(0, 2**32 - 1))
@example(dtype_name="bfloat16", g=None, m=1, k=16, frac=0.5, kind="normal", pow2=False,
         min_amax=1e-4, seed=0)
@example(dtype_name="float32", g=3, m=129, k=1024, frac=1.0, kind="wide", pow2=True,
         min_amax=1e-4, seed=1)
@example(dtype_name="float16", g=2, m=5, k=144, frac=0.0, kind="ties", pow2=False,
         min_amax=Q.MIN_AMAX_FLOOR, seed=2)
def test_per_token_matches_reference(dtype_name, g, m, k, frac, kind, pow2, min_amax, seed):
    rng = np.random.default_rng(seed)
    lo, hi = U_RANGE[dtype_name]
    u = int(round(lo + frac * (hi - lo)))
    shape = (m, k) if g is None else (g, m, k)
    x = make_data(rng, shape, dtype_name, u, kind)
    a, sfa = run_token(x, min_amax=min_amax, pow2_scale=pow2)
    assert a.shape == shape and a.dtype == np.uint8
    compare_token(x, a, sfa, min_amax=min_amax, pow2_scale=pow2)


@settings(max_examples=30, **SETTINGS)
@given(dtype_name=dtype_names, g=batches, n=rows, k=ks, frac=st.floats(0, 1), kind=kinds,
       pow2=st.booleans(), min_amax=min_amaxes, seed=st.integers(0, 2**32 - 1))
@example(dtype_name="bfloat16", g=None, n=1, k=16, frac=0.5, kind="normal", pow2=False,
         min_amax=1e-4, seed=0)
@example(dtype_name="float32", g=3, n=300, k=1024, frac=0.0, kind="wide", pow2=True,
         min_amax=1e-4, seed=1)
def test_per_block_matches_reference(dtype_name, g, n, k, frac, kind, pow2, min_amax, seed):
    rng = np.random.default_rng(seed)
    lo, hi = U_RANGE[dtype_name]
    u = int(round(lo + frac * (hi - lo)))
    shape = (n, k) if g is None else (g, n, k)
    w = make_data(rng, shape, dtype_name, u, kind)
    cp = _cp()
    b, sfb = Q.per_block_cast_to_fp8(cp.asarray(w), min_amax=min_amax, pow2_scale=pow2)
    nb, kb = -(-n // 128), -(-k // 128)
    assert b.shape == shape and sfb.shape == shape[:-2] + (nb, kb)
    compare_block(w, b, sfb, min_amax=min_amax, pow2_scale=pow2)


# ----------------------------------------------------------------------------
# Named edge cases
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("pow2", [False, True])
def test_saturation_literals(dtype_name, pow2):
    """adversarial.md item 9: [449, 470, 1e4, -500, 3e38] inside a block with
    ordinary values; finite input never gives a NaN payload."""
    big = 3e38 if dtype_name != "float16" else 6e4
    x = np.full((8, 256), 1.0)
    x[:, :5] = [449, 470, 1e4, -500, big]
    x[1, :5] = [449, 470, 1e4, -500, -1e3]
    x[2] = np.linspace(-448, 448, 256)
    x[3] = np.linspace(-1e4, 1e4, 256)
    x = x.astype(DTYPES[dtype_name])
    cp = _cp()
    for fn, cmp in ((Q.per_token_cast_to_fp8, compare_token), (Q.per_block_cast_to_fp8, compare_block)):
        p, s = fn(cp.asarray(x), pow2_scale=pow2)
        cmp(x, p, s, pow2_scale=pow2)
        bits = p.get()
        assert not np.any((bits & 0x7F) == 0x7F), "finite input produced a NaN payload"
    # the block maximum maps to +-448 (0x7E / 0xFE) or just below it
    a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x))
    assert int(a.get()[0, 4]) == 0x7E


@pytest.mark.parametrize("min_amax", [1e-4, Q.MIN_AMAX_FLOOR])
@pytest.mark.parametrize("pow2", [False, True])
def test_fp32_subnormal_inputs(min_amax, pow2):
    """fp32 subnormals: with min_amax at its floor the scale is 2^-126 and
    subnormal inputs map to payloads of order 1, so every bit of their exact
    value matters (no flush to zero anywhere)."""
    rng = np.random.default_rng(5)
    tiny = np.float32(2.0 ** -149)
    x = (rng.integers(-2**23 + 1, 2**23, size=(6, 384)).astype(np.float32) * tiny).astype(np.float32)
    x[1, :128] = rng.standard_normal(128).astype(np.float32) * np.float32(2.0 ** -120)   # normals
    x[2, 128:256] = -tiny
    x[3] = np.float32(2.0 ** -126) * np.float32(0.75)
    cp = _cp()
    a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x), min_amax=min_amax, pow2_scale=pow2)
    compare_token(x, a, sfa, min_amax=min_amax, pow2_scale=pow2)
    b, sfb = Q.per_block_cast_to_fp8(cp.asarray(x), min_amax=min_amax, pow2_scale=pow2)
    compare_block(x, b, sfb, min_amax=min_amax, pow2_scale=pow2)
    if min_amax == Q.MIN_AMAX_FLOOR and not pow2:
        assert np.all(sfa.get()[0] == np.float32(2.0 ** -126))
        assert np.count_nonzero(a.get()[0] & 0x7F) > 100       # not flushed to zero


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("min_amax", [1e-4, 1e-10, 3.0])
def test_all_zero_groups(dtype_name, min_amax):
    """adversarial.md item 8: zero rows / blocks get scale min_amax / 448 and
    zero payloads (-0.0 stays 0x80), never NaN."""
    x = np.zeros((6, 384))
    x[1, 128:] = 1.5
    x[2, ::5] = -0.0
    x = x.astype(DTYPES[dtype_name])
    cp = _cp()
    a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x), min_amax=min_amax)
    compare_token(x, a, sfa, min_amax=min_amax)
    s = sfa.get()
    want = np.float32(min_amax) / np.float32(448)
    assert s[0, 0] == want and s[1, 0] == want and s[2, 2] == want
    bits = a.get()
    assert np.all(bits[0] == 0) and np.all(bits[2, ::5] == 0x80)
    w = np.zeros((130, 256), dtype=DTYPES[dtype_name])
    b, sfb = Q.per_block_cast_to_fp8(cp.asarray(w), min_amax=min_amax)
    assert np.all(sfb.get() == want) and not np.any(b.get())


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("pow2", [False, True])
def test_nan_inf_stay_in_their_group(dtype_name, pow2):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    x[1, 130] = np.nan
    x[2, 5] = np.inf
    x[3, 300] = -np.inf
    x[3, 301] = np.inf
    x[4, 0] = -np.nan
    x[5, :] = np.nan
    x = x.astype(DTYPES[dtype_name])
    cp = _cp()
    a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x), pow2_scale=pow2)
    compare_token(x, a, sfa, pow2_scale=pow2)
    s, bits = sfa.get(), a.get()
    poisoned = {(1, 1), (2, 0), (3, 2), (4, 0), (5, 0), (5, 1), (5, 2), (5, 3)}
    for i in range(8):
        for j in range(4):
            assert np.isfinite(s[i, j]) == ((i, j) not in poisoned), (i, j)
            if (i, j) not in poisoned:
                assert not np.any((bits[i, 128 * j:128 * (j + 1)] & 0x7F) == 0x7F)
    assert np.isnan(s[1, 1]) and np.all((bits[1, 128:256] & 0x7F) == 0x7F)
    assert np.isinf(s[2, 0]) and (bits[2, 5] & 0x7F) == 0x7F
    assert np.all(bits[2, [0, 1, 2, 3, 4, 6]] & 0x7F == 0)       # finite / Inf = +-0
    w = rng.standard_normal((300, 400)).astype(np.float32)
    w[129, 131] = np.nan
    w[5, 390] = -np.inf
    w = w.astype(DTYPES[dtype_name])
    b, sfb = Q.per_block_cast_to_fp8(cp.asarray(w), pow2_scale=pow2)
    compare_block(w, b, sfb, pow2_scale=pow2)
    sb = sfb.get()
    assert np.isnan(sb[1, 1]) and np.isinf(sb[0, 3])
    assert np.isfinite(np.delete(sb.ravel(), [1 * 4 + 1, 0 * 4 + 3])).all()


def _views(cp, dtype, rng):
    """(name, view) pairs of non-contiguous inputs, each [.., m, k], k % 16 == 0."""
    def dev(shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))
    base, padded, flat = dev((2, 8, 7168)), dev((37, 400)), dev((70 * 257 + 8,))
    col_major, row, big = dev((256, 33)), dev((1, 272)), dev((3, 20, 304))
    return [
        ("sliced batch x_full[:, 3:, :]", base[:, 3:, :]),                  # read in place
        ("padded row pitch", padded[:, :384]),                              # in place
        ("misaligned base (copy path)", flat[1:1 + 70 * 256].reshape(70, 256)),
        ("odd row pitch (copy path)", flat[:69 * 257].reshape(69, 257)[:, :256]),
        ("column-major (copy path)", col_major.T[:, :256]),
        ("negative row stride", padded[::-1, :384]),                        # in place
        ("broadcast rows (stride 0)", cp.broadcast_to(row, (9, 272))),      # in place
        ("batch and row slicing", big[::2, 1::3, 16:]),                     # in place
        ("column offset slice", big[:, :, 8:296]),
    ]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_non_contiguous_inputs_match_contiguous_copies(dtype_name):
    """adversarial.md item 15: views give exactly the bits of their contiguous
    copies (and of the reference); never a shifted or transposed result."""
    cp = _cp()
    rng = np.random.default_rng(7)
    for name, view in _views(cp, DTYPES[dtype_name], rng):
        before = view.copy()
        dense = cp.ascontiguousarray(view)
        host = dense.get()
        for fn, cmp in ((Q.per_token_cast_to_fp8, compare_token), (Q.per_block_cast_to_fp8, compare_block)):
            p, s = fn(view)
            p2, s2 = fn(dense)
            assert cp.array_equal(p, p2), name
            assert np.array_equal(s.get().view(np.uint32), s2.get().view(np.uint32)), name
            cmp(host, p, s)
        assert cp.array_equal(view, before), f"{name}: input modified"


def test_sfa_layout_contract():
    cp = _cp()
    rng = np.random.default_rng(8)
    for shape in [(1, 16), (3, 128), (129, 128), (5, 1024), (130, 7168), (2, 7, 256), (3, 4, 16),
                  (2, 1, 384)]:
        x = rng.standard_normal(shape).astype(np.float32)
        a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x))
        check_sfa_layout(sfa, shape)
        compare_token(x, a, sfa)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_pow2_scales_are_powers_of_two(dtype_name):
    rng = np.random.default_rng(9)
    x = make_data(rng, (3, 50, 640), dtype_name, 0, "wide")
    cp = _cp()
    for fn in (Q.per_token_cast_to_fp8, Q.per_block_cast_to_fp8):
        _, s = fn(cp.asarray(x), pow2_scale=True)
        _, s_plain = fn(cp.asarray(x), pow2_scale=False)
        s, s_plain = s.get(), s_plain.get()
        mant, _ = np.frexp(s)
        assert np.all(mant == 0.5)
        assert np.all(s >= s_plain) and np.all(s < 2 * s_plain)


_GUARD = 256     # bytes of poisoned guard before and after every output buffer


def _guarded(shape, dtype, poison_bits):
    """A C-contiguous ``shape`` view into a larger buffer whose every byte,
    guards included, holds ``poison_bits``; returns (view, whole buffer)."""
    cp = _cp()
    item = np.dtype(dtype).itemsize
    count = int(np.prod(shape))
    raw_dtype = {1: np.uint8, 4: np.uint32}[item]
    whole = cp.full(count + 2 * _GUARD // item, poison_bits, dtype=raw_dtype)
    view = whole[_GUARD // item:_GUARD // item + count].view(dtype).reshape(shape)
    return view, whole


def _check_guards(whole, poison_bits):
    host = whole.get()
    n = _GUARD // host.itemsize
    assert np.all(host[:n] == poison_bits) and np.all(host[-n:] == poison_bits), \
        "a kernel wrote outside its output buffer"


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("per_task", [1, 2, 3, 4, 5, 8])
def test_every_split_writes_exactly_its_outputs(dtype_name, per_task, monkeypatch):
    """Each per-token work split (chunks per warp, the heuristic's 1/2/4 and
    odd ones), into two differently poisoned output buffers with guards:
    every payload byte and scale is written, the sfa padding rows get 0,
    nothing outside the buffers changes, results equal the reference."""
    cp = _cp()
    rng = np.random.default_rng(10 + per_task)
    x = make_data(rng, (2, 37, 1040), dtype_name, 0, "block_varied")
    g, m, k = x.shape
    kb, m_pad = -(-k // 128), -(-m // 4) * 4
    chunks = -(-k // (32 * (16 // x.itemsize)))
    monkeypatch.setattr(Q, "_per_token_split", lambda *args: (-(-chunks // per_task), per_task))
    with np.errstate(all="ignore"):
        want_a, want_s = R.per_token_cast_to_fp8(x)
    xd = cp.asarray(x)
    for poison_a, poison_s in ((0x5A, 0x7FC00001), (0xA5, 0x3F800000)):
        a, a_whole = _guarded((g, m, k), np.uint8, poison_a)
        sfa_buf, s_whole = _guarded((g, kb, m_pad), np.float32, poison_s)
        Q._launch_per_token(xd, a, sfa_buf, np.float32(1e-4), False, cp)
        assert_payload_equal(a.get(), want_a)
        buf = sfa_buf.get()
        assert_scales_equal(buf[:, :, :m].transpose(0, 2, 1), want_s)
        assert np.all(buf[:, :, m:].view(np.uint32) == 0)
        _check_guards(a_whole, poison_a)
        _check_guards(s_whole, poison_s)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [(1, 16), (130, 144), (3, 129, 400)])
def test_per_block_writes_exactly_its_outputs(dtype_name, shape):
    cp = _cp()
    rng = np.random.default_rng(20)
    w = make_data(rng, shape, dtype_name, 0, "wide")
    *lead, n, k = shape
    g = lead[0] if lead else 1
    nb, kb = -(-n // 128), -(-k // 128)
    with np.errstate(all="ignore"):
        want_b, want_s = R.per_block_cast_to_fp8(w)
    wd = cp.asarray(w)
    for poison_b, poison_s in ((0x5A, 0x7FC00001), (0xA5, 0x3F800000)):
        b, b_whole = _guarded((g, n, k), np.uint8, poison_b)
        sfb, s_whole = _guarded((g, nb, kb), np.float32, poison_s)
        Q._launch_per_block(wd, b, sfb, np.float32(1e-4), False, cp)
        assert_payload_equal(b.get().reshape(shape), want_b)
        assert_scales_equal(sfb.get().reshape(want_s.shape), want_s)
        _check_guards(b_whole, poison_b)
        _check_guards(s_whole, poison_s)


def test_large_shapes_use_the_unrolled_split():
    """Shapes large enough for 4 chunks per warp (prefill) and the per-block
    kernel at DeepSeek-V3 sizes."""
    cp = _cp()
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2048, 7168)).astype(ml_dtypes.bfloat16)
    assert Q._per_token_split(2048, 7168, 2, 132)[1] == 4
    a, sfa = Q.per_token_cast_to_fp8(cp.asarray(x))
    compare_token(x, a, sfa)
    w = rng.standard_normal((1536, 7168)).astype(np.float32)
    b, sfb = Q.per_block_cast_to_fp8(cp.asarray(w))
    compare_block(w, b, sfb)


def test_streams_and_determinism():
    cp = _cp()
    rng = np.random.default_rng(12)
    x = cp.asarray(rng.standard_normal((3, 100, 512)).astype(ml_dtypes.bfloat16))
    a0, s0 = Q.per_token_cast_to_fp8(x)
    b0, t0 = Q.per_block_cast_to_fp8(x)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a1, s1 = Q.per_token_cast_to_fp8(x)
        b1, t1 = Q.per_block_cast_to_fp8(x)
    stream.synchronize()
    assert cp.array_equal(a0, a1) and cp.array_equal(b0, b1)
    assert cp.array_equal(s0.view(cp.uint32), s1.view(cp.uint32))
    assert cp.array_equal(t0.view(cp.uint32), t1.view(cp.uint32))


def test_empty_inputs():
    cp = _cp()
    for shape in [(0, 128), (5, 0), (0, 0), (0, 3, 128), (2, 0, 16)]:
        x = cp.zeros(shape, dtype=np.float32)
        a, sfa = Q.per_token_cast_to_fp8(x)
        *lead, m, k = shape
        assert a.shape == shape and a.dtype == np.uint8
        assert sfa.shape == (*lead, m, -(-k // 128)) and sfa.dtype == np.float32
        b, sfb = Q.per_block_cast_to_fp8(x)
        assert b.shape == shape and sfb.shape == (*lead, -(-m // 128), -(-k // 128))


def test_validation_errors():
    cp = _cp()
    x = cp.zeros((4, 128), dtype=np.float32)
    for fn in (Q.per_token_cast_to_fp8, Q.per_block_cast_to_fp8):
        with pytest.raises(TypeError, match="NumPy"):
            fn(np.zeros((4, 128), np.float32))
        with pytest.raises(TypeError, match="cupy.ndarray"):
            fn([[1.0] * 128])
        with pytest.raises(TypeError, match="dtype"):
            fn(cp.zeros((4, 128), dtype=np.int32))
        with pytest.raises(TypeError, match="dtype"):
            fn(cp.zeros((4, 128), dtype=np.float64))
        with pytest.raises(ValueError, match="2-D"):
            fn(cp.zeros(128, dtype=np.float32))
        with pytest.raises(ValueError, match="2-D"):
            fn(cp.zeros((1, 2, 3, 128), dtype=np.float32))
        # any k is accepted now (issue 17): the payload is padded to 16 columns
        assert fn(cp.ones((4, 100), dtype=np.float32))[0].shape == (4, 112)
        for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-40, 1e39):
            with pytest.raises(ValueError, match="min_amax"):
                fn(x, min_amax=bad)
        with pytest.raises(TypeError, match="min_amax"):
            fn(x, min_amax="1e-4")
        with pytest.raises(TypeError, match="min_amax"):
            fn(x, min_amax=True)
        with pytest.raises(TypeError, match="pow2_scale"):
            fn(x, pow2_scale=1)
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            other = cp.zeros((4, 128), dtype=np.float32)
        with pytest.raises(ValueError, match="device"):
            Q.per_token_cast_to_fp8(other)


def test_gemm_fp8_one_call():
    """gemm_fp8 on float inputs == the GEMM on the explicitly quantised pairs,
    and within the reference error bound."""
    cp = _cp()
    rng = np.random.default_rng(13)
    m, n, k = 65, 256, 640
    x = R.block_varied_normal(rng, (m, k)).astype(ml_dtypes.bfloat16)
    w = R.block_varied_normal(rng, (n, k), block=(128, 128)).astype(ml_dtypes.bfloat16)
    xd, wd = cp.asarray(x), cp.asarray(w)
    out = Q.gemm_fp8(xd, wd)
    assert out.shape == (m, n) and out.dtype == ml_dtypes.bfloat16
    lhs, rhs = Q.per_token_cast_to_fp8(xd), Q.per_block_cast_to_fp8(wd)
    out2 = cp.empty((m, n), dtype=ml_dtypes.bfloat16)
    assert Q.gemm_fp8(lhs, rhs, out2) is out2
    assert cp.array_equal(out.view(cp.uint16), out2.view(cp.uint16))
    a_bits, sfa = R.per_token_cast_to_fp8(x)
    b_bits, sfb = R.per_block_cast_to_fp8(w)
    ref = R.ref_gemm_nt(a_bits, sfa, b_bits, sfb)
    bound = R.error_bound(a_bits, sfa, b_bits, sfb)
    err = np.abs(out.get().astype(np.float64) - ref)
    assert np.all(err <= bound), float((err / bound).max())
    out3 = Q.gemm_fp8(xd, rhs, pow2_scale=True)          # mixed: float lhs, quantised rhs
    assert out3.shape == (m, n)
    with pytest.raises(TypeError):
        Q.gemm_fp8((lhs[0],), rhs)


@pytest.mark.parametrize("pow2", [False, True], ids=["plain", "pow2"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_float32_quotient_is_exact_on_every_16_bit_input(dtype_name, pow2):
    """The float32 quotient (quant.cuh ``quotient_f32``, which gemm_fp8's
    in-kernel forms (warp-MMA and TMA converters) and the per-token cast of
    16-bit x with the default min_amax use) gives the float64 path's
    RN_f32(x / scale) and e4m3 byte on every input it can get: every finite
    amax of the dtype (its scale from the in-kernel forms' function, which
    must equal the cast's: checked too), every finite x with |x| <= amax,
    both signs (cuda_src/quant_check.cuh); the quotient's bits at and above
    2^-10, its byte everywhere."""
    from cugemm8 import _jit
    cp = _cp()
    dt = "kBFloat16" if dtype_name == "bfloat16" else "kFloat16"
    kern = _jit.get_kernel("quant_check.cuh", f"cugemm8::quotient_check_kernel<cugemm8::InDtype::{dt}>")
    counts = cp.zeros(4, dtype=cp.uint64)
    first = cp.full(2, 0xFFFFFFFF, dtype=cp.uint32)
    finite = 0x7F80 if dtype_name == "bfloat16" else 0x7C00
    kern((0x8000,), (256,), (np.uint32(pow2), counts, first))
    checked, quotient_diff, byte_diff, scale_diff = (int(v) for v in counts.get())
    assert scale_diff == 0, f"{scale_diff} in-kernel scales (float32 quotient by 448) differ from the cast's"
    # sum over amax bits a < finite of 2 (a + 1) pairs
    assert checked == finite * (finite + 1), checked
    assert byte_diff == 0, f"{byte_diff} bytes differ; first amax bits {int(first[0]):#x}, x bits {int(first[1]):#x}"
    assert quotient_diff == 0, f"{quotient_diff} float32 quotients >= 2^-10 differ (bytes equal)"
