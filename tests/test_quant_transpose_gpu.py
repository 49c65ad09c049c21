"""GPU tests of the transposing casts of the backward pass (issue 21):
``per_token_cast_to_fp8_t`` (1x128 along tokens, payload [k, m_pad]) and
``cast_transpose_block_fp8`` (128x128 blocks, payload [k, n_pad]), bit for
bit against :mod:`cugemm8.reference` (NaN payloads and NaN scales compare as
NaN, as in tests/test_quant_gpu.py), on hypothesis-drawn shapes (tails in
both dimensions, batches), every input dtype, pow2 scales, several
min_amax; NaN / Inf containment per column or per tile; non-contiguous
views; the padding bytes zero; every output byte written and nothing
outside (poisoned, guarded buffers); agreement with the forward block cast
transposed; empty inputs and argument validation."""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from cugemm8 import quant as Q
from cugemm8 import reference as R
from tests.gpu_helpers import assert_payload_equal
from tests.test_quant_gpu import (DTYPES, SETTINGS, U_RANGE, _check_guards, _guarded, _views,
                                  assert_scales_equal, make_data)

pytestmark = pytest.mark.gpu


def _cp():
    import cupy
    return cupy


def _pad16(r: int) -> int:
    return -(-r // 16) * 16


def check_transposed(x, got_bits, got_sf, per_column: bool, **kw):
    """Compare one transposing cast's outputs with the reference."""
    with np.errstate(all="ignore"):
        ref = R.per_token_cast_to_fp8_t if per_column else R.cast_transpose_block_fp8
        want_bits, want_sf = ref(x, **kw)
    *lead, rows, cols = x.shape
    assert got_bits.dtype == np.uint8 and got_bits.flags.c_contiguous
    assert got_bits.shape == (*lead, cols, _pad16(rows)), (got_bits.shape, x.shape)
    assert got_sf.flags.c_contiguous and got_sf.shape == want_sf.shape, (got_sf.shape, want_sf.shape)
    bits = got_bits.get()
    assert_payload_equal(bits[..., :rows], want_bits, "payload")
    assert not bits[..., rows:].any(), "padding bytes [rows, rows_pad) must be zero"
    assert_scales_equal(got_sf.get(), want_sf, "scales")


rows_st = st.one_of(st.integers(1, 300), st.sampled_from([1, 16, 127, 128, 129, 256, 300]))
cols_st = st.one_of(st.integers(1, 300), st.sampled_from([1, 15, 16, 128, 136, 257]))
batches = st.one_of(st.none(), st.integers(1, 3))
kinds = st.sampled_from(["normal", "block_varied", "wide", "sparse", "ties"])
min_amaxes = st.sampled_from([1e-4, Q.MIN_AMAX_FLOOR, 0.5, 1e3])


@settings(max_examples=40, **SETTINGS)
@given(dtype_name=st.sampled_from(list(DTYPES)), g=batches, rows=rows_st, cols=cols_st,
       frac=st.floats(0, 1), kind=kinds, pow2=st.booleans(), min_amax=min_amaxes,
       per_column=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(dtype_name="bfloat16", g=None, rows=1, cols=16, frac=0.5, kind="normal", pow2=False,
         min_amax=1e-4, per_column=True, seed=0)
@example(dtype_name="float32", g=3, rows=129, cols=257, frac=1.0, kind="wide", pow2=True,
         min_amax=1e-4, per_column=True, seed=1)
@example(dtype_name="float16", g=2, rows=300, cols=136, frac=0.0, kind="ties", pow2=False,
         min_amax=Q.MIN_AMAX_FLOOR, per_column=False, seed=2)
def test_transposing_casts_match_reference(dtype_name, g, rows, cols, frac, kind, pow2, min_amax,
                                           per_column, seed):
    rng = np.random.default_rng(seed)
    lo, hi = U_RANGE[dtype_name]
    u = int(round(lo + frac * (hi - lo)))
    shape = (rows, cols) if g is None else (g, rows, cols)
    x = make_data(rng, shape, dtype_name, u, kind)
    fn = Q.per_token_cast_to_fp8_t if per_column else Q.cast_transpose_block_fp8
    bits, sf = fn(_cp().asarray(x), min_amax=min_amax, pow2_scale=pow2)
    check_transposed(x, bits, sf, per_column, min_amax=min_amax, pow2_scale=pow2)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_deepseek_sizes(dtype_name):
    """A wgrad activation [4096, 7168] and a weight [2112, 7168]."""
    cp = _cp()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4096, 7168)).astype(DTYPES[dtype_name])
    bits, sf = Q.per_token_cast_to_fp8_t(cp.asarray(x))
    check_transposed(x, bits, sf, True)
    w = (rng.standard_normal((2112, 7168)) * 0.02).astype(DTYPES[dtype_name])
    bits, sf = Q.cast_transpose_block_fp8(cp.asarray(w))
    check_transposed(w, bits, sf, False)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_block_transpose_equals_the_forward_cast_transposed(dtype_name):
    cp = _cp()
    rng = np.random.default_rng(4)
    w = cp.asarray(rng.standard_normal((2, 300, 520)).astype(DTYPES[dtype_name]))
    b, sfb = Q.per_block_cast_to_fp8(w)              # [2, 300, 528]: k = 520 padded to 528
    bt, sft = Q.cast_transpose_block_fp8(w)          # [2, 520, 304]: n = 300 padded to 304
    assert b.shape == (2, 300, 528) and bt.shape == (2, 520, 304)
    assert cp.array_equal(bt[..., :300], b[..., :520].transpose(0, 2, 1))
    assert cp.array_equal(sft.view(cp.uint32), sfb.transpose(0, 2, 1).view(cp.uint32))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("pow2", [False, True])
