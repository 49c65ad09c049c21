// SPDX-License-Identifier: MIT
// FP8 GEMM with DeepSeek-V3 fine-grained scaling ("1D2D": 1x128 activation
// scales, 128x128 weight scales) for sm_90a:
//
//   D[m, n] = sum_kb SFA[m, kb] * SFB[n / 128, kb] * sum_{k in kb} A[m, k] * B[n, k]
//
// A [M, K] and B [N, K] are e4m3 (K-major), SFA / SFB float32, D bf16.
//
// Structure (after deepseek-ai/DeepGEMM deep_gemm/include/deep_gemm/fp8_gemm.cuh;
// DeepSeek-V3 technical report §3.3.2):
// * one producer warpgroup (one elected thread issues every TMA load) and two
//   math warpgroups issuing WGMMA (with BLOCK_M = 64 they split K, or a
//   single one runs the whole K: kNumMathWGs); with two, registers moved from
//   the producer to the math warpgroups with setmaxnreg;
// * a kNumStages-deep ring of shared-memory stages guarded by full / empty
//   mbarriers; one stage = one 128-wide K block of A, B and A's scales;
// * "promotion": each K block's WGMMA partial sum (the tensor core keeps about
//   14 mantissa bits) is scaled by SFA * SFB and added into a separate FP32
//   accumulator with CUDA-core FFMAs, so nothing long is ever accumulated
//   inside the tensor core;
// * persistent CTAs walking a rasterised tile order (scheduler.cuh), optional
//   TMA multicast of A or B across a cluster of two (on the contiguous
//   layout B is shared only by two m-blocks of one expert: kPairedB);
// * or, for small M, split K across a cluster of two or four (kNumKSplits):
//   every CTA of the cluster takes the same tile and its share of the K
//   blocks, and the FP32 partial tiles meet in rank 0 by st.async into a
//   peer's shared memory (completing on an mbarrier): with two, rank 1 sends
//   to rank 0; with four, a tree (ranks 1 and 3 send to 0 and 2, then 2 to 0),
//   so the sum is (p0 + p1) + (p2 + p3) on every run; rank 0 stores the tile;
// * epilogue: BF16 through swizzled shared memory and TMA stores that overlap
//   the next tile's main loop.
#pragma once
#include "common.cuh"
#include "pipeline.cuh"
#include "ptx/fp32.cuh"
#include "ptx/griddep.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "quant.cuh"
#include "quant_a.cuh"
#include "scheduler.cuh"

namespace cugemm8 {

// Tiles whose BLOCK_N does not divide 128 straddle a 128-row boundary of the B
// scales at a column that depends on the tile: the first `num_former` 8-column
// chunks use one scale row, the rest the next.  A runtime boundary costs a
// compare and two selects per chunk in every promotion, so when the boundary
// takes at most kMaxFormerVariants values (128 / gcd(BLOCK_N, 128) of them:
// BLOCK_N = 112, 144, 160, 192, ...), the K loop is instantiated once per
// value and each tile runs its copy (DeepGEMM's sm90 1D2D kernel specialises
// the same way).  Measured on the H200: 128x192 tiles 12-14 % faster
// (benches/RESULTS.md, v0.3).
constexpr uint32_t kRuntimeFormer = 0xffffffffu;
constexpr uint32_t kMaxFormerVariants = 8;

template <uint32_t BLOCK_N>
__host__ __device__ constexpr uint32_t num_former_variants() {
  return 128u % BLOCK_N == 0 ? 1u : 128u / constexpr_gcd(BLOCK_N, 128u);
}

// 128-row blocks of B scales a tile can touch: one when BLOCK_N divides 128,
// else those under its worst start (128 - gcd(BLOCK_N, 128) columns into a
// block): two for 112, 144, 160, 192, three for 176 (the 2112-column
// DeepSeek-V3 weights in 12 tiles).  With three, a tile's 8-column chunks
// take the first row before `num_former`, the second for the next 16
// chunks (128 columns) and the third after those.
template <uint32_t BLOCK_N>
__host__ __device__ constexpr uint32_t sfb_tile_rows() {
  return 128u % BLOCK_N == 0 ? 1u : ceil_div(128u - constexpr_gcd(BLOCK_N, 128u) + BLOCK_N, 128u);
}

// Calls f(UConst<num_former>) for the tile starting at column n0, or
// f(UConst<kRuntimeFormer>) when there are too many variants.
template <uint32_t BLOCK_N, uint32_t V = 0, typename F>
__device__ __forceinline__ void dispatch_num_former(uint32_t n0, F&& f) {
  constexpr uint32_t kVariants = num_former_variants<BLOCK_N>();
  if constexpr (128u % BLOCK_N == 0) {
    f(UConst<BLOCK_N / 8>{});
  } else if constexpr (kVariants > kMaxFormerVariants) {
    f(UConst<kRuntimeFormer>{});
  } else {
    constexpr uint32_t kGap = constexpr_gcd(BLOCK_N, 128u);
    constexpr uint32_t kFormer = constexpr_min(BLOCK_N, 128u - V * kGap) / 8;
    // n0 % 128 is a multiple of kGap below 128: the last variant needs no test.
    if (V + 1 == kVariants || n0 % 128u == V * kGap) {
      f(UConst<kFormer>{});
    } else if constexpr (V + 1 < kVariants) {
      dispatch_num_former<BLOCK_N, V + 1>(n0, f);
    }
  }
}

// Shared-memory budget of one configuration; cugemm8/_config.py:smem_size
// must implement the same formula: the launch asks for _config's number of
// bytes, so a drift would under-allocate (tests/test_config.py pins the formula).
// kQuantAXBytes: 0, or the element size of the float activations the kernel
// quantises itself (quant_a.cuh): then a stage's A payload holds only
// kQuantARows rows (its WGMMA descriptor repeats them over the 64-row tile)
// and each stage also has a slot for those rows of x.

template <uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages, uint32_t kNumKSplits,
          uint32_t kNumMathWGs, uint32_t kQuantAXBytes = 0>
struct SmemLayout {
  static constexpr bool kQuantA = kQuantAXBytes != 0;
  static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, 128u);
  static constexpr uint32_t kD = align_up(BLOCK_M * BLOCK_N * 2u, 1024u);   // (BLOCK_M, BLOCK_N) bf16
  // (BLOCK_M, BLOCK_K) e4m3; with kQuantA (kQuantARows, BLOCK_K), 1024 bytes
  static constexpr uint32_t kA = kQuantA ? kQuantARows * 128u : BLOCK_M * 128u;
  static constexpr uint32_t kX = kQuantARows * 128u * kQuantAXBytes;       // kQuantA: (kQuantARows, BLOCK_K) of x
  static constexpr uint32_t kB = BLOCK_N * 128u;                            // (BLOCK_N, BLOCK_K) e4m3
  static constexpr uint32_t kSFA = align_up(BLOCK_M * 4u, 128u);            // (BLOCK_M,) f32
  // B scales: each of the 8 math warps keeps its own copy of the tile's
  // candidate rows (two, or three for BLOCK_N = 176: sfb_tile_rows), so only
  // __syncwarp orders their writes and reads.
  static constexpr uint32_t kSFBRows = sfb_tile_rows<BLOCK_N>() < 2u ? 2u : sfb_tile_rows<BLOCK_N>();
  static constexpr uint32_t kSFB = align_up(8u * kSFBRows * kNumKBlocks * 4u, 16u);  // (8 warps, rows, num_k_blocks) f32
  // BLOCK_M == 64 with two math warpgroups splits K between them; the
  // second hands its FP32 partial tile to the first through this buffer.
  static constexpr uint32_t kReduce = BLOCK_M == 64 && kNumMathWGs == 2 ? 64u * BLOCK_N * 4u : 0u;  // (BLOCK_N/2, 128) f32
  // Split K across the cluster: a peer's FP32 partial tile lands here in a
  // receiving rank (0, and 2 of four), followed by the two barriers of the
  // exchange (full: the receiver's, empty: the sender's).
  static constexpr uint32_t kClusterRedData = kNumKSplits > 1 ? BLOCK_M * BLOCK_N * 4u : 0u;
  static constexpr uint32_t kClusterRed = kNumKSplits > 1 ? align_up(kClusterRedData + 16u, 1024u) : 0u;
  static constexpr uint32_t kOffReduce = kD;
  static constexpr uint32_t kOffClusterRed = kD + kReduce;
  static constexpr uint32_t kOffClusterBar = kOffClusterRed + kClusterRedData;
  static constexpr uint32_t kOffA = kOffClusterRed + kClusterRed;
  static constexpr uint32_t kOffB = kOffA + kNumStages * kA;
  static constexpr uint32_t kOffSFA = kOffB + kNumStages * kB;
  static constexpr uint32_t kOffX = kOffSFA + kNumStages * kSFA;
  static constexpr uint32_t kOffSFB = kOffX + kNumStages * kX;
  static constexpr uint32_t kOffBar = kOffSFB + kSFB;
  // Barriers: full and empty per stage, and with kQuantA an x_full per stage
  // (the activations' TMA load, below).
  static constexpr uint32_t kBarBytes = kQuantA ? 384u : 256u;
  static constexpr uint32_t kTotal = kOffBar + kBarBytes;
  static_assert((kQuantA ? 3u : 2u) * kNumStages * 8u <= kBarBytes, "barrier reserve holds at most 16 stages");
};

