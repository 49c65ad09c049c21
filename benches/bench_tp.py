"""Benchmark the tensor-parallel FP8 MLP layer on N = 1 .. (visible GPUs).

    python benches/bench_tp.py [--tokens 64,1024] [--max-gpus G] [--reps 20]
                               [--reserve-sms 8] [--json OUT]
    python benches/bench_tp.py --overlap [--chunks 2] [--reserve-sms 8] [...]

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

``--overlap`` measures the overlap machinery instead (every N, one-rank NCCL
communicator included), per token count, slowest rank:

* "GEMMs" / "GEMMs -R SMs": the layer's two GEMMs alone (operands quantised
  beforehand) with every SM and with ``--reserve-sms`` R left free
  (``cugemm8.parallel.reserve_sms``); "SM cost" is their ratio - 1, what the
  reservation costs the GEMMs;
* "all-reduce": NCCL's FP32 all-reduce of the layer's output ``[tokens, 7168]``
  alone, with its algorithm bandwidth (bytes / time) and bus bandwidth
  (algbw * 2 (N-1) / N, NCCL's convention): the ceiling of the communication;
* "plain": ``cugemm8.parallel.mlp_forward`` (all-reduce after the GEMMs);
  "chunked": ``mlp_forward_overlapped(overlap=False)`` (--chunks token
  chunks, each reduced on the compute stream, every SM); "overlapped": the
  same chunks with each all-reduce on the communication stream under the next
  chunk's GEMMs and R SMs reserved; "gain" = plain / overlapped - 1.

With N = 1 the all-reduce is a one-rank copy, so the overlap has nothing to
hide; the table then shows the cost of the machinery (chunking re-reads the
weights once per chunk, the events, the reservation).

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
            rows.append({"n": n, "num_sms": sms, "tokens": tokens,
                         "compute_us": tp.median([t[0] for t in times]),
                         "comm_us": tp.median([t[1] for t in times]),
                         "layer_us": tp.median([t[2] for t in times])})
            if rank == 0:
                say(f"N={n} SMs={sms} tokens={tokens}: {rows[-1]['layer_us']:.1f} us (rank 0)")
    cugemm8.set_num_sms(total)
    return {"ok": True, "failures": [], "rows": rows, "device": info["name"], "num_sms": total}


def _time_us(fn, opts: dict, sync) -> float:
    """Median GPU time of ``fn()`` (tp.time_on_stream, back to back)."""
    def call(mid):
        fn()
        if mid is not None:
            mid.record()
    times = tp.time_on_stream(call, reps=opts["reps"], warmup=opts["warmup"], sync_ranks=sync)
    return tp.median([t[2] for t in times])


def _overlap_rank(rank: int, n: int, comm, nccl, opts: dict, say) -> dict:
    """One rank of --overlap: the GEMMs alone with and without the SM
    reservation, the all-reduce alone, and the plain, chunked and overlapped layers."""
    import cupy
    import cugemm8
    from cugemm8 import _device
    from cugemm8.parallel import mlp_forward, mlp_forward_overlapped, reserve_sms, silu_mul

    info = _device.device_info()
    w1, w2 = tp.tp_weight_slices(rank, n, seed=opts["seed"])
    w1q, w2q = cugemm8.per_block_cast_to_fp8(w1), cugemm8.per_block_cast_to_fp8(w2)
    del w1, w2
    sync = lambda: tp.barrier(comm, nccl)          # noqa: E731
    bf16 = cupy.dtype("bfloat16")
    reserve, chunks = opts["reserve_sms"], opts["chunks"]
    rows = []
    for tokens in opts["tokens"]:
        x = tp.tp_activations(tokens, seed=opts["seed"])
        a1 = cugemm8.per_token_cast_to_fp8(x)
        gate_up = cupy.empty((tokens, w1q[0].shape[0]), dtype=bf16)
        cugemm8.gemm_fp8_fp8_bf16_nt(a1, w1q, gate_up)
        a2 = cugemm8.per_token_cast_to_fp8(silu_mul(gate_up))
        y = cupy.empty((tokens, tp.HIDDEN), dtype=bf16)

        def gemms():
            cugemm8.gemm_fp8_fp8_bf16_nt(a1, w1q, gate_up)
            cugemm8.gemm_fp8_fp8_bf16_nt(a2, w2q, y)
        row = {"n": n, "tokens": tokens, "chunks": chunks, "reserve_sms": reserve,
               "gemms_us": _time_us(gemms, opts, sync)}
        with reserve_sms(reserve):
            row["gemms_reserved_us"] = _time_us(gemms, opts, sync)
        buf = cupy.zeros((tokens, tp.HIDDEN), dtype=cupy.float32)
        row["allreduce_us"] = _time_us(lambda: comm.allReduce(
            buf.data.ptr, buf.data.ptr, buf.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, tp.stream_ptr()), opts, sync)
        row["plain_us"] = _time_us(lambda: mlp_forward(x, w1q, w2q, comm=comm), opts, sync)
        row["chunked_us"] = _time_us(lambda: mlp_forward_overlapped(
            x, w1q, w2q, comm=comm, chunks=chunks, overlap=False), opts, sync)
        row["overlapped_us"] = _time_us(lambda: mlp_forward_overlapped(
            x, w1q, w2q, comm=comm, chunks=chunks, reserve=reserve), opts, sync)
        rows.append(row)
        if rank == 0:
            say(f"overlap N={n} tokens={tokens}: plain {row['plain_us']:.1f} us, overlapped "
                f"{row['overlapped_us']:.1f} us (rank 0)")
    return {"ok": True, "failures": [], "rows": rows, "device": info["name"], "num_sms": info["num_sms"]}


def _merge(results: dict, key_fields: tuple) -> list[dict]:
    """Slowest rank per key: every ``*_us`` field is the largest over the ranks."""
    merged = {}
    for rank in sorted(results):
        for row in results[rank]["rows"]:
            cur = merged.setdefault(tuple(row[f] for f in key_fields), dict(row))
            for f, v in row.items():
                if f.endswith("_us"):
                    cur[f] = max(cur[f], v)
    return list(merged.values())


def _overlap_table(rows: list[dict], device: str, reps: int, reserve: int) -> None:
    from cugemm8.cli import print_table
    table = []
    for r in sorted(rows, key=lambda r: (r["tokens"], r["n"])):
        nbytes = 4.0 * r["tokens"] * tp.HIDDEN
        r["algbw_gbs"] = nbytes / r["allreduce_us"] / 1e3
        r["busbw_gbs"] = r["algbw_gbs"] * 2 * (r["n"] - 1) / r["n"]
        r["sm_cost"] = r["gemms_reserved_us"] / r["gemms_us"] - 1
        r["gain"] = r["plain_us"] / r["overlapped_us"] - 1
        table.append((str(r["n"]), str(r["tokens"]), str(r["chunks"]), f"{r['gemms_us']:.1f}",
                      f"{r['gemms_reserved_us']:.1f}", f"{100 * r['sm_cost']:+.1f}%", f"{r['allreduce_us']:.1f}",
                      f"{r['algbw_gbs']:.0f}", f"{r['busbw_gbs']:.0f}", f"{r['plain_us']:.1f}",
                      f"{r['chunked_us']:.1f}", f"{r['overlapped_us']:.1f}", f"{100 * r['gain']:+.1f}%"))
    print_table(f"TP FP8 MLP overlap (hidden {tp.HIDDEN}, intermediate {tp.DENSE_INTER}) on {device}, "
                f"{reserve} SMs reserved, median of {reps}, slowest rank",
                ("N", "tokens", "chunks", "GEMMs us", f"GEMMs -{reserve} SMs us", "SM cost", "all-reduce us",
                 "algbw GB/s", "busbw GB/s", "plain us", "chunked us", "overlapped us", "gain"), table)


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
    p.add_argument("--overlap", action="store_true",
                   help="measure the overlap machinery instead (see the module docstring)")
    p.add_argument("--chunks", type=int, default=2, help="token chunks of --overlap (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per N (default 1200)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 0 or args.reserve_sms < 0 or args.chunks < 1:
        p.error("--reps and --chunks must be >= 1, --warmup and --reserve-sms >= 0")

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
            "reserve_sms": args.reserve_sms, "seed": args.seed, "chunks": args.chunks}
    if args.overlap:
        return _main_overlap(args, ns, skipped, opts)

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
        rows += _merge(results, ("num_sms", "tokens"))

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
    _write_json(args, device, num_sms, skipped, errors, rows)
    return 1 if errors else 0


def _write_json(args, device, num_sms, skipped, errors, rows) -> None:
    if not args.json:
        return
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "mode": "overlap" if args.overlap else "scaling", "device": device, "num_sms": num_sms,
           "reps": args.reps, "warmup": args.warmup, "tokens": args.tokens, "reserve_sms": args.reserve_sms,
           "chunks": args.chunks, "skipped_n": skipped, "errors": {str(k): v for k, v in errors.items()},
           "rows": rows, "env": dict(tp.MULTICAST_OFF_ENV)}
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"bench_tp: wrote {args.json}", flush=True)


def _main_overlap(args, ns: list[int], skipped: list[int], opts: dict) -> int:
    """--overlap: every N with a communicator (one rank included), one table."""
    rows, errors, device, num_sms = [], {}, None, None
    for n in ns:
        print(f"bench_tp: --overlap N = {n} ...", flush=True)
        results, error = tp.run_ranks(_overlap_rank, n, opts, timeout_s=args.timeout, need_comm=True)
        if error is not None:
            errors[n] = error
            print(f"bench_tp: N = {n} FAILED: {error}", flush=True)
            continue
        device, num_sms = results[0]["device"], results[0]["num_sms"]
        rows += _merge(results, ("tokens",))
    if rows:
        _overlap_table(rows, device, args.reps, args.reserve_sms)
    _write_json(args, device, num_sms, skipped, errors, rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
