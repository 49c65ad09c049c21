"""GPU tests of programmatic dependent launch (``cugemm8.set_pdl``) and of the
fused quantise + GEMM path (``cugemm8.gemm_fp8(x, (b, sfb), out, workspace=)``).

The fused path must give the same bits as the two-launch path
(``per_token_cast_to_fp8`` then ``gemm_fp8_fp8_bf16_nt``), and every op must
give the same bits with PDL on as with it off, eagerly and inside CUDA-graph
capture and replay.  Outputs are poisoned first (NaN bits) inside buffers
with guard rows and columns (tests/gpu_helpers.py), and the guards are
checked untouched afterwards; a few shapes are also checked against the
float64 reference of the quantised operands within the promotion bound.

``set_pdl`` / ``get_pdl`` / ``gemm_fp8_workspace_bytes`` are only looked up
inside test bodies, so this module collects on any tree; an autouse fixture
turns PDL off before and after every test.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import cugemm8
from cugemm8.cli import DEEPSEEK_NK
from tests import gpu_helpers as H
from tests.test_reliability_gpu import Capture

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"bfloat16": BF16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
DECODE_MS = (1, 8, 32, 64, 128)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


def _set_pdl_if_present(enabled: bool) -> None:
    setter = getattr(cugemm8, "set_pdl", None)       # absent on a tree without PDL yet
    if setter is not None:
        setter(enabled)


@pytest.fixture(autouse=True)
def _pdl_off():
    """Every test starts and ends with PDL off, also when it fails."""
    _set_pdl_if_present(False)
    yield
    _set_pdl_if_present(False)


@contextlib.contextmanager
def pdl(enabled: bool):
    """``with pdl(True): ...`` runs the block with PDL on; always off afterwards."""
    cugemm8.set_pdl(enabled)
    try:
        yield
    finally:
        cugemm8.set_pdl(False)


@pytest.fixture(scope="module")
def weights(cp):
    """``weights(n, k)``: ``per_block_cast_to_fp8`` of fixed random bf16
    weights ``[n, k]`` (payload ``[n, k_pad]``), quantised once per module
    with PDL off.  Call it before turning PDL on."""
    cache = {}

    def get(n, k):
        if (n, k) not in cache:
            w = randn(cp, n * 7919 + k, (n, k))
            b, sfb = cugemm8.per_block_cast_to_fp8(w)
            assert b.shape == (n, -(-k // 16) * 16) and sfb.shape == (-(-n // 128), -(-b.shape[1] // 128))
            cache[(n, k)] = (b, sfb)
        return cache[(n, k)]

    yield get
    cache.clear()


# ---------------------------------------------------------------- helpers

def randn(cp, seed, shape, dtype=BF16, scale=1.0):
    """Standard normals (times ``scale``) drawn on the GPU, cast to ``dtype``."""
    x = cp.random.RandomState(int(seed) % 2 ** 31).standard_normal(shape, dtype=cp.float32)
    if scale != 1.0:
        x *= np.float32(scale)
    return x.astype(dtype)


def seed_of(rng) -> int:
    return int(rng.integers(0, 2 ** 31))


def assert_same_bits(cp, got, want, what=""):
    """Bit-exact equality of two arrays of one itemsize (NaN bits included);
    reports how many elements differ and the first one."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype.itemsize == want.dtype.itemsize, f"{what}: dtype {got.dtype} != {want.dtype}"
    if not got.size:
        return
    view = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32}[got.dtype.itemsize]
    g, w = got.view(view), want.view(view)
    bad = g != w
    if bool(bad.any()):
        idx = tuple(int(i) for i in cp.asnumpy(cp.argwhere(bad)[0]))
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements differ in bits; first at "
                             f"{idx}: got {int(g[idx]):#x}, want {int(w[idx]):#x}")


def assert_poisoned(cp, full, what=""):
    assert bool(cp.all(full.view(cp.uint16) == H.POISON_BITS)), f"{what}: the output was written"


def two_launch(cp, x, rhs, out):
    """The reference path of the fused GEMM: quantise x, then the GEMM."""
    lhs = cugemm8.per_token_cast_to_fp8(x)
    cugemm8.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    return lhs


def workspace(cp, m, k):
    nbytes = cugemm8.gemm_fp8_workspace_bytes(m, k)
    assert isinstance(nbytes, int) and nbytes >= 0, nbytes
    return cp.empty(max(nbytes, 1), dtype=cp.uint8)


def fused_vs_two_launch(cp, x, rhs, *, ws=None, what=""):
    """Run the fused path (into a poisoned, guarded out; also with out=None)
    and the two-launch path; assert the same bits and intact guards.
    Returns (fused out, (a, sfa) of the two-launch path)."""
    m, n = x.shape[0], rhs[0].shape[0]
    out1, full1 = H.poisoned_out(cp, m, n)
    out2, full2 = H.poisoned_out(cp, m, n)
    kw = {} if ws is None else {"workspace": ws}
    got = cugemm8.gemm_fp8(x, rhs, out1, **kw)
    assert got is out1, f"{what}: gemm_fp8 must return the out it was given"
    lhs = two_launch(cp, x, rhs, out2)
    assert_same_bits(cp, out1, out2, what=f"{what}: fused vs two-launch")
    assert H.guards_intact(cp, full1, m, n), f"{what}: the fused path wrote a guard row/column"
    assert H.guards_intact(cp, full2, m, n), f"{what}: the two-launch path wrote a guard row/column"
    fresh = cugemm8.gemm_fp8(x, rhs, **kw)
    assert fresh.shape == (m, n) and fresh.dtype == BF16
    assert_same_bits(cp, fresh, out2, what=f"{what}: fused (out=None) vs two-launch")
    return out1, lhs