// What A is (the kernel's last template argument, kAIn): kAInFp8 (an e4m3
// payload and its scales, loaded by TMA) or the float activations x,
// quantised inside this kernel (quant_a.cuh).

template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages,
          uint32_t kNumMulticast, bool kMulticastOnA, uint32_t kSwizzleDBytes, uint32_t kGemmType,
          uint32_t kNumGroups, uint32_t kNumKSplits, uint32_t kNumMathWGs, uint32_t kAIn = kAInFp8>
struct GemmTraits {
  static constexpr uint32_t BLOCK_K = 128;
  // Two math warpgroups, or one with BLOCK_M == 64.  BLOCK_M == 64 has one
  // 64-row sub-tile, so two warpgroups split K instead (even / odd K blocks)
  // and reduce at the tile's end: this halves the latency-bound WGMMA ->
  // wait -> promote chain of narrow tiles over long K.  One warpgroup runs
  // the chain alone but needs no reduction, no shared-memory buffer for it
  // (more stages) and no named barriers: the choice of short K (DeepGEMM's
  // sm90 1D2D kernel always runs BLOCK_M = 64 on one warpgroup).  Larger
  // tiles give each of the two warpgroups its own rows.
  static constexpr uint32_t kNumMathWG = kNumMathWGs;
  static constexpr bool kSplitK = BLOCK_M == 64 && kNumMathWG == 2;
  static constexpr uint32_t kWaves = kSplitK ? 1 : BLOCK_M / (64 * kNumMathWG);  // 64-row sub-tiles per warpgroup
  // Warps that consume (and release) each pipeline stage.
  static constexpr uint32_t kConsumerWarps = kSplitK ? 4 : kNumMathWG * 4;
  static constexpr uint32_t kNumMathThreads = 128 * kNumMathWG;
  static constexpr uint32_t kNumThreads = kNumMathThreads + 128;
  static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, BLOCK_K);
  // Cluster: multicast pairs or split-K clusters (never both).  With split K
  // over two, rank 0 runs K blocks [0, kKBlocksRank0) and rank 1 the
  // remaining kKBlocksRank1 (half each, or skewed by kSplitSkew: below); over
  // four, rank r runs [r, r + 1) * kKBlocksPerSplit.
  static constexpr uint32_t kClusterSize = kNumMulticast * kNumKSplits;
  static constexpr uint32_t kKBlocksPerSplit = kNumKBlocks / kNumKSplits;
  // Split K: with BLOCK_M = 128 or one math warpgroup, rank 0 takes
  // kSplitSkew = 2 K blocks more than half and rank 1 two fewer, so rank 1
  // finishes four blocks before rank 0 and its FP32 partial tile is on its
  // way while rank 0 still computes.  Measured on the H200: 128x32 -2.1 %,
  // 128x64 -2.4 % at K = 7168 (benches/RESULTS.md, v0.6); 64x64 w1 -2.2 % at
  // 128x2112x7168, 64x32 w1 0 to -0.4 % at M <= 64 (the exchange wait at
  // rank 0 halved, 0.99 -> 0.47 µs: v0.30).  Two math warpgroups at
  // BLOCK_M = 64 (which split K again between them) lost 1-3 % (v0.6), so
  // they keep an even split.  Even, so both ranks keep the parity of
  // kKBlocksPerSplit; only where each rank keeps at least 6 blocks.
  // (_config.split_k_skew mirrors this rule.)
  static constexpr uint32_t kSplitSkew =
      (kNumKSplits == 2 && (BLOCK_M == 128 || kNumMathWG == 1) && kKBlocksPerSplit >= 8u) ? 2u : 0u;
  static constexpr uint32_t kKBlocksRank0 = kKBlocksPerSplit + kSplitSkew;
  static constexpr uint32_t kKBlocksRank1 = kKBlocksPerSplit - kSplitSkew;
  // Threads that hold a finished tile (and exchange it with split K).
  static constexpr uint32_t kNumHolderThreads = kSplitK ? 128 : kNumMathThreads;
  static constexpr uint32_t kNumSFBRows = ceil_div(SHAPE_N, 128u);   // 128-row blocks of B per group
  // Rows of B scales one tile reads: two (three for 176) when it can
  // straddle a 128-row boundary.
  static constexpr uint32_t kSFBTileRows = sfb_tile_rows<BLOCK_N>();
  static constexpr uint32_t kNumAccum = BLOCK_N / 2;                   // f32 per thread per 64xBLOCK_N
  // K-loop unroll factor: 4 for the large tiles with at most two B-scale
  // boundary variants (256x128, 128x192: +1-3 % over 2 at M = 4096), 2
  // elsewhere (4 made the 8-variant 256x112 masked kernel 13 % slower and
  // the small tiles 0-3 % slower); benches/RESULTS.md, v0.4.  8 at
  // BLOCK_M = 256 (DeepGEMM's depth): 199.4 instead of 200.8 SASS
  // instructions per K block and warp, up to 1.3 % faster at M = 4096 in
  // CUPTI times and sustained loops, 0.2-0.3 % slower (noise) at K <= 1536
  // (benches/RESULTS.md, v0.27); 128x192 spills at 8.
  // The K loop overlaps block j's promotion with block j + 1's WGMMAs (two
  // accumulators: the math loop's kPipelineMma) on one math warpgroup
  // (BLOCK_M = 64, w1) with a third BLOCK_N / 2-register set beside the
  // other two (BLOCK_N <= 96): the decode tiles.  Measured on the H200
  // (benches/RESULTS.md v0.15): 2-4.5 % faster on the 56-96-wide decode
  // picks, even at 16-32 (one 64-wide non-pick 1.5 % slower); with two math
  // warpgroups of 64 rows each (BLOCK_M = 128) 3-6 % slower, so not there.
  static constexpr bool kPipelineMma = kNumMathWG == 1 && BLOCK_N <= 96;
  // Both math warpgroups meet at a named barrier before each tile's K loop
  // (as DeepGEMM's do after staging their B scales) from K = 7168 on.
  // Unsynchronised, the two drift apart by up to the pipeline's depth.  At
  // 4096x7168x16384 the CTAs reading one B tile drifted further apart than
  // DeepGEMM's and the L2 merged fewer of their reads
  // (tools/perf/cluster_timeline.py; with the barrier the merged request
  // sectors rose from 4.6 to 8.7 M, DeepGEMM 10.9 M).  Measured on the H200
  // (benches/RESULTS.md v0.36): -0.9 % (4096x7168x16384) and -1.6 %
  // (2048x7168x16384) in CUPTI times, -1.1 % cycles in Nsight Compute, -0.7 %
  // time in sustained loops; -0.4 % to a tie at K = 7168; a tie at
  // K = 3072-4096; but +0.6 % at K = 2048, +1.1 % on contiguous 128x192 at
  // K = 2048 and +2.1 % at K = 512 (probably the lost overlap of one
  // warpgroup's epilogue with the other's WGMMAs, a larger share of a short
  // tile; not measured).
  static constexpr uint32_t kSyncMathWGMinKBlocks = 56;
  static constexpr bool kSyncMathWGs = kNumMathWG == 2 && !kSplitK && kNumKBlocks >= kSyncMathWGMinKBlocks;
  static constexpr uint32_t kKLoopUnroll =
      (BLOCK_M * BLOCK_N >= 128 * 192 && num_former_variants<BLOCK_N>() <= 2) ? (BLOCK_M == 256 ? 8 : 4) : 2;
  static constexpr uint32_t kDCols = kSwizzleDBytes ? kSwizzleDBytes / 2 : BLOCK_N;  // columns per TMA store
  static constexpr uint32_t kDRowBytes = kDCols * 2;
  static constexpr uint32_t kNumDStores = BLOCK_N / kDCols;
  static constexpr uint32_t kSwizzleMask = kSwizzleDBytes / 16 - 1;     // 7, 3, 1 (128/64/32 B)
  // Quantising A in the kernel: the activations' element type and bytes.
  static constexpr bool kQuantA = kAIn != kAInFp8;
  static constexpr InDtype kXDtype = kQuantA ? static_cast<InDtype>(kAIn - 1) : InDtype::kBFloat16;
  static constexpr uint32_t kXBytes = quant::InTraits<kXDtype>::kBytes;
  static constexpr uint32_t kMaxQuantARows = kQuantARows;
  using Smem = SmemLayout<SHAPE_K, BLOCK_M, BLOCK_N, kNumStages, kNumKSplits, kNumMathWGs, kQuantA ? kXBytes : 0u>;
  // Bytes one stage's loads deliver: A's box of `a_box_rows` rows (a kernel
  // argument: min(rows, BLOCK_M), rows being M, m_sum or m_max per group),
  // its scales (the box rounded up to 16 bytes) and B's full tile.
  __device__ __forceinline__ static uint32_t tx_bytes(uint32_t a_box_rows) {
    return a_box_rows * 128u + align_up(a_box_rows, 4u) * 4u + Smem::kB;
  }

  static_assert(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 256, "BLOCK_M must be 64, 128 or 256");
  static_assert(kNumMathWG == 2 || (kNumMathWG == 1 && BLOCK_M == 64), "one math warpgroup only with BLOCK_M = 64");
  static_assert(BLOCK_N % 8 == 0 && BLOCK_N >= 8 && BLOCK_N <= 256, "WGMMA N is a multiple of 8 in [8, 256]");
  // A tile may touch at most three 128-row blocks of B scales, and three
  // only with a compile-time boundary per tile (num_former_variants <=
  // kMaxFormerVariants: the promotion's second boundary is num_former + 16).
  static_assert(kSFBTileRows <= 2 || (kSFBTileRows == 3 && num_former_variants<BLOCK_N>() <= kMaxFormerVariants),
                "BLOCK_N would straddle more than three 128-row scale blocks, or three at a run-time boundary");
  static_assert((kWaves + 1) * kNumAccum <= 192, "accumulators would not fit in 232 registers");
  static_assert(kSwizzleDBytes == 0 || kSwizzleDBytes == 32 || kSwizzleDBytes == 64 || kSwizzleDBytes == 128,
                "D swizzle is 0, 32, 64 or 128 bytes");
  static_assert(BLOCK_N % kDCols == 0, "the D swizzle width must divide BLOCK_N");
  // The epilogue's swizzled stmatrix addresses pair 8-column groups i, i + 1
  // inside one box row: an even number of groups.
  static_assert(kSwizzleDBytes == 0 || BLOCK_N % 16 == 0, "a swizzled D staging buffer needs BLOCK_N % 16 == 0");
  static_assert(kNumMulticast == 1 || kNumMulticast == 2, "clusters of 1 or 2 CTAs");
  static_assert(kNumKSplits == 1 || kNumKSplits == 2 || kNumKSplits == 4, "K is split across 1, 2 or 4 CTAs");
  static_assert(kNumKSplits == 1 || kNumMulticast == 1, "a cluster either multicasts or splits K");
  static_assert(kNumKSplits == 1 || BLOCK_M <= 128, "split K is for BLOCK_M 64 and 128");
  static_assert(kGemmType == kNormal || kGemmType == kGroupedContiguous || kNumMulticast == 1 || kMulticastOnA,
                "B multicast: normal and contiguous GEMMs");
  // An even count splits evenly, or by +-kSplitSkew; each rank's unrolled K
  // loop has a compile-time trip count (a run-time one made the 128x64
  // K = 2048 kernel spill); the one-warpgroup pipelined loop (kPipelineMma)
  // is not unrolled and takes its rank's count at run time.
  static_assert(kNumKBlocks % kNumKSplits == 0, "split K needs a multiple of kNumKSplits K blocks");
  static_assert(kSplitSkew % 2 == 0 && kSplitSkew < kKBlocksPerSplit, "an even skew, both ranks keep K blocks");
  static_assert(kNumStages >= 2 && kNumStages <= 16, "2..16 pipeline stages");
  // Split K: the tile's j-th K block (of this CTA's share) is consumed (and
  // waited for, by phase parity) only by warpgroup j % 2, in the stage that
  // follows the previous block's.  An odd stage count hands a stage to the other warpgroup every
  // lap within a tile, and a parity wait cannot tell "my block landed" from
  // "the other warpgroup's previous block in this stage has not landed yet":
  // the warpgroup then reads a stale stage and releases it early
  // (cugemm8/_config.py _stages_ok; benches/RESULTS.md v0.4).  Between
  // tiles the owner of a stage may still change (j restarts at 0; with an
  // odd number of K blocks per CTA the parity flips): that is safe only because the
  // split-K reduction's two named barriers make both warpgroups finish every
  // block of a tile before either waits on the next tile's
  // (tests/test_schedule_model.py models both rules).
  static_assert(!kSplitK || kNumStages % 2 == 0, "split K (BLOCK_M = 64) needs an even stage count");
  static_assert(Smem::kTotal <= 232448, "shared memory exceeds the sm_90 opt-in limit (232,448 B)");
  static_assert(kGemmType <= kGroupedMasked, "unknown GEMM type");
  static_assert(kAIn <= kAInBFloat16, "unknown A input");
  // Quantising A in the kernel: the normal GEMM's 64-row tiles on one math
  // warpgroup (the converter warps keep the producer warpgroup's full
  // registers: no setmaxnreg), no cluster multicast (each CTA converts its own A).
  static_assert(!kQuantA || (kGemmType == kNormal && BLOCK_M == 64 && kNumMathWG == 1 && kNumMulticast == 1),
                "A quantised in the kernel: normal GEMM, BLOCK_M 64, one math warpgroup, no multicast");
};

