"""Test data and float64 references, on NumPy or CuPy (argument ``xp``), and
running / timing the ops on CuPy.  ``cugemm8 check`` and the benchmarks
(``benches/``) use the same helpers, so they see the same data.

Test data (``make_operands``)
-----------------------------
Normal values N(0, 1), each 1x128 block of A and each 128x128 block of B
multiplied by 2^u, u uniform in {-3, ..., 3} ("block-varied": a scale read
from the wrong block changes the result by O(1)), then quantised the
DeepSeek-V3 way: scale = max(amax, 1e-4) / 448 per block, payload =
round-to-nearest-even e4m3fn of value / scale.  On the GPU (CuPy arrays)
this is done by the library's own quantisers (``per_token_cast_to_fp8``,
``per_block_cast_to_fp8``); on NumPy by :func:`quantize_blocks`.  This is the distribution
DeepGEMM's H200 anchor numbers were measured on (docs/benchmarks.md).

No cuRAND, no cuBLAS
--------------------
cugemm8's ``cuda12`` / ``cuda13`` extras install CuPy with NVRTC and the CUDA
runtime only, so the main job must not load CuPy's cuRAND-backed
``cupy.random`` or its cuBLAS-backed matrix product: random numbers on the
GPU come from :class:`Rng` (a counter-based hash, splitmix64, and
Box-Muller, one small elementwise kernel) and float64 products from
:func:`matmul_nt` (a shared-memory tiled FP64 kernel).
"""
from __future__ import annotations

import statistics

from .._shapes import GROUP_SIZE_SPREAD, Shape
from ._common import _ceil_div

BLOCK = 128
E4M3_MAX = 448.0
MIN_AMAX = 1e-4
#: calc_diff threshold (DeepGEMM's test threshold).
DIFF_LIMIT = 1e-3
#: bf16 quiet-NaN bits used to poison outputs before a run.
POISON_BITS = 0x7FC1


# ----------------------------------------------------------------------------
# Test data and references (NumPy or CuPy through ``xp``)
# ----------------------------------------------------------------------------

def e4m3_values():
    """float32 [256]: the value of every e4m3fn code (0x7F / 0xFF are NaN)."""
    import ml_dtypes
    import numpy as np
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def encode_e4m3(y, xp):
    """e4m3fn bits (uint8) of float32 ``y`` with ``|y| <= 448``: round to
    nearest, ties to even (the rule of ``ml_dtypes`` and the hardware cvt).

    The 127 non-negative finite codes 0x00..0x7E are increasing in value, so
    the code of ``|y|`` is the number of midpoints between consecutive codes
    that lie below it; at an exact midpoint that count picks the lower code,
    which is then bumped when it is odd (odd mantissa).  Sign in bit 7.
    """
    table = e4m3_values()[:127]
    mids = xp.asarray((table[1:] + table[:-1]) / 2)          # exact in float32
    ay = xp.abs(y)
    code = xp.searchsorted(mids, ay, side="left")
    at = mids[xp.minimum(code, mids.size - 1)]
    code = code + ((code < mids.size) & (ay == at) & (code % 2 == 1))
    return (code.astype(xp.uint8) | (xp.signbit(y).astype(xp.uint8) << 7)).astype(xp.uint8)


