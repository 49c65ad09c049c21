// SPDX-License-Identifier: MIT
// Swap-AB FP8 GEMM with DeepSeek-V3 fine-grained scaling ("1D2D": 1x128
// activation scales, 128x128 weight scales) for decode-sized M on sm_90a:
//
//   D[m, n] = sum_kb SFA[m, kb] * SFB[n / 128, kb] * sum_{k in kb} A[m, k] * B[n, k]
//
// computed as its transpose: the weights B are the WGMMA's A operand (64 of
// their N rows per m64 instruction) and the tokens its N (BLOCK_M = 8 ... 32
// columns, a multiple of 8).  Same operands, layouts and output as
// fp8_gemm_1d2d.cuh (A [M, K] and B [N, K] e4m3 K-major, SFA MN-major f32,
// SFB [ceil(N/128), ceil(K/128)] f32, D [M, N] bf16).
//
// Why: the 1D2D kernel's m64 x BLOCK_N x k32 WGMMAs take 64 rows of A, of
// which only M are tokens, and cover BLOCK_N weight rows each; at decode
// sizes the math warpgroup's share of every K block (the WGMMAs and the
// promotion) is what separates that kernel from a plain read of B
// (benches/RESULTS.md v0.15-v0.16: without either the kernel runs at its
// read probe's speed).  Swapped, one m64 x 8 x k32 instruction covers 64
// weight rows and all the tokens, and the promotion is BLOCK_M / 2 values per
// 64 rows instead of BLOCK_N / 2 per BLOCK_N columns
// (tools/perf/wgmma_probe.py: 72 cycles per 128-deep K block at N = 8, 96 at
// 32, against 128-512 for the 64-256-wide tiles of the 1D2D picks).
// DeepGEMM has no swap-AB form on sm90; the idea is the usual one for
// skinny GEMMs (CUTLASS's and vLLM's FP8 block-scaled sm90 kernels swap the
// operands for small M).
//
// Structure (the 1D2D kernel's, narrowed to what decode needs):
// * one producer warp (one thread issues every TMA load: the tokens' box of
//   a_box_rows rows, their scales, the weights' BLOCK_N x 128 box with the
//   L2 evict-first hint of kFlagBEvictFirst) and one math warpgroup;
// * the kNumStages-deep full / empty mbarrier ring of pipeline.cuh and the
//   persistent tile order of scheduler.cuh (m-blocks of BLOCK_M tokens,
//   n-blocks of BLOCK_N weight rows);
// * promotion after every 128-wide K block, with the 1D2D kernel's FP32
//   operations in its order: final = fma_rn(mul_rn(sfa, sfb), partial, final);
// * split K across a cluster of kNumKSplits = 1, 2 or 4 CTAs: rank r runs a
//   contiguous share of the K blocks, ranks 1.. send their FP32 partial
//   tiles into rank 0's shared memory (st.async, completing on an mbarrier),
//   rank 0 adds them in rank order and stores the tile;
// * epilogue: BF16 stores straight from the accumulators, bounds-checked
//   per element (a few KB per tile at these sizes);
// * with kAIn != kAInFp8 (a token tile of 8), the float activations x are
//   quantised in the kernel by three converter warps beside the producer
//   (quant_a.cuh: gemm_fp8's one-kernel form), bit for bit as
//   per_token_cast_to_fp8 would, so the output equals that cast followed by
//   this kernel.
#pragma once
#include "common.cuh"
#include "pipeline.cuh"
#include "ptx/fp32.cuh"
#include "ptx/griddep.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "quant_a.cuh"
#include "scheduler.cuh"