// Bits of the kernel's `flags` argument: common.cuh (kFlagBEvictFirst, kFlagAPow2Scale).

// Quantising A in the kernel (kAIn != kAInFp8; cugemm8.gemm_fp8's one-kernel
// bf16-in form for decode-sized M, at most kQuantARows = 8 rows): each stage
// holds, beside B, an 8-row e4m3 payload (1 KB, its WGMMA descriptor's
// 8-row-group stride 0, so the 64-row MMA reads those 8 rows eight times:
// rows >= 8 of the accumulator repeat rows 0-7 and are never stored), its
// scales, and a slot for the same rows of x, which warps 1 ..
// kNumConverterWarps of the producer warpgroup quantise (quant_a.cuh,
// QuantAConverter).

// Arguments:
//   shape_m        rows of A / D (normal), m_sum (contiguous) or m_max (masked)
//   a_box_rows     rows of the A box of tmap_a (and, rounded up to 4, of tmap_sfa's):
//                  min(shape_m, BLOCK_M) (shape_m: M, m_sum, or m_max per
//                  group; gemm.py a_box_rows).  The rows of a stage past the box are never
//                  loaded: their stale contents only reach accumulator rows
//                  >= shape_m, which are never stored.  A box of M rows moves
//                  no zero-filled rows through TMA: at M = 1 the 64-row box
//                  cost up to 1.8x the M = 64 time (benches/RESULTS.md v0.8).
//   flags          kFlagBEvictFirst, kFlagAPow2Scale (common.cuh) or 0
//   sfb            B scales, row-major [num_groups, ceil(N/128), ceil(K/128)] f32
//   grouped_layout nullptr (normal), m_indices [m_sum] (contiguous) or masked_m [G] (masked), int32
//   d_ptr, ld_d    D base and row stride in elements (masked partial-tile stores)
//   tmap_a         A   as (K, rows, groups) u8,  box (128, a_box_rows, 1), 128B swizzle;
//                  with kAIn != kAInFp8 the activations x as (K_x, rows, 1) of
//                  their float type, box (128, a_box_rows, 1), no swizzle (tmap_sfa
//                  is then unused)
//   tmap_b         B   as (K, N, groups)    u8,  box (128, BLOCK_N, 1), 128B swizzle
//   tmap_sfa       SFA as (rows, K/128, groups) f32 (MN-major), box (align4(a_box_rows), 1, 1)
//   tmap_d         D   as (N, rows, groups) bf16, box (kDCols, 64, 1), swizzle kSwizzleDBytes
template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumStages,
          uint32_t kNumMulticast, bool kMulticastOnA, uint32_t kSwizzleDBytes, uint32_t kGemmType,
          uint32_t kNumGroups, uint32_t kNumKSplits, uint32_t kNumMathWGs, uint32_t kAIn = kAInFp8>