class Rng:
    """Seeded random numbers for test data on NumPy or CuPy, without cuRAND.

    NumPy: ``numpy.random.RandomState(seed)``.  CuPy: element ``i`` of the
    ``c``-th draw is a function of (seed, c, i) only: splitmix64 of a mixed
    counter gives two 53-bit uniforms, Box-Muller a normal (float32), the
    low bits an integer.  Small host-side draws (group sizes) always use
    NumPy.
    """

    _SRC = r"""
    unsigned long long z = key + (unsigned long long)i * 0x9E3779B97F4A7C15ull;
    unsigned long long h[2];
    for (int t = 0; t < 2; ++t) {
      z += 0x9E3779B97F4A7C15ull;
      unsigned long long x = z;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      h[t] = x ^ (x >> 31);
    }
    """

    def __init__(self, xp, seed: int):
        import numpy as np
        self.xp, self.seed, self.calls = xp, int(seed), 0
        self.host = np.random.RandomState(seed)

    def _key(self) -> int:
        self.calls += 1
        return (self.seed * 0x100000001B3 + self.calls * 0xD1B54A32D192ED03) % (1 << 64)

    _kernels: dict = {}     # name -> CuPy ElementwiseKernel, shared by every Rng

    def _kernel(self, name: str, out_type: str, tail: str):
        # Concrete parameter types: CuPy never infers a type placeholder
        # from scalar arguments alone (a "T lo" here raised KeyError: 'T').
        if name not in Rng._kernels:
            Rng._kernels[name] = self.xp.ElementwiseKernel(
                "uint64 key, int32 lo, int32 span", f"{out_type} y", self._SRC + tail, f"cugemm8_rng_{name}")
        return Rng._kernels[name]

    def standard_normal(self, shape):
        """float32 N(0, 1) of ``shape``."""
        if self.xp.__name__ == "numpy":
            return self.host.standard_normal(shape).astype(self.xp.float32)
        y = self.xp.empty(shape, dtype=self.xp.float32)
        k = self._kernel("normal", "float32", """
        double u1 = ((h[0] >> 11) + 1) * (1.0 / 9007199254740992.0);   // (0, 1]
        double u2 = (h[1] >> 11) * (1.0 / 9007199254740992.0);
        y = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));""")
        k(self.xp.uint64(self._key()), self.xp.int32(0), self.xp.int32(0), y)
        return y

    def randint(self, low: int, high: int, size):
        """int32 uniform in [low, high) of shape ``size``."""
        if self.xp.__name__ == "numpy":
            return self.host.randint(low, high, size=size).astype(self.xp.int32)
        y = self.xp.empty(size, dtype=self.xp.int32)
        k = self._kernel("int", "int32", "y = (int)lo + (int)(h[0] % (unsigned long long)span);")
        k(self.xp.uint64(self._key()), self.xp.int32(low), self.xp.int32(high - low), y)
        return y

    def uniform(self, low: float, high: float, size):
        """float64 uniform in [low, high), on the host (small draws)."""
        return self.host.uniform(low, high, size=size)


_MATMUL_NT = r"""
extern "C" __global__ void cugemm8_matmul_nt_f64(
    const double* __restrict__ a, const double* __restrict__ b, double* __restrict__ c,
    long long m, long long n, long long k, long long lda, long long ldb, long long ldc, int accumulate) {
  // c[r, j] (+)= sum_t a[r, t] * b[j, t]: 32x32 output tiles, block (32, 8),
  // each thread 4 rows of one column; K in 32-wide shared-memory slabs.
  __shared__ double as[32][33];
  __shared__ double bs[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const long long row0 = (long long)blockIdx.y * 32, col0 = (long long)blockIdx.x * 32;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  for (long long k0 = 0; k0 < k; k0 += 32) {
    for (int r = ty; r < 32; r += 8) {
      const long long t = k0 + tx, ar = row0 + r, br = col0 + r;
      as[r][tx] = (ar < m && t < k) ? a[ar * lda + t] : 0.0;
      bs[r][tx] = (br < n && t < k) ? b[br * ldb + t] : 0.0;
    }
    __syncthreads();
    for (int kk = 0; kk < 32; ++kk) {
      const double bv = bs[tx][kk];
      for (int i = 0; i < 4; ++i) acc[i] = fma(as[ty + 8 * i][kk], bv, acc[i]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const long long r = row0 + ty + 8 * i, j = col0 + tx;
    if (r < m && j < n) {
      double* p = c + r * ldc + j;
      *p = accumulate ? *p + acc[i] : acc[i];
    }
  }
}
"""