namespace cugemm8 {

// Shared memory of one configuration; cugemm8/_config.py:swap_ab_smem_size
// implements the same formula (tests/test_config.py pins it).  kQuantAXBytes:
// 0, or the element size of the float activations quantised in the kernel
// (quant_a.cuh): then each stage also has a slot for the token tile's rows
// of x, and an x_full barrier.
template <uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages, uint32_t kNumKSplits,
          uint32_t kQuantAXBytes = 0>
struct SwapABSmem {
  static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, 128u);
  static constexpr uint32_t kWaves = BLOCK_N / 64;
  static constexpr uint32_t kB = BLOCK_N * 128u;                 // (BLOCK_N, 128) e4m3: the MMA's A
  static constexpr uint32_t kA = BLOCK_M * 128u;                 // (BLOCK_M, 128) e4m3: the MMA's B
  static constexpr uint32_t kSFA = align_up(BLOCK_M * 4u, 128u); // (BLOCK_M,) f32
  static constexpr uint32_t kX = BLOCK_M * 128u * kQuantAXBytes;  // (BLOCK_M, 128) of x, or nothing
  // Rows of B scales a tile reads: a 64-row wave never straddles a 128-row
  // block (n0 is a multiple of 64), so BLOCK_N / 128 rows, one more when
  // BLOCK_N is an odd multiple of 64 (192: n0 % 128 is 0 or 64).
  static constexpr uint32_t kSFBTileRows = BLOCK_N / 128u + (BLOCK_N % 128u ? 1u : 0u);
  // Each math warp keeps its own copy of the tile's B scales (only
  // __syncwarp orders its writes and reads), as the 1D2D kernel does.
  static constexpr uint32_t kSFB = align_up(4u * kSFBTileRows * kNumKBlocks * 4u, 16u);
  // Split K: rank 0 receives the other ranks' FP32 partial tiles here.
  static constexpr uint32_t kRedData = kWaves * (BLOCK_M / 2u) * 128u * 4u;
  static constexpr uint32_t kRed = (kNumKSplits - 1u) * kRedData;
  static constexpr uint32_t kOffB = 0;
  static constexpr uint32_t kOffA = kOffB + kNumStages * kB;
  static constexpr uint32_t kOffSFA = kOffA + kNumStages * kA;
  static constexpr uint32_t kOffX = kOffSFA + kNumStages * kSFA;
  static constexpr uint32_t kOffSFB = kOffX + kNumStages * kX;
  static constexpr uint32_t kOffRed = kOffSFB + kSFB;
  static constexpr uint32_t kOffBar = kOffRed + kRed;
  // full and empty per stage, then the exchange's red_full / red_empty, then
  // (x quantised in the kernel) x_full per stage
  static constexpr uint32_t kTotal = kOffBar + ((kQuantAXBytes ? 3u : 2u) * kNumStages + 2u) * 8u;
};

// Arguments (the 1D2D kernel's list, so the host builds both alike):
//   shape_m     rows of A / D (M)
//   a_box_rows  rows of tmap_a's box (and, rounded up to 4, tmap_sfa's):
//               min(M, BLOCK_M).  Token columns of a stage past the box keep
//               stale values; they reach only accumulator columns >= M,
//               which are never stored.
//   flags       kFlagBEvictFirst and kFlagAPow2Scale (common.cuh) or 0
//   sfb         B scales, row-major [ceil(N/128), ceil(K/128)] f32
//   unused      (the 1D2D kernel's grouped_layout)
//   d_ptr, ld_d D and its row stride in elements
//   tmap_a      A   as (K, M, 1) u8,  box (128, a_box_rows, 1), 128B swizzle;
//               with kAIn != kAInFp8 the activations x as (K_x, M, 1) of their
//               float type, box (128, a_box_rows, 1), no swizzle (tmap_sfa is
//               then unused)
//   tmap_b      B   as (K, N, 1) u8,  box (128, BLOCK_N, 1), 128B swizzle
//   tmap_sfa    SFA as (M, K/128, 1) f32 (MN-major), box (align4(a_box_rows), 1, 1)
//   unused_map  (the 1D2D kernel's tmap_d)
template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages,
          uint32_t kNumKSplits, uint32_t kAIn = kAInFp8>
