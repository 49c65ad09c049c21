// SPDX-License-Identifier: MIT
// FP8 GEMM with both operands scaled 1x128 along K ("1D1D", the weight
// gradient of DeepSeek-V3's FP8 training: technical report §3.3) for sm_90a,
// FP32 output, optionally accumulated into C:
//
//   D[m, n] = (C[m, n] +) sum_kb SFA[m, kb] * SFB[n, kb] * sum_{k in kb} A[m, k] * B[n, k]
//
// A [M, K] and B [N, K] are e4m3 (K-major), SFA [M, ceil(K/128)] and
// SFB [N, ceil(K/128)] float32 (read MN-major, as the 1D2D kernel reads
// SFA), D and C float32 row-major (C may be D: in place).  For a linear
// layer's wgrad dW = dY^T X, K is the token dimension: A = dY^T, B = X^T,
// both quantised along the tokens (cugemm8.per_token_cast_to_fp8_t).
//
// kGemmType kGroupedK is DeepGEMM's k-grouped contiguous layout (the MoE
// wgrad): kNumGroups groups own consecutive runs of the K dimension, group g
// the ks[g] columns after those of groups < g (each a multiple of 128, so no
// scale granule straddles two groups), and D[g] (+ C[g]) is the 1D1D
// product over its own run.  A group with ks[g] = 0 stores C[g] (or zeros)
// unchanged.
//
// Structure: the 1D2D kernel's (fp8_gemm_1d2d.cuh) without its B-scale
// staging and split K: one producer warpgroup (one thread issues the TMA
// loads of A, B and both scales into a stage of the ring, pipeline.cuh), two
// math warpgroups that own 64-row sub-tiles (BLOCK_M = 128: one each, 256:
// two each), persistent CTAs on scheduler.cuh's rasterised order.  The
// promotion takes a scale per output element,
//
//   final[m, n] = fma(fl32(SFA[m, kb] * SFB[n, kb]), partial[m, n], final[m, n]),
//
// the order cugemm8.reference.promoted_accumulation_model_1d1d models (after
// DeepGEMM's sm90_fp8_gemm_1d1d.cuh, which promotes the same way).  Three
// forms of the K loop: BLOCK_M = 128 and BLOCK_N <= 128 (kPipelineMma: three
// tiles of accumulators fit) issue K block j + 1's WGMMAs before block j is
// promoted; BLOCK_M = 128 and BLOCK_N > 128 read B's scales for a thread's
// columns into registers before the WGMMAs and release the stage as soon as
// they complete (DeepGEMM's order); with 256 (two sub-tiles per warpgroup)
// they are read from the stage during each promotion and the stage is
// released after both.  The orders tried and not kept are measured in
// benches/RESULTS.md v0.18.
//
// Epilogue, two forms (kTmaStore):
//   * TMA (no C, or C = D in place): each math warpgroup stages its 64-row
//     sub-tile 32 columns at a time (64 x 32 FP32, 128-byte swizzled; the
//     fragment's 8-byte stores take about 4 wavefronts each, measured to
//     cost under 2 %: benches/RESULTS.md v0.18) in two alternating 8 KB
//     buffers, and one thread stores each chunk with a TMA tile store, or
//     with C = D a TMA reduce-add (the L2 adds: fl32(C + D), as the
//     register form; an empty k-group leaves C = D untouched).  Nothing
//     waits for C, and the stores drain behind the next tile's K loop
//     (DeepGEMM's sm90_fp8_gemm_1d1d reduce-adds a whole staged tile).
//   * registers (C not D, or D not 16-byte aligned): FP32 straight from
//     registers to global memory (8-byte stores, bounds-predicated in M and
//     N), adding C first (add.rn: subnormals kept) when given.
#pragma once
#include "common.cuh"
#include "pipeline.cuh"
#include "ptx/fp32.cuh"
#include "ptx/griddep.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "scheduler.cuh"

