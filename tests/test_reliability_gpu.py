"""GPU tests of the reliability issue's six kinds of defect (issue 17), each
on every op where it can occur: CUDA-graph capture and temporaries, the
contiguous layout's 128-row rule at every BLOCK_M, PyTorch FP8 through
interop, any K on the convenience path, degenerate sizes, and a warm start
that never touches NVRTC.

Every GEMM output is poisoned first (NaN bits, guard rows and columns) and
checked against the float64 reference within the promotion bound
(tests/gpu_helpers.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import cugemm8
from cugemm8 import _config, gemm as _gemm
from cugemm8 import reference as R
from tests import gpu_helpers as H

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


# ---------------------------------------------------------------- 1. graph capture

class Capture:
    """``with Capture(cp) as c: ...`` captures the block on a fresh stream;
    the capture is always ended (also when the block raises), and ``c.graph``
    replays it on that stream."""

    def __init__(self, cp):
        self.cp, self.stream, self.graph = cp, cp.cuda.Stream(non_blocking=True), None

    def __enter__(self):
        self.stream.__enter__()
        self.stream.begin_capture()
        return self

    def __exit__(self, *exc):
        try:
            self.graph = self.stream.end_capture()
        finally:
            self.stream.__exit__(*exc)
        return False

    def replay(self):
        # The capture stream is non-blocking: without this, work the caller
        # queued on the current stream (new inputs, a poisoned output) may
        # still be running when the graph does.
        self.cp.cuda.Device().synchronize()
        self.graph.launch(self.stream)
        self.stream.synchronize()


def _normal_operands(cp, rng, m=96, n=256, k=640):
    return H.make_operands(cp, rng, m, n, k)       # sfa row-major: not the kernel's layout


def test_capture_refuses_sfa_conversion_and_sfb_copy(cp, rng):
    a, sfa, b, sfb = _normal_operands(cp, rng)
    out, _ = H.poisoned_out(cp, a.shape[0], b.shape[0])
    sfa_tma = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    sfb_f = cp.asfortranarray(sfb)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa_tma), (b, sfb), out)        # compile outside the capture
    for lhs_sfa, rhs_sfb, frag in ((sfa, sfb, "get_col_major_tma_aligned_tensor"),
                                   (sfa_tma, sfb_f, "ascontiguousarray")):
        with pytest.raises(ValueError, match=frag):
            with Capture(cp):
                cugemm8.gemm_fp8_fp8_bf16_nt((a, lhs_sfa), (b, rhs_sfb), out)


def test_capture_replay_leaves_arrays_allocated_afterwards_alone(cp, rng):
    """The capturable path (sfa in the kernel's layout, contiguous sfb): arrays
    allocated after the capture, where a freed temporary would have been,
    keep their values over replays, and the replay writes the right output."""
    a, sfa, b, sfb = _normal_operands(cp, rng)
    m, n = a.shape[0], b.shape[0]
    sfa_tma = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa_tma), (b, sfb), out)
    want = out.copy()
    with Capture(cp) as c:
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa_tma), (b, sfb), out)
    # Fill the pool's free blocks of the sizes a conversion would have taken.
    probes = [cp.full(s, 7.0, dtype=cp.float32) for s in (sfa.size, sfa.size + 4, sfb.size, 2048, 64)]
    out[...] = 0
    c.replay()
    assert bool(cp.all(out.view(cp.uint16) == want.view(cp.uint16)))
    assert all(bool(cp.all(p == 7.0)) for p in probes), "a replay wrote into memory it does not own"
    assert H.guards_intact(cp, full, m, n)


def test_capture_refuses_grouped_conversions(cp, rng):
    g, m_max, n, k = 2, 64, 256, 512
    a = H.random_fp8(cp, rng, (g, m_max, k))
    sfa = H.random_scales(cp, rng, (g, m_max, 4))                   # row-major
    b = H.random_fp8(cp, rng, (g, n, k))
    sfb = H.random_scales(cp, rng, (g, 2, 4))
    out = cp.empty((g, m_max, n), dtype=BF16)
    masked_m = cp.asarray(np.array([5, 64], np.int32))
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, cugemm8.get_col_major_tma_aligned_tensor(sfa)),
                                                  (b, sfb), out, masked_m, 32)
    with pytest.raises(ValueError, match="get_col_major_tma_aligned_tensor"):
        with Capture(cp):
            cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, 32)
    m_indices, _ = cugemm8.make_contiguous_layout([100, 60])
    a2 = H.random_fp8(cp, rng, (256, k))
    sfa2 = H.random_scales(cp, rng, (256, 4))
    out2 = cp.empty((256, n), dtype=BF16)
    with pytest.raises(ValueError, match="get_col_major_tma_aligned_tensor"):
        with Capture(cp):
            cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a2, sfa2), (b, sfb), out2, m_indices)


def test_capture_refuses_convenience_temporaries_but_captures_quantisers(cp, rng):
    x = cp.asarray(rng.standard_normal((64, 512)).astype(np.float32)).astype(BF16)
    w = cp.asarray(rng.standard_normal((256, 512)).astype(np.float32)).astype(BF16)
    cugemm8.gemm_fp8(x, w)
    with pytest.raises(ValueError, match="per_token_cast_to_fp8"):
        with Capture(cp):
            cugemm8.gemm_fp8(x, w)
    with pytest.raises(ValueError, match="zero-pad"):
        with Capture(cp):
            cugemm8.per_token_cast_to_fp8(x[:, :500])
    with pytest.raises(ValueError, match="copy"):
        with Capture(cp):
            cugemm8.per_token_cast_to_fp8(x[:, ::2])
    # Quantiser + GEMM on aligned inputs capture and replay bit-identically.
    a, sfa = cugemm8.per_token_cast_to_fp8(x)
    b, sfb = cugemm8.per_block_cast_to_fp8(w)
    out = cp.empty((64, 256), dtype=BF16)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    want = out.copy()
    with Capture(cp) as c:
        a2, sfa2 = cugemm8.per_token_cast_to_fp8(x)
        out2 = cp.empty((64, 256), dtype=BF16)
        cugemm8.gemm_fp8_fp8_bf16_nt((a2, sfa2), (b, sfb), out2)
    c.replay()
    assert bool(cp.all(out2.view(cp.uint16) == want.view(cp.uint16)))


# ---------------------------------------------------------------- 2. contiguous rule

# Tile families the contiguous GEMM can run (BLOCK_M, BLOCK_N, stages[, A multicast]).
CONTIGUOUS_TILES = [(64, 64, 8), (64, 128, 6), (128, 128, 4), (128, 192, 4, 2), (256, 128, 3), (256, 128, 3, 2)]


@pytest.mark.parametrize("tile", CONTIGUOUS_TILES, ids=lambda t: "x".join(map(str, t)))
def test_contiguous_128_row_rule_at_every_block_m(cp, tile):
    """Blocks that break the layout inside a 128-row block follow the
    documented per-row rule for every tile size: the expert is the block's
    first row's; -1 rows are zeros; other ids NaN."""
    rng = np.random.default_rng(sum(tile))
    n, k, g = 520, 640, 3
    idx = np.full(6 * 128, -1, np.int32)
    idx[0:128] = 0                                   # a clean block
    idx[128:256] = 0
    idx[128 + 64] = -1                               # a padding row inside expert 0's block
    idx[256:384] = -1
    idx[256 + 64:384] = 1                            # second half of a padding block: violations
    idx[384:448] = 2
    idx[448:512] = 1                                 # expert 1 in expert 2's block: violations
    idx[512:640] = 1
    idx[640:768] = 2
    nan_rows = tuple(range(256 + 64, 384)) + tuple(range(448, 512))
    cfg = _config.make_config("contiguous", *tile[:3], k, num_multicast=tile[3] if len(tile) > 3 else 1,
                              multicast_on_a=len(tile) > 3, num_sms=132)
    ok, why = _config.is_legal(cfg, k=k)
    assert ok, why
    from tests.test_grouped_gpu import check_contiguous_layout
    with _gemm._forced_config(cfg):
        check_contiguous_layout(cp, rng, idx, g, n, k, nan_rows=nan_rows)


# ---------------------------------------------------------------- 3. PyTorch interop

def test_torch_tensors_cross_through_interop(cp, rng):
    torch = pytest.importorskip("torch")
    from cugemm8 import interop
    dev = torch.device("cuda", cp.cuda.runtime.getDevice())
    m, n, k = 64, 256, 512
    x = torch.randn(m, k, device=dev)
    w = torch.randn(n, k, device=dev)
    xq = x.to(torch.float8_e4m3fn)
    a = interop.to_cupy(xq)
    assert a.dtype == np.uint8 and a.shape == (m, k)
    assert np.array_equal(a.get(), xq.view(torch.uint8).cpu().numpy())
    assert interop.to_cupy(xq.view(torch.uint8)).dtype == np.uint8
    xb = interop.to_cupy(x.to(torch.bfloat16))
    assert xb.dtype == BF16 and bool(cp.all(xb.astype(cp.float32) == cp.asarray(x.to(torch.bfloat16).float().cpu().numpy())))
    assert interop.to_cupy(x).dtype == np.float32
    # a full GEMM on torch FP8 bytes, checked against the reference
    a_q, sfa = R.per_token_cast_to_fp8(x.cpu().numpy())
    b_q, sfb = R.per_block_cast_to_fp8(w.cpu().numpy())
    ta = torch.from_numpy(a_q).to(dev).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(b_q).to(dev).view(torch.float8_e4m3fn)
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((interop.to_cupy(ta), cp.asarray(sfa)), (interop.to_cupy(tb), cp.asarray(sfb)), out)
    ref, bound = H.reference_and_bound(cp, cp.asarray(a_q), cp.asarray(sfa), cp.asarray(b_q), cp.asarray(sfb))
    H.check_against(cp, out, ref, bound, what="torch fp8")
    assert H.guards_intact(cp, full, m, n)
    # a transposed FP8 tensor: a clear K-major error from the op
    with pytest.raises(ValueError, match="K-major"):
        cugemm8.gemm_fp8_fp8_bf16_nt((interop.to_cupy(tb.t()), cp.asarray(sfa)), (interop.to_cupy(tb), cp.asarray(sfb)), out)
    with pytest.raises(TypeError, match="host memory"):
        interop.to_cupy(torch.zeros(4, 4))
    if hasattr(torch, "float8_e5m2"):
        with pytest.raises(TypeError, match="float8_e5m2"):
            interop.to_cupy(x.to(torch.float8_e5m2))


# ---------------------------------------------------------------- 4. any K

@pytest.mark.parametrize("k", [300, 1000, 8, 129])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32", "float16"])
def test_quantisers_take_any_k(cp, k, dtype_name):
    rng = np.random.default_rng(k)
    dt = BF16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
    x = R.block_varied_normal(rng, (37, k)).astype(dt)
    kp = -(-k // 16) * 16
    a, sfa = cugemm8.per_token_cast_to_fp8(cp.asarray(x))
    want_a, want_s = R.per_token_cast_to_fp8(x)
    assert a.shape == (37, kp) and a.flags.c_contiguous and sfa.shape == want_s.shape
    H.assert_payload_equal(a[:, :k].get(), want_a)
    assert bool(cp.all(a[:, k:] == 0)), "padding columns must be zero bytes"
    assert np.array_equal(sfa.get(), want_s)
    w = R.block_varied_normal(rng, (200, k), block=(128, 128)).astype(dt)
    b, sfb = cugemm8.per_block_cast_to_fp8(cp.asarray(w))
    want_b, want_sb = R.per_block_cast_to_fp8(w)
    assert b.shape == (200, kp)
    H.assert_payload_equal(b[:, :k].get(), want_b)
    assert bool(cp.all(b[:, k:] == 0))
    assert np.array_equal(sfb.get(), want_sb)


@pytest.mark.parametrize("m,n,k", [(1000, 1000, 1000), (7, 999, 300), (1, 8, 1)])
def test_gemm_fp8_any_shape(cp, m, n, k):
    """The unaligned research-script case works end to end, within the bound
    of the reference on the same quantised bytes, and writes only [m, n]."""
    rng = np.random.default_rng(m + n + k)
    x = R.block_varied_normal(rng, (m, k)).astype(BF16)
    w = R.block_varied_normal(rng, (n, k), block=(128, 128)).astype(BF16)
    got = cugemm8.gemm_fp8(cp.asarray(x), cp.asarray(w))
    assert got.shape == (m, n)
    a_q, sfa = R.per_token_cast_to_fp8(x)
    b_q, sfb = R.per_block_cast_to_fp8(w)
    ref = R.ref_gemm_nt(a_q, sfa, b_q, sfb)
    bound = R.error_bound(a_q, sfa, b_q, sfb)
    err = np.abs(got.get().astype(np.float64) - ref)
    assert np.all(err <= bound), float(np.max(err / bound))
    # into a caller's out (n % 8 != 0 goes through an aligned buffer), guards intact
    out, full = H.poisoned_out(cp, m, n)
    assert cugemm8.gemm_fp8(cp.asarray(x), cp.asarray(w), out) is out
    assert bool(cp.all(out.view(cp.uint16) == got.view(cp.uint16)))
    assert H.guards_intact(cp, full, m, n)


# ---------------------------------------------------------------- 5. degenerate sizes

def test_k_zero_writes_zeros_and_n_or_m_zero_write_nothing(cp, rng):
    m, n = 33, 264
    a, sfa = cp.empty((m, 0), np.uint8), cp.empty((m, 0), np.float32)
    b, sfb = cp.empty((n, 0), np.uint8), cp.empty((3, 0), np.float32)
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    assert bool(cp.all(out.view(cp.uint16) == 0)) and H.guards_intact(cp, full, m, n)
    # n == 0 and m == 0: nothing written
    a, sfa, b, sfb = H.make_operands(cp, rng, m, 8, 256)
    empty_out = cp.empty((m, 0), dtype=BF16)
    cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b[:0], sfb[:0]), empty_out)
    out0, full0 = H.poisoned_out(cp, 0, 8)
    cugemm8.gemm_fp8_fp8_bf16_nt((a[:0], sfa[:0]), (b, sfb), out0)
    assert H.guards_intact(cp, full0, 0, 8)
    assert bool(cp.all(cugemm8.gemm_fp8(cp.ones((5, 0), np.float32), cp.ones((16, 0), np.float32)).view(cp.uint16) == 0))


