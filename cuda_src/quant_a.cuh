// SPDX-License-Identifier: MIT
// Quantising A inside a GEMM kernel: cugemm8.gemm_fp8's one-kernel bf16-in
// form for decode-sized M (at most kQuantARows = 8 rows), shared by the 1D2D
// kernel (fp8_gemm_1d2d.cuh, BLOCK_M = 64 on one math warpgroup) and the
// swap-AB kernel (fp8_gemm_swap_ab.cuh, a token tile of 8).
//
// Each stage of the kernel's ring holds, beside B, an 8-row e4m3 payload
// (1 KB, rows of 128 bytes under the 128-byte swizzle TMA would have
// applied), its 8 scales, and a slot for the same rows of the float
// activations x.  One of kNumConverterWarps otherwise idle warps of the
// producer warpgroup owns each stage (owner = stage % kNumConverterWarps, so
// it waits on every phase of the stage's barriers in order).  It loads x's
// [rows, 128] box of a K block into the slot with TMA (run_warp's load_x:
// the kernel's tmap_a maps x, no swizzle, K tail zero-filled) a whole ring lap before that
// block is due, as soon as it has converted the slot's previous block; once
// the math warpgroup has released the stage (its empty barrier), it quantises
// the rows with the per-token cast's own device functions (quant.cuh: 1x128
// amax, exact scale and quotient -- in float32 for 16-bit x --,
// kQuantAMinAmax), writes the payload and the
// scales into the stage, fences them to the async proxy and arrives on the
// stage's full barrier, which also waits for the producer's arrival and B's
// bytes.  So the conversion runs while B's load for the same stage is in
// flight, not after it.  The math warpgroup is unchanged, and the payload and
// scales it reads are bit for bit what per_token_cast_to_fp8 would have
// written, so the output equals that cast followed by the same GEMM.  Every
// CTA converts the A rows of its own K blocks, so the host uses this form only
// for a few rows (cugemm8/quant.py ONE_KERNEL_MAX_M).
// History: v0.9's converters loaded x from global memory themselves, stage by
// stage (2.3-40x slower than a separate quantiser: a full memory latency per
// stage in series); a first v0.14 form loaded x with B into the stage's A
// region, which put the conversion's latency into every stage's turn around
// the ring (1.0-1.2x the two-kernel form at M <= 2, far slower from M = 4 on:
// benches/RESULTS.md v0.14).  v0.17 moved the converter here from the 1D2D
// kernel so that the swap-AB kernel runs the same code.
#pragma once
#include "common.cuh"
#include "pipeline.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "quant.cuh"

namespace cugemm8 {

// kAIn (what A is) and kQuantAMinAmax: quant.cuh.

// Rows of x a stage's payload holds (the host never launches more: cugemm8/quant.py).
constexpr uint32_t kQuantARows = 8;
constexpr uint32_t kNumConverterWarps = 3;

// The converter warps' code for activations of type kXDtype in a ring of
// kNumStages stages.
template <InDtype kXDtype, uint32_t kNumStages>
struct QuantAConverter {
  using Q = quant::InTraits<kXDtype>;
  static constexpr uint32_t kXBytes = Q::kBytes;
  // Lanes kLanesPerRow apart take consecutive rows, each lane one 16-byte
  // piece (Q::kVec elements) of its row: the per-token cast's own split
  // (kLanesPerGroup), so its butterfly gives the row's amax.  A step converts
  // kRowsPerStep rows.
  static constexpr uint32_t kLanesPerRow = 128 / Q::kVec;   // 16 (16-bit x) or 32 (float32)
  static constexpr uint32_t kRowsPerStep = 32 / kLanesPerRow;

