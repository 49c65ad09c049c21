"""GPU tests of the 1D1D GEMMs (FP32 out): ``cugemm8.fp8_gemm_nt`` and
``cugemm8.k_grouped_fp8_gemm_nt_contiguous`` (need a Hopper GPU; skipped
elsewhere).

Every test draws fresh random operands, poisons the output (NaN) inside a
buffer with guard elements before and after it, and checks the result:
bit for bit against the NumPy model of the promoted kernel
(:func:`cugemm8.reference.training.promoted_accumulation_model_1d1d` with
the H200's measured tensor-core rule) on small shapes, and within a
per-element error bound of the float64 product on the DeepSeek-V3 sizes;
``c`` accumulation bit-identical to ``fl32(c + D)``, in place and not;
forced configurations bit-identical to each other (each element's
promotion runs the same blocks in the same order whatever the tile); empty
k-groups equal to ``c`` (or zero) bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

import cugemm8
from cugemm8 import _config_1d1d, gemm_1d1d as G
from cugemm8.reference import training as RT
from tests import gpu_helpers as H

pytestmark = pytest.mark.gpu

POISON = np.float32(np.nan)
GUARD = 64


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def operands(cp, rng, m, n, k, *, spread=3):
    kb = -(-k // 128)
    return (H.random_fp8(cp, rng, (m, k)), H.random_scales(cp, rng, (m, kb), spread=spread),
            H.random_fp8(cp, rng, (n, k)), H.random_scales(cp, rng, (n, kb), spread=spread))


def poisoned(cp, shape):
    """A C-contiguous float32 view of ``shape`` inside a NaN buffer with GUARD
    elements before and after it."""
    size = int(np.prod(shape))
    full = cp.full(size + 2 * GUARD, POISON, cp.float32)
    return full[GUARD:GUARD + size].reshape(shape), full


def guards_intact(cp, full):
    return bool(cp.isnan(full[:GUARD]).all()) and bool(cp.isnan(full[-GUARD:]).all())


def ref_and_bound(cp, a, sfa, b, sfb, c=None):
    """The float64 product of the dequantised operands (plus c) and a bound
    on |kernel - ref| (the 1D2D helper's tensor-core and FP32 terms, no
    BF16 rounding; one more FP32 rounding with c)."""
    k = a.shape[1]
    da, db = H.dequant_lhs(cp, a, sfa), H.dequant_lhs(cp, b, sfb)
    ref = da @ db.T
    kb = -(-k // 128)
    s = cp.abs(da) @ cp.abs(db).T
    q = (da * da) @ (db * db).T
    bound = 33 * 2.0 ** -13 * np.sqrt(max(1, -(-k // 32))) * cp.sqrt(q) + kb * 2.0 ** -23 * s + 2.0 ** -140
    if c is not None:
        ref = ref + c.astype(cp.float64)
        bound = bound + 2.0 ** -23 * (cp.abs(ref) + bound)
    return ref, bound


def check(cp, d, ref, bound, what):
    got = d.astype(cp.float64)
    err = cp.abs(got - ref)
    bad = ~(err <= bound)
    if bool(bad.any()):
        idx = np.unravel_index(int(cp.argmax(cp.where(bad, err / (bound + 1e-300), 0))), ref.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} elements outside the bound; worst at {idx}: "
                             f"got {float(got[idx])!r}, ref {float(ref[idx])!r}, bound {float(bound[idx])!r}")
    assert H.calc_diff(cp, got, ref) < 1e-6, what


def run(cp, a, sfa, b, sfb, c=None, *, in_place=False):
    m, n = a.shape[0], b.shape[0]
    d, full = poisoned(cp, (m, n))
    if in_place:
        d[...] = c
        cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d)
    else:
        cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)
    assert guards_intact(cp, full), "a guard element was written"
    return d


# ------------------------------------------------------------------ normal

@pytest.mark.parametrize("m,n,k", [(1, 8, 128), (64, 128, 256), (130, 136, 384), (200, 264, 1040), (37, 520, 16)])
@pytest.mark.parametrize("with_c", ["none", "copy", "in_place"])
def test_bit_exact_against_the_promotion_model(cp, m, n, k, with_c):
    """``none`` and ``in_place`` take the TMA epilogue (a store; a reduce-add
    into d), ``copy`` (c another array) the register epilogue."""
    rng = np.random.default_rng(m * 31 + n + k + len(with_c))
    a, sfa, b, sfb = operands(cp, rng, m, n, k)
    c = cp.asarray(rng.standard_normal((m, n)).astype(np.float32)) if with_c != "none" else None
    d = run(cp, a, sfa, b, sfb, c, in_place=with_c == "in_place")
    want = RT.promoted_accumulation_model_1d1d(cp.asnumpy(a), cp.asnumpy(sfa), cp.asnumpy(b), cp.asnumpy(sfb),
                                               None if c is None else cp.asnumpy(c), tensor_core="hopper")
    got = cp.asnumpy(d)
    mism = got.view(np.uint32) != want.view(np.uint32)
    assert not mism.any(), (f"{int(mism.sum())} of {mism.size} elements differ from the model; first at "
                            f"{np.argwhere(mism)[0]}: {got[mism][0]!r} vs {want[mism][0]!r}")
    # and the exact bound of the reference holds
    ref = RT.ref_gemm_1d1d(cp.asnumpy(a), cp.asnumpy(sfa), cp.asnumpy(b), cp.asnumpy(sfb),
                           None if c is None else cp.asnumpy(c))
    bound = RT.error_bound_1d1d(cp.asnumpy(a), cp.asnumpy(sfa), cp.asnumpy(b), cp.asnumpy(sfb),
                                None if c is None else cp.asnumpy(c))
    assert np.all(np.abs(got.astype(np.float64) - ref) <= bound)


# wgrad shapes (m = output features, n = input features, k = tokens) of
# DeepSeek-V3's linear layers (DeepGEMM tests/generators.py backward rows).
WGRAD = [(2112, 7168, 4096), (7168, 2048, 4096), (4096, 7168, 2048), (576, 7168, 1024), (24576, 1536, 1024)]


@pytest.mark.parametrize("m,n,k", WGRAD)
def test_wgrad_shapes(cp, m, n, k):
    rng = np.random.default_rng(m + n + k)
    a, sfa, b, sfb = operands(cp, rng, m, n, k)
    c = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    d0 = run(cp, a, sfa, b, sfb)
    ref, bound = ref_and_bound(cp, a, sfa, b, sfb)
    check(cp, d0, ref, bound, f"{m}x{n}x{k}")
    # c accumulation: bit-identical to fl32(c + D), in place and not
    want = (c.astype(cp.float64) + d0.astype(cp.float64)).astype(cp.float32)
    for in_place in (False, True):
        d1 = run(cp, a, sfa, b, sfb, c, in_place=in_place)
        assert bool(cp.all(d1.view(cp.uint32) == want.view(cp.uint32))), f"c, in_place={in_place}"
    del ref, bound


# (BLOCK_M, BLOCK_N, stages, TMA epilogue)
FORCED = [(128, 64, 8, False), (128, 128, 6, False), (128, 160, 6, False), (128, 136, 5, False),
          (256, 128, 4, False), (256, 96, 4, False), (256, 56, 5, False), (128, 8, 12, False),
          (128, 64, 7, True), (128, 96, 6, True), (128, 128, 5, True), (128, 160, 5, True), (256, 128, 3, True),
          (128, 32, 3, True)]


@pytest.mark.parametrize("num_sms", [132, 5])
def test_forced_configs_bit_identical(cp, num_sms):
    """Tails in M, N and K (333 x 1000 x 1040); 5 SMs run many tiles per CTA
    (and, with the TMA epilogue, reuse its staging buffers across tiles).
    Each configuration also accumulates into c = d (the TMA forms by a
    reduce-add), bit-identical to fl32(c + D)."""
    m, n, k = 333, 1000, 1040
    rng = np.random.default_rng(num_sms)
    a, sfa, b, sfb = operands(cp, rng, m, n, k)
    c = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    ref, bound = ref_and_bound(cp, a, sfa, b, sfb)
    first = None
    for bm, bn, st, tma in FORCED:
        cfg = _config_1d1d.make_config(bm, bn, st, num_sms, tma)
        assert _config_1d1d.is_legal(cfg)[0], cfg
        with G._forced_config(cfg):
            d = run(cp, a, sfa, b, sfb)
            d_c = run(cp, a, sfa, b, sfb, c, in_place=True)
        check(cp, d, ref, bound, str(cfg))
        if first is None:
            first = d
            want = (c.astype(cp.float64) + first.astype(cp.float64)).astype(cp.float32)
        assert bool(cp.all(d.view(cp.uint32) == first.view(cp.uint32))), f"{cfg} differs from {FORCED[0]}"
        assert bool(cp.all(d_c.view(cp.uint32) == want.view(cp.uint32))), f"{cfg}: c = d differs from fl32(c + D)"


@pytest.mark.parametrize("kb", [1, 2, 3, 7, 8, 9, 10, 11, 16, 19])
def test_k_loop_forms_bit_identical_at_every_chunk_remainder(cp, kb):
    """The K loop's three forms (fp8_gemm_1d1d.cuh) on the same operands:
    WGMMAs pipelined across K blocks in chunks of 8, then 2, then 1
    (BLOCK_N <= 128), one block at a time (128 x 160), and two sub-tiles
    per warpgroup (256 x 128).  Every K-block count from 1 to 19 leaves a different remainder
    after the chunks; the outputs are bit for bit the same and within the
    reference's bound, also accumulating in place, on 5 SMs (many tiles per
    CTA, so the ring's stages cross tiles)."""
    m, n, k = 200, 296, kb * 128 - 48       # a K tail in the last block
    rng = np.random.default_rng(kb)
    a, sfa, b, sfb = operands(cp, rng, m, n, k)
    c = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    ref, bound = ref_and_bound(cp, a, sfa, b, sfb)
    outs = {}
    for bm, bn, st, tma in ((128, 128, 5, True), (128, 96, 6, False), (128, 160, 5, True), (256, 128, 3, True)):
        cfg = _config_1d1d.make_config(bm, bn, st, 5, tma)
        with G._forced_config(cfg):
            outs[str(cfg)] = (run(cp, a, sfa, b, sfb), run(cp, a, sfa, b, sfb, c, in_place=True))
    first_d, first_c = next(iter(outs.values()))
    check(cp, first_d, ref, bound, f"kb={kb}")
    want = (c.astype(cp.float64) + first_d.astype(cp.float64)).astype(cp.float32)
    for name, (d, d_c) in outs.items():
        assert bool(cp.all(d.view(cp.uint32) == first_d.view(cp.uint32))), f"{name} differs (kb={kb})"
        assert bool(cp.all(d_c.view(cp.uint32) == want.view(cp.uint32))), f"{name}: c = d (kb={kb})"