# ---------------------------------------------------------------- 1. DeepSeek-V3 shapes

@pytest.mark.parametrize("n,k", DEEPSEEK_NK)
def test_fused_bit_identical_deepseek_shapes(cp, rng, weights, n, k):
    rhs = weights(n, k)
    for m in DECODE_MS:
        what = f"m={m} n={n} k={k}"
        x = randn(cp, seed_of(rng), (m, k))
        out, (a, sfa) = fused_vs_two_launch(cp, x, rhs, what=what)
        if (n, k) == (2112, 7168) and m in (8, 64):
            ref, bound = H.reference_and_bound(cp, a, sfa, *rhs)
            H.check_against(cp, out, ref, bound, what=what)


# ---------------------------------------------------------------- 2. awkward K

AWKWARD_K = (7184, 1040, 144, 1000, 200, 7)      # k % 128 != 0 (first three k % 16 == 0), then k % 16 != 0


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("k", AWKWARD_K)
def test_fused_bit_identical_awkward_k(cp, rng, weights, k, dtype_name):
    dt = DTYPES[dtype_name]
    kp = -(-k // 16) * 16
    for n in (24, 520):
        rhs = weights(n, k)
        assert rhs[0].shape == (n, kp)
        for m in (3, 130):
            what = f"m={m} n={n} k={k} {dtype_name}"
            x = randn(cp, seed_of(rng), (m, k), dt)
            out, (a, sfa) = fused_vs_two_launch(cp, x, rhs, what=what)
            assert a.shape == (m, kp)
            ref, bound = H.reference_and_bound(cp, a, sfa, *rhs)
            H.check_against(cp, out, ref, bound, what=what)
            # the same with a caller's workspace (eager: any k)
            fused_vs_two_launch(cp, x, rhs, ws=workspace(cp, m, k), what=what + " workspace")


# ---------------------------------------------------------------- 3. special values

NAN_ROW, ONE_NAN_ROW, POS_INF_ROW, NEG_INF_ROW, ZERO_ROW, MAX_ROW, HUGE_ROW, TINY_ROW = 1, 4, 6, 7, 9, 11, 12, 13
POISONED_ROWS = (NAN_ROW, ONE_NAN_ROW, POS_INF_ROW, NEG_INF_ROW)   # NaN in every output column
MAYBE_NONFINITE_ROWS = POISONED_ROWS + (MAX_ROW, HUGE_ROW)          # may overflow (Inf, or Inf - Inf)
SPECIAL_ROWS = MAYBE_NONFINITE_ROWS + (ZERO_ROW, TINY_ROW)


def special_rows(x_host, dtype):
    """Write the special rows into the host copy ``x_host`` [m, k] of dtype ``dtype``."""
    m, k = x_host.shape
    signs = np.where(np.arange(k) % 2, -1.0, 1.0)
    fmax = float(ml_dtypes.finfo(dtype).max)
    huge = 3e38 if dtype != np.float16 else 6e4
    tiny = {np.dtype(np.float16): 6e-8}.get(np.dtype(dtype), 1e-40)   # subnormal in each dtype
    x_host[NAN_ROW] = np.nan
    x_host[ONE_NAN_ROW, 300] = np.nan
    x_host[POS_INF_ROW, 5] = np.inf
    x_host[NEG_INF_ROW, k - 1] = -np.inf
    x_host[ZERO_ROW] = 0
    x_host[MAX_ROW] = signs * fmax
    x_host[HUGE_ROW] = -signs * huge
    x_host[TINY_ROW] = signs * tiny
    x_host[TINY_ROW, ::7] = signs[::7] * float(ml_dtypes.finfo(dtype).smallest_subnormal)
    t = x_host[TINY_ROW].astype(np.float64)
    assert np.all((t != 0) & (np.abs(t) < float(ml_dtypes.finfo(dtype).smallest_normal))), dtype
    return x_host


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_fused_special_values(cp, rng, weights, dtype_name):
    """NaN, Inf, zero, huge and subnormal rows: the fused path gives the
    two-launch path's bits (NaN bits too: the same kernels), NaN and Inf stay
    in their own rows, and every other row has the bits of a run on the same
    data without the special rows.  (Host-built: CuPy's own kernels flush
    subnormals.)"""
    dt = DTYPES[dtype_name]
    m, n, k = 32, 2112, 7168
    rhs = weights(n, k)
    clean = randn(cp, seed_of(rng), (m, k), dt)
    x = cp.asarray(special_rows(cp.asnumpy(clean).copy(), dt))
    special_out, _ = fused_vs_two_launch(cp, x, rhs, what=f"special {dtype_name}")
    clean_out, _ = fused_vs_two_launch(cp, clean, rhs, what=f"clean {dtype_name}")
    got = H.to_f64(cp, special_out)
    normal = np.setdiff1d(np.arange(m), SPECIAL_ROWS)
    assert_same_bits(cp, special_out[normal], clean_out[normal],
                     what=f"{dtype_name}: ordinary rows next to special rows")
    finite_rows = np.setdiff1d(np.arange(m), MAYBE_NONFINITE_ROWS)
    assert bool(cp.isfinite(got[finite_rows]).all()), f"{dtype_name}: NaN/Inf leaked out of its row"
    for r in POISONED_ROWS:
        assert bool(cp.isnan(got[r]).all()), f"{dtype_name}: row {r} holds NaN/Inf input, must be NaN"
    assert bool(cp.all(got[ZERO_ROW] == 0)), f"{dtype_name}: an all-zero row must give zeros"


# ---------------------------------------------------------------- 4. PDL on / off, eager

def _both_pdl(fn):
    """(fn() with PDL off, fn() with PDL on)."""
    with pdl(False):
        off = fn()
    with pdl(True):
        assert cugemm8.get_pdl() is True
        on = fn()
    return off, on


@pytest.mark.parametrize("shape", [(1, 7168), (333, 1040), (64, 1000), (3, 37, 2048)], ids=str)
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_pdl_quantisers_bit_identical(cp, rng, shape, dtype_name):
    x = randn(cp, seed_of(rng), shape, DTYPES[dtype_name], scale=3.0)
    for fn_name in ("per_token_cast_to_fp8", "per_block_cast_to_fp8"):
        fn = getattr(cugemm8, fn_name)
        (q0, s0), (q1, s1) = _both_pdl(lambda: fn(x))
        assert_same_bits(cp, q1, q0, what=f"{fn_name} {shape}: payload")
        assert s1.strides == s0.strides
        assert_same_bits(cp, s1, s0, what=f"{fn_name} {shape}: scales")


@pytest.mark.parametrize("m,n,k", [(1, 576, 7168), (64, 2112, 7168), (333, 1000, 1040), (256, 7168, 2048)])
def test_pdl_normal_gemm_bit_identical(cp, rng, m, n, k):
    a, sfa, b, sfb = H.make_operands(cp, rng, m, n, k)
    for what, lhs_sfa in (("row-major sfa", sfa), ("TMA sfa", cugemm8.get_col_major_tma_aligned_tensor(sfa))):
        def run():
            out, full = H.poisoned_out(cp, m, n)
            cugemm8.gemm_fp8_fp8_bf16_nt((a, lhs_sfa), (b, sfb), out)
            assert H.guards_intact(cp, full, m, n), f"{what}: guard written"
            return out
        off, on = _both_pdl(run)
        assert_same_bits(cp, on, off, what=f"m={m} n={n} k={k} {what}: PDL on vs off")
    ref, bound = H.reference_and_bound(cp, a, sfa, b, sfb)
    H.check_against(cp, on, ref, bound, what=f"m={m} n={n} k={k} PDL on")


def test_pdl_contiguous_grouped_bit_identical(cp, rng):
    sizes, n, k = [100, 300, 0, 77, 128], 1024, 2048
    g, kb, nb = len(sizes), k // 128, n // 128
    m_indices, _ = cugemm8.make_contiguous_layout(sizes)
    m = int(m_indices.size)
    a = H.random_fp8(cp, rng, (m, k))
    sfa = cugemm8.get_col_major_tma_aligned_tensor(H.random_scales(cp, rng, (m, kb)))
    b = H.random_fp8(cp, rng, (g, n, k))
    sfb = H.random_scales(cp, rng, (g, nb, kb))

    def run():
        out, full = H.poisoned_out(cp, m, n)
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, m_indices)
        assert H.guards_intact(cp, full, m, n)
        return out
    off, on = _both_pdl(run)
    assert_same_bits(cp, on, off, what="contiguous grouped: PDL on vs off")
    idx = cp.asnumpy(m_indices)
    assert not bool(cp.isnan(H.to_f64(cp, on)).any())
    for e in range(g):
        rows = np.nonzero(idx == e)[0]
        if rows.size:
            ref, bound = H.reference_and_bound(cp, a[rows], sfa[rows], b[e], sfb[e])
            H.check_against(cp, on[rows], ref, bound, what=f"contiguous PDL on, expert {e}")