def test_grouped_k_zero_and_empty_masked(cp, rng):
    n, g = 256, 3
    idx = np.full(384, -1, np.int32)
    idx[:100] = 0
    idx[128:200] = 2
    idx[200] = 1                                      # a violation: NaN
    idx[256:300] = 7                                  # an id outside [-1, g): NaN
    m = idx.size
    out, full = H.poisoned_out(cp, m, n)
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
        (cp.empty((m, 0), np.uint8), cp.empty((m, 0), np.float32)),
        (cp.empty((g, n, 0), np.uint8), cp.empty((g, 2, 0), np.float32)), out, cp.asarray(idx))
    got = H.to_f64(cp, out).get()
    bad = np.zeros(m, bool)
    bad[200] = True
    bad[256:300] = True
    assert np.all(got[~bad] == 0) and np.all(np.isnan(got[bad]))
    assert H.guards_intact(cp, full, m, n)
    # masked: rows < masked_m zero, the rest untouched
    m_max = 40
    out3, full3 = H.poisoned_out(cp, m_max, n, batch=g, guard_rows=0, guard_cols=0)
    masked_m = cp.asarray(np.array([0, 17, 99], np.int32))           # 99 is clamped to m_max
    cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked(
        (cp.empty((g, m_max, 0), np.uint8), cp.empty((g, m_max, 0), np.float32)),
        (cp.empty((g, n, 0), np.uint8), cp.empty((g, 2, 0), np.float32)), out3, masked_m, 16)
    bits = out3.view(cp.uint16).get()
    for grp, valid in enumerate((0, 17, 40)):
        assert np.all(bits[grp, :valid] == 0) and np.all(bits[grp, valid:] == H.POISON_BITS)
    # no groups, no rows: nothing launched, nothing written
    for gg, mm in ((0, 16), (2, 0)):
        o, f = H.poisoned_out(cp, mm, n, batch=gg, guard_rows=0, guard_cols=0)
        cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked(
            (cp.empty((gg, mm, 256), np.uint8), cp.empty((gg, mm, 2), np.float32)),
            (cp.empty((gg, n, 256), np.uint8), cp.empty((gg, 2, 2), np.float32)), o,
            cp.zeros(gg, np.int32), 1)
        assert bool(cp.all(f.view(cp.uint16) == H.POISON_BITS))


