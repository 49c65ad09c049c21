"""Cycles per 128-deep K block of FP8 WGMMAs on one math warpgroup, by N and issue pattern (one GPU call).

    python tools/perf/wgmma_probe.py [--iters 2048] [--json OUT]

A decode tile's math warpgroup issues, per K block, four
``wgmma.mma_async.m64nNk32.f32.e4m3.e4m3`` into one accumulator (PTX ISA
§9.7.15.5), with N = BLOCK_N (8-256) while the tile's 64 MMA rows hold only
M <= 64 tokens.  This probe times that block alone, with nothing else on
the SM's pipes: 132 CTAs of one warpgroup each (one per SM), operands in
shared memory that never change (zeros: the tensor core's time does not
depend on the values), ``%clock64`` around ``--iters`` blocks, median over
CTAs.  Patterns:

* ``chain``: blocks back to back into one accumulator, one commit per block
  and no wait until the end (the tensor pipe's throughput);
* ``serial``: ``wait_group 0`` after every block (the kernel's loop on two
  math warpgroups: issue, wait, promote);
* ``pairs``: two blocks into two accumulators, then ``wait_group 1`` and
  ``wait_group 0`` (the kernel's kPipelineMma loop);
* ``chain8``: ``chain`` with A's descriptor stride 0, so all eight 8-row
  groups read the same 1 KB (what A costs when only 8 rows are real);
* ``rs``: ``chain`` with A from registers (``wgmma ... {a0..a3}, desc_b``),
  so only B is read from shared memory.

What it answers: whether the K loop's time per block at small BLOCK_N is
the tensor pipe's (cycles per block nearly flat in N: a fixed cost per
instruction) and so whether swapping A and B (the weights as the MMA's 64
rows, the tokens as its N = 8) would shorten it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

NS = (8, 16, 32, 64, 128, 256)
PATTERNS = ("chain", "serial", "pairs", "chain8", "rs")


def _rs_wrapper(n: int) -> str:
    """An RS-form m64nNk32 FP8 WGMMA (A's four 32-bit registers, B by descriptor)."""
    acc = n // 2
    d = ", ".join(f"%{i}" for i in range(acc))
    a = ", ".join(f"%{acc + i}" for i in range(4))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
    ins = ", ".join(f'"r"(a[{i}])' for i in range(4))
    return f"""
template <> struct WgmmaFp8Rs<{n}> {{
  __device__ __forceinline__ static void mma(float* d, const uint32_t* a, uint64_t desc_b, uint32_t scale_d) {{
    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{acc + 5}, 0;\\n"
                 "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "
                 "{{{d}}}, {{{a}}}, %{acc + 4}, p, 1, 1;\\n}}\\n"
                 : {outs}
                 : {ins}, "l"(desc_b), "r"(scale_d));
  }}
}};
"""


SRC = r"""
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"
namespace cugemm8 {
template <int N> struct WgmmaFp8Rs;
""" + "".join(_rs_wrapper(n) for n in NS) + r"""
template <uint32_t N, uint32_t P>
__global__ void __launch_bounds__(128, 1) wgmma_probe(long long* cycles, float* sink, uint32_t iters) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr uint32_t kAcc = N / 2;
  uint32_t* words = reinterpret_cast<uint32_t*>(smem);
  for (uint32_t i = threadIdx.x; i < (8192 + N * 128) / 4; i += blockDim.x) words[i] = 0;
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t a_lo = smem_desc_sw128_lo(smem), b_lo = smem_desc_sw128_lo(smem + 8192);
  float acc[kAcc], acc2[kAcc];
  #pragma unroll
  for (uint32_t i = 0; i < kAcc; ++i) acc[i] = acc2[i] = 0.f;
  uint32_t a_regs[4] = {0u, 0u, 0u, 0u};
  const long long t0 = clock64();
  #pragma unroll 1
  for (uint32_t it = 0; it < iters; ++it) {
    if constexpr (P == 0 || P == 1 || P == 3) {   // chain / serial / chain8
      constexpr uint64_t kHi = P == 3 ? kSmemDescSw128Hi8Rows : kSmemDescSw128Hi;
      wgmma_fp8_k128<N, kAcc, kHi>(acc, a_lo, b_lo);
      if constexpr (P == 1) wgmma_wait_group<0>();
    } else if constexpr (P == 2) {                // pairs
      wgmma_fp8_k128<N, kAcc>(acc, a_lo, b_lo);
      wgmma_fp8_k128<N, kAcc>(acc2, a_lo, b_lo);
      wgmma_wait_group<1>();
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc[i]);
      wgmma_wait_group<0>();
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc2[i]);
    } else {                                      // rs
      #pragma unroll
      for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc[i]);
      wgmma_fence();
      #pragma unroll
      for (uint32_t k = 0; k < 4; ++k)
        WgmmaFp8Rs<N>::mma(acc, a_regs, smem_desc_sw128_from_lo(b_lo + k * 2), k > 0 ? 1u : 0u);
      wgmma_commit_group();
    }
  }
  wgmma_wait_group<0>();
  #pragma unroll
  for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc[i]);
  const long long t1 = clock64();
  float s = 0.f;
  #pragma unroll
  for (uint32_t i = 0; i < kAcc; ++i) s += acc[i] + acc2[i];
  if (s != 0.f) sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
}  // namespace cugemm8
"""


def names() -> list[str]:
    # Two 256-wide accumulators (pairs) do not fit in the registers.
    return [f"cugemm8::wgmma_probe<{n},{p}>" for n in NS for p in range(len(PATTERNS))
            if not (n == 256 and PATTERNS[p] == "pairs")]


def build_module(src: str, name_exprs, root: Path = _ROOT / "cuda_src", extra_options=()) -> dict:
    """Compile a probe's source for sm_90a against ``cuda_src/`` (its PTX
    headers); returns {name expression: kernel}."""
    opts = ("-std=c++17", "-arch=sm_90a", *extra_options, f"-I{root}")
    mod = cp.RawModule(code=src, options=opts, name_expressions=list(name_exprs))
    return {nm: mod.get_function(nm) for nm in name_exprs}


def build(root: Path = _ROOT / "cuda_src"):
    return build_module(SRC, names(), root)


def launch_warm(fn, grid, block, args, smem: int) -> None:
    """Launch a probe kernel twice (the first launch warms the clock) with
    ``smem`` bytes of dynamic shared memory, then synchronise."""
    fn.max_dynamic_shared_size_bytes = smem
    for _ in range(2):
        fn(grid, block, args, shared_mem=smem)
    cp.cuda.Device().synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2048)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    fns = build()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    cycles = cp.zeros(sms, dtype=cp.int64)
    sink = cp.zeros(sms * 128, dtype=cp.float32)
    rows = []
    print(f"{'N':>4} " + " ".join(f"{p:>8}" for p in PATTERNS) + "   (cycles per 128-deep K block, median over CTAs)")
    for n in NS:
        line = []
        for p, pat in enumerate(PATTERNS):
            fn = fns.get(f"cugemm8::wgmma_probe<{n},{p}>")
            if fn is None:
                line.append(f"{'-':>8}")
                continue
            launch_warm(fn, (sms,), (128,), (cycles, sink, np.uint32(args.iters)), 8192 + n * 128)
            per_block = float(np.median(cycles.get())) / args.iters
            rows.append({"n": n, "pattern": pat, "cycles_per_block": per_block})
            line.append(f"{per_block:8.1f}")
        print(f"{n:>4} " + " ".join(line))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