def test_nan_inf_stay_in_their_column_or_tile(dtype_name, pow2):
    cp = _cp()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 272)).astype(np.float32)
    x[5, 3] = np.nan            # channel 3, token group 0
    x[200, 7] = np.inf          # channel 7, token group 1
    x[290, 8] = -np.inf         # channel 8, token group 2 (the tail)
    x[:, 200] = np.nan          # a whole channel
    x = x.astype(DTYPES[dtype_name])
    bits, sf = Q.per_token_cast_to_fp8_t(cp.asarray(x), pow2_scale=pow2)
    check_transposed(x, bits, sf, True, pow2_scale=pow2)
    s, b = sf.get(), bits.get()
    bad = {(3, 0), (7, 1), (8, 2), (200, 0), (200, 1), (200, 2)}
    for c in range(272):
        for j in range(3):
            assert np.isfinite(s[c, j]) == ((c, j) not in bad), (c, j)
    assert np.all((b[3, :128] & 0x7F) == 0x7F) and not np.any((b[3, 128:300] & 0x7F) == 0x7F)
    assert not b[200, 300:].any()               # padding stays zero even in a NaN channel
    bits, sft = Q.cast_transpose_block_fp8(cp.asarray(x), pow2_scale=pow2)
    check_transposed(x, bits, sft, False, pow2_scale=pow2)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("per_column", [True, False])