__global__ void __launch_bounds__(
    GemmTraits<SHAPE_N, SHAPE_K, BLOCK_M, BLOCK_N, kNumStages, kNumMulticast, kMulticastOnA, kSwizzleDBytes,
               kGemmType, kNumGroups, kNumKSplits, kNumMathWGs, kAIn>::kNumThreads, 1) __cluster_dims__(kNumMulticast * kNumKSplits, 1, 1)
fp8_gemm_1d2d_kernel(uint32_t shape_m, uint32_t a_box_rows, uint32_t flags, const float* __restrict__ sfb, const int32_t* __restrict__ grouped_layout,
                     uint16_t* __restrict__ d_ptr, uint32_t ld_d,
                     const __grid_constant__ TmaDescriptor tmap_a, const __grid_constant__ TmaDescriptor tmap_b,
                     const __grid_constant__ TmaDescriptor tmap_sfa, const __grid_constant__ TmaDescriptor tmap_d) {
  using T = GemmTraits<SHAPE_N, SHAPE_K, BLOCK_M, BLOCK_N, kNumStages, kNumMulticast, kMulticastOnA,
                       kSwizzleDBytes, kGemmType, kNumGroups, kNumKSplits, kNumMathWGs, kAIn>;
  using Smem = typename T::Smem;
  // Tiles wider than tall walk M fastest (scheduler.cuh, kRasterM).
  using Scheduler = TileScheduler<kGemmType, SHAPE_N, BLOCK_M, BLOCK_N, kNumMulticast, kMulticastOnA, kNumGroups,
                                  (BLOCK_N > BLOCK_M)>;
  constexpr uint32_t kNumKBlocks = T::kNumKBlocks;
  constexpr uint32_t kNumAccum = T::kNumAccum;
  constexpr uint32_t kWaves = T::kWaves;
  constexpr uint32_t kNumMathWG = T::kNumMathWG;
  // B multicast on the contiguous layout: the cluster's two 128-row m-blocks
  // share B only when they have one valid expert, decided per tile (a rule
  // like DeepGEMM's: deep_gemm/include/deep_gemm/scheduler/gemm.cuh,
  // is_tma_multicast_valid), and skipped tiles cannot leave the stage ring.
  constexpr bool kPairedB = kGemmType == kGroupedContiguous && kNumMulticast == 2 && !kMulticastOnA;
  // (One pass, one tile a CTA per cluster tile: no absent tiles, no split K.)
  static_assert(!kPairedB || (BLOCK_M == 128 && Scheduler::kMPasses == 1 && kNumKSplits == 1),
                "contiguous B multicast: BLOCK_M 128, one pass");

  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + Smem::kOffBar);
  uint64_t* empty_bar = full_bar + kNumStages;
  uint64_t* x_full_bar = empty_bar + kNumStages;   // kQuantA: x's box landed in the stage's slot
  // Split K: a peer's partial tile has landed here (the receiver's barrier:
  // one expect_tx arrival plus the st.async bytes) / the receiver has read
  // what this CTA sent (the sender's barrier: one release.cluster arrival per
  // holder warp of the receiver).
  uint64_t* red_full_bar = reinterpret_cast<uint64_t*>(smem + Smem::kOffClusterBar);
  uint64_t* red_empty_bar = red_full_bar + 1;
  float* smem_sfb = reinterpret_cast<float*>(smem + Smem::kOffSFB);   // (8, 2, kNumKBlocks) f32
  auto smem_a = [&](uint32_t s) { return smem + Smem::kOffA + s * Smem::kA; };
  auto smem_b = [&](uint32_t s) { return smem + Smem::kOffB + s * Smem::kB; };
  auto smem_sfa = [&](uint32_t s) { return reinterpret_cast<const float*>(smem + Smem::kOffSFA + s * Smem::kSFA); };
  // kQuantA: the stage's slot for x's box of a_box_rows rows.
  auto smem_x = [&](uint32_t s) { return smem + Smem::kOffX + s * Smem::kX; };

  const uint32_t warpgroup = threadIdx.x / 128;
  const uint32_t producer_leader = T::kNumMathThreads;

  // Initialise the barriers: a full barrier completes on the producer's one
  // arrival plus tx_bytes(a_box_rows) of TMA data; an empty barrier on one arrival per math
  // warp of every CTA of the cluster (a multicast refill overwrites the stage
  // in both CTAs, so both must have released it).
  if (threadIdx.x == producer_leader) {
    if ((smem_addr(smem) & 1023u) != 0) device_trap();   // 128B swizzle needs 1024-aligned tiles
    // More rows than a stage's payload holds (the host never launches that:
    // cugemm8/quant.py).
    if (T::kQuantA && a_box_rows > T::kMaxQuantARows) device_trap();
    tma_prefetch_descriptor(&tmap_a);
    tma_prefetch_descriptor(&tmap_b);
    if constexpr (!T::kQuantA) tma_prefetch_descriptor(&tmap_sfa);
    tma_prefetch_descriptor(&tmap_d);
    // kQuantA: the full barrier also waits for the stage's converter warp.
    init_stage_barriers<kNumStages>(full_bar, empty_bar, kNumMulticast * T::kConsumerWarps, T::kQuantA ? 2u : 1u);
    if constexpr (T::kQuantA) {
      for (uint32_t s = 0; s < kNumStages; ++s) mbarrier_init(x_full_bar + s, 1);
    }
    if constexpr (kNumKSplits > 1) {
      mbarrier_init(red_full_bar, 1);
      mbarrier_init(red_empty_bar, T::kNumHolderThreads / 32);
    }
    fence_barrier_init();
  }
  // Split K without multicast: the peer touches this CTA only in the
  // exchange after a tile's K loop, so each thread's wait on the cluster
  // barrier is deferred to there (the arrival's release covers the barrier
  // initialisation) and the K loop starts after a CTA-wide sync (the
  // prologue 0.5-0.6 µs instead of 0.6-0.7, the kernels 0-0.2 µs faster:
  // benches/RESULTS.md v0.15).
  constexpr bool kDeferClusterWait = kNumKSplits > 1 && kNumMulticast == 1;
  bool cluster_waited = !kDeferClusterWait;
  if constexpr (kDeferClusterWait) {
    cluster_arrive();
    __syncthreads();
  } else if constexpr (T::kClusterSize > 1) {
    cluster_sync();   // the peer may multicast into us / arrive on our barriers from now on
  } else {
    __syncthreads();
  }
  // Programmatic dependent launch (ptx/griddep.cuh): everything above touched
  // only shared memory and the descriptors.  Every thread waits for the
  // previous grid before its first global access, then lets the next grid
  // launch.
  griddep_wait();
  griddep_launch_dependents();

  const uint32_t rank = T::kClusterSize > 1 ? cluster_cta_rank() : 0;
  // This CTA's K blocks of every tile (all of them unless K is split).
  const uint32_t kb_begin = kNumKSplits > 1 ? rank * T::kKBlocksRank0 : 0u;
  const uint32_t kb_count = kNumKSplits == 2 && rank == 1 ? T::kKBlocksRank1 : T::kKBlocksRank0;
  // With split K every CTA of a cluster takes the same tile (the scheduler
  // pairs nothing: kNumMulticast is 1).
  Scheduler scheduler(shape_m, grouped_layout, blockIdx.x / T::kClusterSize, gridDim.x / T::kClusterSize, rank);
  typename Scheduler::Tile tile;

  // Which B group a tile reads; whether its MMA is skipped (contiguous
  // layout: padding blocks, marked -1, and blocks with an invalid expert id);
  // whether the tile is absent (nothing to do at all); and which 128-row
  // blocks of the tile it stores (bit b: rows [128 b, 128 b + 128)).  With
  // BLOCK_M = 256 the contiguous layout runs two passes (scheduler.cuh): pass
  // 0 takes the first block's expert and stores every block that has it;
  // pass 1 is absent unless the second block's expert differs, and then
  // takes that expert and stores the second block.
  auto resolve = [&](const typename Scheduler::Tile& t, int32_t& b_group, bool& skip, bool& absent,
                     uint32_t& stores) {
    absent = false;
    stores = 0x3u;
    if constexpr (kGemmType == kGroupedContiguous) {
      // The expert of a 128-row block is its first row's, for every BLOCK_M
      // (a 64-row tile in a block's second half reads row 128 b, not 64 + 128 b).
      const uint32_t row0 = t.m_block * BLOCK_M / 128u * 128u;
      b_group = row0 < shape_m ? __ldg(grouped_layout + row0) : -1;
      if constexpr (Scheduler::kMPasses == 2) {
        const uint32_t row1 = row0 + 128;
        const int32_t e1 = row1 < shape_m ? __ldg(grouped_layout + row1) : b_group;
        const bool same = e1 == b_group;
        if (t.pass == 0) {
          stores = same ? 0x3u : 0x1u;
        } else {
          absent = same;
          stores = 0x2u;
          b_group = e1;
        }
      }
      skip = b_group < 0 || b_group >= static_cast<int32_t>(kNumGroups);
    } else if constexpr (kGemmType == kGroupedMasked) {
      b_group = static_cast<int32_t>(t.group);
      skip = false;
    } else {
      b_group = 0;
      skip = false;
    }
  };

  if (warpgroup == kNumMathWG) {
    // ------------------------------------------------------------------ producer
    if constexpr (kNumMathWG == 2) setmaxnreg_dec<40>();
    if (threadIdx.x == producer_leader) {
      PipeState<kNumStages> pipe;
      // kQuantA: A comes from the converter warps; the full barrier counts B's bytes.
      const uint32_t tx_bytes = T::kQuantA ? Smem::kB : T::tx_bytes(a_box_rows);
      // Issue B's loads for one K block into `stage` (multicast rules as
      // below).  With kFlagBEvictFirst B's loads carry an L2 evict-first
      // hint, else no hint at all (ptx/tma.cuh, tma_load_3d_hint_if: a
      // hinted load, even evict-normal, is never merged by the L2 request
      // coalescer); one predicated load of each form, not a branch in the
      // K loop, with the policy made at each load: a 64-bit policy held
      // across the unrolled loop spilled on the producer's 40 registers.
      const bool b_evict_first = (flags & kFlagBEvictFirst) != 0;
      // `b_shared`: the cluster's two tiles read the same B box (always with
      // B multicast, except on the contiguous layout: kPairedB).
      auto load_b = [&](uint64_t* bar, uint32_t stage_b, uint32_t kb, int32_t b_row, int32_t b_group,
                        bool b_shared) {
        const int32_t k = static_cast<int32_t>(kb * 128);
        const uint64_t b_policy = l2_policy_evict_first();
        if (kNumMulticast == 2 && !kMulticastOnA && b_shared) {
          if (rank == 0) {
            tma_load_3d_multicast_hint_if(smem_b(stage_b), &tmap_b, bar, 0b11, b_evict_first, b_policy, k, b_row,
                                          b_group);
          }
        } else {
          tma_load_3d_hint_if(smem_b(stage_b), &tmap_b, bar, b_evict_first, b_policy, k, b_row, b_group);
        }
      };
      while (scheduler.next(tile)) {
        int32_t b_group;
        bool skip, absent;
        uint32_t stores;
        resolve(tile, b_group, skip, absent, stores);
        // kPairedB: every tile runs through the stages, skipped ones too
        // (each stage's empty barrier counts the releases of both CTAs'
        // consumers, so both must walk the same stages on every tile); B is
        // multicast only when the peer m-block has the same (valid) expert,
        // else each CTA loads its own, a skipped tile expert 0's (its MMAs
        // do not run).
        bool b_shared = true;
        if constexpr (kPairedB) {
          const uint32_t peer_row = (tile.m_block ^ 1u) * BLOCK_M;
          const int32_t peer_group = peer_row < shape_m ? __ldg(grouped_layout + peer_row) : -1;
          b_shared = !skip && peer_group == b_group;
          if (skip) b_group = 0;
        } else if (skip || absent) {
          continue;
        }
        const int32_t a_row = static_cast<int32_t>(tile.m_block * BLOCK_M);
        const int32_t a_group = kGemmType == kGroupedMasked ? static_cast<int32_t>(tile.group) : 0;
        const int32_t b_row = static_cast<int32_t>(tile.n_block * BLOCK_N);
        // One K block: wait for the stage, then issue its loads.
        auto load_block = [&](uint32_t kb) {
          // Wait until every consumer (of every CTA in the cluster) released the stage.
          uint64_t* bar = producer_acquire(pipe, full_bar, empty_bar, tx_bytes);
          const uint32_t stage = pipe.stage;
          const int32_t k = static_cast<int32_t>(kb * 128);
          if constexpr (T::kQuantA) {
            // A and its scales: the stage's converter warp (below).
          } else if constexpr (kNumMulticast == 2 && kMulticastOnA) {
            if (rank == 0) {
              tma_load_3d_multicast(smem_a(stage), &tmap_a, bar, 0b11, k, a_row, a_group);
              tma_load_3d_multicast(const_cast<float*>(smem_sfa(stage)), &tmap_sfa, bar, 0b11, a_row,
                                    static_cast<int32_t>(kb), a_group);
            }
          } else {
            tma_load_3d(smem_a(stage), &tmap_a, bar, k, a_row, a_group);
            tma_load_3d(const_cast<float*>(smem_sfa(stage)), &tmap_sfa, bar, a_row, static_cast<int32_t>(kb),
                        a_group);
          }
          load_b(bar, stage, kb, b_row, b_group, b_shared);
          pipe.advance();
        };
        if constexpr (kNumKSplits > 1) {
          // Not unrolled: the producer runs on 40 registers (setmaxnreg), and
          // the unrolled split-K loop (a compile-time trip count) spilled there.
          #pragma unroll 1
          for (uint32_t kb = kb_begin; kb < kb_begin + kb_count; ++kb) load_block(kb);
        } else {
          // The compiler's unrolling: 0.3-1.2 % faster at 256x128 than none
          // (benches/RESULTS.md, v0.5).
          for (uint32_t kb = 0; kb < kNumKBlocks; ++kb) load_block(kb);
        }
      }
    }
    if constexpr (T::kQuantA) {
      // -------------------------------------------------------------- converters
      // Warps 1 .. kNumConverterWarps of the producer warpgroup quantise A
      // (quant_a.cuh, QuantAConverter::run_warp; the other warps return).
      QuantAConverter<T::kXDtype, kNumStages>::run_warp(
          (threadIdx.x - producer_leader) / 32, scheduler, kb_begin, kb_count, &tmap_a, a_box_rows,
          (flags & kFlagAPow2Scale) != 0, full_bar, empty_bar, x_full_bar, smem_x, smem_a, smem_sfa);
    }
  } else {
    // ------------------------------------------------------------------ math
    if constexpr (kNumMathWG == 2) setmaxnreg_inc<232>();
    const uint32_t tid = threadIdx.x % 128;
    const uint32_t warp = tid / 32, lane = tid % 32;
    // Row (within the tile) of sub-tile `v` handled by this warpgroup.
    auto row_off = [&](uint32_t v) { return T::kSplitK ? 0u : v * 64 * kNumMathWG + warpgroup * 64; };
    PipeState<kNumStages> pipe;
    float* warp_sfb = smem_sfb + (threadIdx.x / 32) * Smem::kSFBRows * kNumKBlocks;   // this warp's B-scale copy
    // Low words of the WGMMA descriptors of stage 0's A rows (this
    // warpgroup's) and B tile.  Each WGMMA adds its stage / sub-tile / k byte
    // offset, in 16-byte units, to the start-address field (bits 0-13):
    // shared-memory addresses stay below 2^18, so the sum never carries into
    // the next field.  The shuffle makes the row offset visibly warp-uniform,
    // so all of this stays in uniform registers (no R2UR before each QGMMA in
    // the SASS).  Measured on the H200 against rebuilding each descriptor from
    // its address, together with the two-way unrolled K loop below: +5-6 % at
    // M = 4096, 0-7 % at M <= 128 (benches/RESULTS.md, v0.4).
    const uint32_t desc_a0 = smem_desc_sw128_lo(smem_a(0)) +
                             __shfl_sync(0xffffffffu, row_off(0) * 128 / 16, 0);
    const uint32_t desc_b0 = smem_desc_sw128_lo(smem_b(0));
    // kQuantA: the stage's 8 payload rows stand for all 64 (8-row groups 0 bytes apart).
    constexpr uint64_t kADescHi = T::kQuantA ? kSmemDescSw128Hi8Rows : kSmemDescSw128Hi;
    const uint32_t sfa_row = row_off(0) + warp * 16 + lane / 4;   // this thread's first A-scale row
    // Stage 0's empty barrier, the address mapped once: this CTA's, or with
    // multicast CTA `lane`'s of the cluster (lanes < kNumMulticast release there).
    const uint32_t empty_addr = kNumMulticast > 1 ? mapa_shared(smem_addr(empty_bar), lane % kNumMulticast)
                                                  : smem_addr(empty_bar);
    // Release a stage to the producer(s): one arrival per warp, on every
    // CTA of the cluster.
    auto release = [&](uint32_t s) {
      if constexpr (kNumMulticast == 1) {
        if (lane == 0) mbarrier_arrive_addr(empty_addr + s * 8u);
      } else {
        if (lane < kNumMulticast) mbarrier_arrive_remote(empty_addr + s * 8u);
      }
    };
    float accum[kNumAccum];
    float final_accum[kWaves][kNumAccum];
    uint32_t red_phase = 0;   // split K across the cluster: exchanges done, mod 2

    while (scheduler.next(tile)) {
      int32_t b_group;
      bool skip, absent;
      uint32_t stores;
      resolve(tile, b_group, skip, absent, stores);
      if (absent) continue;
      // Contiguous layout: the experts of this thread's output rows (the
      // epilogue's layout contract), loaded here so that their latency hides
      // behind the K loop instead of standing between the last WGMMA and the
      // stores while the tensor cores idle.
      int32_t row_expert[kWaves][2];
      if constexpr (kGemmType == kGroupedContiguous) {
        #pragma unroll
        for (uint32_t v = 0; v < kWaves; ++v) {
          #pragma unroll
          for (uint32_t h = 0; h < 2; ++h) {
            const uint32_t r = tile.m_block * BLOCK_M + row_off(v) + warp * 16 + lane / 4 + h * 8;
            row_expert[v][h] = r < shape_m ? __ldg(grouped_layout + r) : -1;
          }
        }
      }

      #pragma unroll
      for (uint32_t v = 0; v < kWaves; ++v) {
        #pragma unroll
        for (uint32_t i = 0; i < kNumAccum; ++i) final_accum[v][i] = 0.f;
      }

      if (!skip) {
        // Stage both candidate rows of B scales for the whole K before the K
        // loop (pitfall 9), into this warp's private copy: __syncwarp orders
        // the previous tile's reads before these writes and these writes
        // before this tile's reads, with no barrier across warps.  (A buffer
        // shared by the 8 warps needs named barriers, and compute-sanitizer
        // racecheck reported a hazard on that version in the split-K path;
        // loading the scales from global memory inside the K loop instead
        // cost 7-10 % at M = 4096: benches/RESULTS.md v0.3.)
        //
        // All of a batch's loads are issued before any store (a constant
        // trip count, the index clamped instead of tested): the strided loop
        // this replaces compiled to dependent load -> store round trips, 4 of
        // them at K = 7168, on the critical path of every tile's first WGMMA
        // (../shared/notes/perf-gap.md, small-M item 1; benches/RESULTS.md
        // v0.8).  Tiles that never straddle a 128-row boundary (BLOCK_N
        // divides 128) stage one row only.
        const uint32_t n0 = tile.n_block * BLOCK_N;
        const uint32_t sfb_row0 = n0 / 128;
        const float* sfb_tile = sfb + (static_cast<uint64_t>(b_group) * T::kNumSFBRows + sfb_row0) * kNumKBlocks;
        constexpr uint32_t kCount = T::kSFBTileRows * kNumKBlocks;
        // The candidate rows past the last 128-row block of B do not exist
        // (no column of the tile reads them: they stage zeros).
        const uint32_t valid = T::kSFBTileRows == 3 ? constexpr_min(3u, T::kNumSFBRows - sfb_row0) * kNumKBlocks
                               : sfb_row0 + 1 < T::kNumSFBRows ? kCount : kNumKBlocks;
        warp_copy_f32<kCount>(warp_sfb, sfb_tile, valid, lane);
        // kSyncMathWGs: both math warpgroups start the tile's K loop together
        // (named barrier 1: split K's, a kernel that never syncs here).
        if constexpr (T::kSyncMathWGs) named_barrier_sync(1, T::kNumMathThreads);
        // 8-column chunks before the next 128-row boundary of B use the first
        // scale row; the rest (if the tile straddles) the second.
        const uint32_t num_former_rt = 128 % BLOCK_N == 0 ? BLOCK_N / 8 : constexpr_min(BLOCK_N, 128 - n0 % 128) / 8;

        // Issue the four k32 WGMMAs of one stage for sub-tile v into `acc`
        // (the first clears it) and commit them as one group.
        // Stage offsets as s * (bytes / 16), not (s * bytes) / 16: in 32-bit
        // arithmetic the two differ on overflow, so the divided form costs a
        // shift and mask per K block (benches/RESULTS.md v0.28).
        auto issue_mma = [&](float* acc, uint32_t s, uint32_t v) {
          wgmma_fp8_k128<BLOCK_N, kNumAccum, kADescHi>(acc,
                                                       desc_a0 + s * (Smem::kA / 16) + (row_off(v) - row_off(0)) * 8,
                                                       desc_b0 + s * (Smem::kB / 16));
        };
        // After a wait: the accumulator's values are final from here on
        // (keeps the compiler from reading them earlier).
        auto fence_acc = [&](float* acc) {
          #pragma unroll
          for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(acc[i]);
        };
        // Promotion: final += (SFA[row] * SFB[n-block]) * partial, in FP32.
        // Chunk i (8 columns) takes B-scale row 0 before num_former, row 2
        // from num_former + 16 on (three-row tiles only), row 1 between.
        auto promote = [&](const float* acc, float* fin, float sa0, float sa1, const float (&sb)[3],
                           uint32_t num_former) {
          const float s00 = mul_rn(sa0, sb[0]), s01 = mul_rn(sa0, sb[1]);
          const float s10 = mul_rn(sa1, sb[0]), s11 = mul_rn(sa1, sb[1]);
          const float s02 = T::kSFBTileRows == 3 ? mul_rn(sa0, sb[2]) : s01;
          const float s12 = T::kSFBTileRows == 3 ? mul_rn(sa1, sb[2]) : s11;
          #pragma unroll
          for (uint32_t i = 0; i < kNumAccum / 4; ++i) {
            const bool former = i < num_former;
            const bool latter = T::kSFBTileRows == 3 && i >= num_former + 16;
            const float s0 = former ? s00 : (latter ? s02 : s01), s1 = former ? s10 : (latter ? s12 : s11);
            fin[i * 4 + 0] = fma_rn(s0, acc[i * 4 + 0], fin[i * 4 + 0]);
            fin[i * 4 + 1] = fma_rn(s0, acc[i * 4 + 1], fin[i * 4 + 1]);
            fin[i * 4 + 2] = fma_rn(s1, acc[i * 4 + 2], fin[i * 4 + 2]);
            fin[i * 4 + 3] = fma_rn(s1, acc[i * 4 + 3], fin[i * 4 + 3]);
          }
        };

        // The K loop, with the B-scale boundary a compile-time constant where possible.
        auto k_loop = [&](auto former_tag) {
          constexpr uint32_t kFormer = decltype(former_tag)::value;
          const uint32_t num_former = kFormer == kRuntimeFormer ? num_former_rt : kFormer;
          // Unrolled (kKLoopUnroll): the next block's scale loads, barrier
          // wait and descriptor arithmetic are scheduled into this block's
          // promotion.
          auto blocks = [&](auto count_tag) {
            constexpr uint32_t kCount = decltype(count_tag)::value;
            #pragma unroll (T::kKLoopUnroll)
            for (uint32_t j = 0; j < kCount; ++j) {
              const uint32_t kb = kb_begin + j;
              if (T::kSplitK && j % 2 != warpgroup) {   // the other warpgroup's block
                pipe.advance();
                continue;
              }
              const float sb0 = warp_sfb[kb];
              const float sb[3] = {sb0, T::kSFBTileRows >= 2 ? warp_sfb[kNumKBlocks + kb] : sb0,
                                   T::kSFBTileRows == 3 ? warp_sfb[2 * kNumKBlocks + kb] : sb0};
              const uint32_t stage = pipe.stage;
              mbarrier_wait(full_bar + stage, pipe.phase);
              // Read this stage's A scales before the stage can be released.
              float sa[kWaves][2];
              #pragma unroll
              for (uint32_t v = 0; v < kWaves; ++v) {
                // The thread's row offset once (sfa_row), the sub-tile's as a
                // constant: one address per stage instead of one per row.
                const float* row = smem_sfa(stage) + sfa_row + (row_off(v) - row_off(0));
                sa[v][0] = row[0];
                sa[v][1] = row[8];
              }
              #pragma unroll
              for (uint32_t v = 0; v < kWaves; ++v) {
                issue_mma(accum, stage, v);
                wgmma_wait_group<0>();
                fence_acc(accum);
                // Release after the last sub-tile's WGMMA, so the next TMA load
                // overlaps the promotion.
                if (v == kWaves - 1) release(stage);
                promote(accum, final_accum[v], sa[v][0], sa[v][1], sb, num_former);
              }
              pipe.advance();
            }
          };
          // kPipelineMma: block j + 1's WGMMAs are issued before block j's are
          // waited for, into a second accumulator, so block j's wait, release
          // and promotion overlap block j + 1's MMAs instead of each K block
          // being one WGMMA -> wait -> promote chain after the other.  The
          // same operations in the same order on every value: the output
          // bits do not change.
          auto blocks_pipelined = [&](uint32_t count) {
            float accum_b[kNumAccum];
            // Wait for the next stage, read its A scales, issue its MMAs into `acc`.
            auto start = [&](float* acc, float (&sa)[2]) {
              const uint32_t stage = pipe.stage;
              mbarrier_wait(full_bar + stage, pipe.phase);
              const uint32_t r = row_off(0) + warp * 16 + lane / 4;
              sa[0] = smem_sfa(stage)[r];
              sa[1] = smem_sfa(stage)[r + 8];
              issue_mma(acc, stage, 0);
              pipe.advance();
              return stage;
            };
            // K block kb's MMAs into `acc` are complete: release its stage, promote.
            auto finish = [&](float* acc, uint32_t stage, uint32_t kb, const float (&sa)[2]) {
              fence_acc(acc);
              release(stage);
              const float sb0 = warp_sfb[kb];
              const float sb[3] = {sb0, T::kSFBTileRows >= 2 ? warp_sfb[kNumKBlocks + kb] : sb0,
                                   T::kSFBTileRows == 3 ? warp_sfb[2 * kNumKBlocks + kb] : sb0};
              promote(acc, final_accum[0], sa[0], sa[1], sb, num_former);
            };
            // Pairs of blocks: both issued, then the first waited for and
            // promoted while the second runs.  No group stays in flight across
            // the loop's back edge or a branch (ptxas then serialised every
            // WGMMA, C7514).
            float sa_a[2], sa_b[2];
            uint32_t j = 0;
            #pragma unroll 1
            for (; j + 1 < count; j += 2) {
              const uint32_t stage_a = start(accum, sa_a);
              const uint32_t stage_b = start(accum_b, sa_b);
              wgmma_wait_group<1>();
              finish(accum, stage_a, kb_begin + j, sa_a);
              wgmma_wait_group<0>();
              finish(accum_b, stage_b, kb_begin + j + 1, sa_b);
            }
            if (j < count) {   // an odd count's last block
              const uint32_t stage_a = start(accum, sa_a);
              wgmma_wait_group<0>();
              finish(accum, stage_a, kb_begin + j, sa_a);
            }
          };
          if constexpr (T::kPipelineMma) {
            // This rank's count, as the producer's (a run-time trip count:
            // the loop is not unrolled).
            blocks_pipelined(kb_count);
          } else if (T::kSplitSkew != 0 && rank == 1) {
            // A compile-time trip count for each rank (a run-time one spilled).
            blocks(UConst<T::kKBlocksRank1>{});
          } else {
            blocks(UConst<T::kKBlocksRank0>{});
          }
        };
        dispatch_num_former<BLOCK_N>(n0, k_loop);
        if constexpr (T::kSplitK) {
          // Hand warpgroup 1's partial tile to warpgroup 0 (thread-private
          // slots: the two hold identical fragment layouts).  Two barriers:
          // the first orders the writes before the reads; the second keeps
          // warpgroup 1 from writing the next tile's partial sums (it can run
          // ahead through the next tile's odd K blocks while warpgroup 0 is
          // in this tile's epilogue) before warpgroup 0 has read these.
          float* red = reinterpret_cast<float*>(smem + Smem::kOffReduce);
          if (warpgroup == 1) {
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum; ++i) red[i * 128 + tid] = final_accum[0][i];
          }
          named_barrier_sync(1, T::kNumMathThreads);
          if (warpgroup == 0) {
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum; ++i) final_accum[0][i] = add_rn(final_accum[0][i], red[i * 128 + tid]);
          }
          named_barrier_sync(1, T::kNumMathThreads);
        }
      } else if constexpr (kPairedB) {
        // A skipped tile's stages (kPairedB: the producer fills them): wait
        // and release each, with no MMA, in step with the peer CTA.
        #pragma unroll 1
        for (uint32_t j = 0; j < kNumKBlocks; ++j) {
          mbarrier_wait(full_bar + pipe.stage, pipe.phase);
          release(pipe.stage);
          pipe.advance();
        }
      }
      if constexpr (kNumKSplits > 1) {
        // Split K across the cluster: partial tiles are sent into a peer's
        // shared memory (16-byte st.async per 4 accumulators, slots private
        // to each holder thread: every rank holds identical fragment
        // layouts), which adds them in a fixed order; rank 0 stores the
        // tile.  Two ranks: 1 -> 0.  Four: 1 -> 0 and 3 -> 2, then 2 -> 0,
        // so rank 0 adds (p0 + p1) + (p2 + p3) (the one buffer of rank 0
        // takes rank 1's tile, then rank 2's).  The tile's `skip` is the
        // same in every rank (same tile), so all skip the exchange together.
        if (!cluster_waited) {   // the peers' barriers are initialised from here on
          cluster_wait();
          cluster_waited = true;
        }
        const bool holder = !T::kSplitK || warpgroup == 0;
        if (holder && !skip) {
          constexpr uint32_t kQuads = kNumAccum / 4;
          const uint32_t h = threadIdx.x;   // < kNumHolderThreads
          float* cred = reinterpret_cast<float*>(smem + Smem::kOffClusterRed);
          // Send this CTA's tile to rank `dst` once its buffer is free: this
          // CTA's empty barrier has completed the phase of parity `parity`
          // (the receiver's arrival after reading what was there before).
          auto send = [&](uint32_t dst, uint32_t parity) {
            mbarrier_wait<true>(red_empty_bar, parity);
            const uint32_t remote_bar = mapa_shared(smem_addr(red_full_bar), dst);
            const uint32_t remote = mapa_shared(smem_addr(cred), dst);
            #pragma unroll
            for (uint32_t v = 0; v < kWaves; ++v) {
              #pragma unroll
              for (uint32_t q = 0; q < kQuads; ++q) {
                const float* f = final_accum[v] + q * 4;
                st_async_v4(remote + ((v * kQuads + q) * T::kNumHolderThreads + h) * 16, f[0], f[1], f[2], f[3],
                            remote_bar);
              }
            }
          };
          // Wait for a tile in this CTA's buffer (the full barrier's phase of
          // parity `parity`), add it, then free the buffer for rank `next`,
          // the next rank to send here.
          auto receive = [&](uint32_t parity, uint32_t next) {
            if (h == 0) mbarrier_arrive_expect_tx(red_full_bar, Smem::kClusterRedData);
            mbarrier_wait<true>(red_full_bar, parity);
            #pragma unroll
            for (uint32_t v = 0; v < kWaves; ++v) {
              #pragma unroll
              for (uint32_t q = 0; q < kQuads; ++q) {
                const float4 p = reinterpret_cast<const float4*>(cred)[(v * kQuads + q) * T::kNumHolderThreads + h];
                final_accum[v][q * 4 + 0] = add_rn(final_accum[v][q * 4 + 0], p.x);
                final_accum[v][q * 4 + 1] = add_rn(final_accum[v][q * 4 + 1], p.y);
                final_accum[v][q * 4 + 2] = add_rn(final_accum[v][q * 4 + 2], p.z);
                final_accum[v][q * 4 + 3] = add_rn(final_accum[v][q * 4 + 3], p.w);
              }
            }
            // Reads done: `next` may send into this buffer.  The warp's reads
            // are ordered before lane 0's cluster-scope release (the sender
            // overwrites the buffer once its acquire-wait returns).
            __syncwarp();
            if (lane == 0) mbarrier_arrive_cluster<true>(red_empty_bar, next);
          };
          if constexpr (kNumKSplits == 2) {
            // The sender's first wait (parity 1 of a fresh barrier) passes.
            if (rank == 1) send(0, red_phase ^ 1);
            else receive(red_phase, 1);
          } else {
            // Rank 0's full barrier completes twice per tile (parities 0 then
            // 1); it frees its buffer for rank 2 after rank 1's tile and for
            // rank 1 (the next tile) after rank 2's.  Rank 2 sends only
            // after rank 0 has read rank 1's tile of this same tile (its
            // first wait does not pass).
            if (rank & 1u) {
              send(rank - 1, red_phase ^ 1);
            } else if (rank == 2) {
              receive(red_phase, 3);
              send(0, red_phase);
            } else {
              receive(0, 2);
              receive(1, 1);
            }
          }
          red_phase ^= 1;
        }
        if (rank != 0) continue;   // rank 0 stores the tile
      }
      // With split K only warpgroup 0 holds the tile and stores it.
      if (T::kSplitK && warpgroup != 0) continue;

      // ---------------------------------------------------------------- epilogue
      const uint32_t m0 = tile.m_block * BLOCK_M;
      const uint32_t n0 = tile.n_block * BLOCK_N;
      const uint32_t d_group = kGemmType == kGroupedMasked ? tile.group : 0;
      bool use_tma[kWaves];
      #pragma unroll
      for (uint32_t v = 0; v < kWaves; ++v) {
        const uint32_t slab = m0 + row_off(v);
        const bool any = !tile.phantom && slab < tile.valid_m && ((stores >> (row_off(v) / 128)) & 1u);
        // A masked group's rows in [masked_m, m_max) must stay untouched, which a
        // 64-row TMA box cannot express: such slabs are stored row by row.
        const bool partial = kGemmType == kGroupedMasked && slab + 64 > tile.valid_m;
        use_tma[v] = any && !partial;
        if (!any) continue;
        const uint32_t r0 = slab + warp * 16 + lane / 4;
        if constexpr (kGemmType == kGroupedContiguous) {
          // Row-level layout contract: -1 rows are written as zeros; a row whose
          // expert differs from its block's (or any row of a block with an
          // invalid expert id) is a layout violation and is written as NaN.
          // The common case, all 16 of the warp's rows with the block's expert,
          // is one vote: the selects (two per accumulator) run only in warps
          // with padding or violating rows.
          const int32_t (&e)[2] = row_expert[v];
          if (!__all_sync(0xffffffffu, !skip && e[0] == b_group && e[1] == b_group)) {
            #pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
              const bool zero = e[h] == -1, bad = !zero && (skip || e[h] != b_group);
              #pragma unroll
              for (uint32_t i = 0; i < kNumAccum / 4; ++i) {
                #pragma unroll
                for (uint32_t j = 0; j < 2; ++j) {
                  float& x = final_accum[v][i * 4 + h * 2 + j];
                  x = zero ? 0.f : (bad ? __int_as_float(0x7fffffff) : x);
                }
              }
            }
          }
        }
        if (!use_tma[v]) {
          // Direct, predicated stores (masked partial slab).
          #pragma unroll
          for (uint32_t h = 0; h < 2; ++h) {
            const uint32_t r = r0 + h * 8;
            if (r >= tile.valid_m) continue;
            uint16_t* row_ptr = d_ptr + (static_cast<uint64_t>(d_group) * shape_m + r) * ld_d;
            #pragma unroll
            for (uint32_t i = 0; i < kNumAccum / 4; ++i) {
              const uint32_t col = n0 + i * 8 + (lane % 4) * 2;
              if (col < SHAPE_N) {
                *reinterpret_cast<uint32_t*>(row_ptr + col) =
                    pack_bf16x2(final_accum[v][i * 4 + h * 2], final_accum[v][i * 4 + h * 2 + 1]);
              }
            }
          }
        }
      }

      // TMA path: wait until this warpgroup's previous stores finished reading
      // the staging buffer, stage BF16 into swizzled shared memory, then store.
      if (tid == 0) tma_store_wait_read<0>();
      named_barrier_sync(2 + warpgroup, 128);
      // stmatrix (PTX ISA "stmatrix"): each m8n8 matrix is one 8-row x
      // 8-column block of the accumulator fragment (a thread's two BF16 of
      // row lane / 4), so one .x4 stores the blocks (h, i), (h + 1, i),
      // (h, i + 1), (h + 1, i + 1) of 8-column groups i and i + 1, lane l
      // giving the 16-byte row address of block l / 8: 4x fewer store
      // instructions than 4-byte stores.
      //
      // Addresses: the byte offset of 8-column group g's row r in a slab is
      // (col / kDCols) * 64 * kDRowBytes + r * kDRowBytes + ((col % kDCols) * 2
      // ^ swizzle(r)) with col = 8 g.  With a swizzled buffer kDRowBytes is
      // 32, 64 or 128 (it divides 128), so the 16-byte-chunk XOR of the
      // swizzle (CUTLASS's Swizzle<3,4,3> family: bits 7-9 of the offset
      // into bits 4-6) depends only on the row and lands inside the column's
      // byte offset (< kDRowBytes), and everything else is a multiple of
      // kDRowBytes.  So a lane's address is one per-lane register (the
      // staging buffer, this warpgroup's slab, the lane's row and the row's
      // XOR; a 128-byte-aligned base is all this needs, and the buffer is
      // 1024-aligned) XORed with the lane's 8-column half (lane / 16, .x4
      // stores) and a per-group constant (kDRowBytes / 32 distinct values
      // over the even groups), plus an immediate (the wave's slab and the box).
      // Measured on the H200 (benches/RESULTS.md v0.34): bit-identical
      // outputs, 59 fewer instructions a tile and math warp at 256x128
      // (-5.6 % of the kernel's at 4096x32768x512, -2.1 % at K = 1536),
      // 0.2-1.5 % faster in sustained loops.
      const uint32_t r = warp * 16 + ((lane / 8) & 1u) * 8 + lane % 8;   // the row this lane addresses
      const uint32_t slab0 = smem_addr(smem) + warpgroup * 64 * BLOCK_N * 2;   // 1024-byte aligned
      constexpr uint32_t kGroupsPerRow = T::kDRowBytes / 16;                  // 8-column groups per box row
      const uint32_t lane_base =
          kSwizzleDBytes != 0 ? (slab0 + r * T::kDRowBytes) ^ (((r * T::kDRowBytes >> 7) & T::kSwizzleMask) << 4) : 0u;
      #pragma unroll
      for (uint32_t v = 0; v < kWaves; ++v) {
        if (!use_tma[v]) continue;
        const uint32_t slab_off = (v * kNumMathWG) * 64 * BLOCK_N * 2;
        // Group `group`'s address; `half` = 1 when the lane addresses group + 1 of an
        // even group (the .x4 stores' lanes 16-31).
        auto row_addr = [&](uint32_t group, uint32_t half) {
          if constexpr (kSwizzleDBytes != 0) {
            return ((lane_base ^ (half << 4)) ^ ((group % kGroupsPerRow) << 4)) + slab_off +
                   (group / kGroupsPerRow) * 64 * T::kDRowBytes;
          } else {
            const uint32_t col = (group + half) * 8;
            return slab0 + slab_off + (col / T::kDCols) * 64 * T::kDRowBytes + r * T::kDRowBytes + (col % T::kDCols) * 2;
          }
        };
        const float* acc = final_accum[v];
        #pragma unroll
        for (uint32_t i = 0; i + 1 < kNumAccum / 4; i += 2) {
          stmatrix_x4(row_addr(i, lane / 16), pack_bf16x2(acc[i * 4 + 0], acc[i * 4 + 1]),
                      pack_bf16x2(acc[i * 4 + 2], acc[i * 4 + 3]), pack_bf16x2(acc[i * 4 + 4], acc[i * 4 + 5]),
                      pack_bf16x2(acc[i * 4 + 6], acc[i * 4 + 7]));
        }
        if constexpr ((kNumAccum / 4) % 2 == 1) {
          // An odd number of 8-column groups: the last one by .x2 (lanes 0-15 address).
          constexpr uint32_t i = kNumAccum / 4 - 1;
          stmatrix_x2(row_addr(i, 0u), pack_bf16x2(acc[i * 4 + 0], acc[i * 4 + 1]),
                      pack_bf16x2(acc[i * 4 + 2], acc[i * 4 + 3]));
        }
      }
      fence_proxy_async_smem();
      named_barrier_sync(2 + warpgroup, 128);
      if (tid == 0) {
        bool issued = false;
        #pragma unroll
        for (uint32_t v = 0; v < kWaves; ++v) {
          if (!use_tma[v]) continue;
          const uint8_t* slab = smem + (v * kNumMathWG + warpgroup) * 64 * BLOCK_N * 2;
          #pragma unroll
          for (uint32_t c = 0; c < T::kNumDStores; ++c) {
            tma_store_3d(&tmap_d, slab + c * 64 * T::kDRowBytes, static_cast<int32_t>(n0 + c * T::kDCols),
                         static_cast<int32_t>(m0 + row_off(v)), static_cast<int32_t>(d_group));
          }
          issued = true;
        }
        if (issued) tma_store_commit();
      }
    }
    // Shared memory must outlive the reads of the last TMA stores.
    if (tid == 0) tma_store_wait_read<0>();
  }

  if constexpr (T::kClusterSize > 1) {
    if (!cluster_waited) cluster_wait();   // the deferred wait of a thread that never exchanged
    // No CTA exits while a peer may still arrive on its barriers (or, with
    // split K, send into its shared memory).
    cluster_sync();
  }
}

}  // namespace cugemm8