def test_tma_epilogue_needs_c_to_be_d(cp):
    """A forced TMA configuration with c another array is refused before the
    launch (the reduce-add adds into d); the heuristic takes the register
    epilogue there, and for a d that is 8- but not 16-byte aligned."""
    rng = np.random.default_rng(11)
    m, n, k = 64, 128, 256
    a, sfa, b, sfb = operands(cp, rng, m, n, k)
    c = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    d = cp.full((m, n), np.nan, cp.float32)
    with G._forced_config(_config_1d1d.make_config(128, 128, 5, 132, True)):
        with pytest.raises(ValueError, match="TMA"):
            cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)
    assert bool(cp.isnan(d).all()), "the refused call wrote d"
    assert not G.get_gemm_1d1d_config(m, n, k, with_c=True, tma_store=False).tma_store
    full = cp.full(m * n + 2 * GUARD + 2, np.nan, cp.float32)
    odd = full[GUARD + 2:GUARD + 2 + m * n].reshape(m, n)         # 8 mod 16 bytes
    assert odd.data.ptr % 16 == 8 and not G._tma_store_allowed(odd, None)
    cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), odd)
    aligned = run(cp, a, sfa, b, sfb)
    assert bool(cp.all(odd.view(cp.uint32) == aligned.view(cp.uint32)))
    assert bool(cp.isnan(full[:GUARD + 2]).all()) and bool(cp.isnan(full[GUARD + 2 + m * n:]).all())