  // kPar steps from row r0 of the x slot at shared address x_s into the
  // payload at shared address a_s and the scales sfa_s (rows < `rows` only).
  template <uint32_t kPar>
  __device__ __forceinline__ static void convert(uint32_t x_s, uint32_t a_s, float* sfa_s, uint32_t rows,
                                                 uint32_t r0, bool pow2, uint32_t sub, uint32_t piece) {
    uint32_t raw[kPar][4], q[kPar][Q::kVec / 4], amax[kPar];
    float scale[kPar];
    bool finite[kPar];
    bool any_nonfinite = false;
    #pragma unroll
    for (uint32_t h = 0; h < kPar; ++h) {
      const uint32_t r = r0 + h * kRowsPerStep + sub;
      #pragma unroll
      for (uint32_t w = 0; w < 4; ++w) raw[h][w] = 0u;
      if (r < rows) ld_shared_v4(raw[h], x_s + r * 128u * kXBytes + piece * 16u);
      amax[h] = quant::abs_max_bits<kXDtype>(raw[h], 0u);
    }
    #pragma unroll
    for (uint32_t off = kLanesPerRow / 2; off > 0; off /= 2) {
      #pragma unroll
      for (uint32_t h = 0; h < kPar; ++h) amax[h] = max(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], off));
    }
    #pragma unroll
    for (uint32_t h = 0; h < kPar; ++h) {
      const float sc = quant::activation_scale<kXDtype>(amax[h], pow2);
      scale[h] = sc;
      finite[h] = __float_as_uint(sc) < 0x7f800000u;
      any_nonfinite |= !finite[h];
      // A non-finite scale's reciprocal would be garbage: 1 stands in,
      // and its bytes are replaced below.  16-bit x: the float32 quotient
      // (quant.cuh: the float64 one's bytes on every 16-bit input).
      quant::quantize_activation<kXDtype>(raw[h], finite[h] ? sc : 1.0f, q[h]);
    }
    // NaN / Inf rows (rare): their bytes from the integer-only path.
    if (__any_sync(0xffffffffu, any_nonfinite)) {
      #pragma unroll
      for (uint32_t h = 0; h < kPar; ++h) {
        if (!finite[h]) quant::quantize_nonfinite<kXDtype>(raw[h], scale[h], q[h]);
      }
    }
    #pragma unroll
    for (uint32_t h = 0; h < kPar; ++h) {
      const uint32_t r = r0 + h * kRowsPerStep + sub;
      if (r < rows) {
        // Byte piece * kVec of row r, under the 128-byte swizzle TMA
        // would have applied (16-byte chunk c of row r at c ^ (r % 8)).
        const uint32_t col = piece * Q::kVec;
        const uint32_t off = r * 128u + (((col / 16u) ^ (r % 8u)) << 4) + col % 16u;
        if constexpr (Q::kVec == 8) {
          st_shared_v2_u32(a_s + off, q[h][0], q[h][1]);
        } else {
          st_shared_u32(a_s + off, q[h][0]);
        }
        if (piece == 0) sfa_s[r] = scale[h];
      }
    }
  }

  // One converter warp's whole run: warp `owner` (0 .. kNumConverterWarps -
  // 1) converts the stages s with s % kNumConverterWarps == owner of this
  // CTA's `num_blocks` K blocks (its tiles' blocks in the ring's order), each
  // of `rows` rows.  smem_x / smem_a / smem_sfa(stage) give the stage's x
  // slot, payload and scales; load_x(j) (called by lane 0) issues the TMA
  // load of block j's x box into its stage's slot, completing on
  // x_full_bar[j % kNumStages].  Two steps run side by side where there are
  // two (their chains interleave), never a step of no rows (the conversion
  // is bound by the warp's issue and conversion rate, not by latency:
  // benches/RESULTS.md v0.14).
  template <typename SmemX, typename SmemA, typename SmemSFA, typename LoadX>
  __device__ __forceinline__ static void run(uint32_t owner, uint32_t num_blocks, uint32_t rows, bool pow2,
                                             uint64_t* full_bar, uint64_t* empty_bar, uint64_t* x_full_bar,
                                             SmemX smem_x, SmemA smem_a, SmemSFA smem_sfa, LoadX load_x) {
    const uint32_t lane = threadIdx.x % 32, sub = lane / kLanesPerRow, piece = lane % kLanesPerRow;
    if (lane == 0) {
      for (uint32_t j = owner; j < kNumStages && j < num_blocks; j += kNumConverterWarps) load_x(j);
    }
    PipeState<kNumStages> pipe;
    #pragma unroll 1
    for (uint32_t j = 0; j < num_blocks; ++j, pipe.advance()) {
      const uint32_t stage = pipe.stage;
      if (stage % kNumConverterWarps != owner) continue;
      mbarrier_wait(x_full_bar + stage, pipe.phase);        // x's box of block j
      mbarrier_wait(empty_bar + stage, pipe.phase ^ 1);     // the math warpgroup released the stage
      const uint32_t x_s = smem_addr(smem_x(stage)), a_s = smem_addr(smem_a(stage));
      float* sfa_s = const_cast<float*>(smem_sfa(stage));
      #pragma unroll 1
      for (uint32_t r0 = 0; r0 < rows;) {
        if (rows - r0 > kRowsPerStep) {
          convert<2>(x_s, a_s, sfa_s, rows, r0, pow2, sub, piece);
          r0 += 2 * kRowsPerStep;
        } else {
          convert<1>(x_s, a_s, sfa_s, rows, r0, pow2, sub, piece);
          r0 += kRowsPerStep;
        }
      }
      fence_proxy_async_smem();   // the payload, to WGMMA's async proxy
      __syncwarp();               // and every lane's reads of the slot done
      if (lane == 0) {
        mbarrier_arrive(full_bar + stage);
        // The slot is free: x's box of the stage's next block, a lap ahead.
        if (j + kNumStages < num_blocks) load_x(j + kNumStages);
      }
    }
  }

  // The GEMM kernels' entry: warp `cw` of the producer warpgroup converts
  // if it is one of warps 1 .. kNumConverterWarps (the others return).  It
  // counts this CTA's K blocks over the tiles `scheduler` still hands out
  // (every tile has kb_count blocks from kb_begin, so the CTA's block j is K
  // block kb_begin + j % kb_count) and run()s them, loading x's [rows, 128]
  // box of each block from tmap_x (x as (K, rows, 1), no swizzle).
  template <typename Scheduler, typename SmemX, typename SmemA, typename SmemSFA>
  __device__ __forceinline__ static void run_warp(uint32_t cw, Scheduler& scheduler, uint32_t kb_begin,
                                                  uint32_t kb_count, const TmaDescriptor* tmap_x, uint32_t rows,
                                                  bool pow2, uint64_t* full_bar, uint64_t* empty_bar,
                                                  uint64_t* x_full_bar, SmemX smem_x, SmemA smem_a,
                                                  SmemSFA smem_sfa) {
    if (cw < 1 || cw > kNumConverterWarps) return;
    uint32_t num_blocks = 0;
    typename Scheduler::Tile tile;
    while (scheduler.next(tile)) num_blocks += kb_count;
    const uint32_t x_box_bytes = rows * 128u * kXBytes;
    auto load_x = [&](uint32_t j) {
      const uint32_t s = j % kNumStages;
      mbarrier_arrive_expect_tx(x_full_bar + s, x_box_bytes);
      tma_load_3d(smem_x(s), tmap_x, x_full_bar + s, static_cast<int32_t>((kb_begin + j % kb_count) * 128u), 0, 0);
    };
    run(cw - 1, num_blocks, rows, pow2, full_bar, empty_bar, x_full_bar, smem_x, smem_a, smem_sfa, load_x);
  }
};

}  // namespace cugemm8
