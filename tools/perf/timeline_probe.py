"""Per-CTA timeline of the normal GEMM kernel from in-kernel clocks (one GPU call).

    python tools/perf/timeline_probe.py [M N K "CONFIG"]... [--json OUT]

Builds an instrumented copy of ``cuda_src/`` (text insertions, as in
``tools/perf/variant_sweep.py``) whose kernel writes ``%clock64`` (and
``%globaltimer`` at entry and exit) at fixed points of each CTA's first tile
into a buffer passed in the normal GEMM's unused ``grouped_layout``
argument, runs each configuration once cold (L2 flushed) after a warm-up
and once warm (right after another launch: operands in L2), and prints the
medians over CTAs, in microseconds:

* ``prologue``: entry -> the producer's first TMA issue (barrier init,
  descriptor prefetch, CTA/cluster sync, scheduler);
* ``sfb``: entry -> the math warpgroup's B scales staged (global loads);
* ``first``: first TMA issue -> first full barrier (first stage landed);
* ``per kb``: mean time per K block between the first and the last stage
  arrivals (the steady-state feed);
* ``tail``: last stage landed -> K loop done (last WGMMA + promotion);
* ``epi``: K loop done (split K: the exchange done, rank 0) -> TMA store
  issued; ``drain``: -> store's smem read done (split K: rank 0's CTAs, the
  ones that store); ``total``: entry -> exit;
* ``exchange`` (split K): K loop done -> the pair's partial tile sent
  (rank 1) or received and added (rank 0);
* ``cwait`` / ``pwait``: the math warpgroup's time waiting on full barriers
  in its first tile's K loop after the first block (the first block's wait
  is ``first``), and the producer's waiting on empty barriers
  (all its tiles), as fractions of that K loop (first stage landed -> loop
  done): a starved math warpgroup (high cwait) is bound by the feed, a
  producer waiting on a full ring with a low cwait by the math;
* ``skew``: spread of CTA entry times (globaltimer), ``span``: first entry
  -> last exit over the grid.

The clock rate comes from each CTA's own globaltimer / clock64 pair.  This
is a diagnostic for M <= 128 shapes (one tile per CTA); only the first tile
of each CTA is recorded.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))
sys.path.insert(2, str(_HERE))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

import common  # noqa: E402
import cugemm8  # noqa: E402
from cugemm8 import _jit, gemm as G  # noqa: E402
from cugemm8.cli import Shape, bf16_to_f64, calc_diff, make_operands, poisoned_out, reference  # noqa: E402
from sweep_configs import parse_config  # noqa: E402
from variant_sweep import make_tree, variant  # noqa: E402

K = "fp8_gemm_1d2d.cuh"
SLOTS = 16
# (file, exact text, replacement): instrumentation points.
PROBE = [
    (K, "  const uint32_t producer_leader = T::kNumMathThreads;\n",
     "  const uint32_t producer_leader = T::kNumMathThreads;\n"
     "  unsigned long long* probe_ts = reinterpret_cast<unsigned long long*>(\n"
     "      const_cast<int32_t*>(grouped_layout)) + blockIdx.x * 16;\n"
     "  auto probe_clock = [] { unsigned long long c; asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(c)); return c; };\n"
     "  auto probe_gt = [] { unsigned long long c; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(c)); return c; };\n"
     "  if (threadIdx.x == producer_leader) {\n"
     "    uint32_t sm; asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(sm));\n"
     "    probe_ts[0] = probe_gt(); probe_ts[1] = probe_clock(); probe_ts[11] = sm;\n"
     "  }\n"),
    (K, "    if (threadIdx.x == producer_leader) {\n      PipeState<kNumStages> pipe;\n",
     "    if (threadIdx.x == producer_leader) {\n      PipeState<kNumStages> pipe;\n"
     "      bool probe_first_p = true;\n      unsigned long long probe_pwait = 0;\n"),
    (K, "          uint64_t* bar = producer_acquire(pipe, full_bar, empty_bar, tx_bytes);\n",
     "          const unsigned long long probe_p0 = probe_clock();\n"
     "          uint64_t* bar = producer_acquire(pipe, full_bar, empty_bar, tx_bytes);\n"
     "          probe_pwait += probe_clock() - probe_p0;\n          probe_ts[15] = probe_pwait;\n"),
    (K, "          continue;\n        }\n        const int32_t a_row",
     "          continue;\n        }\n"
     "        if (probe_first_p) { probe_ts[2] = probe_clock(); probe_first_p = false; }\n"
     "        const int32_t a_row"),
    (K, "    uint32_t red_phase = 0;   // split K across the cluster: exchanges done, mod 2\n",
     "    uint32_t red_phase = 0;   // split K across the cluster: exchanges done, mod 2\n"
     "    bool probe_first_m = true;\n    unsigned long long probe_cwait = 0;\n    uint32_t probe_j = 0;\n"),
    (K, "        warp_copy_f32<kCount>(warp_sfb, sfb_tile, valid, lane);\n",
     "        warp_copy_f32<kCount>(warp_sfb, sfb_tile, valid, lane);\n"
     "        if (threadIdx.x == 0 && probe_first_m) probe_ts[3] = probe_clock();\n"),
    (K, "              mbarrier_wait(full_bar + stage, pipe.phase);\n              // Read this stage's A scales",
     "              const unsigned long long probe_w0 = probe_clock();\n"
     "              mbarrier_wait(full_bar + stage, pipe.phase);\n"
     "            if (threadIdx.x == 0 && probe_first_m) {\n"
     "              if (j > 0) probe_cwait += probe_clock() - probe_w0;\n"
     "              if (j == 0) probe_ts[4] = probe_clock();\n"
     "              if (j + 2 >= kCount) { probe_ts[5] = probe_clock(); probe_ts[13] = j; }\n"
     "            }\n"
     "              // Read this stage's A scales"),
    # the pipelined K loop (kPipelineMma): its `start` waits for each block's stage
    (K, "              mbarrier_wait(full_bar + stage, pipe.phase);\n              const uint32_t r = row_off(0)",
     "              const unsigned long long probe_w0 = probe_clock();\n"
     "              mbarrier_wait(full_bar + stage, pipe.phase);\n"
     "              if (threadIdx.x == 0 && probe_first_m) {\n"
     "                if (probe_j > 0) probe_cwait += probe_clock() - probe_w0;\n"
     "                if (probe_j == 0) probe_ts[4] = probe_clock();\n"
     "                if (probe_j + 2 >= count) { probe_ts[5] = probe_clock(); probe_ts[13] = probe_j; }\n"
     "                ++probe_j;\n"
     "              }\n"
     "              const uint32_t r = row_off(0)"),
    (K, "          red_phase ^= 1;\n",
     "          red_phase ^= 1;\n"
     "          if (threadIdx.x == 0 && probe_first_m) probe_ts[12] = probe_clock();\n"),
    (K, "        dispatch_num_former<BLOCK_N>(n0, k_loop);\n",
     "        dispatch_num_former<BLOCK_N>(n0, k_loop);\n"
     "        if (threadIdx.x == 0 && probe_first_m) { probe_ts[6] = probe_clock(); probe_ts[14] = probe_cwait; }\n"),
    (K, "        if (issued) tma_store_commit();\n      }\n    }\n",
     "        if (issued) tma_store_commit();\n"
     "        if (threadIdx.x == 0 && probe_first_m) probe_ts[7] = probe_clock();\n      }\n"
     "      probe_first_m = false;\n    }\n"),
    (K, "    if (tid == 0) tma_store_wait_read<0>();\n  }\n",
     "    if (tid == 0) tma_store_wait_read<0>();\n"
     "    if (threadIdx.x == 0) probe_ts[8] = probe_clock();\n  }\n"),
    (K, "    cluster_sync();\n  }\n}\n\n}  // namespace cugemm8",
     "    cluster_sync();\n  }\n"
     "  if (threadIdx.x == 0) { probe_ts[9] = probe_clock(); probe_ts[10] = probe_gt(); }\n"
     "}\n\n}  // namespace cugemm8"),
]

DEFAULT = [(128, 4096, 7168, "64x64 s12"), (64, 4096, 7168, "64x32 s16"),
           (64, 2112, 7168, "64x32 s16 k2"), (64, 2112, 7168, "64x16 s16"),
           (128, 7168, 16384, "128x64 s8"), (128, 7168, 2048, "128x64 s8"),
           (64, 32768, 512, "64x128 s6")]


def summarise(ts: np.ndarray, ctas: int) -> dict:
    t = ts[:ctas].astype(np.float64)
    cyc_total = t[:, 9] - t[:, 1]
    ns_total = t[:, 10] - t[:, 0]
    ghz = np.median(cyc_total / np.maximum(ns_total, 1))
    us = lambda a, b: np.median(t[:, b] - t[:, a]) / ghz / 1e3  # noqa: E731
    # With split K only rank 0 (even CTAs) runs the epilogue (slots 7, 8).
    split_any = bool((t[:, 12] > 0).any())
    stores = t[0::2] if split_any else t
    us_st = lambda a, b: np.median(stores[:, b] - stores[:, a]) / ghz / 1e3  # noqa: E731
    # slot 4: the first K block's stage landed (j = 0); slot 5: a late one
    # (j = slot 13), both seen by warpgroup 0's first thread
    valid = (t[:, 5] > t[:, 4]) & (t[:, 13] > 0)
    per_kb = (np.median((t[valid, 5] - t[valid, 4]) / t[valid, 13]) / ghz / 1e3) if valid.any() else 0.0
    kloop = (t[:, 6] - t[:, 1]) / ghz / 1e3    # entry -> K loop done, per CTA
    split = t[:, 12] > 0                      # split K: the pair exchange ran
    xchg0 = np.median(t[0::2, 12][split[0::2]] - t[0::2, 6][split[0::2]]) / ghz / 1e3 if split[0::2].any() else 0.0
    xchg1 = np.median(t[1::2, 12][split[1::2]] - t[1::2, 6][split[1::2]]) / ghz / 1e3 if split[1::2].any() else 0.0
    return {"ghz": ghz, "xchg_rank0": xchg0, "xchg_rank1": xchg1,
            "kloop_rank0": float(np.median(kloop[0::2])), "kloop_rank1": float(np.median(kloop[1::2])),
            "raw": ts[:ctas].tolist(), "prologue": us(1, 2), "sfb": us(1, 3), "first": us(2, 4), "per_kb": per_kb,
            "tail": us(5, 6), "epi": us_st(12 if split_any else 6, 7), "drain": us_st(7, 8), "total": us(1, 9),
            "skew": (t[:, 0].max() - t[:, 0].min()) / 1e3, "span": (t[:, 10].max() - t[:, 0].min()) / 1e3,
            "first_max": np.max(t[:, 4] - t[:, 2]) / ghz / 1e3,
            # waits as fractions of the first tile's K loop (first stage landed -> loop done):
            # the math warpgroup's on full barriers, the producer's on empty ones (all its tiles)
            "cwait": float(np.median(t[:, 14] / np.maximum(t[:, 6] - t[:, 4], 1))),
            "pwait": float(np.median(t[:, 15] / np.maximum(t[:, 6] - t[:, 4], 1))),
            "sms": len(set(t[:, 11].astype(int).tolist()))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="M N K CONFIG, repeated (CONFIG 'pick': the op's own)")
    p.add_argument("--json")
    p.add_argument("--variant", metavar="PLAN.json:NAME",
                   help="apply that variant_sweep plan variant's text replacements to the kernel "
                        "first (a probe that removes work: its output is not checked here)")
    p.add_argument("--spin", type=int, default=0, metavar="N",
                   help="queue N float32 4096^3 matmuls (no sync) right before each measured "
                        "launch, so the SM clock is at its busy value")
    args = p.parse_args(argv)
    spin_x = cp.ones((4096, 4096), dtype=cp.float32) if args.spin else None
    cases = DEFAULT
    if args.cases:
        c = args.cases
        cases = [(int(c[i]), int(c[i + 1]), int(c[i + 2]), c[i + 3]) for i in range(0, len(c), 4)]
    tmp = Path(tempfile.mkdtemp(prefix="cugemm8_timeline_"))
    extra = []
    if args.variant:
        plan_path, name = args.variant.rsplit(":", 1)
        extra = [list(r) for r in json.loads(Path(plan_path).read_text())["variants"][name].get("replace", [])]
    tree = make_tree(_jit.cuda_src_dir(), {"replace": extra + [list(r) for r in PROBE]}, tmp / "probe")
    num_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    flush = common.L2Flush()
    rows = []
    print(f"{'shape':16s} {'config':22s} {'GHz':>5s} {'prolog':>6s} {'sfb':>5s} {'first':>6s} "
          f"{'(max)':>6s} {'per kb':>7s} {'tail':>5s} {'epi':>5s} {'drain':>5s} {'total':>6s} "
          f"{'skew':>5s} {'span':>6s}  (us)")
    with variant(tree, {}):
        for m, n, k, text in cases:
            shape = Shape("normal", m, n, k)
            cfg = (cugemm8.get_gemm_config("normal", m, n, k) if text == "pick"
                   else parse_config(text, shape, num_sms))
            ops = make_operands(shape, cp, seed=0)
            out = poisoned_out(shape, ops, cp)
            ts = cp.zeros((cfg.num_sms, SLOTS), dtype=cp.uint64)
            layout = ts.view(cp.int32)
            sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
            launch = G._prepare_launch(cfg, "normal", n, k, 1, m, m, ops["a"], sfa, ops["b"],
                                       ops["sfb"], out, layout, 1)
            for cold in (True, False):
                for _ in range(3):
                    launch()
                cp.cuda.runtime.deviceSynchronize()
                ts.fill(0)
                for _ in range(args.spin):
                    spin_x @ spin_x
                if cold:
                    flush()
                launch()
                cp.cuda.runtime.deviceSynchronize()
                ref, _ = reference(ops, shape, cp)
                diff = calc_diff(bf16_to_f64(out, cp), ref, cp)
                s = summarise(cp.asnumpy(ts), cfg.num_sms)
                s.update(shape=f"{m}x{n}x{k}", config=str(cfg), calc_diff=diff, cold=cold)
                rows.append(s)
                print(f"{s['shape']:16s} {s['config'] + (' cold' if cold else ' warm'):22s} {s['ghz']:5.2f} "
                      f"{s['prologue']:6.2f} {s['sfb']:5.2f} "
                      f"{s['first']:6.2f} {s['first_max']:6.2f} {s['per_kb']:7.3f} {s['tail']:5.2f} {s['epi']:5.2f} "
                      f"{s['drain']:5.2f} {s['total']:6.2f} {s['skew']:5.2f} {s['span']:6.2f}"
                      f"  diff {diff:.1e}"
                      + f"  cwait {s['cwait']:.2f} pwait {s['pwait']:.2f}"
                      + (f"  exchange: rank0 {s['xchg_rank0']:.2f} rank1 {s['xchg_rank1']:.2f}"
                         f"  K loop done: rank0 {s['kloop_rank0']:.2f} rank1 {s['kloop_rank1']:.2f}"
                         if cfg.num_k_splits == 2 else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