def test_in_place_reduce_add_keeps_subnormals_and_specials(cp):
    """The TMA reduce-add (c = d) against the register epilogue's add.rn (c
    another array) and NumPy's fl32(c + D): D mostly FP32 subnormals (B
    scales 2^-149), subnormal and zero c of both signs, +-Inf, NaN, and an
    exact cancellation."""
    m, n, k = 130, 256, 1024
    rng = np.random.default_rng(12)
    a = H.random_fp8(cp, rng, (m, k))
    b = H.random_fp8(cp, rng, (n, k))
    sfa = cp.ones((m, k // 128), cp.float32)
    sfb = cp.asarray(np.full((n, k // 128), 2.0 ** -149, np.float32))
    d0 = run(cp, a, sfa, b, sfb)
    tiny = cp.asnumpy(d0)
    assert np.any((tiny != 0) & (np.abs(tiny) < 2.0 ** -126)), "the case must produce subnormal D"
    c_host = (rng.standard_normal((m, n)) * 2.0 ** -128).astype(np.float32)   # mostly subnormal
    c_host[0, :6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, np.float32(2.0 ** -149)]
    c_host[1, :] = -tiny[1, :]                                                # exact cancellation: +0
    c = cp.asarray(c_host)
    in_place = run(cp, a, sfa, b, sfb, c, in_place=True)
    copy = run(cp, a, sfa, b, sfb, c)
    want = (c_host.astype(np.float64) + tiny.astype(np.float64)).astype(np.float32)
    for name, got in (("reduce-add", cp.asnumpy(in_place)), ("register add", cp.asnumpy(copy))):
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), name
        same = got.view(np.uint32)[~nan] == want.view(np.uint32)[~nan]
        assert same.all(), (f"{name}: {int((~same).sum())} elements differ from fl32(c + D), e.g. "
                            f"{got[~nan][~same][:3]!r} vs {want[~nan][~same][:3]!r}")


def test_all_positive_long_k_is_promoted(cp):
    """All-positive K = 16384: without promotion every 128 K the tensor core's
    ~14-bit accumulator would lose far more than the bound allows."""
    m, n, k = 256, 256, 16384
    rng = np.random.default_rng(5)
    a = cp.asarray(rng.integers(0x30, 0x50, (m, k), dtype=np.uint8))      # positive e4m3 codes
    b = cp.asarray(rng.integers(0x30, 0x50, (n, k), dtype=np.uint8))
    sfa = H.random_scales(cp, rng, (m, k // 128), spread=1)
    sfb = H.random_scales(cp, rng, (n, k // 128), spread=1)
    d = run(cp, a, sfa, b, sfb)
    ref, bound = ref_and_bound(cp, a, sfa, b, sfb)
    check(cp, d, ref, bound, "all positive K = 16384")
    rel = float(cp.max(cp.abs(d.astype(cp.float64) - ref) / ref))
    # Four k32 steps per block truncate toward zero on a 2^-13 grid of the
    # step's largest product: about 2^-10 relative at worst with these
    # codes; unpromoted (16384 K inside the tensor core) it would be ~2^-3.
    assert rel < 2e-3, rel


def test_subnormal_scale_products_kept(cp):
    """SFA = 1, SFB = 2^-140, A = B = 1: each block adds 128 * 2^-140, an FP32
    subnormal; 8 blocks give 2^-130 exactly (no flush to zero)."""
    m, n, k = 130, 256, 1024
    a = cp.full((m, k), 0x38, cp.uint8)
    b = cp.full((n, k), 0x38, cp.uint8)
    sfa = cp.ones((m, k // 128), cp.float32)
    sfb = cp.asarray(np.full((n, k // 128), 2.0 ** -140, np.float32))
    d = run(cp, a, sfa, b, sfb)
    got = cp.asnumpy(d)
    assert np.all(got == np.float32(2.0 ** -130)), np.unique(got)[:4]


def test_nan_rows_and_columns_stay_in_place(cp):
    m, n, k = 200, 264, 512
    rng = np.random.default_rng(7)
    a, sfa, b, sfb = operands(cp, rng, m, n, k)
    a[17, 300] = 0x7F            # NaN in row 17 of A
    b[250, 3] = 0xFF             # NaN in row 250 of B (column 250 of D)
    d = cp.asnumpy(run(cp, a, sfa, b, sfb))
    nan = np.isnan(d)
    want = np.zeros_like(nan)
    want[17, :] = True
    want[:, 250] = True
    assert np.array_equal(nan, want)


def test_k_zero_and_empty(cp):
    a = cp.zeros((5, 0), cp.uint8)
    b = cp.zeros((16, 0), cp.uint8)
    sf = cp.zeros((5, 0), cp.float32), cp.zeros((16, 0), cp.float32)
    d, full = poisoned(cp, (5, 16))
    cugemm8.fp8_gemm_nt((a, sf[0]), (b, sf[1]), d)
    assert bool(cp.all(d == 0)) and guards_intact(cp, full)
    c = cp.asarray(np.full((5, 16), -0.0, np.float32))
    cugemm8.fp8_gemm_nt((a, sf[0]), (b, sf[1]), d, c=c)
    assert bool(cp.all(d.view(cp.uint32) == c.view(cp.uint32)))


def test_bf16_d_runs_the_1d2d_gemm(cp):
    rng = np.random.default_rng(3)
    m, n, k = 64, 256, 512
    a, sfa, b, _ = operands(cp, rng, m, n, k)
    sfb = H.random_scales(cp, rng, (2, 4))
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    ref = cp.empty((m, n), cp.dtype("bfloat16"))
    cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), out)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), ref)
    assert bool(cp.all(out.view(cp.uint16) == ref.view(cp.uint16)))


def test_quantised_wgrad_end_to_end(cp):
    """dW = dY^T X through the GPU quantisers: per_token_cast_to_fp8_t of
    both (1x128 along the tokens) into the 1D1D GEMM, against float64."""
    tokens, n_out, n_in = 1000, 576, 1024
    rng = np.random.default_rng(11)
    dy = cp.asarray(rng.standard_normal((tokens, n_out)).astype(np.float32)).astype(cp.dtype("bfloat16"))
    x = cp.asarray(rng.standard_normal((tokens, n_in)).astype(np.float32)).astype(cp.dtype("bfloat16"))
    a, sfa = cugemm8.per_token_cast_to_fp8_t(dy)
    b, sfb = cugemm8.per_token_cast_to_fp8_t(x)
    # a [n_out, tokens_pad], sfa [n_out, ceil(tokens/128)]: the op's K is tokens_pad
    # (ceil(tokens/16)*16, the padding zero), whose 128-blocks the scales cover.
    d, full = poisoned(cp, (n_out, n_in))
    cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d)
    assert guards_intact(cp, full)
    want = dy.astype(cp.float64).T @ x.astype(cp.float64)
    rel = float(cp.linalg.norm(d.astype(cp.float64) - want) / cp.linalg.norm(want))
    assert rel < 0.05, rel          # FP8 (e4m3) quantisation error of both operands


def test_quantised_wgrad_with_mn_major_scales_captures_and_matches(cp):
    """per_token_cast_to_fp8_t(..., mn_major=True) hands the 1D1D GEMM scales
    it reads as they are: no conversion, so the GEMM is capturable in a CUDA
    graph on them, and the output has the bits of the row-major path (which
    converts inside the call)."""
    from tests.test_reliability_gpu import Capture
    tokens, n_out, n_in = 640, 520, 1040
    rng = np.random.default_rng(12)
    dy = cp.asarray(rng.standard_normal((tokens, n_out)).astype(np.float32)).astype(cp.dtype("bfloat16"))
    x = cp.asarray(rng.standard_normal((tokens, n_in)).astype(np.float32)).astype(cp.dtype("bfloat16"))
    a, sfa = cugemm8.per_token_cast_to_fp8_t(dy, mn_major=True)
    b, sfb = cugemm8.per_token_cast_to_fp8_t(x, mn_major=True)
    assert cugemm8.get_col_major_tma_aligned_tensor(sfa) is sfa
    assert cugemm8.get_col_major_tma_aligned_tensor(sfb) is sfb
    want, _ = poisoned(cp, (n_out, n_in))
    a_r, sfa_r = cugemm8.per_token_cast_to_fp8_t(dy)
    b_r, sfb_r = cugemm8.per_token_cast_to_fp8_t(x)
    cugemm8.fp8_gemm_nt((a_r, sfa_r), (b_r, sfb_r), want)
    d, full = poisoned(cp, (n_out, n_in))
    cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d)          # compiles outside the capture
    d.view(cp.uint32)[...] = 0x7FC00001
    with Capture(cp) as c:
        cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), d)
    c.replay()
    assert bool(cp.all(d.view(cp.uint32) == want.view(cp.uint32)))
    assert guards_intact(cp, full)


def test_wgrad_step_captured_with_its_quantisers(cp):
    """A training step's wgrad as one CUDA graph: both transposing casts
    (mn_major=True) and the accumulating 1D1D GEMM, replayed on new
    contents of dy, x and the accumulator, with the bits of the same step
    run eagerly; row-major scales are refused under capture with the fix
    named."""
    from tests.test_reliability_gpu import Capture
    # Channel counts multiples of 16: the casts' K (here the channels) then
    # needs no zero-padding temporary, which capture refuses (its first run
    # on the H200 used 264 and met that refusal).
    tokens, n_out, n_in = 384, 272, 528
    rng = np.random.default_rng(13)
    bf16 = cp.dtype("bfloat16")

    def rand(shape, dtype=bf16):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    dy, x = rand((tokens, n_out)), rand((tokens, n_in))
    acc = cp.zeros((n_out, n_in), cp.float32)

    def step():
        a, sfa = cugemm8.per_token_cast_to_fp8_t(dy, mn_major=True)
        b, sfb = cugemm8.per_token_cast_to_fp8_t(x, mn_major=True)
        cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), acc, c=acc)
        return a, sfa, b, sfb
    step()                                          # compiles outside the capture
    with pytest.raises(ValueError, match="mn_major=True"):
        with Capture(cp):
            a, sfa = cugemm8.per_token_cast_to_fp8_t(dy)
            b, sfb = cugemm8.per_token_cast_to_fp8_t(x)
            cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), acc, c=acc)
    with Capture(cp) as c:
        keep = step()                               # the graph's operands: alive as long as it is
    for _ in range(2):
        dy[...] = rand(dy.shape)
        x[...] = rand(x.shape)
        start = rand(acc.shape, cp.float32)
        acc[...] = start
        cp.cuda.Device().synchronize()
        c.replay()
        got = acc.copy()
        acc[...] = start
        step()
        assert bool(cp.all(got.view(cp.uint32) == acc.view(cp.uint32)))
    assert len(keep) == 4


# ------------------------------------------------------------------ k-grouped

def grouped_case(cp, rng, g, m, n, k_mean, *, empty=()):
    ks = [int(round(k_mean * f / 128)) * 128 for f in rng.uniform(0.7, 1.3, g)]
    for e in empty:
        ks[e] = 0
    kt = sum(ks)
    a, sfa, b, sfb = operands(cp, rng, m, n, kt)
    return ks, a, sfa, b, sfb


def run_grouped(cp, ks, a, sfa, b, sfb, c=None, *, ks_tensor=True, in_place=False):
    g, m, n = len(ks), a.shape[0], b.shape[0]
    d, full = poisoned(cp, (g, m, n))
    kt = cp.asarray(np.asarray(ks, np.int32)) if ks_tensor else None
    if in_place:
        d[...] = c
        cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, kt, c=d)
    else:
        cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, kt, c=c)
    assert guards_intact(cp, full)
    return d