# ---------------------------------------------------------------- 6. warm start

def test_warm_start_never_touches_nvrtc(tmp_path):
    """A second process whose kernels are in the disk cache runs its first
    GEMM without any NVRTC call: no compile, no preprocessing pass, no
    version query (CuPy's RawModule cache made each of these: 73 ms)."""
    script = textwrap.dedent("""
        import sys
        from cupy_backends.cuda.libs import nvrtc
        calls = []
        for name in ("createProgram", "compileProgram", "getVersion"):
            real = getattr(nvrtc, name)
            def counting(*a, _real=real, _name=name, **k):
                calls.append(_name)
                return _real(*a, **k)
            setattr(nvrtc, name, counting)
        import cupy as cp, numpy as np
        import cugemm8
        from tests import gpu_helpers as H
        rng = np.random.default_rng(0)
        a, sfa, b, sfb = H.make_operands(cp, rng, 64, 2112, 7168)
        sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
        out = cp.empty((64, 2112), dtype=cp.dtype("bfloat16"))
        before = len(calls)
        cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
        cp.cuda.runtime.deviceSynchronize()
        print(before, len(calls) - before)
        """)
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CUGEMM8_DISABLE_CACHE", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert int(first.stdout.split()[-1]) >= 1, "the first process should have compiled"
    second = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert int(second.stdout.split()[-1]) == 0, f"NVRTC was called on a warm start: {second.stdout}"