namespace cugemm8 {

// Shared-memory budget; cugemm8/_config_1d1d.py:smem_size must implement the
// same formula (tests/test_gemm_1d1d.py pins it).
template <uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages, bool kTmaStore>
struct SmemLayout1d1d {
  // D staging (TMA epilogue): 2 warpgroups x 2 buffers of 64 x 32 FP32.
  static constexpr uint32_t kDChunk = 64u * 32u * 4u;
  static constexpr uint32_t kD = kTmaStore ? 2u * 2u * kDChunk : 0u;
  static constexpr uint32_t kA = BLOCK_M * 128u;                  // (BLOCK_M, BLOCK_K) e4m3
  static constexpr uint32_t kB = BLOCK_N * 128u;                  // (BLOCK_N, BLOCK_K) e4m3
  static constexpr uint32_t kSFA = align_up(BLOCK_M * 4u, 128u);  // (BLOCK_M,) f32
  static constexpr uint32_t kSFB = align_up(BLOCK_N * 4u, 128u);  // (BLOCK_N,) f32
  static constexpr uint32_t kOffD = 0;                            // 1024-aligned (128B swizzle)
  static constexpr uint32_t kOffA = kOffD + kD;
  static constexpr uint32_t kOffB = kOffA + kNumStages * kA;
  static constexpr uint32_t kOffSFA = kOffB + kNumStages * kB;
  static constexpr uint32_t kOffSFB = kOffSFA + kNumStages * kSFA;
  static constexpr uint32_t kOffBar = kOffSFB + kNumStages * kSFB;
  static constexpr uint32_t kTotal = kOffBar + 256u;
  static_assert(2u * kNumStages * 8u <= 256u, "barrier reserve holds at most 16 stages");
};

template <uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages, uint32_t kGemmType,
          uint32_t kNumGroups, bool kTmaStore>
struct Gemm1d1dTraits {
  static constexpr uint32_t kNumMathWG = 2;
  static constexpr uint32_t kWaves = BLOCK_M / 128;          // 64-row sub-tiles per math warpgroup
  static constexpr uint32_t kNumMathThreads = 128 * kNumMathWG;
  static constexpr uint32_t kNumThreads = kNumMathThreads + 128;
  static constexpr uint32_t kNumAccum = BLOCK_N / 2;          // f32 per thread per 64 x BLOCK_N
  // WGMMAs pipelined across K blocks (a second accumulator: K block j + 1's
  // WGMMAs run while block j is promoted) where three tiles of accumulators
  // fit: one 64-row sub-tile per warpgroup and BLOCK_N <= 128.
  static constexpr bool kPipelineMma = kWaves == 1 && BLOCK_N <= 128;
  static constexpr uint32_t kPipeUnroll = 8;                 // K blocks per pipelined chunk
  using Smem = SmemLayout1d1d<BLOCK_M, BLOCK_N, kNumStages, kTmaStore>;
  static constexpr uint32_t kDChunks = BLOCK_N / 32;          // TMA epilogue: 32-column chunks per sub-tile
  // Bytes one stage's four boxes deliver (TMA counts the zero-filled
  // out-of-bounds part of a box too).
  static constexpr uint32_t kTxBytes = Smem::kA + Smem::kB + BLOCK_M * 4u + BLOCK_N * 4u;
  static_assert(BLOCK_M == 128 || BLOCK_M == 256, "BLOCK_M must be 128 or 256");
  static_assert(BLOCK_N % 8 == 0 && BLOCK_N >= 8 && BLOCK_N <= 256, "WGMMA N is a multiple of 8 in [8, 256]");
  // Accumulators (two with kPipelineMma), final tile(s) and (one sub-tile
  // per warpgroup, unpipelined) B's scales: cugemm8/_config_1d1d.py
  // _registers_needed (128 x 176 and 128 x 192 spilled).
  static_assert((kPipelineMma ? 3 : kWaves + 1) * kNumAccum + (kWaves == 1 && !kPipelineMma ? BLOCK_N / 4 : 0) <= 208,
                "accumulators and scales would not fit in 232 registers");
  static_assert(kNumStages >= 2 && kNumStages <= 16, "2..16 pipeline stages");
  static_assert(Smem::kTotal <= 232448, "shared memory exceeds the sm_90 opt-in limit (232,448 B)");
  static_assert(kGemmType == kNormal || kGemmType == kGroupedK, "the 1D1D kernel is normal or k-grouped");
  static_assert(kGemmType == kGroupedK || kNumGroups == 1, "a normal 1D1D GEMM has one group");
  static_assert(!kTmaStore || BLOCK_N % 32 == 0, "the TMA epilogue stores 32-column chunks");
};

// K blocks [begin, begin + count) of group g: the whole K for a normal GEMM;
// for a k-grouped one, the run after the groups before g, clamped to the
// ceil(shape_k / 128) blocks of the operands (ks entries below 0 count as 0).
// The host validates ks; a ks_tensor that disagrees with it gives wrong
// values, never an access outside the tensor maps (every load is a TMA box,
// zero-filled out of bounds) and never more K blocks than the operands have.
template <uint32_t kGemmType>
__device__ __forceinline__ void group_k_blocks(uint32_t g, uint32_t shape_k, const int32_t* ks,
                                               uint32_t& begin, uint32_t& count) {
  const uint32_t total = ceil_div(shape_k, 128u);
  if constexpr (kGemmType == kGroupedK) {
    uint64_t off = 0;
    for (uint32_t e = 0; e < g; ++e) off += static_cast<uint32_t>(max(__ldg(ks + e), 0));
    const uint64_t b = off / 128u;
    begin = b < total ? static_cast<uint32_t>(b) : total;
    count = constexpr_min(ceil_div(static_cast<uint32_t>(max(__ldg(ks + g), 0)), 128u), total - begin);
  } else {
    begin = 0;
    count = total;
  }
}

// Arguments:
//   shape_m   rows of A / D (per group)
//   shape_k   K (normal), or the sum of ks (k-grouped: bounds each group's run)
//   ks        k-grouped: int32 [kNumGroups] tokens per group; else nullptr
//   d_ptr     D float32 [kNumGroups, shape_m, SHAPE_N], row stride ld_d elements,
//             group stride shape_m * ld_d
//   c_ptr     C with D's layout, or nullptr; may equal d_ptr
//   tmap_a    A   as (K, M, 1) u8,   box (128, BLOCK_M, 1), 128B swizzle
//   tmap_b    B   as (K, N, 1) u8,   box (128, BLOCK_N, 1), 128B swizzle
//   tmap_sfa  SFA as (M, ceil(K/128), 1) f32 (MN-major), box (BLOCK_M, 1, 1)
//   tmap_sfb  SFB as (N, ceil(K/128), 1) f32 (MN-major), box (BLOCK_N, 1, 1)
//   tmap_d    kTmaStore: D as (SHAPE_N, shape_m, kNumGroups) f32, box (32, 64, 1),
//             128B swizzle; c_ptr then nullptr (store) or d_ptr (reduce-add).
//             Otherwise unused.
template <uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages, uint32_t kGemmType,
          uint32_t kNumGroups, bool kTmaStore>
__global__ void __launch_bounds__(
    Gemm1d1dTraits<SHAPE_N, BLOCK_M, BLOCK_N, kNumStages, kGemmType, kNumGroups, kTmaStore>::kNumThreads, 1)
fp8_gemm_1d1d_kernel(uint32_t shape_m, uint32_t shape_k, const int32_t* __restrict__ ks, float* d_ptr,
                     const float* c_ptr, uint32_t ld_d,
                     const __grid_constant__ TmaDescriptor tmap_a, const __grid_constant__ TmaDescriptor tmap_b,
                     const __grid_constant__ TmaDescriptor tmap_sfa, const __grid_constant__ TmaDescriptor tmap_sfb,
                     const __grid_constant__ TmaDescriptor tmap_d) {
  using T = Gemm1d1dTraits<SHAPE_N, BLOCK_M, BLOCK_N, kNumStages, kGemmType, kNumGroups, kTmaStore>;
  using Smem = typename T::Smem;
  using Scheduler = TileScheduler<kGemmType, SHAPE_N, BLOCK_M, BLOCK_N, 1, false, kNumGroups>;
  constexpr uint32_t kNumAccum = T::kNumAccum;
  constexpr uint32_t kWaves = T::kWaves;

  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + Smem::kOffBar);
  uint64_t* empty_bar = full_bar + kNumStages;
  auto smem_a = [&](uint32_t s) { return smem + Smem::kOffA + s * Smem::kA; };
  auto smem_b = [&](uint32_t s) { return smem + Smem::kOffB + s * Smem::kB; };
  auto smem_sfa = [&](uint32_t s) { return reinterpret_cast<float*>(smem + Smem::kOffSFA + s * Smem::kSFA); };
  auto smem_sfb = [&](uint32_t s) { return reinterpret_cast<float*>(smem + Smem::kOffSFB + s * Smem::kSFB); };