__global__ void __launch_bounds__(kAIn == kAInFp8 ? 160 : 256, 1) __cluster_dims__(kNumKSplits, 1, 1)
fp8_gemm_swap_ab_kernel(uint32_t shape_m, uint32_t a_box_rows, uint32_t flags, const float* __restrict__ sfb,
                        const int32_t* __restrict__ unused, uint16_t* __restrict__ d_ptr, uint32_t ld_d,
                        const __grid_constant__ TmaDescriptor tmap_a, const __grid_constant__ TmaDescriptor tmap_b,
                        const __grid_constant__ TmaDescriptor tmap_sfa,
                        const __grid_constant__ TmaDescriptor unused_map) {
  // Float activations quantised in the kernel (quant_a.cuh): their type and bytes.
  constexpr bool kQuantA = kAIn != kAInFp8;
  constexpr InDtype kXDtype = kQuantA ? static_cast<InDtype>(kAIn - 1) : InDtype::kBFloat16;
  constexpr uint32_t kXBytes = quant::InTraits<kXDtype>::kBytes;
  using Smem = SwapABSmem<SHAPE_K, BLOCK_M, BLOCK_N, kNumStages, kNumKSplits, kQuantA ? kXBytes : 0u>;
  using Scheduler = TileScheduler<kNormal, SHAPE_N, BLOCK_M, BLOCK_N, 1, false, 1>;
  constexpr uint32_t kNumKBlocks = Smem::kNumKBlocks;
  constexpr uint32_t kWaves = Smem::kWaves;
  constexpr uint32_t kNumAccum = BLOCK_M / 2;          // f32 per thread per 64 x BLOCK_M wave
  constexpr uint32_t kNumSFBRows = ceil_div(SHAPE_N, 128u);
  static_assert(BLOCK_M % 8 == 0 && BLOCK_M >= 8 && BLOCK_M <= 32, "token tile (the MMA's N): 8, 16, 24 or 32");
  static_assert(BLOCK_N % 64 == 0 && BLOCK_N >= 64 && BLOCK_N <= 256, "weight tile: 64-row waves, 64 ... 256");
  static_assert(kNumKSplits == 1 || kNumKSplits == 2 || kNumKSplits == 4, "clusters of 1, 2 or 4 CTAs");
  static_assert(kNumKBlocks >= kNumKSplits, "every rank runs at least one K block");
  static_assert(kNumStages >= 2 && kNumStages <= 32, "2..32 pipeline stages");
  static_assert(Smem::kTotal <= 232448, "shared memory exceeds the sm_90 opt-in limit (232,448 B)");
  static_assert(kAIn <= kAInBFloat16, "unknown A input");
  // The converters fill one 8-row payload per stage (the token tile).
  static_assert(!kQuantA || BLOCK_M == kQuantARows, "A quantised in the kernel: a token tile of kQuantARows (8)");
  (void)unused;
  (void)unused_map;

  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + Smem::kOffBar);
  uint64_t* empty_bar = full_bar + kNumStages;
  uint64_t* red_full_bar = empty_bar + kNumStages;   // rank 0: every other rank's partial tile landed
  uint64_t* red_empty_bar = red_full_bar + 1;        // ranks 1..: rank 0 has read the last one
  uint64_t* x_full_bar = red_empty_bar + 1;          // kQuantA: x's box landed in the stage's slot
  auto smem_a = [&](uint32_t s) { return smem + Smem::kOffA + s * Smem::kA; };
  auto smem_b = [&](uint32_t s) { return smem + Smem::kOffB + s * Smem::kB; };
  auto smem_sfa = [&](uint32_t s) { return reinterpret_cast<float*>(smem + Smem::kOffSFA + s * Smem::kSFA); };
  auto smem_x = [&](uint32_t s) { return smem + Smem::kOffX + s * Smem::kX; };
  float* red = reinterpret_cast<float*>(smem + Smem::kOffRed);

  const uint32_t producer_leader = 128;
  if (threadIdx.x == producer_leader) {
    if ((smem_addr(smem) & 1023u) != 0) device_trap();   // 128B swizzle needs 1024-aligned tiles
    // More rows than a stage's payload holds (the host never launches that).
    if (kQuantA && a_box_rows > kQuantARows) device_trap();
    tma_prefetch_descriptor(&tmap_a);
    tma_prefetch_descriptor(&tmap_b);
    if constexpr (!kQuantA) tma_prefetch_descriptor(&tmap_sfa);
    // kQuantA: the full barrier also waits for the stage's converter warp.
    init_stage_barriers<kNumStages>(full_bar, empty_bar, 4u, kQuantA ? 2u : 1u);
    mbarrier_init(red_full_bar, 1);
    mbarrier_init(red_empty_bar, 4);
    if constexpr (kQuantA) {
      for (uint32_t s = 0; s < kNumStages; ++s) mbarrier_init(x_full_bar + s, 1);
    }
    fence_barrier_init();
  }
  // Split K: the peers touch this CTA only in the exchange after a tile's K
  // loop, so the cluster wait is deferred to there (as in the 1D2D kernel).
  bool cluster_waited = kNumKSplits == 1;
  if constexpr (kNumKSplits > 1) cluster_arrive();
  __syncthreads();
  griddep_wait();
  griddep_launch_dependents();

  const uint32_t rank = kNumKSplits > 1 ? cluster_cta_rank() : 0u;
  // Rank r's K blocks: a contiguous share, the first kNumKBlocks % kNumKSplits ranks one more.
  constexpr uint32_t kPerRank = kNumKBlocks / kNumKSplits, kExtra = kNumKBlocks % kNumKSplits;
  const uint32_t kb_begin = rank * kPerRank + constexpr_min(rank, kExtra);
  const uint32_t kb_count = kPerRank + (constexpr_min(rank + 1u, kExtra) - constexpr_min(rank, kExtra));
  Scheduler scheduler(shape_m, nullptr, blockIdx.x / kNumKSplits, gridDim.x / kNumKSplits, rank);
  typename Scheduler::Tile tile;

  if (threadIdx.x >= 128) {
    // ------------------------------------------------------------------ producer
    if (threadIdx.x == producer_leader) {
      PipeState<kNumStages> pipe;
      // kQuantA: the tokens and their scales come from the converter warps.
      const uint32_t tx_bytes = (kQuantA ? 0u : a_box_rows * 128u + align_up(a_box_rows, 4u) * 4u) + Smem::kB;
      const bool b_evict_first = (flags & kFlagBEvictFirst) != 0;
      while (scheduler.next(tile)) {
        const int32_t a_row = static_cast<int32_t>(tile.m_block * BLOCK_M);
        const int32_t b_row = static_cast<int32_t>(tile.n_block * BLOCK_N);
        #pragma unroll 1
        for (uint32_t kb = kb_begin; kb < kb_begin + kb_count; ++kb) {
          uint64_t* bar = producer_acquire(pipe, full_bar, empty_bar, tx_bytes);
          const uint32_t stage = pipe.stage;
          const int32_t k = static_cast<int32_t>(kb * 128);
          if constexpr (!kQuantA) {
            tma_load_3d(smem_a(stage), &tmap_a, bar, k, a_row, 0);
            tma_load_3d(smem_sfa(stage), &tmap_sfa, bar, a_row, static_cast<int32_t>(kb), 0);
          }
          tma_load_3d_hint_if(smem_b(stage), &tmap_b, bar, b_evict_first, l2_policy_evict_first(), k, b_row, 0);
          pipe.advance();
        }
      }
    }
    // (the other producer lanes have nothing to do)
    if constexpr (kQuantA) {
      // Warps 1 .. kNumConverterWarps of the producer warpgroup quantise A
      // (quant_a.cuh, QuantAConverter::run_warp; the other warps return).
      QuantAConverter<kXDtype, kNumStages>::run_warp(
          (threadIdx.x - producer_leader) / 32, scheduler, kb_begin, kb_count, &tmap_a, a_box_rows,
          (flags & kFlagAPow2Scale) != 0, full_bar, empty_bar, x_full_bar, smem_x, smem_a, smem_sfa);
    }
  } else {
    // ------------------------------------------------------------------ math
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float* warp_sfb = reinterpret_cast<float*>(smem + Smem::kOffSFB) + warp * Smem::kSFBTileRows * kNumKBlocks;
    // Low descriptor words of stage 0's weight tile (this warpgroup's MMA A)
    // and token tile (MMA B); a stage / wave / k32 step adds its byte offset / 16.
    const uint32_t desc_w0 = smem_desc_sw128_lo(smem_b(0));
    const uint32_t desc_t0 = smem_desc_sw128_lo(smem_a(0));
    PipeState<kNumStages> pipe;
    uint32_t red_phase = 0;
    float accum[kWaves][kNumAccum];
    float final_accum[kWaves][kNumAccum];

    while (scheduler.next(tile)) {
      const uint32_t n0 = tile.n_block * BLOCK_N;
      #pragma unroll
      for (uint32_t v = 0; v < kWaves; ++v) {
        #pragma unroll
        for (uint32_t i = 0; i < kNumAccum; ++i) final_accum[v][i] = 0.f;
      }
      // The tile's B scales (rows n0 / 128 ...) for all of K into this warp's
      // copy, zeros past the last 128-row block.
      {
        const uint32_t row0 = n0 / 128u;
        constexpr uint32_t kCount = Smem::kSFBTileRows * kNumKBlocks;
        const uint32_t valid = constexpr_min(kCount, (kNumSFBRows - row0) * kNumKBlocks);
        warp_copy_f32<kCount>(warp_sfb, sfb + static_cast<uint64_t>(row0) * kNumKBlocks, valid, lane);
      }

      #pragma unroll 1
      for (uint32_t j = 0; j < kb_count; ++j) {
        const uint32_t kb = kb_begin + j;
        const uint32_t stage = pipe.stage;
        mbarrier_wait(full_bar + stage, pipe.phase);
        // This thread's token columns: c = 8 i + 2 (lane % 4) + e.
        float sa[kNumAccum / 2];
        #pragma unroll
        for (uint32_t i = 0; i < BLOCK_M / 8; ++i) {
          sa[i * 2 + 0] = smem_sfa(stage)[i * 8 + (lane % 4) * 2 + 0];
          sa[i * 2 + 1] = smem_sfa(stage)[i * 8 + (lane % 4) * 2 + 1];
        }
        #pragma unroll
        for (uint32_t v = 0; v < kWaves; ++v) {
          wgmma_fp8_k128<BLOCK_M, kNumAccum>(accum[v], desc_w0 + stage * (Smem::kB / 16) + v * (64u * 128u / 16),
                                             desc_t0 + stage * (Smem::kA / 16));
        }
        wgmma_wait_group<0>();
        #pragma unroll
        for (uint32_t v = 0; v < kWaves; ++v) {
          #pragma unroll
          for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(accum[v][i]);
        }
        // The stage is read: release it before the promotion.
        if (lane == 0) mbarrier_arrive(empty_bar + stage);
        // Promotion: final += (SFA[token] * SFB[rows' 128-block]) * partial,
        // accumulator element 4 i + 2 h + e = (weight row 16 warp + 8 h + lane / 4,
        // token 8 i + 2 (lane % 4) + e).
        #pragma unroll
        for (uint32_t v = 0; v < kWaves; ++v) {
          const uint32_t rel = (n0 + v * 64u) / 128u - n0 / 128u;
          const float sb = warp_sfb[rel * kNumKBlocks + kb];
          #pragma unroll
          for (uint32_t i = 0; i < BLOCK_M / 8; ++i) {
            const float s0 = mul_rn(sa[i * 2 + 0], sb), s1 = mul_rn(sa[i * 2 + 1], sb);
            float* f = final_accum[v] + i * 4;
            const float* a = accum[v] + i * 4;
            f[0] = fma_rn(s0, a[0], f[0]);
            f[1] = fma_rn(s1, a[1], f[1]);
            f[2] = fma_rn(s0, a[2], f[2]);
            f[3] = fma_rn(s1, a[3], f[3]);
          }
        }
        pipe.advance();
      }

      if constexpr (kNumKSplits > 1) {
        // Ranks 1.. send their partial tiles into rank 0 (16-byte st.async
        // per 4 accumulators into slots private to each thread: every rank
        // holds the same fragment layout); rank 0 adds them in rank order.
        if (!cluster_waited) {   // the peers' barriers are initialised from here on
          cluster_wait();
          cluster_waited = true;
        }
        constexpr uint32_t kQuads = kNumAccum / 4;
        if (rank != 0) {
          mbarrier_wait<true>(red_empty_bar, red_phase ^ 1);   // rank 0 read the previous tile's
          const uint32_t remote_bar = mapa_shared(smem_addr(red_full_bar), 0);
          const uint32_t remote = mapa_shared(smem_addr(red), 0) + (rank - 1) * Smem::kRedData;
          #pragma unroll
          for (uint32_t v = 0; v < kWaves; ++v) {
            #pragma unroll
            for (uint32_t q = 0; q < kQuads; ++q) {
              const float* f = final_accum[v] + q * 4;
              st_async_v4(remote + ((v * kQuads + q) * 128u + tid) * 16u, f[0], f[1], f[2], f[3], remote_bar);
            }
          }
        } else {
          if (tid == 0) mbarrier_arrive_expect_tx(red_full_bar, (kNumKSplits - 1) * Smem::kRedData);
          mbarrier_wait<true>(red_full_bar, red_phase);
          #pragma unroll
          for (uint32_t r = 1; r < kNumKSplits; ++r) {
            const float4* part = reinterpret_cast<const float4*>(red + (r - 1) * Smem::kRedData / 4u);
            #pragma unroll
            for (uint32_t v = 0; v < kWaves; ++v) {
              #pragma unroll
              for (uint32_t q = 0; q < kQuads; ++q) {
                const float4 p = part[(v * kQuads + q) * 128u + tid];
                float* f = final_accum[v] + q * 4;
                f[0] = add_rn(f[0], p.x);
                f[1] = add_rn(f[1], p.y);
                f[2] = add_rn(f[2], p.z);
                f[3] = add_rn(f[3], p.w);
              }
            }
          }
          // Reads done (ordered before lane 0's cluster-scope release): the
          // other ranks may send the next tile's partial sums.
          __syncwarp();
          if (lane == 0) {
            #pragma unroll
            for (uint32_t r = 1; r < kNumKSplits; ++r) mbarrier_arrive_cluster<true>(red_empty_bar, r);
          }
        }
        red_phase ^= 1;
        if (rank != 0) continue;   // rank 0 stores the tile
      }

      // ---------------------------------------------------------------- epilogue
      // D[token, n] for this thread's elements, each checked against M and N.
      const uint32_t m0 = tile.m_block * BLOCK_M;
      #pragma unroll
      for (uint32_t v = 0; v < kWaves; ++v) {
        #pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
          const uint32_t n = n0 + v * 64u + warp * 16u + h * 8u + lane / 4u;
          if (n >= SHAPE_N) continue;
          #pragma unroll
          for (uint32_t i = 0; i < BLOCK_M / 8; ++i) {
            #pragma unroll
            for (uint32_t e = 0; e < 2; ++e) {
              const uint32_t t = m0 + i * 8u + (lane % 4u) * 2u + e;
              if (t < shape_m) {
                d_ptr[static_cast<uint64_t>(t) * ld_d + n] =
                    static_cast<uint16_t>(pack_bf16x2(final_accum[v][i * 4 + h * 2 + e], 0.f) & 0xffffu);
              }
            }
          }
        }
      }
    }
  }

  if constexpr (kNumKSplits > 1) {
    if (!cluster_waited) cluster_wait();   // a thread that never exchanged
    // No CTA exits while a peer may still arrive on its barriers or send into it.
    cluster_sync();
  }
}

}  // namespace cugemm8