def test_pdl_masked_grouped_bit_identical(cp, rng):
    g, m_max, n, k, expected_m = 4, 128, 1024, 2048, 64
    masked = [5, 128, 0, 77]
    a = H.random_fp8(cp, rng, (g, m_max, k))
    sfa = H.random_scales(cp, rng, (g, m_max, k // 128))            # row-major: converted per call
    b = H.random_fp8(cp, rng, (g, n, k))
    sfb = H.random_scales(cp, rng, (g, n // 128, k // 128))
    masked_m = cp.asarray(np.array(masked, np.int32))

    def run():
        out, _ = H.poisoned_out(cp, m_max, n, batch=g, guard_rows=0, guard_cols=0)
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m)
        return out
    off, on = _both_pdl(run)
    assert_same_bits(cp, on, off, what="masked grouped: PDL on vs off")
    bits = on.view(cp.uint16)
    for i, v in enumerate(masked):
        assert bool(cp.all(bits[i, v:] == H.POISON_BITS)), f"group {i}: rows >= masked_m were written"
        if v:
            ref, bound = H.reference_and_bound(cp, a[i, :v], sfa[i, :v], b[i], sfb[i])
            H.check_against(cp, on[i, :v], ref, bound, what=f"masked PDL on, group {i}")


@pytest.mark.parametrize("m,n,k", [(8, 2112, 7168), (130, 520, 1000), (64, 24, 7)])
def test_pdl_fused_bit_identical(cp, rng, weights, m, n, k):
    rhs = weights(n, k)
    x = randn(cp, seed_of(rng), (m, k))
    want = cp.empty((m, n), BF16)
    two_launch(cp, x, rhs, want)
    for use_ws in (False, True):
        ws = workspace(cp, m, k) if use_ws else None

        def run():
            out, _ = fused_vs_two_launch(cp, x, rhs, ws=ws, what=f"m={m} n={n} k={k} ws={use_ws} "
                                                             f"pdl={cugemm8.get_pdl()}")
            return out
        off, on = _both_pdl(run)
        assert_same_bits(cp, off, want, what=f"workspace={use_ws}: PDL off vs two-launch PDL off")
        assert_same_bits(cp, on, want, what=f"workspace={use_ws}: PDL on vs two-launch PDL off")


def chain_two_launch(cp, x, w1, w2, y=None, z=None):
    """x -> quantise -> GEMM w1 -> y -> quantise -> GEMM w2 -> z (fresh y, z when None)."""
    m = x.shape[0]
    y = cp.empty((m, w1[0].shape[0]), BF16) if y is None else y
    z = cp.empty((m, w2[0].shape[0]), BF16) if z is None else z
    two_launch(cp, x, w1, y)
    two_launch(cp, y, w2, z)
    return y, z


def chain_fused(cp, x, w1, w2, y, z, ws1, ws2):
    cugemm8.gemm_fp8(x, w1, y, workspace=ws1)
    cugemm8.gemm_fp8(y, w2, z, workspace=ws2)
    return y, z


def test_pdl_back_to_back_chains_without_sync(cp, rng, weights):
    """Several dependent chains queued with PDL on and no host sync between
    them, one y buffer reused by all (read-after-write and write-after-read
    across PDL launches), give the PDL-off bits."""
    w1, w2 = weights(4096, 7168), weights(7168, 4096)
    m = 64
    xs = [randn(cp, seed_of(rng), (m, 7168)) for _ in range(3)]
    want = [chain_two_launch(cp, x, w1, w2) for x in xs]
    with pdl(True):
        y = cp.empty((m, 4096), BF16)
        zs = [chain_two_launch(cp, x, w1, w2, y=y)[1] for x in xs]
        ws1, ws2 = workspace(cp, m, 7168), workspace(cp, m, 4096)
        zf = [chain_fused(cp, x, w1, w2, y, cp.empty((m, 7168), BF16), ws1, ws2)[1] for x in xs]
    cp.cuda.get_current_stream().synchronize()
    for i, (z, f, (_, zw)) in enumerate(zip(zs, zf, want)):
        assert_same_bits(cp, z, zw, what=f"chain {i}: two-launch PDL on vs off")
        assert_same_bits(cp, f, zw, what=f"chain {i}: fused PDL on vs two-launch PDL off")


# ---------------------------------------------------------------- 5. PDL in CUDA graphs

@pytest.mark.parametrize("m", [1, 8, 64])
def test_pdl_graph_two_launch_chain(cp, rng, weights, m):
    w1, w2 = weights(4096, 7168), weights(7168, 4096)
    x = cp.empty((m, 7168), BF16)                      # C-contiguous: read in place under capture
    x[...] = randn(cp, seed_of(rng), (m, 7168))
    y0, z0 = chain_two_launch(cp, x, w1, w2)           # compiles, PDL off
    with pdl(True):
        y1, z1 = chain_two_launch(cp, x, w1, w2)       # any PDL-only set-up happens outside capture
    assert_same_bits(cp, z1, z0, what=f"m={m}: eager PDL on vs off")
    y = cp.empty((m, 4096), BF16)
    z, zfull = H.poisoned_out(cp, m, 7168)
    with pdl(True):
        with Capture(cp) as c:
            keep = [cugemm8.per_token_cast_to_fp8(x)]
            cugemm8.gemm_fp8_fp8_bf16_nt(keep[0], w1, y)
            keep.append(cugemm8.per_token_cast_to_fp8(y))
            cugemm8.gemm_fp8_fp8_bf16_nt(keep[1], w2, z)
    assert cugemm8.get_pdl() is False
    assert_poisoned(cp, zfull, what="capture must not run the kernels")
    for replay in range(2):
        x_new = randn(cp, seed_of(rng), (m, 7168))
        x[...] = x_new
        z.view(cp.uint16)[...] = H.POISON_BITS
        cp.cuda.Device().synchronize()             # the updates ran on another stream
        c.replay()
        y_want, z_want = chain_two_launch(cp, x_new, w1, w2)
        assert_same_bits(cp, y, y_want, what=f"m={m} replay {replay}: y")
        assert_same_bits(cp, z, z_want, what=f"m={m} replay {replay}: z")
        assert H.guards_intact(cp, zfull, m, 7168)
    del keep


@pytest.mark.parametrize("shared_ws", [False, True], ids=["own-ws", "shared-ws"])
@pytest.mark.parametrize("pdl_on", [False, True], ids=["pdl-off", "pdl-on"])
@pytest.mark.parametrize("m", [1, 8, 64])
def test_pdl_graph_fused_chain(cp, rng, weights, m, pdl_on, shared_ws):
    """Two fused calls with workspaces captured (PDL on or off) replay to the
    bits of the eager PDL-off two-launch chain.  ``shared-ws``: both calls
    use one workspace (stream order must protect it, also under PDL)."""
    w1, w2 = weights(4096, 7168), weights(7168, 4096)
    x = cp.empty((m, 7168), BF16)
    x[...] = randn(cp, seed_of(rng), (m, 7168))
    if shared_ws:
        nbytes = max(cugemm8.gemm_fp8_workspace_bytes(m, 7168), cugemm8.gemm_fp8_workspace_bytes(m, 4096))
        ws1 = ws2 = cp.empty(max(nbytes, 1), dtype=cp.uint8)
    else:
        ws1, ws2 = workspace(cp, m, 7168), workspace(cp, m, 4096)
    y = cp.empty((m, 4096), BF16)
    z, zfull = H.poisoned_out(cp, m, 7168)
    _, z_want = chain_two_launch(cp, x, w1, w2)
    with pdl(pdl_on):
        chain_fused(cp, x, w1, w2, y, z, ws1, ws2)     # eager, compiles outside the capture
        assert_same_bits(cp, z, z_want, what=f"m={m}: eager fused chain")
        z.view(cp.uint16)[...] = H.POISON_BITS
        with Capture(cp) as c:
            chain_fused(cp, x, w1, w2, y, z, ws1, ws2)
    assert_poisoned(cp, zfull, what="capture must not run the kernels")
    for replay in range(2):
        x_new = randn(cp, seed_of(rng), (m, 7168))
        x[...] = x_new
        z.view(cp.uint16)[...] = H.POISON_BITS
        cp.cuda.Device().synchronize()
        c.replay()
        y_want, z_want = chain_two_launch(cp, x_new, w1, w2)
        assert_same_bits(cp, y, y_want, what=f"m={m} replay {replay}: y")
        assert_same_bits(cp, z, z_want, what=f"m={m} replay {replay}: z")
        assert H.guards_intact(cp, zfull, m, 7168)


# ---------------------------------------------------------------- 6. fused path under capture

def assert_replays_match_two_launch(cp, rng, c, x, rhs, out, full):
    """Replay the captured graph ``c`` twice, each time on new values in
    ``x`` [m, k] (the captured input) with ``out`` [m, n] poisoned first
    (``full``: its guarded buffer): the bits of the two-launch path on those
    values, guards intact."""
    (m, k), n = x.shape, out.shape[1]
    for replay in range(2):
        x_new = randn(cp, seed_of(rng), (m, k))
        x[...] = x_new
        out.view(cp.uint16)[...] = H.POISON_BITS
        cp.cuda.Device().synchronize()
        c.replay()
        want = cp.empty((m, n), BF16)
        two_launch(cp, x_new, rhs, want)
        assert_same_bits(cp, out, want, what=f"replay {replay}")
        assert H.guards_intact(cp, full, m, n)


@pytest.mark.parametrize("pdl_on", [False, True], ids=["pdl-off", "pdl-on"])
def test_fused_capture_needs_workspace(cp, rng, weights, pdl_on):
    """Under capture the fused call is refused without a workspace, with a k
    that needs padding, or with an x that is not readable in place (each
    refusal queues nothing and leaves the capture usable); with a workspace
    it captures and replays to the eager bits."""
    m, n, k = 64, 2112, 7168
    rhs = weights(n, k)
    rhs_odd = weights(n, 1000)
    x = cp.empty((m, k), BF16)
    x[...] = randn(cp, seed_of(rng), (m, k))
    x_odd = randn(cp, seed_of(rng), (m, 1000))
    x_strided = cp.empty((m, 2 * k), BF16)[:, ::2]
    x_strided[...] = x
    ws, ws_odd = workspace(cp, m, k), workspace(cp, m, 1000)
    out, full = H.poisoned_out(cp, m, n)
    with pdl(pdl_on):
        cugemm8.gemm_fp8(x, rhs, out, workspace=ws)                   # eager: compiles
        cugemm8.gemm_fp8(x_odd, rhs_odd, out, workspace=ws_odd)
        cugemm8.gemm_fp8(x_strided, rhs, out, workspace=ws)
        out.view(cp.uint16)[...] = H.POISON_BITS
        with Capture(cp) as c:
            with pytest.raises(ValueError):
                cugemm8.gemm_fp8(x, rhs, out)
            with pytest.raises(ValueError):
                cugemm8.gemm_fp8(x_odd, rhs_odd, out, workspace=ws_odd)
            with pytest.raises(ValueError):
                cugemm8.gemm_fp8(x_strided, rhs, out, workspace=ws)
            assert c.stream.is_capturing(), "a refused call ended or broke the capture"
            cugemm8.gemm_fp8(x, rhs, out, workspace=ws)
    assert c.graph is not None and not c.stream.is_capturing()
    assert_poisoned(cp, full, what="capture must not run the kernels")
    assert_replays_match_two_launch(cp, rng, c, x, rhs, out, full)


# ---------------------------------------------------------------- 7. workspace validation

def test_workspace_validation(cp, rng, weights):
    m, n, k = 64, 2112, 7168
    rhs = weights(n, k)
    x = randn(cp, seed_of(rng), (m, k))
    need = cugemm8.gemm_fp8_workspace_bytes(m, k)
    assert isinstance(need, int) and need > 0
    assert cugemm8.gemm_fp8_workspace_bytes(2 * m, k) >= need
    bad = {
        "too small": cp.empty(need - 1, cp.uint8),
        "float32": cp.empty(-(-need // 4) + 16, cp.float32),
        "2-D": cp.empty((2, need), cp.uint8),
        "non-contiguous": cp.empty(2 * need, cp.uint8)[::2],
    }
    if cp.cuda.runtime.getDeviceCount() > 1:
        other = (cp.cuda.runtime.getDevice() + 1) % cp.cuda.runtime.getDeviceCount()
        with cp.cuda.Device(other):
            bad["other device"] = cp.empty(need, cp.uint8)
    # Also refused (the implementation's docstring): a base that is not 16-byte
    # aligned, and a workspace overlapping an operand (here x's own bytes).
    bad["misaligned"] = cp.empty(need + 32, cp.uint8)[1:need + 1]
    bad["overlapping x"] = x.reshape(-1).view(cp.uint8)
    assert bad["overlapping x"].size >= need
    x_before = x.copy()
    out, full = H.poisoned_out(cp, m, n)
    for what, ws in bad.items():
        with pytest.raises((ValueError, TypeError), match="workspace"):
            cugemm8.gemm_fp8(x, rhs, out, workspace=ws)
        cp.cuda.Device().synchronize()
        assert_poisoned(cp, full, what=f"workspace {what}: rejected call launched")
        assert_same_bits(cp, x, x_before, what=f"workspace {what}: x changed")
    # a workspace outside the fused path (both operands quantised) is refused too
    lhs = cugemm8.per_token_cast_to_fp8(x)
    with pytest.raises(ValueError, match="workspace"):
        cugemm8.gemm_fp8(lhs, rhs, out, workspace=cp.empty(need, cp.uint8))
    cp.cuda.Device().synchronize()
    assert_poisoned(cp, full, what="workspace on the quantised path: rejected call launched")
    for args, exc in (((1.5, k), TypeError), ((m, True), TypeError), ((-1, k), ValueError)):
        with pytest.raises(exc):
            cugemm8.gemm_fp8_workspace_bytes(*args)
    # exactly the size asked for, and a C-contiguous prefix of a bigger buffer, work
    want = cp.empty((m, n), BF16)
    two_launch(cp, x, rhs, want)
    for what, ws in (("exact", cp.empty(need, cp.uint8)), ("prefix", cp.empty(need + 4096, cp.uint8)[:need])):
        cugemm8.gemm_fp8(x, rhs, out, workspace=ws)
        assert_same_bits(cp, out, want, what=f"workspace {what}")
        assert H.guards_intact(cp, full, m, n)


# ---------------------------------------------------------------- 8. set_pdl / get_pdl

def test_set_pdl_get_pdl():
    assert cugemm8.get_pdl() is False
    for value in (1, 0, "yes", None, 1.0):
        with pytest.raises(TypeError):
            cugemm8.set_pdl(value)
        assert cugemm8.get_pdl() is False
    cugemm8.set_pdl(True)
    try:
        assert cugemm8.get_pdl() is True
        with pytest.raises(TypeError):
            cugemm8.set_pdl(1)
        assert cugemm8.get_pdl() is True, "a refused set_pdl changed the setting"
    finally:
        cugemm8.set_pdl(False)
    assert cugemm8.get_pdl() is False


def test_pdl_is_off_in_a_fresh_process():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", "import cugemm8; print(repr(cugemm8.get_pdl()))"],
                         cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


# ---------------------------------------------------------------- 8. the one-kernel form

@contextlib.contextmanager
def one_kernel_up_to(rows: int):
    """gemm_fp8's fused path takes its one-kernel form up to ``rows`` rows
    (at most the kernel's own limit) whatever the pick's BLOCK_N, so that
    every pick is tested, also where the library's rule keeps two kernels;
    and the ops pick as under a reduced SM budget (the persistent kernels,
    which have that form: on the whole device the decode shapes take the
    warp-MMA kernel, which has none, tests/test_warp_mma_gpu.py).  The
    launch cache is cleared on the way in and out (its keys do not hold
    the form)."""
    from cugemm8 import _device, gemm, quant
    saved = quant.ONE_KERNEL_MAX_M, _device.is_whole_device
    quant.ONE_KERNEL_MAX_M = {2: ((8, rows),), 4: ((8, rows),)}
    _device.is_whole_device = lambda device_id: False
    gemm.clear_launch_cache()
    try:
        yield
    finally:
        quant.ONE_KERNEL_MAX_M, _device.is_whole_device = saved
        gemm.clear_launch_cache()


def assert_one_kernel(x, n, what=""):
    from cugemm8 import gemm, quant
    k = quant.padded_k(x.shape[1])
    assert quant._one_kernel_config(x, n, k, gemm) is not None, f"{what}: not the one-kernel form"


ONE_KERNEL_SHAPES = [(2112, 7168), (24576, 1536), (32768, 512), (4096, 7168), (7168, 2048),
                     (576, 7168), (520, 1000), (24, 144), (1000, 7184)]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("n,k", ONE_KERNEL_SHAPES, ids=str)
def test_one_kernel_form_bit_identical(cp, rng, weights, n, k, dtype_name):
    """The GEMM quantising x itself gives the bits of per_token_cast_to_fp8
    followed by the GEMM, at every row count up to the kernel's limit (8
    rows): the DeepSeek-V3 picks (split K across a pair at 2112 x 7168 and
    across four CTAs at 576 x 7168, 6-16 stages, one to two tiles per CTA), N tails, K tails (1000, 144: the x
    box past K zero-filled; 7184: an odd number of K blocks), into poisoned
    outputs with guards, out given and not."""
    dt = DTYPES[dtype_name]
    from cugemm8 import _config
    limit = _config.QUANT_A_MAX_ROWS
    rhs = weights(n, k)
    kp, ran = -(-k // 16) * 16, []
    with one_kernel_up_to(limit):
        for m in sorted({1, 2, 3, 4, 5, limit - 1, limit}):
            what = f"m={m} n={n} k={k} {dtype_name}"
            x = randn(cp, seed_of(rng), (m, k), dt, scale=2.0)
            if _config.quant_a_config(cugemm8.gemm._select("normal", m, n, kp, 1), kp, dt.itemsize) is None:
                continue                                     # this m's pick has no one-kernel form
            ran.append(m)
            assert_one_kernel(x, n, what)
            out, (a, sfa) = fused_vs_two_launch(cp, x, rhs, what=what)
            if m in (1, limit):
                ref, bound = H.reference_and_bound(cp, a, sfa, *rhs)
                H.check_against(cp, out, ref, bound, what=what)
    if not ran:
        pytest.skip(f"n={n} k={k}: no pick at these m has a one-kernel form")


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_one_kernel_form_special_values(cp, rng, weights, dtype_name):
    """NaN, Inf, zero, the dtype's max, subnormal and smallest-normal rows,
    and a row whose amax is below min_amax, quantised in the kernel: the
    two-launch path's bits, NaN / Inf kept in their rows."""
    dt = DTYPES[dtype_name]
    from cugemm8 import _config
    m, n, k = _config.QUANT_A_MAX_ROWS, 2112, 7168
    rhs = weights(n, k)
    host = cp.asnumpy(randn(cp, seed_of(rng), (m, k), dt)).copy()
    signs = np.where(np.arange(k) % 2, -1.0, 1.0)
    host[0] = np.nan
    host[2, 300] = np.nan
    host[3, 5] = np.inf
    host[4, k - 1] = -np.inf
    host[5] = 0
    host[6] = signs * float(ml_dtypes.finfo(dt).max)
    host[7] = signs * float(ml_dtypes.finfo(dt).smallest_subnormal)
    host[1] = signs * 5e-5                         # amax below min_amax (1e-4): the clamp decides the bytes
    host[1, ::3] = signs[::3] * float(ml_dtypes.finfo(dt).smallest_normal)
    x = cp.asarray(host)
    with one_kernel_up_to(m):
        assert_one_kernel(x, n)
        out, _ = fused_vs_two_launch(cp, x, rhs, what=f"special {dtype_name}")
    got = H.to_f64(cp, out)
    for r in (0, 2, 3, 4):
        assert bool(cp.isnan(got[r]).all()), f"{dtype_name}: row {r} holds NaN / Inf input, must be NaN"
    assert bool(cp.all(got[5] == 0)), f"{dtype_name}: an all-zero row must give zeros"
    rest = [r for r in range(m) if r not in (0, 2, 3, 4, 6)]
    assert bool(cp.isfinite(got[rest]).all()), f"{dtype_name}: NaN / Inf leaked out of its row"


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_one_kernel_form_pow2_scale(cp, rng, weights, dtype_name):
    m, n, k = 8, 7168, 2048
    rhs = weights(n, k)
    x = randn(cp, seed_of(rng), (m, k), DTYPES[dtype_name], scale=5.0)
    with one_kernel_up_to(8):            # (both paths with the same pick)
        assert_one_kernel(x, n)
        got, full = H.poisoned_out(cp, m, n)
        cugemm8.gemm_fp8(x, rhs, got, pow2_scale=True)
        want = cp.empty((m, n), BF16)
        cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(x, pow2_scale=True), rhs, want)
        assert_same_bits(cp, got, want, what=f"pow2_scale {dtype_name}")
        assert H.guards_intact(cp, full, m, n)
        plain = cp.empty((m, n), BF16)
        two_launch(cp, x, rhs, plain)
    assert not bool(cp.all(plain.view(cp.uint16) == want.view(cp.uint16))), "pow2_scale changed nothing"


# (n, k, BLOCK_N, stages, K splits, grid): a split-K pair's 66 tiles over 4
# pairs, then 256 and 128 tiles over 6 and 3 CTAs.
MANY_TILES = [(2112, 7168, 32, 16, 2, 8), (32768, 512, 128, 8, 1, 6), (7168, 2048, 56, 14, 1, 3)]


@pytest.mark.parametrize("n,k,bn,stages,splits,grid", MANY_TILES, ids=str)
def test_one_kernel_form_many_tiles_per_cta(cp, rng, weights, n, k, bn, stages, splits, grid):
    """Forced small grids (the same configuration for both paths): each
    persistent CTA (or split-K pair) runs many tiles, so every stage's
    converter warp walks many laps of the ring (the x_full, empty and full
    barriers' phases) across tiles.  (Written after this session's last GPU
    run: the earlier form of this test let the split-K case fall back to two
    kernels unnoticed.)"""
    from cugemm8 import _config, gemm
    rhs = weights(n, k)
    cfg = _config.make_config("normal", 64, bn, stages, k, num_k_splits=splits, num_sms=grid,
                              num_math_warpgroups=1)
    assert _config.is_legal(cfg, k=k)[0]
    for m in (3, 8):
        x = randn(cp, seed_of(rng), (m, k))
        with one_kernel_up_to(8), gemm._forced_config(cfg):
            assert_one_kernel(x, n, f"m={m} {cfg}")
            fused_vs_two_launch(cp, x, rhs, what=f"m={m} n={n} k={k} {cfg}")


# The swap-AB kernel's one-kernel form (quant_a.cuh in fp8_gemm_swap_ab.cuh):
# (n, k, weight tile, stages, K splits, grid): the DeepSeek-V3 pick at
# 4096 x 7168, clusters of 1 and 4, K tails (1040: 9 K blocks over 4 ranks;
# 16: one partial block), N tails, and grids of fewer CTAs than tiles (each
# converter warp walks many laps of the ring across tiles).
SWAP_AB_ONE_KERNEL = [(4096, 7168, 64, 20, 2, 128), (1000, 1040, 128, 6, 4, 132), (520, 16, 64, 4, 1, 9),
                      (4096, 7168, 64, 20, 2, 6), (2112, 2048, 192, 5, 1, 3), (576, 7168, 64, 12, 2, 4)]


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
@pytest.mark.parametrize("n,k,bn,stages,splits,grid", SWAP_AB_ONE_KERNEL, ids=str)
def test_swap_ab_one_kernel_form_bit_identical(cp, rng, weights, n, k, bn, stages, splits, grid, dtype_name):
    """The swap-AB kernel quantising x itself gives the bits of
    per_token_cast_to_fp8 followed by the same swap-AB GEMM, at 1 ... 8 rows,
    for forced token tiles of 8 (the form's only one), and matches the
    float64 reference within the bound at 1 and 8 rows."""
    from cugemm8 import _config, gemm
    dt = DTYPES[dtype_name]
    rhs = weights(n, k)
    cfg = _config.make_config("normal", 8, bn, stages, k, num_k_splits=splits, num_sms=grid, swap_ab=True)
    assert _config.is_legal(cfg, k=k)[0], _config.is_legal(cfg, k=k)
    assert _config.quant_a_config(cfg, -(-k // 16) * 16, dt.itemsize) is not None
    for m in (1, 2, 5, 8):
        what = f"m={m} n={n} k={k} {cfg} {dtype_name}"
        x = randn(cp, seed_of(rng), (m, k), dt, scale=2.0)
        with one_kernel_up_to(8), gemm._forced_config(cfg):
            assert_one_kernel(x, n, what)
            out, (a, sfa) = fused_vs_two_launch(cp, x, rhs, what=what)
        if m in (1, 8):
            ref, bound = H.reference_and_bound(cp, a, sfa, *rhs)
            H.check_against(cp, out, ref, bound, what=what)


def test_swap_ab_one_kernel_form_special_values_and_pow2(cp, rng, weights):
    """NaN / Inf / zero / max rows through the swap-AB kernel's converters
    (the 4096 x 7168 pick): the two-launch bits, NaN kept in its rows; and
    pow2_scale's bits."""
    from cugemm8 import _config
    m, n, k = 8, 4096, 7168
    rhs = weights(n, k)
    dt = DTYPES["bfloat16"]
    host = cp.asnumpy(randn(cp, seed_of(rng), (m, k), dt)).copy()
    signs = np.where(np.arange(k) % 2, -1.0, 1.0)
    host[0] = np.nan
    host[3, 5] = np.inf
    host[5] = 0
    host[6] = signs * float(ml_dtypes.finfo(dt).max)
    x = cp.asarray(host)
    with one_kernel_up_to(m):
        assert _config.select_config("normal", 1, n, k, warp_mma=False).swap_ab
        assert_one_kernel(x, n)
        out, _ = fused_vs_two_launch(cp, x, rhs, what="swap-AB special values")
        got = H.to_f64(cp, out)
        for r in (0, 3):
            assert bool(cp.isnan(got[r]).all()), f"row {r} holds NaN / Inf input, must be NaN"
        assert bool(cp.all(got[5] == 0)), "an all-zero row must give zeros"
        rest = [r for r in range(m) if r not in (0, 3, 6)]
        assert bool(cp.isfinite(got[rest]).all()), "NaN / Inf leaked out of its row"
        y = randn(cp, seed_of(rng), (4, k), dt, scale=5.0)
        got, full = H.poisoned_out(cp, 4, n)
        cugemm8.gemm_fp8(y, rhs, got, pow2_scale=True)
        want = cp.empty((4, n), BF16)
        cugemm8.gemm_fp8_fp8_bf16_nt(cugemm8.per_token_cast_to_fp8(y, pow2_scale=True), rhs, want)
        assert_same_bits(cp, got, want, what="swap-AB pow2_scale")
        assert H.guards_intact(cp, full, 4, n)


def test_one_kernel_form_reads_strided_rows_in_place(cp, rng, weights):
    """x a column slice of a wider buffer (row stride 2048 bytes, K = 1000):
    read in place by TMA, the K tail zero-filled."""
    m, n, k = 7, 1000, 1000
    rhs = weights(n, k)
    buf = randn(cp, seed_of(rng), (m, 1024))
    x = buf[:, :k]
    with one_kernel_up_to(8):
        assert_one_kernel(x, n)
        fused_vs_two_launch(cp, x, rhs, what="strided x")


@pytest.mark.parametrize("m,n,k", [(8, 7168, 2048), (4, 4096, 7168)], ids=["1d2d-64x56", "swap-ab"])
@pytest.mark.parametrize("pdl_on", [False, True], ids=["pdl-off", "pdl-on"])
def test_one_kernel_form_captures_without_a_workspace(cp, rng, weights, pdl_on, m, n, k):
    """Nothing temporary: the call captures without a workspace and replays
    to the two-launch bits of each new x, in the 1D2D kernel (7168 x 2048's
    64x56 pick) and in the swap-AB kernel (4096 x 7168's pick, 256 threads).
    (The swap-AB case was written after v0.17's last GPU run.)"""
    rhs = weights(n, k)
    x = cp.empty((m, k), BF16)
    x[...] = randn(cp, seed_of(rng), (m, k))
    out, full = H.poisoned_out(cp, m, n)
    with one_kernel_up_to(8), pdl(pdl_on):
        assert_one_kernel(x, n)
        cugemm8.gemm_fp8(x, rhs, out)                                  # eager: compiles
        out.view(cp.uint16)[...] = H.POISON_BITS
        with Capture(cp) as c:
            cugemm8.gemm_fp8(x, rhs, out)
        assert_poisoned(cp, full, what="capture must not run the kernel")
        assert_replays_match_two_launch(cp, rng, c, x, rhs, out, full)