  const uint32_t warpgroup = threadIdx.x / 128;
  const uint32_t producer_leader = T::kNumMathThreads;
  if (threadIdx.x == producer_leader) {
    if ((smem_addr(smem) & 1023u) != 0) device_trap();   // 128B swizzle needs 1024-aligned tiles
    tma_prefetch_descriptor(&tmap_a);
    tma_prefetch_descriptor(&tmap_b);
    tma_prefetch_descriptor(&tmap_sfa);
    tma_prefetch_descriptor(&tmap_sfb);
    if constexpr (kTmaStore) tma_prefetch_descriptor(&tmap_d);
    // Every math warp releases every stage.
    init_stage_barriers<kNumStages>(full_bar, empty_bar, T::kNumMathThreads / 32);
    fence_barrier_init();
  }
  __syncthreads();
  griddep_wait();
  griddep_launch_dependents();

  Scheduler scheduler(shape_m, nullptr, blockIdx.x, gridDim.x, 0);
  typename Scheduler::Tile tile;

  if (warpgroup == T::kNumMathWG) {
    // ------------------------------------------------------------------ producer
    setmaxnreg_dec<40>();
    if (threadIdx.x == producer_leader) {
      PipeState<kNumStages> pipe;
      while (scheduler.next(tile)) {
        uint32_t kb0, kb_count;
        group_k_blocks<kGemmType>(tile.group, shape_k, ks, kb0, kb_count);
        const int32_t m0 = static_cast<int32_t>(tile.m_block * BLOCK_M);
        const int32_t n0 = static_cast<int32_t>(tile.n_block * BLOCK_N);
        for (uint32_t j = 0; j < kb_count; ++j) {
          uint64_t* bar = producer_acquire(pipe, full_bar, empty_bar, T::kTxBytes);
          const uint32_t s = pipe.stage;
          const int32_t kb = static_cast<int32_t>(kb0 + j);
          tma_load_3d(smem_a(s), &tmap_a, bar, kb * 128, m0, 0);
          tma_load_3d(smem_b(s), &tmap_b, bar, kb * 128, n0, 0);
          tma_load_3d(smem_sfa(s), &tmap_sfa, bar, m0, kb, 0);
          tma_load_3d(smem_sfb(s), &tmap_sfb, bar, n0, kb, 0);
          pipe.advance();
        }
      }
    }
  } else {
    // ------------------------------------------------------------------ math
    setmaxnreg_inc<232>();
    const uint32_t tid = threadIdx.x % 128;
    const uint32_t warp = tid / 32, lane = tid % 32;
    // Row (within the tile) of sub-tile v handled by this warpgroup.
    auto row_off = [&](uint32_t v) { return v * 128 + warpgroup * 64; };
    // WGMMA descriptors' low words, as in the 1D2D kernel (warp-uniform via
    // the shuffle, so they stay in uniform registers).
    const uint32_t desc_a0 = smem_desc_sw128_lo(smem_a(0)) + __shfl_sync(0xffffffffu, row_off(0) * 128 / 16, 0);
    const uint32_t desc_b0 = smem_desc_sw128_lo(smem_b(0));
    PipeState<kNumStages> pipe;
    uint32_t d_buf = 0;                      // TMA epilogue: the staging buffer next written
    float accum[kNumAccum];
    float final_accum[kWaves][kNumAccum];

    auto issue_mma = [&](uint32_t s, uint32_t v) {
      wgmma_fp8_k128<BLOCK_N, kNumAccum>(accum, desc_a0 + s * (Smem::kA / 16) + (row_off(v) - row_off(0)) * 8,
                                         desc_b0 + s * (Smem::kB / 16));
    };

    while (scheduler.next(tile)) {
      uint32_t kb0, kb_count;
      group_k_blocks<kGemmType>(tile.group, shape_k, ks, kb0, kb_count);
      (void)kb0;
      #pragma unroll
      for (uint32_t v = 0; v < kWaves; ++v) {
        #pragma unroll
        for (uint32_t i = 0; i < kNumAccum; ++i) final_accum[v][i] = 0.f;
      }
      // Promotion with a scale per element: the thread's columns are i*8 +
      // 2*(lane%4) + {0, 1} (the m64nNk32 accumulator fragment).
      auto promote = [&](const float* acc, float* fin, float sa0, float sa1, uint32_t i, float2 sb) {
        const float* a = acc + i * 4;
        float* f = fin + i * 4;
        f[0] = fma_rn(mul_rn(sa0, sb.x), a[0], f[0]);
        f[1] = fma_rn(mul_rn(sa0, sb.y), a[1], f[1]);
        f[2] = fma_rn(mul_rn(sa1, sb.x), a[2], f[2]);
        f[3] = fma_rn(mul_rn(sa1, sb.y), a[3], f[3]);
      };
      // B's scales of the thread's columns i*8 + 2*(lane%4) + {0, 1} in a stage.
      auto sb_pair = [&](const float* sfb_stage, uint32_t i) {
        return *reinterpret_cast<const float2*>(sfb_stage + i * 8 + (lane % 4) * 2);
      };
      if constexpr (T::kPipelineMma) {
        // K blocks in chunks of kPipeUnroll: block u + 1's WGMMAs are issued
        // (into the other of `accum` / `accum_b`) before block u is waited
        // for and promoted, so every promotion but a chunk's last overlaps
        // this warpgroup's next WGMMAs (chunks of 8 measured faster than 4
        // or 2).  Both scales are read from block u's stage during its
        // promotion, and the stage is released after it.  No WGMMA group
        // stays in flight across a chunk's end (across the loop's back edge
        // ptxas serialises every WGMMA, C7514).  Same operations in the same order on every value
        // as the unpipelined loop: the output bits do not change.
        float accum_b[kNumAccum];
        const uint32_t r = row_off(0) + warp * 16 + lane / 4;
        auto start = [&](float* acc) {
          const uint32_t s = pipe.stage;
          mbarrier_wait(full_bar + s, pipe.phase);
          wgmma_fp8_k128<BLOCK_N, kNumAccum>(acc, desc_a0 + s * (Smem::kA / 16), desc_b0 + s * (Smem::kB / 16));
          pipe.advance();
          return s;
        };
        auto finish = [&](float* acc, uint32_t s) {
          #pragma unroll
          for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(acc[i]);
          const float sa0 = smem_sfa(s)[r], sa1 = smem_sfa(s)[r + 8];
          const float* sfb_stage = smem_sfb(s);
          #pragma unroll
          for (uint32_t i = 0; i < kNumAccum / 4; ++i)
            promote(acc, final_accum[0], sa0, sa1, i, sb_pair(sfb_stage, i));
          __syncwarp();
          if (lane == 0) mbarrier_arrive(empty_bar + s);
        };
        auto chunk = [&](auto count) {
          constexpr uint32_t U = decltype(count)::value;
          uint32_t stage[U];
          #pragma unroll
          for (uint32_t u = 0; u < U; ++u) {
            stage[u] = start(u % 2 ? accum_b : accum);
            if (u > 0) {
              wgmma_wait_group<1>();
              finish((u - 1) % 2 ? accum_b : accum, stage[u - 1]);
            }
          }
          wgmma_wait_group<0>();
          finish((U - 1) % 2 ? accum_b : accum, stage[U - 1]);
        };
        uint32_t j = 0;
        #pragma unroll 1
        for (; j + T::kPipeUnroll <= kb_count; j += T::kPipeUnroll) chunk(UConst<T::kPipeUnroll>{});
        #pragma unroll 1
        for (; j + 2 <= kb_count; j += 2) chunk(UConst<2>{});
        if (j < kb_count) chunk(UConst<1>{});
      } else {
        #pragma unroll 1
        for (uint32_t j = 0; j < kb_count; ++j) {
          const uint32_t s = pipe.stage;
          mbarrier_wait(full_bar + s, pipe.phase);
          const float* sfb_stage = smem_sfb(s);
          const uint32_t r = row_off(0) + warp * 16 + lane / 4;
          if constexpr (kWaves == 1) {
            // DeepGEMM's order: both scales into registers, the WGMMAs, the
            // stage released as soon as they completed, then the promotion
            // (overlapping the refill and the other warpgroup's WGMMAs).
            // Measured slower (RESULTS v0.18): the loads after the WGMMAs
            // were issued (+19-26 %: they wait behind the WGMMAs' shared-memory
            // reads), the next block's scales read during this promotion
            // (+2-4 %), 16-byte scale loads (no change), the two warpgroups'
            // WGMMAs taking turns through named barriers (+2-5 %).
            const float sa0 = smem_sfa(s)[r], sa1 = smem_sfa(s)[r + 8];
            float2 sb[kNumAccum / 4];
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum / 4; ++i)
              sb[i] = sb_pair(sfb_stage, i);
            issue_mma(s, 0);
            wgmma_wait_group<0>();
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(accum[i]);
            __syncwarp();
            if (lane == 0) mbarrier_arrive(empty_bar + s);
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum / 4; ++i) promote(accum, final_accum[0], sa0, sa1, i, sb[i]);
          } else {
            // Two sub-tiles per warpgroup: B's scales (too many to keep in
            // registers beside two tiles of accumulators) are read from the
            // stage during each promotion, and the stage is released after both.
            #pragma unroll
            for (uint32_t v = 0; v < kWaves; ++v) {
              const float sa0 = smem_sfa(s)[r + v * 128], sa1 = smem_sfa(s)[r + v * 128 + 8];
              issue_mma(s, v);
              wgmma_wait_group<0>();
              #pragma unroll
              for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(accum[i]);
              #pragma unroll
              for (uint32_t i = 0; i < kNumAccum / 4; ++i)
                promote(accum, final_accum[v], sa0, sa1, i, sb_pair(sfb_stage, i));
            }
            __syncwarp();
            if (lane == 0) mbarrier_arrive(empty_bar + s);
          }
          pipe.advance();
        }
      }

