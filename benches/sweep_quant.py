"""Sweep of the per-token quantiser's work split (chunks per warp).

    python benches/sweep_quant.py [--reps 40] [--per-task 1 --per-task 2 ...] [--json OUT]

``per_token_cast_kernel`` gives each warp ``chunks_per_task`` consecutive
512-byte chunks of one row (``cugemm8.quant._per_token_split`` picks 4, 2
or 1).  For each case (bfloat16 / float16 / float32 activations of
DeepSeek-V3 sizes, prefill to decode, a K tail, a 3-D batch, a padded row
pitch) this times ``per_token_cast_to_fp8`` with the library's own split
and with each forced ``--per-task`` value (default 1, 2 and 4), and checks
every forced result bit for bit against the library's (which
tests/test_quant_gpu.py checks against the NumPy reference).

Times are CUPTI kernel durations (torch installed) or CUDA-event medians,
with L2 flushed before each repetition; ``%`` is of a 2 GB device copy
measured in the same run (bytes read + written, scales included).
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
from bench_quant import case_bytes_of, same_bits  # noqa: E402
from cugemm8 import quant as Q  # noqa: E402


def cases():
    bf16 = ml_dtypes.bfloat16

    def make(shape, dtype, cols=None):
        def build(rng):
            scale = np.exp2(rng.integers(-8, 8, size=shape[:-1] + (1,))).astype(np.float32)
            x = cp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)
            return x if cols is None else x[..., :cols]
        return build
    rows = [("[4096, 7168] bf16", make((4096, 7168), bf16)),
            ("[4096, 7168] fp16", make((4096, 7168), np.float16)),
            ("[4096, 7168] fp32", make((4096, 7168), np.float32)),
            ("[8, 512, 7168] bf16", make((8, 512, 7168), bf16)),
            ("[4096, 7168/7296] bf16", make((4096, 7296), bf16, 7168)),
            ("[4096, 2112] bf16", make((4096, 2112), bf16)),
            ("[4000, 7184] bf16", make((4000, 7184), bf16))]
    rows += [(f"[{m}, 7168] bf16", make((m, 7168), bf16))
             for m in (2048, 1024, 768, 512, 384, 256, 128, 64)]
    return rows


def timed(fn, reps, flush):
    k = common.kernel_times([fn], reps=reps, flush=flush)
    if k is not None:
        return k.median, "cupti"
    return common.time_call(fn, reps=reps, warmup=3, flush=flush).median, "events"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--per-task", type=int, action="append", default=None,
                    help="chunks per warp to force (repeatable; default 1, 2, 4)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    per_tasks = args.per_task or [1, 2, 4]
    flush = common.L2Flush()
    ceiling = common.copy_bandwidth_gbps(common.COPY_BYTES, reps=10)
    num_sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    rng = np.random.default_rng(0)
    results, timer = [], ""
    for label, build in cases():
        x = build(rng)
        *lead, rows, k = x.shape
        rows_all = rows * (lead[0] if lead else 1)

        def fn():
            return Q.per_token_cast_to_fp8(x)
        ref = fn()
        t_lib, timer = timed(fn, args.reps, flush)
        chunks = -(-k // (32 * (16 // x.itemsize)))
        row = {"case": label, "bytes": case_bytes_of("per_token", x), "library_us": t_lib,
               "library_split": list(Q._per_token_split(rows_all, k, x.itemsize, num_sms)),
               "forced": {}}
        saved = Q._per_token_split
        for p in per_tasks:
            Q._per_token_split = lambda *a, p=p: (-(-chunks // p), p)
            try:
                got = fn()
                row["forced"][str(p)] = {"us": timed(fn, args.reps, flush)[0],
                                         "exact": same_bits(got, ref)}
            finally:
                Q._per_token_split = saved
        results.append(row)
        x = ref = None
        cp.get_default_memory_pool().free_all_blocks()

    report = {"copy_gbps": ceiling, "num_sms": num_sms, "timer": timer, "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"2 GB copy: {ceiling:.0f} GB/s; us ({timer}) and % of that copy; "
          f"* = result differs from the library split's")
    head = f"{'case':<24}{'split':>7}{'library':>16}" + "".join(f"{'p=' + str(p):>16}" for p in per_tasks)
    print(head)
    print("-" * len(head))
    for r in results:
        def cell(us, ok=True):
            return f"{us:7.1f} {r['bytes'] / us / 1e3 / ceiling:6.1%}{'' if ok else '*'}"
        line = f"{r['case']:<24}{r['library_split'][1]:>7}{cell(r['library_us']):>16}"
        for p in per_tasks:
            f = r["forced"][str(p)]
            line += f"{cell(f['us'], f['exact']):>16}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
