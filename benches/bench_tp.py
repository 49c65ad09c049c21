"""Benchmark the tensor-parallel FP8 MLP layer on N = 1 .. (visible GPUs).

    python benches/bench_tp.py [--tokens 64,1024] [--max-gpus G] [--reps 20]
                               [--reserve-sms 8] [--json OUT]

The layer is the DeepSeek-V3 dense MLP of examples/tensor_parallel.py
(hidden 7168, intermediate 18432): per rank, per-token FP8 quantisation of x,
the column-parallel W1 GEMM (gate and up, 2 * 18432 / N outputs), SiLU-mul,
quantisation, the row-parallel W2 GEMM (K = 18432 / N), the BF16 -> FP32 cast
and an NCCL all-reduce (cupy.cuda.nccl, FP32 sum) on CuPy's current stream.
N = 1 is the plain single-GPU layer, without NCCL.  N runs only where
18432 / N is a multiple of 128 (N divides 144), so the per-block weight scales
never straddle ranks.

Method: one process per GPU (spawn), NCCL unique id shared through a queue,
NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 in the parent and in every child).  Per rank: 3 warm-up
layers, a barrier, then a spin kernel holds the stream while --reps layers are
queued, so the CUDA events see back-to-back GPU work rather than Python launch
gaps.  Per rank the median over the repetitions; the table reports the
slowest rank (the layer is done when every rank is).  No L2 flush: the FP8
weights (264 + 132 MB / N) do not fit in the 60 MB L2 anyway for N <= 4.

Columns: "GEMMs+quant" is start -> after the second GEMM and the cast,
"all-reduce" the rest; TFLOPS/GPU = 2 * tokens * 7168 * (2 * 18432 + 18432) / N
over the layer time, total = N times that; efficiency = (N = 1 layer time) /
(N * layer time), against the N = 1 run with every SM.

The second variant calls cugemm8.set_num_sms(num_sms - --reserve-sms) on every
GPU, the setting one would use to leave SMs to a communication kernel running
concurrently.  This layer runs the all-reduce after the GEMMs (no overlap), so
the variant shows what the GEMMs lose by giving up those SMs, the price of any
overlap scheme.

This script reports; it verifies nothing (examples/tensor_parallel.py
--check-only does).  Exit status 0, 1 if a run failed, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent / "examples", _HERE.parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import tensor_parallel as tp  # noqa: E402  (examples/tensor_parallel.py)

FLOPS_PER_TOKEN = 2.0 * tp.HIDDEN * (2 * tp.DENSE_INTER + tp.DENSE_INTER)


def _bench_rank(rank: int, n: int, comm, nccl, opts: dict, say) -> dict:
    """One rank: build its weight slices, time the layer for every variant and token count."""
    import cugemm8
    from cugemm8 import _device

    info = _device.device_info()
    total = info["num_sms"]
    w1, w2 = tp.tp_weight_slices(rank, n, seed=opts["seed"])
    w1q, w2q = cugemm8.per_block_cast_to_fp8(w1), cugemm8.per_block_cast_to_fp8(w2)
    del w1, w2
    sync = (lambda: tp.barrier(comm, nccl)) if comm is not None else None
    rows = []
    variants = [total] + ([total - opts["reserve_sms"]] if opts["reserve_sms"] else [])
    for sms in variants:
        cugemm8.set_num_sms(sms)
        for tokens in opts["tokens"]:
            x = tp.tp_activations(tokens, seed=opts["seed"])

            def layer(mid, x=x):
                return tp.mlp_forward(x, w1q, w2q, comm=comm, nccl=nccl, mid_event=mid)

            times = tp.time_on_stream(layer, reps=opts["reps"], warmup=opts["warmup"],
                                      sync_ranks=sync)
            rows.append({"num_sms": sms, "tokens": tokens,
                         "compute_us": tp.median([t[0] for t in times]),
                         "comm_us": tp.median([t[1] for t in times]),
                         "layer_us": tp.median([t[2] for t in times])})
            if rank == 0:
                say(f"N={n} SMs={sms} tokens={tokens}: {rows[-1]['layer_us']:.1f} us (rank 0)")
    cugemm8.set_num_sms(total)
    return {"ok": True, "failures": [], "rows": rows, "device": info["name"], "num_sms": total}


def _merge(n: int, results: dict) -> list[dict]:
    """Slowest rank per (SMs, tokens)."""
    merged = {}
    for rank in sorted(results):
        for row in results[rank]["rows"]:
            key = (row["num_sms"], row["tokens"])
            cur = merged.setdefault(key, {"n": n, "num_sms": row["num_sms"], "tokens": row["tokens"],
                                          "compute_us": 0.0, "comm_us": 0.0, "layer_us": 0.0})
            for f in ("compute_us", "comm_us", "layer_us"):
                cur[f] = max(cur[f], row[f])
    return list(merged.values())


def main(argv=None) -> int:
    tp.multicast_off()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=tp.parse_tokens, default=tp.parse_tokens("64,1024"),
                   help="comma-separated batch sizes (default 64,1024)")
    p.add_argument("--max-gpus", type=int, default=None, help="largest N (default: all visible)")
    p.add_argument("--reps", type=int, default=20, help="timed layers per case (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed layers first (default 3)")
    p.add_argument("--reserve-sms", type=int, default=8,
                   help="SMs left free in the second variant (default 8; 0: no second variant)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per N (default 1200)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 0 or args.reserve_sms < 0:
        p.error("--reps must be >= 1, --warmup and --reserve-sms >= 0")

    count, why = tp.visible_gpus()
    if count == 0:
        print(f"bench_tp: no GPU: {why}", flush=True)
        return 2
    max_n = count if args.max_gpus is None else min(count, args.max_gpus)
    ns, skipped = [], []
    for n in range(1, max_n + 1):
        try:
            tp.tp_split(n)
            ns.append(n)
        except ValueError:
            skipped.append(n)
    if skipped:
        print(f"bench_tp: skipping N = {skipped}: 18432 / N is not a multiple of 128", flush=True)
    opts = {"tokens": args.tokens, "reps": args.reps, "warmup": args.warmup,
            "reserve_sms": args.reserve_sms, "seed": args.seed}

    rows, errors, device, num_sms = [], {}, None, None
    for n in ns:
        print(f"bench_tp: N = {n} ...", flush=True)
        results, error = tp.run_ranks(_bench_rank, n, opts, timeout_s=args.timeout,
                                      need_comm=n > 1)
        if error is not None:
            errors[n] = error
            print(f"bench_tp: N = {n} FAILED: {error}", flush=True)
            continue
        device, num_sms = results[0]["device"], results[0]["num_sms"]
        rows += _merge(n, results)

    base = {r["tokens"]: r["layer_us"] for r in rows if r["n"] == 1 and r["num_sms"] == num_sms}
    for r in rows:
        flops = FLOPS_PER_TOKEN * r["tokens"]
        r["tflops_per_gpu"] = flops / r["n"] / r["layer_us"] / 1e6
        r["tflops_total"] = flops / r["layer_us"] / 1e6
        b = base.get(r["tokens"])
        r["efficiency"] = b / (r["n"] * r["layer_us"]) if b else None
    rows.sort(key=lambda r: (-r["num_sms"], r["tokens"], r["n"]))

    from cugemm8.cli import print_table
    table = [(str(r["num_sms"]), str(r["n"]), str(r["tokens"]), f"{r['layer_us']:.1f}",
              f"{r['compute_us']:.1f}", f"{r['comm_us']:.1f}", f"{r['tflops_per_gpu']:.0f}",
              f"{r['tflops_total']:.0f}",
              "-" if r["efficiency"] is None else f"{100 * r['efficiency']:.0f}%")
             for r in rows]
    print_table(f"TP FP8 MLP (hidden {tp.HIDDEN}, intermediate {tp.DENSE_INTER}) on {device}, "
                f"median of {args.reps}, slowest rank",
                ("SMs", "N", "tokens", "layer us", "GEMMs+quant us", "all-reduce us",
                 "TFLOPS/GPU", "TFLOPS total", "eff vs N=1"), table)
    if args.json:
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": device, "num_sms": num_sms, "reps": args.reps, "warmup": args.warmup,
               "tokens": args.tokens, "reserve_sms": args.reserve_sms, "skipped_n": skipped,
               "errors": {str(k): v for k, v in errors.items()}, "rows": rows,
               "env": dict(tp.MULTICAST_OFF_ENV)}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"bench_tp: wrote {args.json}", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
