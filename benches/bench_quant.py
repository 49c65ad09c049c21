"""Benchmark of the FP8 quantisation kernels (issue 6) on one GPU.

    python benches/bench_quant.py [--reps 50] [--warmup 5] [--extra] [--json OUT]

Cases (bfloat16 input, DeepSeek-V3 sizes):

* per_token_cast_to_fp8 on [4096, 7168] (prefill) and [128, 7168] (decode);
* per_block_cast_to_fp8 on [7168, 7168] (a weight matrix);
* the backward pass's transposing casts: per_token_cast_to_fp8_t on
  [4096, 7168] and [4096, 2048] bf16 and [4096, 7168] float32, and
  cast_transpose_block_fp8 on [7168, 7168] bf16;
* with ``--extra``, also per_token on [2048, 7168] bf16, [4096, 7168]
  float32 and float16, [4096, 7168] bf16 with pow2_scale, a 3-D
  [8, 512, 7168] bf16 batch and a strided [4096, 7168] view of a
  [4096, 7296] bf16 buffer (row pitch 7296: read in place).

For each: kernel time (median over repetitions, CUDA events around the call,
a 256 MB write before every repetition so each starts with a cold L2; with
torch installed, also the CUPTI kernel durations in a second table), the
achieved bandwidth (bytes read + written, scales included) and its ratio to

* ``of copy``: a device-to-device copy of a 2 GB buffer measured in the same
  run (the large-copy memory ceiling, bytes read + written);
* ``of same-size copy``: a device-to-device copy (cudaMemcpyAsync) moving
  exactly the case's bytes (half of them read, half written), timed the same
  way (cold L2, median): the ceiling for a transfer of that size, launch
  latency and DRAM latency included.  Small cases (decode) cannot approach
  the large-copy rate; this column says how close they come to a plain copy
  of the same bytes;
* the same quantisation written as plain CuPy expressions (reshape,
  abs().max(axis), divide, clip, e4m3 encoding by integer bit manipulation);
  its result is compared with cugemm8's (the ``same bits`` column).

Nothing here asserts; problems are reported in the table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cupy as cp          # noqa: E402
import ml_dtypes           # noqa: E402
import numpy as np         # noqa: E402

import common              # noqa: E402
from cugemm8 import quant  # noqa: E402

# ----------------------------------------------------------------------------
# Timing (the L2 flush, CUDA-event timing and the copy ceiling are
# benches/common.py's, shared with bench_gemm.py)
# ----------------------------------------------------------------------------

def time_us(fn, *, reps: int, warmup: int, flush) -> float:
    """Median kernel time in microseconds (see common.time_calls)."""
    return common.time_call(fn, reps=reps, warmup=warmup, flush=flush).median


def same_size_copy(nbytes: int):
    """A callable doing a cudaMemcpyAsync that moves ``nbytes`` bytes in all
    (half read, half written); the buffers live as long as the callable."""
    half = max(nbytes // 2, 1)
    src = cp.empty(half, dtype=cp.uint8)
    dst = cp.empty(half, dtype=cp.uint8)
    src.fill(1)
    return lambda: dst.data.copy_from_device_async(src.data, half)


# ----------------------------------------------------------------------------
# The plain-CuPy baseline
# ----------------------------------------------------------------------------

def _e4m3_bits(q):
    """float32 values already clipped to [-448, 448] (NaN allowed) -> e4m3fn
    bit patterns, round to nearest even, with CuPy array expressions."""
    bits = q.view(cp.uint32)
    sign = ((bits >> 31) << 7).astype(cp.uint8)
    a = cp.abs(q)
    ab = a.view(cp.uint32)
    # normals (|q| >= 2^-6): round the 23-bit fraction to 3 bits (RNE) in place
    r = ab + cp.uint32(0x7FFFF) + ((ab >> 20) & cp.uint32(1))
    normal = (((r >> 23).astype(cp.int32) - 120) << 3) | ((r >> 20) & cp.uint32(7)).astype(cp.int32)
    # subnormals: multiples of 2^-9 (rint is RNE)
    sub = cp.rint(a * cp.float32(512.0)).astype(cp.int32)
    code = cp.where(a >= cp.float32(2.0 ** -6), normal, sub)
    code = cp.where(cp.isnan(q), 0x7F, code).astype(cp.uint8)
    return code | sign


def cupy_per_token(x, min_amax=1e-4):
    m, k = x.shape
    kb = -(-k // 128)
    xf = x.astype(cp.float32)
    if kb * 128 != k:
        xf = cp.pad(xf, ((0, 0), (0, kb * 128 - k)))
    g = xf.reshape(m, kb, 128)
    amax = cp.maximum(cp.abs(g).max(axis=-1), cp.float32(min_amax))
    scale = amax / cp.float32(448.0)
    q = cp.clip(g / scale[..., None], cp.float32(-448.0), cp.float32(448.0))
    a = _e4m3_bits(q).reshape(m, kb * 128)[:, :k]
    m_pad = -(-m // 4) * 4
    sfa = cp.zeros((kb, m_pad), dtype=cp.float32)
    sfa[:, :m] = scale.T
    return a, sfa[:, :m].T


def cupy_per_block(w, min_amax=1e-4):
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    wf = w.astype(cp.float32)
    if (nb * 128, kb * 128) != (n, k):
        wf = cp.pad(wf, ((0, nb * 128 - n), (0, kb * 128 - k)))
    t = wf.reshape(nb, 128, kb, 128)
    amax = cp.maximum(cp.abs(t).max(axis=(1, 3)), cp.float32(min_amax))
    scale = amax / cp.float32(448.0)
    q = cp.clip(t / scale[:, None, :, None], cp.float32(-448.0), cp.float32(448.0))
    b = _e4m3_bits(q).reshape(nb * 128, kb * 128)[:n, :k]
    return b, scale


def same_bits(mine, base) -> bool:
    (p1, s1), (p2, s2) = mine, base
    return bool(cp.array_equal(p1, p2)) and bool(cp.array_equal(s1.view(cp.uint32), s2.view(cp.uint32)))


# ----------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------

def case_bytes(kind: str, rows: int, k: int, item: int) -> int:
    kb = -(-k // 128)
    if kind == "per_token":
        return rows * k * item + rows * k + kb * (-(-rows // 4) * 4) * 4
    if kind == "transpose_column":          # payload [k, rows_pad16], scales [k, ceil(rows/128)]
        return rows * k * item + k * (-(-rows // 16) * 16) + k * (-(-rows // 128)) * 4
    if kind == "transpose_block":
        return rows * k * item + k * (-(-rows // 16) * 16) + (-(-rows // 128)) * kb * 4
    return rows * k * item + rows * k + (-(-rows // 128)) * kb * 4


#: the function of each case kind
FUNCS = {"per_token": "per_token_cast_to_fp8", "per_block": "per_block_cast_to_fp8",
         "transpose_column": "per_token_cast_to_fp8_t", "transpose_block": "cast_transpose_block_fp8"}


def _input(rng, shape, dtype):
    host = (rng.standard_normal(shape, dtype=np.float32)
            * np.exp2(rng.integers(-3, 4, shape[:-1] + (1,))).astype(np.float32))
    return cp.asarray(host.astype(dtype))


def _cases(extra: bool) -> list:
    """(label, kind, build(rng) -> x, keyword arguments, baseline or None)."""
    bf16 = ml_dtypes.bfloat16
    cases = [
        ("per_token [4096, 7168] bf16", "per_token", lambda r: _input(r, (4096, 7168), bf16), {}, cupy_per_token),
        ("per_token [128, 7168] bf16", "per_token", lambda r: _input(r, (128, 7168), bf16), {}, cupy_per_token),
        ("per_block [7168, 7168] bf16", "per_block", lambda r: _input(r, (7168, 7168), bf16), {}, cupy_per_block),
        # the backward pass's transposing casts (issue 21): wgrad operands and W^T
        ("per_token_t [4096, 7168] bf16", "transpose_column", lambda r: _input(r, (4096, 7168), bf16), {}, None),
        ("per_token_t [4096, 2048] bf16", "transpose_column", lambda r: _input(r, (4096, 2048), bf16), {}, None),
        ("cast_transpose [7168, 7168] bf16", "transpose_block", lambda r: _input(r, (7168, 7168), bf16), {},
         None),
        ("per_token_t [4096, 7168] fp32", "transpose_column", lambda r: _input(r, (4096, 7168), np.float32), {},
         None),
    ]
    if extra:
        cases += [
            ("per_token [2048, 7168] bf16", "per_token", lambda r: _input(r, (2048, 7168), bf16), {}, None),
            ("per_token [4096, 7168] fp32", "per_token", lambda r: _input(r, (4096, 7168), np.float32), {}, None),
            ("per_token [4096, 7168] fp16", "per_token", lambda r: _input(r, (4096, 7168), np.float16), {}, None),
            ("per_token [4096, 7168] bf16 pow2", "per_token", lambda r: _input(r, (4096, 7168), bf16),
             {"pow2_scale": True}, None),
            ("per_token [8, 512, 7168] bf16", "per_token", lambda r: _input(r, (8, 512, 7168), bf16), {}, None),
            ("per_token [4096, 7168/7296] bf16", "per_token",
             lambda r: _input(r, (4096, 7296), bf16)[:, :7168], {}, None),
        ]
    return cases


def case_bytes_of(kind: str, x) -> int:
    *lead, rows, k = x.shape
    g = lead[0] if lead else 1
    return g * case_bytes(kind, rows, k, x.itemsize)


def run(reps: int, warmup: int, extra: bool = False) -> dict:
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    flush = common.L2Flush()
    ceiling = common.copy_bandwidth_gbps(common.COPY_BYTES, reps=max(5, reps // 5))
    rng = np.random.default_rng(0)
    results = []
    for label, kind, build, kwargs, base in _cases(extra):
        x = build(rng)
        fn = getattr(quant, FUNCS[kind])
        nbytes = case_bytes_of(kind, x)
        t_mine = time_us(lambda: fn(x, **kwargs), reps=reps, warmup=warmup, flush=flush)
        copy = same_size_copy(nbytes)
        t_copy = time_us(copy, reps=reps, warmup=warmup, flush=flush)
        row = {"case": label, "bytes": nbytes, "us": t_mine, "gbps": nbytes / t_mine / 1e3,
               "copy_same_size_us": t_copy, "copy_same_size_gbps": nbytes / t_copy / 1e3}
        row["of_copy"] = row["gbps"] / ceiling
        row["of_same_size_copy"] = t_copy / t_mine
        # CUPTI durations (torch installed): no launch latency in either time.
        k_mine = common.kernel_times([lambda: fn(x, **kwargs)], reps=reps, flush=flush)
        k_copy = common.kernel_times([copy], reps=reps, flush=flush)
        copy = None
        if k_mine is not None:
            row["kus"] = k_mine.median
            row["k_of_copy"] = nbytes / k_mine.median / 1e3 / ceiling
            if k_copy is not None:
                row["copy_same_size_kus"] = k_copy.median
                row["k_of_same_size_copy"] = k_copy.median / k_mine.median
        if base is not None:
            try:
                t_base = time_us(lambda: base(x), reps=max(5, reps // 5), warmup=2, flush=flush)
                row["cupy_us"] = t_base
                row["speedup_vs_cupy"] = t_base / t_mine
                row["same_bits"] = same_bits(fn(x), base(x))
            except Exception as exc:  # the baseline is best effort
                row["cupy_error"] = f"{type(exc).__name__}: {exc}"
        results.append(row)
        x = None          # free the input before the next case is built
        cp.get_default_memory_pool().free_all_blocks()
    return {"device": name, "copy_gbps": ceiling, "reps": reps, "results": results}


def print_table(report: dict) -> None:
    print(f"device: {report['device']}   large D2D copy ceiling: {report['copy_gbps']:.0f} GB/s "
          f"(2 GB, read + write), median of {report['reps']} reps, cold L2")
    print("of copy: against that ceiling; same-size copy: a D2D copy moving the case's own bytes, "
          "timed the same way (its us and GB/s in the copy columns)")
    head = (f"{'case':<34}{'us':>8}{'GB/s':>8}{'of copy':>9}{'copy us':>9}{'copy GB/s':>10}"
            f"{'of same-size copy':>19}{'cupy us':>9}{'x cupy':>8}  same bits")
    print(head)
    print("-" * len(head))
    for r in report["results"]:
        cu = f"{r['cupy_us']:9.1f}{r['speedup_vs_cupy']:8.1f}" if "cupy_us" in r else \
            f"{'n/a':>9}{'':>8}"
        bits = str(r.get("same_bits", r.get("cupy_error", "n/a")))
        print(f"{r['case']:<34}{r['us']:8.1f}{r['gbps']:8.0f}{r['of_copy']:9.1%}"
              f"{r['copy_same_size_us']:9.1f}{r['copy_same_size_gbps']:10.0f}"
              f"{r['of_same_size_copy']:19.1%}{cu}  {bits}")
    if any("kus" in r for r in report["results"]):
        print("\nCUPTI kernel durations (torch.profiler: launch latency excluded, as in DeepGEMM's bench_kineto)")
        head = f"{'case':<34}{'us':>8}{'GB/s':>8}{'of copy':>9}{'copy us':>9}{'of same-size copy':>19}"
        print(head)
        print("-" * len(head))
        for r in report["results"]:
            if "kus" not in r:
                continue
            cu = (f"{r['copy_same_size_kus']:9.1f}{r['k_of_same_size_copy']:19.1%}"
                  if "copy_same_size_kus" in r else f"{'n/a':>9}{'n/a':>19}")
            print(f"{r['case']:<34}{r['kus']:8.1f}{r['bytes'] / r['kus'] / 1e3:8.0f}{r['k_of_copy']:9.1%}{cu}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--extra", action="store_true",
                    help="also time per_token on more shapes / dtypes (see the module docstring)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    report = run(args.reps, args.warmup, args.extra)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