def matmul_nt(x, y, xp, *, out=None, accumulate: bool = False):
    """float64 ``x @ y.T`` (``x`` [m, k], ``y`` [n, k]); on CuPy without
    cuBLAS (see the module docstring).  With ``out`` (float64 [m, n],
    C-contiguous) the product is written (or, ``accumulate``, added) there."""
    if xp.__name__ == "numpy":
        p = x.astype(xp.float64) @ y.astype(xp.float64).T
        if out is None:
            return p
        if accumulate:
            out += p
        else:
            out[...] = p
        return out
    m, k = x.shape
    n = y.shape[0]
    x = x.astype(xp.float64, copy=False)
    y = y.astype(xp.float64, copy=False)
    if k > 1 and x.strides[1] != 8 or m > 1 and x.strides[0] <= 0:
        x = xp.ascontiguousarray(x)
    if k > 1 and y.strides[1] != 8 or n > 1 and y.strides[0] <= 0:
        y = xp.ascontiguousarray(y)
    if out is None:
        out = xp.empty((m, n), dtype=xp.float64)
        accumulate = False
    if not m or not n:
        return out
    kern = getattr(matmul_nt, "_kernel", None)
    if kern is None:
        kern = matmul_nt._kernel = xp.RawKernel(_MATMUL_NT, "cugemm8_matmul_nt_f64")
    i64 = xp.int64
    kern(((n + 31) // 32, (m + 31) // 32), (32, 8),
         (x, y, out, i64(m), i64(n), i64(k), i64(max(x.strides[0] // 8, 1)), i64(max(y.strides[0] // 8, 1)),
          i64(out.strides[0] // 8), xp.int32(1 if accumulate else 0)))
    return out


def quantize_blocks(x, block_rows: int, xp):
    """Quantise float32 ``x`` [..., R, C] (R a multiple of ``block_rows``, C of
    128) per ``block_rows`` x 128 block: returns (bits uint8 like ``x``,
    scales float32 [..., R / block_rows, C / 128])."""
    *lead, r, c = x.shape
    x4 = x.reshape(*lead, r // block_rows, block_rows, c // BLOCK, BLOCK)
    amax = xp.abs(x4).max(axis=(-3, -1))
    scale = (xp.maximum(amax, xp.float32(MIN_AMAX)) / xp.float32(E4M3_MAX)).astype(xp.float32)
    y = xp.clip(x4 / scale[..., :, None, :, None], -E4M3_MAX, E4M3_MAX).astype(xp.float32)
    return encode_e4m3(y, xp).reshape(x.shape), scale


def random_quantized(xp, rs, lead: tuple, rows: int, cols: int, block_rows: int):
    """Block-varied normal data [*lead, rows, cols] quantised per block.

    Returns (bits uint8 [*lead, rows, cols] contiguous, scales float32
    [*lead, ceil(rows/block_rows), ceil(cols/128)] contiguous).
    """
    rp, cp_ = _ceil_div(rows, block_rows) * block_rows, _ceil_div(cols, BLOCK) * BLOCK
    x = rs.standard_normal((*lead, rp, cp_))
    u = rs.randint(-3, 4, size=(*lead, rp // block_rows, 1, cp_ // BLOCK, 1))
    x = (x.reshape(*lead, rp // block_rows, block_rows, cp_ // BLOCK, BLOCK)
         * xp.exp2(u.astype(xp.float32))).reshape(*lead, rp, cp_)
    if xp.__name__ == "cupy":
        # On the GPU the library's own quantisers do it (issue 6: the main job
        # and the benches run on what users get).  Same recipe and rounding as
        # quantize_blocks; the K and N tails are zero-padded (the reference
        # rule) rather than filled with the random padding drawn above.
        from .. import quant
        xs = xp.ascontiguousarray(x[..., :rows, :cols])
        del x
        if block_rows == 1:
            bits, scale = quant.per_token_cast_to_fp8(xs, min_amax=MIN_AMAX)
            return bits, xp.ascontiguousarray(scale)       # row-major [..., rows, kb]
        return quant.per_block_cast_to_fp8(xs, min_amax=MIN_AMAX)
    bits, scale = quantize_blocks(x, block_rows, xp)
    del x
    return xp.ascontiguousarray(bits[..., :rows, :cols]), scale


def _group_sizes(xp, rs, m: int, g: int, vary: bool) -> list[int]:
    if not vary:
        return [m] * g
    f = rs.uniform(*GROUP_SIZE_SPREAD, size=g)
    return [max(1, int(round(float(v) * m))) for v in (f.get() if hasattr(f, "get") else f)]


def _k_group_sizes(rs, k: int, g: int, vary: bool) -> list[int]:
    """Tokens per group of a ``k_grouped`` shape: multiples of 128 summing
    to ``k``; with ``vary`` drawn in [0.7, 1.3] * k / g (DeepGEMM's
    enumerate_k_grouped_contiguous spread) with group 1 empty when g >= 3."""
    blocks = k // BLOCK
    if not vary:
        base = [blocks // g] * g
    else:
        f = rs.uniform(*GROUP_SIZE_SPREAD, size=g)
        w = [float(v) for v in (f.get() if hasattr(f, "get") else f)]
        if g >= 3:
            w[1] = 0.0
        base = [int(blocks * v / sum(w)) for v in w]
    base[-1] += blocks - sum(base)
    return [b * BLOCK for b in base]


def k_group_slices(ks):
    """(group, token slice, 128-token block slice, tokens) of each group of a
    ``k_grouped`` shape, in order: group e owns the ``ks[e]`` tokens after
    those of the groups before it."""
    off = 0
    for e, ke in enumerate(ks):
        yield e, slice(off, off + ke), slice(off // BLOCK, (off + ke) // BLOCK), ke
        off += ke


def make_operands(shape: Shape, xp, *, seed: int = 0, vary: bool = False) -> dict:
    """Random operands for ``shape`` on ``xp`` (NumPy or CuPy).

    Keys: ``a``, ``sfa`` (row-major ``[..., rows, kb]``), ``b``, ``sfb``, and
    ``valid`` (bool per row of A / D: rows a correct kernel must compute).
    ``contiguous``: ``sizes`` (host list), ``offsets``, ``m_indices`` (int32);
    with ``vary`` the group sizes are drawn in [0.7, 1.3] * m (padding rows
    then exist), else every group has exactly m rows.  ``masked``:
    ``masked_m`` (int32 [g]; random in [1, m] with ``vary``, else m).
    The training kinds (1x128 scales along K on both operands): ``wgrad``
    (A ``[m, k]``, B ``[n, k]``); ``k_grouped`` (A ``[m, k]``, B ``[n, k]``
    over the groups' consecutive token runs, ``ks`` (host list, multiples of
    128 summing to k; with ``vary`` drawn in [0.7, 1.3] * k / g, one group
    empty when g >= 3) and ``ks_tensor`` (int32)).
    The output is not allocated here (see :func:`poisoned_out`).
    """
    import numpy as np
    rs = Rng(xp, seed)
    kind, m, n, k, g = shape.kind, shape.m, shape.n, shape.k, shape.num_groups
    ops: dict = {}
    if kind == "normal":
        ops["a"], ops["sfa"] = random_quantized(xp, rs, (), m, k, 1)
        ops["b"], ops["sfb"] = random_quantized(xp, rs, (), n, k, BLOCK)
        ops["valid"] = xp.ones(m, dtype=bool)
    elif kind == "contiguous":
        sizes = _group_sizes(xp, rs, m, g, vary)
        offsets, total = [], 0
        for s in sizes:
            offsets.append(total)
            total += _ceil_div(s, BLOCK) * BLOCK
        m_indices = np.full(total, -1, dtype=np.int32)
        for e, (off, s) in enumerate(zip(offsets, sizes)):
            m_indices[off:off + s] = e
        ops.update(sizes=sizes, offsets=offsets, m_indices=xp.asarray(m_indices),
                   valid=xp.asarray(m_indices >= 0))
        ops["a"], ops["sfa"] = random_quantized(xp, rs, (), total, k, 1)
        ops["b"], ops["sfb"] = random_quantized(xp, rs, (g,), n, k, BLOCK)
    elif kind == "wgrad":
        ops["a"], ops["sfa"] = random_quantized(xp, rs, (), m, k, 1)
        ops["b"], ops["sfb"] = random_quantized(xp, rs, (), n, k, 1)
        ops["valid"] = xp.ones(m, dtype=bool)
    elif kind == "k_grouped":
        ks = _k_group_sizes(rs, k, g, vary)
        ops.update(ks=ks, ks_tensor=xp.asarray(np.asarray(ks, np.int32)), valid=xp.ones((g, m), dtype=bool))
        ops["a"], ops["sfa"] = random_quantized(xp, rs, (), m, k, 1)
        ops["b"], ops["sfb"] = random_quantized(xp, rs, (), n, k, 1)
    elif kind == "masked":
        host = (np.asarray(rs.randint(1, m + 1, size=g).tolist(), dtype=np.int32) if vary
                else np.full(g, m, dtype=np.int32))
        ops["masked_m"] = xp.asarray(host)
        ops["masked_host"] = host.tolist()
        ops["valid"] = xp.asarray(np.arange(m)[None, :] < host[:, None])
        ops["a"], ops["sfa"] = random_quantized(xp, rs, (g,), m, k, 1)
        ops["b"], ops["sfb"] = random_quantized(xp, rs, (g,), n, k, BLOCK)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return ops


def dequantize(bits, scales, block_rows: int, xp):
    """float64 values of e4m3 ``bits`` [..., R, C] times their block scales."""
    vals = xp.asarray(e4m3_values().astype("float64"))[bits]
    r, c = bits.shape[-2:]
    s = xp.repeat(xp.repeat(scales.astype(xp.float64), BLOCK, axis=-1), block_rows, axis=-2)
    return vals * s[..., :r, :c]


def _ref_rows(a, sfa, b, sfb, xp):
    """float64 ``dequant(A) dequant(B)^T`` for rows of A against one B."""
    return matmul_nt(dequantize(a, sfa, 1, xp), dequantize(b, sfb, BLOCK, xp), xp)


#: Hopper FP8 tensor-core accumulator fraction bits (cugemm8.reference).
TC_MANTISSA_BITS = 13
MMA_K = 32


def _ref_and_bound_rows(a, sfa, b, sfb, xp, *, b_block_rows: int = BLOCK, bf16_out: bool = True):
    """(ref, bound) for rows of A against one B, both float64 [rows, n].

    ``ref`` is the float64 product of the dequantised operands.  ``bound`` is
    :func:`cugemm8.reference.error_bound` (the per-32-K-step tensor-core
    truncation grid, FP32 promotion per 128 K, BF16 rounding) evaluated on
    ``xp``, so large shapes stay fast on the GPU; overflow cases (never in
    this module's data) are not special-cased.  The 1D1D GEMMs
    (``b_block_rows = 1``: a B scale per row; ``bf16_out = False``: FP32
    out, no final rounding) follow
    :func:`cugemm8.reference.training.error_bound_1d1d` the same way.
    """
    m, k = a.shape
    n = b.shape[0]
    kb = _ceil_div(k, BLOCK)
    u_tc, fp32_u, fp32_eta = 2.0 ** -TC_MANTISSA_BITS, 2.0 ** -24, 2.0 ** -150
    table = xp.asarray(e4m3_values().astype("float64"))
    sa = sfa.astype(xp.float64)
    sb_rows = xp.repeat(sfb.astype(xp.float64), b_block_rows, axis=0)[:n]   # [n, kb]
    ref, sum_s_tc, sum_lin, q_sum = (xp.zeros((m, n)) for _ in range(4))
    for j in range(kb):
        lo, hi = j * BLOCK, min(k, (j + 1) * BLOCK)
        av, bv = table[a[:, lo:hi]], table[b[:, lo:hi]]
        amag = xp.where(av == 0, 0.0, xp.maximum(xp.abs(av), 2.0 ** -6))
        bmag = xp.where(bv == 0, 0.0, xp.maximum(xp.abs(bv), 2.0 ** -6))
        p_cum, e = xp.zeros((m, n)), xp.zeros((m, n))
        for c in range(0, hi - lo, MMA_K):
            ce = min(hi - lo, c + MMA_K)
            acc_mag = xp.abs(p_cum) + e
            matmul_nt(av[:, c:ce], bv[:, c:ce], xp, out=p_cum, accumulate=True)
            grid = u_tc * xp.maximum(acc_mag, amag[:, c:ce].max(axis=1)[:, None]
                                     * bmag[:, c:ce].max(axis=1)[None, :])
            step = (ce - c + (c > 0)) * grid
            e = e + step + u_tc * (xp.abs(p_cum) + e + step)
        w = sa[:, j][:, None] * sb_rows[:, j][None, :]
        s = xp.abs(w)
        mag = xp.abs(p_cum) + e
        sum_s_tc += s * e
        sum_lin += (fp32_u * s + fp32_eta) * mag
        q_sum += (s * (1 + fp32_u) + fp32_eta) * mag
        ref += w * p_cum
    nu = kb * fp32_u
    e32 = sum_s_tc + sum_lin + nu / (1 - nu) * q_sum + kb * fp32_eta
    if not bf16_out:
        return ref, e32 + fp32_eta
    return ref, e32 + 2.0 ** -8 * (xp.abs(ref) + e32) + 2.0 ** -134


def _group_parts(ops: dict, shape: Shape) -> list:
    """(rows of A / D, group) of every non-empty group of a grouped shape."""
    if shape.kind == "contiguous":
        return [(slice(off, off + size), e)
                for e, (off, size) in enumerate(zip(ops["offsets"], ops["sizes"])) if size]
    return [((g, slice(0, m)), g) for g, m in enumerate(ops["masked_host"]) if m]


def reference(ops: dict, shape: Shape, xp, *, bound: bool = False):
    """(ref, bound): the float64 reference like D and, with ``bound``, the
    per-element error bound of a correct kernel (else None).  Rows outside
    ``ops['valid']`` are 0 in both."""
    a, sfa, b, sfb = ops["a"], ops["sfa"], ops["b"], ops["sfb"]
    if shape.kind in ("wgrad", "k_grouped"):
        def rows_1d1d(a, sfa, b, sfb):
            if bound:
                return _ref_and_bound_rows(a, sfa, b, sfb, xp, b_block_rows=1, bf16_out=False)
            return matmul_nt(dequantize(a, sfa, 1, xp), dequantize(b, sfb, 1, xp), xp), None
        if shape.kind == "wgrad":
            return rows_1d1d(a, sfa, b, sfb)
        ref = xp.zeros((shape.num_groups, a.shape[0], shape.n), dtype=xp.float64)
        bnd = xp.zeros(ref.shape, dtype=xp.float64) if bound else None
        for e, sl, kb, ke in k_group_slices(ops["ks"]):
            if ke:
                r, bd = rows_1d1d(a[:, sl], sfa[:, kb], b[:, sl], sfb[:, kb])
                ref[e] = r
                if bound:
                    bnd[e] = bd
        return ref, bnd
    rows_fn = _ref_and_bound_rows if bound else (lambda *args: (_ref_rows(*args), None))
    if shape.kind == "normal":
        return rows_fn(a, sfa, b, sfb, xp)
    ref = xp.zeros(a.shape[:-1] + (shape.n,), dtype=xp.float64)
    bnd = xp.zeros(ref.shape, dtype=xp.float64) if bound else None
    for rows, g in _group_parts(ops, shape):
        r, bd = rows_fn(a[rows], sfa[rows], b[g], sfb[g], xp)
        ref[rows] = r
        if bound:
            bnd[rows] = bd
    return ref, bnd


def calc_diff(x, y, xp) -> float:
    """DeepGEMM's ``1 - 2 sum(xy) / sum(x^2 + y^2)`` in float64 (NaN in, NaN out)."""
    x = x.astype(xp.float64)
    y = y.astype(xp.float64)
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0.0 else 1.0 - 2.0 * float((x * y).sum()) / den


def bf16_to_f64(d, xp):
    """float64 values of a bfloat16 array (decoded from its bits)."""
    bits = xp.ascontiguousarray(d).view(xp.uint16).astype(xp.uint32) << 16
    return bits.view(xp.float32).astype(xp.float64)


def out_to_f64(d, xp):
    """float64 values of an op's output: a bfloat16 one (:func:`bf16_to_f64`)
    or the training GEMMs' float32 one."""
    return d.astype(xp.float64) if d.dtype == xp.float32 else bf16_to_f64(d, xp)


def gemm_flops(kind: str, rows: int, n: int, k: int) -> float:
    """2 * rows * n * k with ``rows`` the valid rows (all groups)."""
    return 2.0 * rows * n * k


def gemm_bytes_1d1d(m: int, n: int, k: int, num_groups: int = 1) -> int:
    """Bytes a 1D1D GEMM must move: A + B + D (FP32, one [m, n] per group)
    + SFA + SFB (1x128 along K on both)."""
    kb = _ceil_div(k, BLOCK)
    return (m + n) * k + num_groups * m * n * 4 + (m + n) * kb * 4


def gemm_bytes(rows: int, n: int, k: int, num_b: int = 1) -> int:
    """Bytes a GEMM must move: A + B + D (bf16) + SFA + SFB.

    ``rows`` counts valid rows only (all groups), ``num_b`` the weight
    matrices (groups) read.
    """
    kb, nb = _ceil_div(k, BLOCK), _ceil_div(n, BLOCK)
    return rows * k + num_b * n * k + rows * n * 2 + rows * kb * 4 + num_b * nb * kb * 4


def valid_rows(shape: Shape, ops: dict) -> int:
    if shape.kind == "contiguous":
        return int(sum(ops["sizes"]))
    if shape.kind == "masked":
        return int(sum(ops["masked_host"]))
    return shape.m


# ----------------------------------------------------------------------------
# Running the ops (CuPy)
# ----------------------------------------------------------------------------

def poisoned_out(shape: Shape, ops: dict, cp):
    """A bfloat16 output for ``shape`` filled with a NaN pattern (float32
    NaN for the training kinds)."""
    if shape.kind == "wgrad":
        return cp.full((shape.m, shape.n), cp.nan, dtype=cp.float32)
    if shape.kind == "k_grouped":
        return cp.full((shape.num_groups, shape.m, shape.n), cp.nan, dtype=cp.float32)
    rows = ops["a"].shape[:-1]
    return cp.full(rows + (shape.n,), POISON_BITS, dtype=cp.uint16).view(cp.dtype("bfloat16"))


def gemm_call(shape: Shape, ops: dict, out):
    """A no-argument callable running the cugemm8 op on ``ops`` into ``out``.

    ``sfa`` is converted to the kernel's MN-major TMA-aligned layout here,
    once, so the callable times the kernel only.
    """
    import cugemm8
    sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
    if shape.kind in ("wgrad", "k_grouped"):        # both operands' scales MN-major, once
        lhs, rhs = (ops["a"], sfa), (ops["b"], cugemm8.get_col_major_tma_aligned_tensor(ops["sfb"]))
        if shape.kind == "wgrad":
            return lambda: cugemm8.fp8_gemm_nt(lhs, rhs, out)
        ks, ks_tensor = ops["ks"], ops["ks_tensor"]
        return lambda: cugemm8.k_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, ks, ks_tensor)
    lhs, rhs = (ops["a"], sfa), (ops["b"], ops["sfb"])
    if shape.kind == "normal":
        return lambda: cugemm8.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    if shape.kind == "contiguous":
        m_indices = ops["m_indices"]
        return lambda: cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, m_indices)
    masked_m, expected_m = ops["masked_m"], shape.m
    return lambda: cugemm8.m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, masked_m, expected_m)


def config_string(shape: Shape, ops: dict | None = None) -> str:
    """The configuration the op will use (``str(GemmConfig)``), or ``?`` on error."""
    try:
        import cugemm8
        m = shape.m
        if shape.kind in ("wgrad", "k_grouped"):
            return "1d1d " + str(cugemm8.get_gemm_1d1d_config(m, shape.n, shape.k, num_groups=shape.num_groups))
        if shape.kind == "contiguous":
            m = ops["a"].shape[0] if ops is not None else shape.m * shape.num_groups
        return str(cugemm8.get_gemm_config(shape.kind, m, shape.n, shape.k, shape.num_groups))
    except Exception as exc:  # a report must not die on a config query
        return f"? ({type(exc).__name__})"


def time_us(fn, cp, *, reps: int = 10, warmup: int = 2, flush=None) -> float:
    """Median kernel time (µs) of ``fn`` by CUDA events on the current stream,
    after ``warmup`` calls; ``flush()`` (if given) runs before each rep,
    outside the timed interval."""
    for _ in range(warmup):
        fn()
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for start, end in events:
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in events) * 1e3


def make_l2_flush(cp, nbytes: int = 256 << 20, kind: str = "write"):
    """A callable that evicts L2 by touching ``nbytes`` of device memory.

    ``kind='write'`` (the default, DeepGEMM's ``bench_kineto`` method)
    overwrites them, leaving L2 full of dirty lines whose write-backs the
    next kernel's misses pay for; ``'read'`` sums them, leaving clean lines,
    closer to a decode step in a model (its activations are a few KB).  The
    two bracket serving conditions; which kernel is faster can differ
    between them (benches/RESULTS.md v0.16: the swap-AB decode kernel).
    Raises ``ValueError`` for another ``kind``."""
    if kind not in ("write", "read"):
        raise ValueError(f"flush kind must be 'write' or 'read', got {kind!r}")
    if kind == "read":
        words = cp.ones(nbytes // 8, dtype=cp.uint64)
        total = [None]

        def read_flush():
            total[0] = words.sum()
        return read_flush
    buf = cp.empty(nbytes, dtype=cp.uint8)
    state = [0]

    def flush():
        state[0] = (state[0] + 1) & 0xFF
        buf.fill(state[0])
    return flush