def test_non_contiguous_inputs_match_contiguous_copies(dtype_name, per_column):
    cp = _cp()
    rng = np.random.default_rng(7)
    fn = Q.per_token_cast_to_fp8_t if per_column else Q.cast_transpose_block_fp8
    w = cp.asarray(rng.standard_normal((130, 272)).astype(np.float32).astype(DTYPES[dtype_name]))
    views = _views(cp, DTYPES[dtype_name], rng) + [
        ("shared weights, batch stride 0", cp.broadcast_to(w, (3, 130, 272))),     # read in place
        ("batch stride 0 and reversed rows", cp.broadcast_to(w[::-1], (2, 130, 272)))]
    for name, view in views:
        before = view.copy()
        got_b, got_s = fn(view)
        assert cp.array_equal(view, before), f"{name}: the input changed"
        want_b, want_s = fn(cp.ascontiguousarray(view))
        assert cp.array_equal(got_b, want_b), name
        assert cp.array_equal(got_s.view(cp.uint32), want_s.view(cp.uint32)), name


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [(1, 16), (130, 144), (3, 129, 400), (300, 20)])
@pytest.mark.parametrize("per_column", [True, False])
def test_writes_exactly_its_outputs(dtype_name, shape, per_column):
    """Into two differently poisoned buffers with guards: every byte of the
    payload (padding included) and every scale is written, nothing outside."""
    cp = _cp()
    rng = np.random.default_rng(20)
    x = make_data(rng, shape, dtype_name, 0, "wide")
    *lead, rows, cols = shape
    g = lead[0] if lead else 1
    rb, cb = -(-rows // 128), -(-cols // 128)
    sf_shape = (g, cols, rb) if per_column else (g, cb, rb)
    with np.errstate(all="ignore"):
        ref = R.per_token_cast_to_fp8_t if per_column else R.cast_transpose_block_fp8
        want_b, want_s = ref(x)
    xd = Q._in_place_or_copy(Q._pad_k("x", cp.asarray(x), cp), cp)
    for poison_b, poison_s in ((0x5A, 0x7FC00001), (0xA5, 0x3F800000)):
        b, b_whole = _guarded((g, cols, _pad16(rows)), np.uint8, poison_b)
        sf, s_whole = _guarded(sf_shape, np.float32, poison_s)
        Q._launch_cast_transpose(xd, b, sf, rows, cols, np.float32(1e-4), False, per_column)
        host = b.get()
        assert_payload_equal(host[..., :rows].reshape(want_b.shape), want_b)
        assert not host[..., rows:].any()
        assert_scales_equal(sf.get().reshape(want_s.shape), want_s)
        _check_guards(b_whole, poison_b)
        _check_guards(s_whole, poison_s)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [(1, 16), (130, 21), (3, 129, 400), (300, 130), (257, 7168)])
