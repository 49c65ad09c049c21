"""FP8 tensor-core throughput and power under the power cap, without the GEMM around it (issue 20; one GPU call).

    python tools/perf/tensor_power_probe.py [--seconds 2] [--rounds 3] [--deepgemm] [--json OUT]

At M = 4096 both cugemm8 and DeepGEMM run against the H200's 700 W power
cap (``benches/bench_energy.py``: every sustained loop reads SWpow 100 % and
the same mean power), so the time of a GEMM is its energy per GEMM over the
cap.  This probe asks how much of that energy is the tensor cores' own: a
kernel on every SM that does only what the GEMM's 256x128 tile does in the
tensor pipe, and nothing else, run in the same sustained, edge-aligned
loops (``bench_energy.sustained``) as the GEMMs it is compared with.
Each CTA (two warpgroups, one per SM) holds in shared memory four 64-row A
sub-tiles and one 128-row B tile of 128 K bytes (128B swizzle), copied
from the operands of a real quantised 4096x7168x16384 GEMM (``make_operands``:
the same e4m3 bit statistics as the benches'), and repeats per iteration
what a math warpgroup does per K block: two sub-tiles x four
``wgmma.mma_async.m64n128k32.f32.e4m3.e4m3`` (PTX ISA section 9.7.15.5).
Patterns:

* ``chain``: the sub-tiles' WGMMAs back to back into two accumulators,
  never waited for until the end: the tensor pipe alone (its energy per
  FLOP sets a ceiling on any FP8 GEMM of these operands on this board);
* ``promote``: the GEMM kernels' loop without its memory traffic: issue
  one sub-tile, wait, promote (64 FP32 FMAs per thread into the sub-tile's
  final accumulator), the next sub-tile, wait, promote;
* ``chain zeros``: ``chain`` on all-zero operands (the tensor core's power
  depends on the values it multiplies; zeros show by how much).

For each pattern and each GEMM (cugemm8's pick, and DeepGEMM's with
``--deepgemm``) the table gives TFLOPS, mean W, TFLOPS per W and the SM
clock, and each GEMM's TFLOPS as a share of ``chain``'s: how far any change
that leaves the tensor work as it is could take it, under the cap.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT))
sys.path.insert(1, str(_ROOT / "benches"))
sys.path.insert(2, str(Path(__file__).resolve().parent))

import bench_energy  # noqa: E402  (its sustained loop, check limit and argument types)

BLOCK_N = 128
PATTERNS = ("chain", "promote")     # kernel template argument P: 0, 1
SUB_TILE_BYTES = 64 * 128           # one 64-row A sub-tile of one 128-byte K block
SMEM_BYTES = 4 * SUB_TILE_BYTES + BLOCK_N * 128
THREADS = 256                       # two math warpgroups

SRC = r"""
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"
#include "ptx/fp32.cuh"
namespace cugemm8 {
// P = 0: chain, 1: promote (tools/perf/tensor_power_probe.py).
template <uint32_t N, uint32_t P>
__global__ void __launch_bounds__(256, 1) tensor_power(const uint4* a_src, const uint4* b_src, float* sink,
                                                        uint32_t iters) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr uint32_t kA = 64 * 128, kB = N * 128, kAcc = N / 2;
  // This CTA's four A sub-tiles (two per warpgroup) and its B tile.
  const uint4* a = a_src + blockIdx.x * (4 * kA / 16);
  const uint4* b = b_src + blockIdx.x * (kB / 16);
  uint4* s = reinterpret_cast<uint4*>(smem);
  for (uint32_t i = threadIdx.x; i < 4 * kA / 16; i += blockDim.x) s[i] = a[i];
  for (uint32_t i = threadIdx.x; i < kB / 16; i += blockDim.x) s[4 * kA / 16 + i] = b[i];
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t wg = threadIdx.x / 128;
  const uint32_t a_lo = smem_desc_sw128_lo(smem + wg * 2 * kA), b_lo = smem_desc_sw128_lo(smem + 4 * kA);
  float total = 0.f;
  if constexpr (P == 0) {
    float acc0[kAcc], acc1[kAcc];
    #pragma unroll
    for (uint32_t i = 0; i < kAcc; ++i) acc0[i] = acc1[i] = 0.f;
    #pragma unroll 1
    for (uint32_t it = 0; it < iters; ++it) {
      wgmma_fp8_k128<N, kAcc>(acc0, a_lo, b_lo);
      wgmma_fp8_k128<N, kAcc>(acc1, a_lo + kA / 16, b_lo);
    }
    wgmma_wait_group<0>();
    #pragma unroll
    for (uint32_t i = 0; i < kAcc; ++i) {
      fence_operand(acc0[i]);
      fence_operand(acc1[i]);
      total += acc0[i] + acc1[i];
    }
  } else {
    float acc[kAcc], fin[2][kAcc];
    #pragma unroll
    for (uint32_t i = 0; i < kAcc; ++i) fin[0][i] = fin[1][i] = 0.f;
    // A per-thread scale, as the product of the row's and the block's scales would be.
    const float scale = 1.f + static_cast<float>(threadIdx.x % 32) * 0x1p-10f;
    #pragma unroll 1
    for (uint32_t it = 0; it < iters; ++it) {
      #pragma unroll
      for (uint32_t v = 0; v < 2; ++v) {
        wgmma_fp8_k128<N, kAcc>(acc, a_lo + v * (kA / 16), b_lo);
        wgmma_wait_group<0>();
        #pragma unroll
        for (uint32_t i = 0; i < kAcc; ++i) fence_operand(acc[i]);
        #pragma unroll
        for (uint32_t i = 0; i < kAcc; ++i) fin[v][i] = fma_rn(scale, acc[i], fin[v][i]);
      }
    }
    #pragma unroll
    for (uint32_t i = 0; i < kAcc; ++i) total += fin[0][i] + fin[1][i];
  }
  // Keeps the results live; never true for finite sums of these magnitudes.
  if (total == 0x1p100f) sink[blockIdx.x * blockDim.x + threadIdx.x] = total;
}
}  // namespace cugemm8
"""


def names() -> list[str]:
    return [f"cugemm8::tensor_power<{BLOCK_N},{p}>" for p in range(len(PATTERNS))]


def flops_per_launch(num_sms: int, iters: int) -> int:
    """Each CTA: two warpgroups x two 64-row sub-tiles x a 64 x BLOCK_N x 128 MMA, per iteration."""
    return num_sms * 2 * 2 * (2 * 64 * BLOCK_N * 128) * iters


def operand_bytes(num_sms: int, seed: int = 0):
    """(A bytes, B bytes) as uint8 CuPy arrays: the e4m3 bits of a real
    quantised 4096x7168x16384 GEMM's operands (``cugemm8.cli.make_operands``),
    enough for every CTA's four A sub-tiles and its B tile."""
    import cupy as cp
    from cugemm8.cli import Shape, make_operands
    ops = make_operands(Shape("normal", 4096, 7168, 16384), cp, seed=seed)
    a = ops["a"].ravel()[: num_sms * 4 * SUB_TILE_BYTES].copy()
    b = ops["b"].ravel()[: num_sms * BLOCK_N * 128].copy()
    del ops
    return a, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each sustained loop")
    ap.add_argument("--rounds", type=bench_energy._positive_int, default=3, help="alternations of all entries")
    ap.add_argument("--iters", type=bench_energy._positive_int, default=4096,
                    help="K blocks per launch (about 2.7 ms for chain on the H200)")
    ap.add_argument("--deepgemm", action="store_true", help="DeepGEMM's 4096x7168x16384 GEMM beside")
    ap.add_argument("--json", help="write the rounds and medians here")
    args = ap.parse_args(argv)
    from cugemm8 import _device
    reason = _device.gpu_unavailable_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason}): nothing to measure")
        return 2
    import cupy as cp
    import numpy as np

    import common
    import cugemm8
    from cugemm8.cli import Shape, calc_diff, make_operands, poisoned_out, print_table, reference, bf16_to_f64
    from wgmma_probe import build_module

    nv = bench_energy.Nvml(cp)
    if nv.handle is None:
        print(f"no NVML energy counter ({nv.reason}): times only")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    fns = build_module(SRC, names())
    a, b = operand_bytes(sms)
    za, zb = cp.zeros_like(a), cp.zeros_like(b)
    sink = cp.zeros(sms * THREADS, dtype=cp.float32)
    for fn in fns.values():
        fn.max_dynamic_shared_size_bytes = SMEM_BYTES
    entries = {}                        # label -> (launch, FLOPs a launch)
    for label, pat, sa, sb in (("chain", "chain", a, b), ("chain zeros", "chain", za, zb),
                               ("promote", "promote", a, b)):
        fn = fns[f"cugemm8::tensor_power<{BLOCK_N},{PATTERNS.index(pat)}>"]
        entries[label] = (lambda fn=fn, sa=sa, sb=sb: fn((sms,), (THREADS,), (sa, sb, sink, np.uint32(args.iters)),
                                                       shared_mem=SMEM_BYTES),
                          flops_per_launch(sms, args.iters))
    # The GEMMs, checked against the float64 reference first.
    m, n, k = 4096, 7168, 16384
    shape = Shape("normal", m, n, k)
    ops = make_operands(shape, cp, seed=1)
    ref, _ = reference(ops, shape, cp)
    sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
    out = poisoned_out(shape, ops, cp)

    status = {}

    def add(key, fn, got, ref=ref):
        """Run ``fn`` once and time it as an entry only if ``got()`` passes
        the check (bench_energy's rule)."""
        fn()
        cp.cuda.runtime.deviceSynchronize()
        d = calc_diff(got(), ref, cp)
        status[key] = f"{d:.1e}" if d < bench_energy.CHECK_LIMIT else f"FAIL {d:.1e}"
        if d < bench_energy.CHECK_LIMIT:
            entries[f"{key} {m}x{n}x{k}"] = (fn, 2 * m * n * k)

    add("cugemm8", lambda: cugemm8.gemm_fp8_fp8_bf16_nt((ops["a"], sfa), (ops["b"], ops["sfb"]), out),
        lambda: bf16_to_f64(out, cp))
    if args.deepgemm:
        import deepgemm_anchor
        if deepgemm_anchor.load()[0] is None:
            print(deepgemm_anchor.load()[1])
        else:
            run = deepgemm_anchor.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
            add("deepgemm", run, lambda: common.torch_to_f64(run.out, m))
    del ref
    print("check (calc_diff against the float64 reference): "
          + ", ".join(f"{key} {v}" for key, v in status.items()))
    runs = {label: [] for label in entries}
    for _ in range(args.rounds):
        for label, (fn, _) in entries.items():
            runs[label].append(bench_energy.sustained(cp, fn, args.seconds, nv))
    med = {}
    for label, rs in runs.items():
        fl = entries[label][1]
        med[label] = {
            "tflops": statistics.median(fl / r["us"] / 1e6 for r in rs),
            "watts": statistics.median(r["watts"] for r in rs) if all("watts" in r for r in rs) else None,
            "mhz": statistics.median(r["mhz"] for r in rs) if all(r.get("mhz") for r in rs) else None,
        }
    chain = med["chain"]["tflops"]
    rows = []
    for label, r in med.items():
        w = r["watts"]
        rows.append((label, f"{r['tflops']:.0f}", f"{w:.0f}" if w else "-",
                     f"{r['tflops'] / w:.2f}" if w else "-", f"{r['mhz']:.0f}" if r["mhz"] else "-",
                     f"{r['tflops'] / chain:.3f}"))
    print_table(f"sustained loops of {args.seconds:g} s, {args.rounds} rounds (medians); tensor work of a 256x128 "
                f"tile, {args.iters} K blocks a launch", ("entry", "TFLOPS", "W", "TFLOPS / W", "SM MHz",
                                                          "x chain"), rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": args.seconds, "rounds": args.rounds,
                                               "iters": args.iters, "status": status, "median": med,
                                               "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
