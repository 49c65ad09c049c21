"""The ``cugemm8`` command line (also ``python -m cugemm8``).

Subcommands
-----------
``check`` (the default)
    Runs every DeepSeek-V3 normal-GEMM shape (M in 1, 64, 128, 4096) plus one
    contiguous and one masked grouped shape on random data, checks each result
    against a float64 reference of the dequantised operands, times it, prints
    a table and exits 1 if any shape fails (2 when no Hopper GPU is usable).
``info``
    Versions, the GPU, the kernel cache and whether sm_90a kernels can be
    compiled and run here.  Works without a GPU; always exits 0.
``bench [...]``
    Forwards to ``benches/bench_gemm.py`` (present in a source checkout).
``warmup --shapes FILE [--compile-only]``
    Compiles every kernel the shapes in FILE need, so later processes load
    them from cugemm8's disk cache (with ``--compile-only``: NVRTC only, no GPU,
    nothing cached; a check that they build).
``configs [--shapes FILE] [--num-sms N]``
    Prints the heuristic's kernel configuration (tile, stages, multicast,
    split K, grid, shared memory, waves) for the benchmark shapes or the
    shapes in FILE.  Pure Python: no GPU needed.

Importing this module is cheap: CuPy and the GEMM code are imported inside
the functions that need them.  The data and reference helpers below
(:func:`make_operands`, :func:`reference`, :func:`calc_diff`,
:func:`gemm_bytes`) work on NumPy as well as CuPy arrays (argument ``xp``);
``benches/bench_gemm.py`` uses them too, so the benchmark and the check see
the same data.

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
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

#: DeepSeek-V3 (N, K) of the normal-GEMM table (docs/benchmarks.md).
DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
               (4096, 7168), (7168, 2048), (576, 7168))
#: M values ``cugemm8 check`` runs for every (N, K).
CHECK_MS = (1, 64, 128, 4096)

BLOCK = 128
E4M3_MAX = 448.0
MIN_AMAX = 1e-4
#: calc_diff threshold (DeepGEMM's test threshold).
DIFF_LIMIT = 1e-3
#: bf16 quiet-NaN bits used to poison outputs before a run.
POISON_BITS = 0x7FC1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Shape:
    """One GEMM problem.

    ``m`` is the rows of A for ``normal``, the rows per group for
    ``contiguous`` (m_sum = num_groups * m when every group has exactly m
    rows) and ``m_max`` (= expected_m) for ``masked``.
    """
    kind: str
    m: int
    n: int
    k: int
    num_groups: int = 1

    def label(self) -> str:
        dims = f"{self.m}x{self.n}x{self.k}"
        return dims if self.kind == "normal" else f"{self.num_groups}x{dims}"


def check_shapes(quick: bool = False) -> list[Shape]:
    """The shapes ``cugemm8 check`` runs (``quick``: a handful)."""
    if quick:
        normal = [Shape("normal", m, n, k) for m, n, k in
                  ((1, 2112, 7168), (64, 7168, 2048), (128, 576, 7168), (4096, 4096, 7168))]
    else:
        normal = [Shape("normal", m, n, k) for m in CHECK_MS for n, k in DEEPSEEK_NK]
    return normal + [Shape("contiguous", 1024, 4096, 7168, 4), Shape("masked", 256, 7168, 2048, 4)]


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


def _normal(xp, rs, shape):
    if xp.__name__ == "numpy":
        return rs.standard_normal(shape).astype(xp.float32)
    return rs.standard_normal(shape, dtype=xp.float32)


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
    x = _normal(xp, rs, (*lead, rp, cp_))
    u = rs.randint(-3, 4, size=(*lead, rp // block_rows, 1, cp_ // BLOCK, 1))
    x = (x.reshape(*lead, rp // block_rows, block_rows, cp_ // BLOCK, BLOCK)
         * xp.exp2(u.astype(xp.float32))).reshape(*lead, rp, cp_)
    if xp.__name__ == "cupy":
        # On the GPU the library's own quantisers do it (issue 6: the main job
        # and the benches run on what users get).  Same recipe and rounding as
        # quantize_blocks; the K and N tails are zero-padded (the reference
        # rule) rather than filled with the random padding drawn above.
        from . import quant
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
    f = rs.uniform(0.7, 1.3, size=g)
    return [max(1, int(round(float(v) * m))) for v in (f.get() if hasattr(f, "get") else f)]


def make_operands(shape: Shape, xp, *, seed: int = 0, vary: bool = False) -> dict:
    """Random operands for ``shape`` on ``xp`` (NumPy or CuPy).

    Keys: ``a``, ``sfa`` (row-major ``[..., rows, kb]``), ``b``, ``sfb``, and
    ``valid`` (bool per row of A / D: rows a correct kernel must compute).
    ``contiguous``: ``sizes`` (host list), ``offsets``, ``m_indices`` (int32);
    with ``vary`` the group sizes are drawn in [0.7, 1.3] * m (padding rows
    then exist), else every group has exactly m rows.  ``masked``:
    ``masked_m`` (int32 [g]; random in [1, m] with ``vary``, else m).
    The output is not allocated here (see :func:`poisoned_out`).
    """
    import numpy as np
    rs = xp.random.RandomState(seed)
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
    return dequantize(a, sfa, 1, xp) @ dequantize(b, sfb, BLOCK, xp).T


#: Hopper FP8 tensor-core accumulator fraction bits (cugemm8.reference).
TC_MANTISSA_BITS = 13
MMA_K = 32


def _ref_and_bound_rows(a, sfa, b, sfb, xp):
    """(ref, bound) for rows of A against one B, both float64 [rows, n].

    ``ref`` is the float64 product of the dequantised operands.  ``bound`` is
    :func:`cugemm8.reference.error_bound` (the per-32-K-step tensor-core
    truncation grid, FP32 promotion per 128 K, BF16 rounding) evaluated on
    ``xp``, so large shapes stay fast on the GPU; overflow cases (never in
    this module's data) are not special-cased.
    """
    m, k = a.shape
    n = b.shape[0]
    kb = _ceil_div(k, BLOCK)
    u_tc, fp32_u, fp32_eta = 2.0 ** -TC_MANTISSA_BITS, 2.0 ** -24, 2.0 ** -150
    table = xp.asarray(e4m3_values().astype("float64"))
    sa = sfa.astype(xp.float64)
    sb_rows = xp.repeat(sfb.astype(xp.float64), BLOCK, axis=0)[:n]        # [n, kb]
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
            p_cum += av[:, c:ce] @ bv[:, c:ce].T
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
    rows_fn = _ref_and_bound_rows if bound else (lambda *args: (_ref_rows(*args), None))
    a, sfa, b, sfb = ops["a"], ops["sfa"], ops["b"], ops["sfb"]
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


def gemm_flops(kind: str, rows: int, n: int, k: int) -> float:
    """2 * rows * n * k with ``rows`` the valid rows (all groups)."""
    return 2.0 * rows * n * k


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
    """A bfloat16 output for ``shape`` filled with a NaN pattern."""
    rows = ops["a"].shape[:-1]
    return cp.full(rows + (shape.n,), POISON_BITS, dtype=cp.uint16).view(cp.dtype("bfloat16"))


def gemm_call(shape: Shape, ops: dict, out):
    """A no-argument callable running the cugemm8 op on ``ops`` into ``out``.

    ``sfa`` is converted to the kernel's MN-major TMA-aligned layout here,
    once, so the callable times the kernel only.
    """
    import cugemm8
    sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
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


def make_l2_flush(cp, nbytes: int = 256 << 20):
    """A callable that overwrites ``nbytes`` of device memory (evicts L2)."""
    buf = cp.empty(nbytes, dtype=cp.uint8)
    state = [0]

    def flush():
        state[0] = (state[0] + 1) & 0xFF
        buf.fill(state[0])
    return flush


# ----------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class CheckResult:
    shape: Shape
    config: str = ""
    us: float = float("nan")
    tflops: float = float("nan")
    gbps: float = float("nan")
    diff: float = float("nan")
    max_err: float = float("nan")          # worst |D - ref| / bound (<= 1 passes)
    passed: bool = False
    note: str = ""


def _one_line(text) -> str:
    return " ".join(str(text).split())


def gpu_reason() -> str | None:
    """Why the cugemm8 kernels cannot run here (None: they can)."""
    try:
        from . import _device
        reason = _device.gpu_unavailable_reason()
    except Exception as exc:  # a broken probe is reported, not raised
        return _one_line(f"device probe failed: {type(exc).__name__}: {exc}")
    return None if reason is None else _one_line(reason)


def nvrtc_reason() -> str | None:
    """Why sm_90a kernels cannot be compiled here (None: they can)."""
    try:
        from . import _device
        reason = _device.nvrtc_unavailable_reason()
    except Exception as exc:
        return _one_line(f"NVRTC probe failed: {type(exc).__name__}: {exc}")
    return None if reason is None else _one_line(reason)


def _check_values(shape: Shape, ops: dict, out, cp, res: CheckResult) -> None:
    """Fill ``res.diff``, ``res.max_err``, ``res.passed``, ``res.note``."""
    ref, bound = reference(ops, shape, cp, bound=True)
    got = bf16_to_f64(out, cp)
    valid = ops["valid"]
    err = cp.abs(got - ref) / bound
    res.diff = calc_diff(got[valid], ref[valid], cp)
    res.max_err = float(cp.nan_to_num(err[valid], nan=cp.inf).max()) if bool(valid.any()) else 0.0
    notes = []
    if not res.diff < DIFF_LIMIT:
        notes.append(f"calc_diff {res.diff:.2e} >= {DIFF_LIMIT:g}")
    if not res.max_err <= 1.0:
        notes.append("element error above its bound")
    invalid = ~valid
    if bool(invalid.any()):
        bits = out.view(cp.uint16)[invalid]
        if shape.kind == "contiguous" and not bool((got[invalid] == 0).all()):
            notes.append("padding rows not zero")
        if shape.kind == "masked" and not bool((bits == POISON_BITS).all()):
            notes.append("rows past masked_m were written")
    res.passed = not notes
    res.note = "; ".join(notes)


def check_one(shape: Shape, *, seed: int, reps: int, flush=None) -> CheckResult:
    """Build data, run, check against the reference, then time one shape."""
    import cupy as cp
    res = CheckResult(shape)
    try:
        ops = make_operands(shape, cp, seed=seed, vary=shape.kind != "normal")
        res.config = config_string(shape, ops)
        out = poisoned_out(shape, ops, cp)
        run = gemm_call(shape, ops, out)
        run()
        cp.cuda.get_current_stream().synchronize()
        _check_values(shape, ops, out, cp, res)
        res.us = time_us(run, cp, reps=reps, flush=flush)
        rows = valid_rows(shape, ops)
        num_b = shape.num_groups
        res.tflops = gemm_flops(shape.kind, rows, shape.n, shape.k) / res.us / 1e6
        res.gbps = gemm_bytes(rows, shape.n, shape.k, num_b) / res.us / 1e3
    except Exception as exc:
        res.passed = False
        res.note = _one_line(f"{type(exc).__name__}: {exc}")[:300]
    finally:
        cp.get_default_memory_pool().free_all_blocks()
    return res


def _fmt(x: float, spec: str) -> str:
    return "-" if x != x else format(x, spec)


CHECK_COLUMNS = ("kind", "shape", "config", "µs", "TFLOPS", "GB/s", "calc_diff", "err/bound", "result")


def _check_row(r: CheckResult) -> tuple:
    verdict = "PASS" if r.passed else "FAIL" + (f": {r.note}" if r.note else "")
    return (r.shape.kind, r.shape.label(), r.config, _fmt(r.us, ".1f"), _fmt(r.tflops, ".1f"),
            _fmt(r.gbps, ".0f"), _fmt(r.diff, ".2e"), _fmt(r.max_err, ".3f"), verdict)


def _numeric(cell) -> bool:
    """True for a number or the '-' placeholder (right-justified columns)."""
    if str(cell) == "-":
        return True
    try:
        float(str(cell))
    except ValueError:
        return False
    return True


def print_table(title: str, columns, rows, *, file=None) -> None:
    """A rich table when rich is importable, else aligned plain text."""
    file = sys.stdout if file is None else file
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows)]
        print(title, file=file)
        for row in (columns, *rows):
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip(), file=file)
        return
    table = Table(title=title)
    for i, c in enumerate(columns):
        table.add_column(c, justify="right" if rows and all(_numeric(r[i]) for r in rows) else "left")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console = Console(file=file, width=None if file.isatty() else 220)
    console.print(table)


def _progress(total: int):
    """(advance(label), close()) with a rich progress bar when possible."""
    try:
        from rich.progress import Progress
    except ImportError:
        count = [0]

        def advance(label):
            count[0] += 1
            print(f"[{count[0]}/{total}] {label}", file=sys.stderr, flush=True)
        return advance, lambda: None
    from rich.console import Console
    prog = Progress(console=Console(stderr=True), transient=True)
    prog.start()
    task = prog.add_task("cugemm8 check", total=total)

    def advance(label):
        prog.update(task, advance=1, description=f"cugemm8 check {label}")
    return advance, prog.stop


def cmd_check(args) -> int:
    reason = gpu_reason()
    if reason is not None:
        print(f"cugemm8: no usable Hopper GPU: {reason}")
        return 2
    import cupy as cp
    shapes = check_shapes(quick=args.quick)
    flush = make_l2_flush(cp)
    advance, close = _progress(len(shapes))
    results = []
    try:
        for i, shape in enumerate(shapes):
            results.append(check_one(shape, seed=args.seed + i, reps=args.reps, flush=flush))
            advance(f"{shape.kind} {shape.label()}")
    finally:
        close()
    failed = sum(not r.passed for r in results)
    title = (f"cugemm8 check: {len(results) - failed}/{len(results)} passed "
             f"(median of {args.reps}, L2 flushed; err/bound <= 1 and calc_diff < {DIFF_LIMIT:g} pass)")
    print_table(title, CHECK_COLUMNS, [_check_row(r) for r in results])
    if args.json:
        rows = [dict(dataclasses.asdict(r), shape=dataclasses.asdict(r.shape)) for r in results]
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 1 if failed else 0


# ----------------------------------------------------------------------------
# info
# ----------------------------------------------------------------------------

def _try(fn, default="unavailable"):
    try:
        return fn()
    except Exception as exc:
        return f"{default} ({_one_line(f'{type(exc).__name__}: {exc}')[:200]})"


def _dist_version(*names: str) -> str:
    from importlib import metadata
    for name in names:
        try:
            return f"{metadata.version(name)} ({name})"
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10} ({v})" if v else f"none ({v})"


def cache_dir() -> Path:
    """CuPy's kernel cache directory (``CUPY_CACHE_DIR`` or ``~/.cupy/kernel_cache``)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or os.path.join("~", ".cupy", "kernel_cache")).expanduser()


def _dir_usage(path: Path) -> str:
    if not path.is_dir():
        return "does not exist yet"
    files = [p for p in path.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return f"{len(files)} files, {size / 2**20:.1f} MiB"


def _gpu_lines() -> list[tuple[str, str]]:
    import cupy as cp
    count = cp.cuda.runtime.getDeviceCount()
    lines = [("GPUs visible", str(count))]
    for i in range(count):
        props = cp.cuda.runtime.getDeviceProperties(i)
        name = props.get("name", "?")
        name = name.decode(errors="replace") if isinstance(name, bytes) else name
        cc = f"{props.get('major', '?')}.{props.get('minor', '?')}"
        mem = props.get("totalGlobalMem", 0) / 2**30
        l2 = props.get("l2CacheSize", 0) / 2**20
        lines.append((f"GPU {i}", f"{name}, compute capability {cc}, "
                      f"{props.get('multiProcessorCount', '?')} SMs, {mem:.1f} GiB, L2 {l2:.0f} MiB, "
                      f"{props.get('sharedMemPerBlockOptin', '?')} B shared memory per block (opt-in)"))
    return lines


def info_lines() -> list[tuple[str, str]]:
    """(key, value) pairs of ``cugemm8 info``; never raises."""
    import platform
    from . import __version__
    lines = [("cugemm8", f"{__version__} ({Path(__file__).resolve().parent})"),
             ("python", f"{platform.python_version()} ({sys.executable})"),
             ("numpy", _dist_version("numpy")), ("ml_dtypes", _dist_version("ml_dtypes")),
             ("cupy", _dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy")),
             ("cuda-bindings", _dist_version("cuda-bindings"))]
    try:
        import cupy as cp
    except Exception as exc:
        lines.append(("cupy import", _one_line(f"FAILED: {type(exc).__name__}: {exc}")))
        cp = None
    if cp is not None:
        rt = cp.cuda.runtime
        lines += [("CUDA driver", _try(lambda: _cuda_version(rt.driverGetVersion()))),
                  ("CUDA runtime", _try(lambda: _cuda_version(rt.runtimeGetVersion())))]

        def nvrtc():
            from cupy_backends.cuda.libs import nvrtc as lib
            return ".".join(map(str, lib.getVersion()))
        lines.append(("NVRTC", _try(nvrtc)))
        gpu = _try(_gpu_lines, default="no GPU")
        lines += gpu if isinstance(gpu, list) else [("GPUs", gpu)]
    cdir = cache_dir()
    src = "CUPY_CACHE_DIR" if os.environ.get("CUPY_CACHE_DIR") else "default; set CUPY_CACHE_DIR to move it"
    lines.append(("kernel cache", f"{cdir} ({src}): {_try(lambda: _dir_usage(cdir))}"))
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "0") not in ("", "0"):
        lines.append(("kernel cache note", "CUPY_CACHE_IN_MEMORY is set: nothing is written to disk"))
    env = {k: v for k, v in os.environ.items() if k.startswith("CUGEMM8_")}
    if env:
        lines.append(("CUGEMM8_* set", ", ".join(f"{k}={v}" for k, v in sorted(env.items()))))
    nv = nvrtc_reason()
    lines.append(("compile sm_90a", "yes" if nv is None else f"no: {nv}"))
    gr = gpu_reason()
    lines.append(("run kernels", "yes" if gr is None else f"no: {gr}"))
    return lines


def cmd_info(args) -> int:
    lines = info_lines()
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")
    return 0


# ----------------------------------------------------------------------------
# bench
# ----------------------------------------------------------------------------

def bench_script() -> Path:
    """Where ``benches/bench_gemm.py`` is in a source checkout."""
    return Path(__file__).resolve().parent.parent / "benches" / "bench_gemm.py"


def cmd_bench(argv: list[str]) -> int:
    path = bench_script()
    if not path.is_file():
        print(f"cugemm8 bench: {path} is not here: the benchmarks ship with the source tree, "
              "not with the installed package; run `python benches/bench_gemm.py` from a checkout")
        return 2
    import importlib.util
    spec = importlib.util.spec_from_file_location("cugemm8_bench_gemm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(argv) or 0)


# ----------------------------------------------------------------------------
# warmup
# ----------------------------------------------------------------------------

def load_shapes(path: str) -> list[Shape]:
    """Parse a warm-up file: a JSON list of {"kind", "m", "n", "k", "num_groups"}.

    ``m`` is m_sum for ``contiguous`` and expected_m for ``masked``
    (the values the configuration is chosen from).  Raises ValueError.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read shapes file {path}: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of shape objects, got {type(data).__name__}")
    shapes = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{path}[{i}]: expected an object, got {item!r}")
        unknown = set(item) - {"kind", "m", "n", "k", "num_groups"}
        if unknown:
            raise ValueError(f"{path}[{i}]: unknown keys {sorted(unknown)}")
        try:
            kind = item.get("kind", "normal")
            vals = [item[key] for key in ("m", "n", "k")] + [item.get("num_groups", 1)]
        except KeyError as exc:
            raise ValueError(f"{path}[{i}]: missing key {exc}") from None
        if kind not in ("normal", "contiguous", "masked"):
            raise ValueError(f"{path}[{i}]: kind must be normal, contiguous or masked, got {kind!r}")
        if any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
            raise ValueError(f"{path}[{i}]: m, n, k, num_groups must be integers, got {item}")
        m, n, k, g = vals
        # The rules the ops themselves enforce (cugemm8.gemm).
        if m < 0 or g < 1 or n <= 0 or n % 8 or k <= 0 or k % 16:
            raise ValueError(f"{path}[{i}]: need m >= 0, num_groups >= 1, n a positive multiple of 8 "
                             f"and k a positive multiple of 16, got {item}")
        shapes.append(Shape(kind, *vals))
    return shapes


@dataclasses.dataclass
class WarmupJob:
    name: str            # kernel name expression
    config: str
    smem: int
    shapes: list


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def plan_warmup(shapes: list[Shape], num_sms: int) -> tuple[list[WarmupJob], list[str]]:
    """Distinct kernels the shapes need, and one error line per bad shape."""
    from . import _config, gemm
    jobs: dict[str, WarmupJob] = {}
    errors = []
    for s in shapes:
        try:
            cfg = _config.select_config(s.kind, s.m, s.n, s.k, num_groups=s.num_groups, num_sms=num_sms)
            name = gemm._kernel_name(cfg, s.n, s.k, gemm._GEMM_TYPE[s.kind], s.num_groups)
        except Exception as exc:
            errors.append(f"{s.kind} {s.label()}: {type(exc).__name__}: {exc}")
            continue
        job = jobs.setdefault(name, WarmupJob(name, str(cfg), cfg.smem_bytes, []))
        job.shapes.append(f"{s.kind} {s.label()}")
    return list(jobs.values()), errors


def _compile_only(job: WarmupJob) -> tuple[float, str]:
    from . import _jit, gemm
    t0 = time.perf_counter()
    rep = _jit.compile_only(gemm._HEADER, [job.name])
    dt = time.perf_counter() - t0
    res = next(iter(rep.resources.values()), None)
    detail = "" if res is None else (f"{res.registers} regs, {res.spill_stores}/{res.spill_loads} B "
                                     f"spill st/ld, {res.stack_frame} B stack")
    return dt, detail


def _load_on_gpu(job: WarmupJob, device_id: int = 0) -> tuple[float, str]:
    import cupy
    from . import _jit, gemm
    t0 = time.perf_counter()
    with cupy.cuda.Device(device_id):   # worker threads start on device 0
        kern = _jit.get_kernel(gemm._HEADER, job.name, max_dynamic_smem=job.smem)
    dt = time.perf_counter() - t0
    return dt, f"{kern.num_regs} regs, {kern.local_size_bytes} B local"


def cmd_configs(args) -> int:
    """``cugemm8 configs``: the heuristic's choices, as a table (no GPU)."""
    from . import _config
    if args.shapes:
        try:
            shapes = load_shapes(args.shapes)
        except ValueError as exc:
            print(f"cugemm8 configs: {exc}", file=sys.stderr)
            return 2
        cases = [(s.kind, s.num_groups, s.m, s.n, s.k) for s in shapes]
    else:
        cases = _config.BENCHMARK_CASES
    try:
        print(_config.format_table(cases, num_sms=args.num_sms))
    except (TypeError, ValueError) as exc:
        print(f"cugemm8 configs: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_warmup(args) -> int:
    try:
        shapes = load_shapes(args.shapes)
    except ValueError as exc:
        print(f"cugemm8 warmup: {exc}", file=sys.stderr)
        return 2
    if args.compile_only:
        reason = nvrtc_reason()
        if reason is not None:
            print(f"cugemm8 warmup: cannot compile sm_90a kernels here: {reason}", file=sys.stderr)
            return 2
        num_sms = args.num_sms or 132
        worker = _compile_only
    else:
        reason = gpu_reason()
        if reason is not None:
            print(f"cugemm8 warmup: no usable Hopper GPU: {reason} "
                  "(use --compile-only to compile without one)", file=sys.stderr)
            return 2
        import cupy
        from . import _device
        num_sms = args.num_sms or _device.get_num_sms()
        device_id = cupy.cuda.Device().id
        worker = lambda job: _load_on_gpu(job, device_id)   # noqa: E731
    jobs, errors = plan_warmup(shapes, num_sms)
    rows, failed = [], len(errors)
    t0 = time.perf_counter()

    def run(job):
        try:
            dt, detail = worker(job)
            return job, dt, detail, None
        except Exception as exc:
            return job, float("nan"), "", _one_line(f"{type(exc).__name__}: {exc}")[:300]

    if len(jobs) > 1:
        # NVRTC releases the GIL and _jit locks per kernel: builds run in parallel.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=args.jobs or min(len(jobs), os.cpu_count() or 1)) as pool:
            outcomes = list(pool.map(run, jobs))
    else:
        outcomes = [run(job) for job in jobs]
    for job, dt, detail, err in outcomes:
        failed += err is not None
        rows.append((job.config, _fmt(dt, ".2f"), "ok" if err is None else f"FAILED: {err}",
                     detail, "; ".join(job.shapes)))
    mode = "compiled (no GPU)" if args.compile_only else "loaded on the GPU"
    ok = sum(err is None for _, _, _, err in outcomes)
    title = (f"cugemm8 warmup: {ok} of {len(jobs)} kernels {mode} for {len(shapes)} shapes "
             f"in {time.perf_counter() - t0:.1f} s (grid for {num_sms} SMs)")
    print_table(title, ("config", "seconds", "status", "resources", "shapes"), rows)
    for line in errors:
        print(f"cugemm8 warmup: bad shape: {line}", file=sys.stderr)
    return 1 if failed else 0


# ----------------------------------------------------------------------------
# argument parsing
# ----------------------------------------------------------------------------

SUBCOMMANDS = ("check", "info", "bench", "warmup")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cugemm8",
        description="FP8 GEMMs for Hopper with DeepSeek-V3 fine-grained scaling. "
                    "Without a subcommand, runs `check`.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{check,info,bench,warmup,configs}")

    p = sub.add_parser("check", help="run, verify and time the DeepSeek-V3 shapes (default)",
                       description="Check every DeepSeek-V3 shape against a float64 reference and time it. "
                                   "Exit 0: all pass; 1: a shape failed; 2: no usable Hopper GPU.")
    p.add_argument("--quick", action="store_true", help="a handful of shapes only")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per shape (median; default 10)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("info", help="versions, GPU, kernel cache, what is missing (no GPU needed)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("bench", help="run benches/bench_gemm.py (source checkout only); "
                                     "arguments are passed through", add_help=False)
    p.set_defaults(func=None)

    p = sub.add_parser("warmup", help="compile the kernels a list of shapes needs",
                       description='Compile (or load from the disk cache) every kernel the shapes need. '
                                   'FILE: a JSON list of {"kind": "normal"|"contiguous"|"masked", '
                                   '"m": ..., "n": ..., "k": ..., "num_groups": ...}; m is m_sum '
                                   'for contiguous and expected_m for masked.')
    p.add_argument("--shapes", required=True, metavar="FILE", help="JSON list of shapes")
    p.add_argument("--compile-only", action="store_true",
                   help="compile with NVRTC without a GPU (nothing is cached; checks that the kernels build)")
    p.add_argument("--num-sms", type=_positive_int, default=0,
                   help="SM count the configs are chosen for (default: the GPU's, or 132 with --compile-only)")
    p.add_argument("--jobs", type=_positive_int, default=0, help="parallel compiles with --compile-only (default: CPUs)")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("configs", help="the heuristic's kernel configuration per shape (no GPU needed)",
                       description="Print the configuration select_config picks (tile, stages, multicast, "
                                   "split K, grid, shared memory, waves, the cost model's estimate) for the "
                                   "benchmark shapes, or for the shapes in FILE (the warmup format).")
    p.add_argument("--shapes", metavar="FILE", help="JSON list of shapes (default: the benchmark shapes)")
    p.add_argument("--num-sms", type=_positive_int, default=132, help="SMs available (default 132, an H200)")
    p.set_defaults(func=cmd_configs)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["check", *argv]
    args = build_parser().parse_args(argv)
    if args.version:
        from . import __version__
        print(f"cugemm8 {__version__}")
        return 0
    if args.command is None:
        args = build_parser().parse_args(["check"])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