def test_mn_major_scales(dtype_name, shape):
    """mn_major=True: the same payload and scale values as the row-major
    form, in the MN-major TMA-aligned layout (padding channels zero); into
    poisoned guarded buffers every scale and padding slot is written and
    nothing outside."""
    from cugemm8 import layout
    cp = _cp()
    rng = np.random.default_rng(21)
    x = make_data(rng, shape, dtype_name, 0, "wide")
    xd = cp.asarray(x)
    bits_r, sf_r = Q.per_token_cast_to_fp8_t(xd)
    bits_m, sf_m = Q.per_token_cast_to_fp8_t(xd, mn_major=True)
    assert_payload_equal(bits_m.get(), bits_r.get(), "payload")
    assert sf_m.shape == sf_r.shape and layout.is_tma_aligned_mn_major(sf_m), sf_m.strides
    assert_scales_equal(sf_m.get(), sf_r.get(), "scales")
    *lead, rows, cols = shape
    g, rb, cpad = (lead[0] if lead else 1), -(-rows // 128), layout.tma_aligned_size(cols)
    buf = cp.ndarray((g, rb, cpad), dtype=cp.float32, memptr=sf_m.data)
    assert not buf[..., cols:].get().any(), "padding channels must be zero"
    xk = Q._in_place_or_copy(Q._pad_k("x", xd, cp), cp)
    for poison in (0x7FC00001, 0x3F800000):
        sf, whole = _guarded((g, rb, cpad), np.float32, poison)
        b, _ = _guarded((g, cols, _pad16(rows)), np.uint8, 0x5A)
        Q._launch_cast_transpose(xk, b, sf, rows, cols, np.float32(1e-4), False, True, True)
        got = sf.get()
        assert_scales_equal(np.swapaxes(got[..., :cols], -1, -2).reshape(sf_r.shape), sf_r.get(), "scales")
        assert not got[..., cols:].any()
        _check_guards(whole, poison)
    with pytest.raises(TypeError, match="mn_major"):
        Q.per_token_cast_to_fp8_t(xd, mn_major=1)


def test_empty_inputs_and_validation():
    cp = _cp()
    for fn in (Q.per_token_cast_to_fp8_t, Q.cast_transpose_block_fp8):
        for shape in [(0, 128), (5, 0), (0, 3, 128), (2, 0, 16)]:
            *lead, r, c = shape
            b, s = fn(cp.zeros(shape, dtype=np.float32))
            assert b.shape == (*lead, c, _pad16(r)) and b.dtype == np.uint8
        with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
            fn(cp.zeros((4, 16), dtype=np.int32))
        with pytest.raises(ValueError, match="2-D"):
            fn(cp.zeros((16,), dtype=np.float32))
        with pytest.raises(TypeError, match="pow2_scale"):
            fn(cp.zeros((4, 16), dtype=np.float32), pow2_scale=1)
        with pytest.raises(ValueError, match="min_amax"):
            fn(cp.zeros((4, 16), dtype=np.float32), min_amax=-1.0)
    x = cp.asarray(np.ones((4, 16), dtype=ml_dtypes.bfloat16))
    b, s = Q.per_token_cast_to_fp8_t(x)
    assert b.shape == (16, 16)


def _config_cases():
    """(kind, dtype, config) of every built configuration of the transposing casts."""
    cases = []
    for kind in ("transpose_column", "transpose_block"):
        for dt in DTYPES:
            for cfg in Q.transpose_configs(kind, dt):
                cases.append(pytest.param(kind, dt, cfg, id=f"{kind}-{dt}-{cfg.label().replace(' ', '')}"))
    return cases


@pytest.mark.parametrize("kind,dtype_name,cfg", _config_cases())
@pytest.mark.parametrize("grid", ["balanced", "full", "tiles"])
def test_every_config_writes_exactly_its_outputs(kind, dtype_name, cfg, grid, monkeypatch):
    """Each built configuration (tools/perf/sweep_cast_t.py times them), on
    two SMs' worth of persistent CTAs (every ring slot reused many times, in
    both persistent grid forms) and as one CTA per tile: into poisoned
    guarded buffers, bit-identical to the
    reference, padding zero, nothing outside; partial tiles in both
    dimensions, batches, NaN / Inf columns and tiles, a NaN in the last
    partial 16-row chunk (its rows past R must stay zero bytes); both scale
    layouts of the per-column kind."""
    cp = _cp()
    monkeypatch.setattr(Q._device, "get_num_sms", lambda device_id=None: 2)
    per_column = kind == "transpose_column"
    cfg = cfg._replace(grid=grid)
    rng = np.random.default_rng(zlib.crc32(repr((kind, dtype_name, tuple(cfg))).encode()))
    for shape, pow2 in (((2, 300, 520), False), ((129, 257), True), ((1, 16), False)):
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 9, shape)
        flat = x.reshape(-1, shape[-2], shape[-1])
        if shape[-2] >= 300:
            flat[-1, 290, 5] = np.nan          # last row block, chunk rows 288..303 with 12 valid
            flat[0, 260, 9] = np.inf
            flat[0, 100, 130] = -np.inf
            flat[-1, :, 200] = np.nan          # a whole channel
        with np.errstate(over="ignore"):
            x = x.astype(DTYPES[dtype_name])
        *lead, rows, cols = shape
        g = lead[0] if lead else 1
        rb, cb = -(-rows // 128), -(-cols // 128)
        with np.errstate(all="ignore"):
            ref = R.per_token_cast_to_fp8_t if per_column else R.cast_transpose_block_fp8
            want_b, want_s = ref(x, pow2_scale=pow2)
        xd = Q._in_place_or_copy(Q._pad_k("x", cp.asarray(x), cp), cp)
        for mn_major in ((False, True) if per_column else (False,)):
            if mn_major:
                cpad = Q.tma_aligned_size(cols)
                sf_shape = (g, rb, cpad)
            else:
                sf_shape = (g, cols, rb) if per_column else (g, cb, rb)
            for poison_b, poison_s in ((0x5A, 0x7FC00001), (0xA5, 0x3F800000)):
                b, b_whole = _guarded((g, cols, _pad16(rows)), np.uint8, poison_b)
                sf, s_whole = _guarded(sf_shape, np.float32, poison_s)
                Q._launch_cast_transpose(xd, b, sf, rows, cols, np.float32(1e-4), pow2, per_column, mn_major,
                                         config=cfg)
                host = b.get()
                assert_payload_equal(host[..., :rows].reshape(want_b.shape), want_b, f"payload {shape}")
                assert not host[..., rows:].any(), f"{shape}: padding bytes must be zero"
                got_s = sf.get()
                if mn_major:
                    assert not got_s[..., cols:].any(), "padding channels must be zero"
                    got_s = np.swapaxes(got_s[..., :cols], -1, -2)
                assert_scales_equal(got_s.reshape(want_s.shape), want_s, f"scales {shape}")
                _check_guards(b_whole, poison_b)
                _check_guards(s_whole, poison_s)
