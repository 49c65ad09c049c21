"""Whether FP32 promotion work overlaps a warpgroup's FP8 WGMMAs (one GPU call).

    python tools/perf/overlap_probe.py [--iters 1024] [--json OUT]

The 1D1D GEMM (``cuda_src/fp8_gemm_1d1d.cuh``) promotes with two FP32 ops
per accumulator element (``fma(sa * sb, acc, final)``), half the tensor
core's time for the same tile at full rate (2 ops / 128 FP32 lanes against
128 MACs / 4096 FP8 MACs per SM cycle).  Forms of its K loop that give the
promotion a WGMMA to hide behind (N halves, two accumulators) measured no
faster (benches/RESULTS.md v0.25).  This probe times, per 128-deep K block
(four ``wgmma.mma_async.m64nNk32.f32.e4m3.e4m3``, operands zeros in shared
memory, ``%clock64``, median over 132 CTAs of one or two warpgroups):

* ``mma``: the WGMMAs, then ``wait_group 0``;
* ``fp``: the promotion's work (its scale loads from shared memory and
  2 x N/2 FP32 ops per thread) on registers that no WGMMA touches;
* ``mma||fp``: the WGMMAs issued, the same FP32 ops on those other registers
  while they run, then ``wait_group 0``;
* ``serial``: the WGMMAs, ``wait_group 0``, then the FP32 ops on the
  accumulator (the 1D1D kernel's order).

* ``fp_regs``: ``fp`` with the scales in registers (no loads);
* ``pre||fp``: the scales loaded from shared memory *before* the WGMMAs are
  issued, the FP32 ops after, then ``wait_group 0``;
* ``mma||fp_ldg``: ``mma||fp`` with the scales from global memory
  (``ld.global.nc``) instead of shared memory;
* ``split`` (two warpgroups): warpgroup 0 runs ``mma``, warpgroup 1
  ``fp_regs`` at the same time; printed as the two warpgroups' cycles per
  block (the cleanest test: no instruction order inside a warp to blame);
* ``split_int``: ``split`` with warpgroup 1's FMULs replaced by integer
  adds (the product of two power-of-two scales as an exponent add), so
  half its operations leave the FP32 pipe.

``mma||fp`` near ``max(mma, fp)`` says the pipes overlap; near ``mma + fp``
that they do not.  The instruction order inside one warp is ptxas's, not
the source's: it moves FP32 operations between and ahead of the four
QGMMAs (SASS of the v0.25 build: ``pre||fp`` at N = 160 issues 64, 160,
160 and 160 of its 160 FP32 operations before the first to fourth QGMMA,
so it is serial by construction; ``mma||fp`` 20 / 36 / 80 / 152; only
``mma||fp_ldg`` at N = 128, 0 / 0 / 0 / 8, keeps the WGMMAs ahead).
``split`` has no such order to depend on (one warpgroup's four QGMMAs back
to back, the other's FP32 work in other warps) and is the one to read;
its cycles are those of each warpgroup's first warp.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wgmma_probe  # noqa: E402

NS = (128, 160)
PATTERNS = ("mma", "fp", "mma||fp", "serial", "fp_regs", "pre||fp", "mma||fp_ldg", "split", "split_int")

SRC = r"""
#include "ptx/fp32.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"
namespace cugemm8 {
template <uint32_t N, uint32_t P, uint32_t WG>
__global__ void __launch_bounds__(128 * WG, 1) overlap_probe(long long* cycles, float* sink, uint32_t iters,
                                                             float x, const float* __restrict__ gsf) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr uint32_t kAcc = N / 2;
  uint32_t* words = reinterpret_cast<uint32_t*>(smem);
  for (uint32_t i = threadIdx.x; i < (WG * 8192 + N * 128 + 2048) / 4; i += blockDim.x) words[i] = 0;
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t wg = threadIdx.x / 128;
  const uint32_t a_lo = smem_desc_sw128_lo(smem + wg * 8192), b_lo = smem_desc_sw128_lo(smem + WG * 8192);
  float acc[kAcc], fin[kAcc];
  #pragma unroll
  for (uint32_t i = 0; i < kAcc; ++i) acc[i] = 0.f, fin[i] = x * i;
  // The scales as the kernel reads them: A's two rows and B's column pairs
  // from shared memory each block (zeros after the first: timing only).
  const float* sf = reinterpret_cast<const float*>(smem + WG * 8192 + N * 128);
  const uint32_t lane = threadIdx.x % 32, row = threadIdx.x % 128 / 4;
  // The scales of one block: A's two rows, B's column pairs (from shared
  // memory, or with `global` UConst<1> from global memory through the
  // read-only path).
  float sa[2], sa_r[2];
  float2 sb[kAcc / 4], sb_r[kAcc / 4];
  auto load = [&](uint32_t it, auto global, float* a, float2* b) {
    const float* base = decltype(global)::value ? gsf + (it % 64) * 256 : sf;
    a[0] = base[(row + it) % 64];
    a[1] = base[(row + it) % 64 + 64];
    #pragma unroll
    for (uint32_t i = 0; i < kAcc / 4; ++i) {
      b[i] = decltype(global)::value ? __ldg(reinterpret_cast<const float2*>(base + 128 + i * 8 + (lane % 4) * 2))
                                     : *reinterpret_cast<const float2*>(base + 128 + i * 8 + (lane % 4) * 2);
    }
  };
  auto fp_with = [&](const float* src, const float* a, const float2* b) {
    #pragma unroll
    for (uint32_t i = 0; i < kAcc / 4; ++i) {
      fin[i * 4 + 0] = fma_rn(mul_rn(a[0], b[i].x), src[i * 4 + 0], fin[i * 4 + 0]);
      fin[i * 4 + 1] = fma_rn(mul_rn(a[0], b[i].y), src[i * 4 + 1], fin[i * 4 + 1]);
      fin[i * 4 + 2] = fma_rn(mul_rn(a[1], b[i].x), src[i * 4 + 2], fin[i * 4 + 2]);
      fin[i * 4 + 3] = fma_rn(mul_rn(a[1], b[i].y), src[i * 4 + 3], fin[i * 4 + 3]);
    }
  };
  auto fp_ops = [&](const float* src, uint32_t it) {
    load(it, UConst<0>{}, sa, sb);
    fp_with(src, sa, sb);
  };
  // fp_regs: scales that change every block without any load.
  load(0, UConst<0>{}, sa_r, sb_r);
  const long long t0 = clock64();
  #pragma unroll 1
  for (uint32_t it = 0; it < iters; ++it) {
    if constexpr (P == 0) {
      wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
      wgmma_wait_group<0>();
    } else if constexpr (P == 1) {
      fp_ops(fin, it);
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);
    } else if constexpr (P == 2) {
      wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
      fp_ops(fin, it);
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);
      wgmma_wait_group<0>();
    } else if constexpr (P == 3) {
      wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
      wgmma_wait_group<0>();
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc[i]);
      fp_ops(acc, it);
    } else if constexpr (P == 4) {
      sa_r[0] += 1.f;
      sa_r[1] += 1.f;
      fp_with(fin, sa_r, sb_r);
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);
    } else if constexpr (P == 5) {
      load(it, UConst<0>{}, sa, sb);
      wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);   // the FP32 ops after the issue
      fp_with(fin, sa, sb);
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);
      wgmma_wait_group<0>();
    } else if constexpr (P == 7 || P == 8) {
      // split: warpgroup 0 only the WGMMAs, warpgroup 1 only the FP32 ops;
      // split_int: warpgroup 1's FMULs replaced by integer adds (the
      // exponent-add product of two power-of-two scales).
      if (wg == 0) {
        wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
        wgmma_wait_group<0>();
      } else {
        sa_r[0] += 1.f;
        sa_r[1] += 1.f;
        if constexpr (P == 7) {
          fp_with(fin, sa_r, sb_r);
        } else {
          const int32_t a0 = __float_as_int(sa_r[0]) - 0x3f800000, a1 = __float_as_int(sa_r[1]) - 0x3f800000;
          #pragma unroll
          for (uint32_t i = 0; i < kAcc / 4; ++i) {
            const int32_t bx = __float_as_int(sb_r[i].x), by = __float_as_int(sb_r[i].y);
            fin[i * 4 + 0] = fma_rn(__int_as_float(a0 + bx), fin[i * 4 + 0], fin[i * 4 + 0]);
            fin[i * 4 + 1] = fma_rn(__int_as_float(a0 + by), fin[i * 4 + 1], fin[i * 4 + 1]);
            fin[i * 4 + 2] = fma_rn(__int_as_float(a1 + bx), fin[i * 4 + 2], fin[i * 4 + 2]);
            fin[i * 4 + 3] = fma_rn(__int_as_float(a1 + by), fin[i * 4 + 3], fin[i * 4 + 3]);
          }
        }
        #pragma unroll
        for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);
      }
    } else {
      static_assert(P == 6, "patterns 0-8");
      wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
      load(it, UConst<1>{}, sa, sb);
      fp_with(fin, sa, sb);
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(fin[i]);
      wgmma_wait_group<0>();
    }
  }
  wgmma_wait_group<0>();
  #pragma unroll
  for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc[i]);
  const long long t1 = clock64();
  float s = 0.f;
  #pragma unroll
  for (uint32_t i = 0; i < kAcc; ++i) s += acc[i] + fin[i];
  if (s == 12345.f) sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * WG + wg] = t1 - t0;
}
}  // namespace cugemm8
"""


def names() -> list[str]:
    return [f"cugemm8::overlap_probe<{n},{p},{wg}>" for n in NS for p in range(len(PATTERNS)) for wg in (1, 2)]


def build(root: Path = _ROOT / "cuda_src"):
    # -default-device: the probe's generic lambdas (loads from either memory)
    return wgmma_probe.build_module(SRC, names(), root, extra_options=("-default-device",))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=1024)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    fns = build()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    cycles = cp.zeros(2 * sms, dtype=cp.int64)
    sink = cp.zeros(sms * 256, dtype=cp.float32)
    gsf = cp.zeros(64 * 256 + 512, dtype=cp.float32)   # 64 blocks' scales, 256 floats apart, 288 read
    rows = []
    print(f"{'N':>4} {'WGs':>3} " + " ".join(f"{p:>8}" for p in PATTERNS) + "   (cycles per K block, median over CTAs)")
    for n in NS:
        for wg in (1, 2):
            line = []
            for p, pat in enumerate(PATTERNS):
                fn = fns[f"cugemm8::overlap_probe<{n},{p},{wg}>"]
                wgmma_probe.launch_warm(fn, (sms,), (128 * wg,),
                                        (cycles, sink, np.uint32(args.iters), np.float32(1e-3), gsf),
                                        wg * 8192 + n * 128 + 2048)
                c = cycles.get()[: sms * wg].reshape(sms, wg)
                if pat.startswith("split"):
                    if wg == 1:
                        line.append(f"{'-':>13}")
                        continue
                    mma_wg, fp_wg = (float(np.median(c[:, i])) / args.iters for i in (0, 1))
                    rows.append({"n": n, "warpgroups": wg, "pattern": pat, "cycles_per_block": mma_wg,
                                 "fp_warpgroup_cycles_per_block": fp_wg})
                    line.append(f"{mma_wg:6.1f}/{fp_wg:6.1f}")
                    continue
                per_block = float(np.median(c)) / args.iters
                rows.append({"n": n, "warpgroups": wg, "pattern": pat, "cycles_per_block": per_block})
                line.append(f"{per_block:8.1f}")
            print(f"{n:>4} {wg:>3} " + " ".join(line))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