      // ---------------------------------------------------------------- epilogue
      const bool empty = kb_count == 0;
      if constexpr (kTmaStore) {
        // Chunk j of sub-tile v: columns [32 j, 32 j + 32) of its 64 rows.
        // Before a buffer is rewritten, the store issued from it two chunks
        // earlier must have finished reading it (wait_group.read 1 by the
        // issuing thread, then the warpgroup's barrier); after the writes,
        // a proxy fence and the barrier again, then one thread issues.
        const bool accumulate = c_ptr != nullptr;
        if (!(accumulate && empty)) {
          const int32_t n0 = static_cast<int32_t>(tile.n_block * BLOCK_N);
          #pragma unroll
          for (uint32_t v = 0; v < kWaves; ++v) {
            const int32_t m0 = static_cast<int32_t>(tile.m_block * BLOCK_M + row_off(v));
            #pragma unroll
            for (uint32_t j = 0; j < T::kDChunks; ++j) {
              const uint32_t buf = Smem::kOffD + (warpgroup * 2 + d_buf) * Smem::kDChunk;
              if (tid == 0) tma_store_wait_read<1>();
              named_barrier_sync(2 + warpgroup, 128);
              #pragma unroll
              for (uint32_t h = 0; h < 2; ++h) {
                const uint32_t r = warp * 16 + lane / 4 + h * 8;
                #pragma unroll
                for (uint32_t q = 0; q < 4; ++q) {
                  const uint32_t i = j * 4 + q;
                  const uint32_t off = (r * 128 + (q * 8 + (lane % 4) * 2) * 4) ^ ((r % 8) << 4);
                  st_shared_v2_f32(smem_addr(smem + buf) + off, final_accum[v][i * 4 + h * 2],
                                   final_accum[v][i * 4 + h * 2 + 1]);
                }
              }
              fence_proxy_async_smem();
              named_barrier_sync(2 + warpgroup, 128);
              if (tid == 0) {
                const int32_t nc = n0 + static_cast<int32_t>(j * 32);
                if (accumulate) tma_reduce_add_3d(&tmap_d, smem + buf, nc, m0, static_cast<int32_t>(tile.group));
                else tma_store_3d(&tmap_d, smem + buf, nc, m0, static_cast<int32_t>(tile.group));
                tma_store_commit();
              }
              d_buf ^= 1u;
            }
          }
        }
      } else {
        // Register form.  Per row of the thread's fragment (2 per 64-row
        // sub-tile): every load of C first (BLOCK_N / 8 independent 8-byte
        // loads, sharing one memory latency), then the additions and the
        // stores.  Loading and
        // storing element by element serialised a DRAM round trip per 8 bytes
        // (C may be D, so the compiler keeps each load after the previous
        // store): 2x the GEMM's time at 2112 x 7168 x 4096 (benches/RESULTS.md
        // v0.11).  A whole sub-tile's loads at once spilled (BLOCK_N / 2 more
        // registers).  Each element of C is read, then D written, by this
        // thread alone, so C may be D.
        const uint64_t group_off = static_cast<uint64_t>(tile.group) * shape_m * ld_d;
        #pragma unroll
        for (uint32_t v = 0; v < kWaves; ++v) {
          #pragma unroll
          for (uint32_t h = 0; h < 2; ++h) {
            const uint32_t r = tile.m_block * BLOCK_M + row_off(v) + warp * 16 + lane / 4 + h * 8;
            if (r >= shape_m) continue;
            const uint64_t row = group_off + static_cast<uint64_t>(r) * ld_d;
            const uint32_t c0 = tile.n_block * BLOCK_N + (lane % 4) * 2;
            float2 cv[kNumAccum / 4];
            if (c_ptr != nullptr) {
              #pragma unroll
              for (uint32_t i = 0; i < kNumAccum / 4; ++i) {
                cv[i] = c0 + i * 8 < SHAPE_N ? *reinterpret_cast<const float2*>(c_ptr + row + c0 + i * 8)
                                             : make_float2(0.f, 0.f);
              }
            }
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum / 4; ++i) {
              const uint32_t col = c0 + i * 8;
              if (col >= SHAPE_N) continue;
              float2 x = make_float2(final_accum[v][i * 4 + h * 2], final_accum[v][i * 4 + h * 2 + 1]);
              if (c_ptr != nullptr) {
                x = empty ? cv[i] : make_float2(add_rn(cv[i].x, x.x), add_rn(cv[i].y, x.y));
              }
              *reinterpret_cast<float2*>(d_ptr + row + col) = x;
            }
          }
        }
      }
    }
    // The staging buffers must outlive the TMA stores' reads, and the
    // stores are complete before the CTA exits.
    if constexpr (kTmaStore) {
      if (tid == 0) tma_store_wait_all();
    }
  }
}

}  // namespace cugemm8