# DeepGEMM's enumerate_k_grouped_contiguous sizes (g, m, n, k per group),
# and smaller ones with empty groups.
K_GROUPED = [(4, 4096, 7168, 2048), (8, 7168, 2048, 1024), (16, 2048, 1024, 512), (3, 333, 1000, 640)]


@pytest.mark.parametrize("g,m,n,k", K_GROUPED)
def test_k_grouped_equals_per_group_gemms(cp, g, m, n, k):
    rng = np.random.default_rng(g * m + n + k)
    ks, a, sfa, b, sfb = grouped_case(cp, rng, g, m, n, k, empty=(1,))
    c = cp.asarray(rng.standard_normal((g, m, n)).astype(np.float32))
    c[1, 0, :4] = cp.asarray(np.array([-0.0, np.inf, -np.inf, np.nan], np.float32))
    d_noc = run_grouped(cp, ks, a, sfa, b, sfb)
    d_c = run_grouped(cp, ks, a, sfa, b, sfb, c)
    d_in = run_grouped(cp, ks, a, sfa, b, sfb, c, in_place=True)
    off = 0
    for e, ke in enumerate(ks):
        if ke == 0:
            assert bool(cp.all(d_noc[e].view(cp.uint32) == 0)), f"empty group {e} without c"
            assert bool(cp.all(d_c[e].view(cp.uint32) == c[e].view(cp.uint32))), f"empty group {e} != c"
        else:
            sl = slice(off, off + ke)
            kb = slice(off // 128, (off + ke) // 128)
            one, _ = poisoned(cp, (m, n))
            cugemm8.fp8_gemm_nt((a[:, sl], sfa[:, kb]), (b[:, sl], sfb[:, kb]), one)
            assert bool(cp.all(d_noc[e].view(cp.uint32) == one.view(cp.uint32))), f"group {e}"
            if e < 3:
                ref, bound = ref_and_bound(cp, a[:, sl], sfa[:, kb], b[:, sl], sfb[:, kb])
                check(cp, d_noc[e], ref, bound, f"group {e}")
            want = (c[e].astype(cp.float64) + one.astype(cp.float64)).astype(cp.float32)
            assert bool(cp.all(d_c[e].view(cp.uint32) == want.view(cp.uint32))), f"group {e} with c"
        off += ke
    assert bool(cp.all(d_in.view(cp.uint32) == d_c.view(cp.uint32))), "in place differs"


def test_k_grouped_all_empty_and_small(cp):
    rng = np.random.default_rng(2)
    ks = [0, 0, 128, 0]
    a, sfa, b, sfb = operands(cp, rng, 100, 264, 128)
    d = run_grouped(cp, ks, a, sfa, b, sfb)
    one, _ = poisoned(cp, (100, 264))
    cugemm8.fp8_gemm_nt((a, sfa), (b, sfb), one)
    assert bool(cp.all(d[2].view(cp.uint32) == one.view(cp.uint32)))
    assert bool(cp.all(d[[0, 1, 3]] == 0))


def test_k_grouped_graph_capture(cp):
    """Captured with ks_tensor, replayed with new operand contents; without
    ks_tensor the call is refused under capture (it would copy ks into a
    temporary the graph keeps using)."""
    rng = np.random.default_rng(4)
    ks, a, sfa, b, sfb = grouped_case(cp, rng, 4, 256, 512, 512, empty=(2,))
    sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    sfb = cugemm8.get_col_major_tma_aligned_tensor(sfb)
    kt = cp.asarray(np.asarray(ks, np.int32))
    d = cp.zeros((4, 256, 512), cp.float32)
    c = cp.asarray(rng.standard_normal((4, 256, 512)).astype(np.float32))
    cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, kt, c=c)   # compile, warm
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="ks_tensor"):
                cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, None, c=c)
            cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, kt, c=c)
        finally:
            graph = stream.end_capture()
    a[...] = H.random_fp8(cp, rng, a.shape)
    d[...] = np.nan
    cp.cuda.Device().synchronize()      # the updates ran on the legacy stream
    graph.launch(stream)
    stream.synchronize()
    want = cp.empty_like(d)
    cugemm8.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), want, ks, kt, c=c)
    assert bool(cp.all(d.view(cp.uint32) == want.view(cp.uint32)))
