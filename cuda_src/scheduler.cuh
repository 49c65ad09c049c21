// SPDX-License-Identifier: MIT
// Persistent tile scheduler shared by the normal, contiguous-grouped and
// masked-grouped GEMMs (a grouped GEMM is an addressing variant, not another
// kernel), and by the 1D1D kernel's normal and k-grouped forms
// (fp8_gemm_1d1d.cuh): a k-grouped GEMM has kNumGroups full M x N outputs,
// walked group after group, each rasterised like a normal GEMM.
//
// Work is handed out in "cluster tiles": with TMA multicast the two CTAs of a
// cluster take the two halves of one cluster tile, sharing the multicast
// operand (same m-block when A is multicast, same n-block when B is; on the
// contiguous layout B only when the two m-blocks have one expert, else each
// CTA loads its own: fp8_gemm_1d2d.cuh, kPairedB).  A CTA
// whose half falls outside the matrix runs a *phantom* tile: it still loads
// (TMA fills zeros out of bounds) and computes (with kPairedB: only loads,
// and drains its stages), so both CTAs walk their pipelines in lockstep,
// but it stores nothing.
//
// Contiguous grouped GEMMs with BLOCK_M = 256 run in two passes (kMPasses):
// a 256-row tile spans two 128-row expert blocks, which may belong to two
// experts.  Every tile of pass 0 comes first, then every tile of pass 1 (the
// kernel finds a pass-1 tile absent unless its second block has another
// expert), so pass 0 is spread over the CTAs exactly like a normal GEMM and
// pass 1 adds one full row of tiles for every expert boundary at an odd
// multiple of 128 rows (about half the boundaries: the heuristic charges it,
// and with many small experts prefers BLOCK_M <= 128).
//
// Cluster tiles are rasterised in bands of kBandN cluster-columns (16
// n-blocks: kBandN * kPairN): within a band the index walks N fastest, so one
// wave of CTAs touches a few A row-panels and at most 16 B column-panels,
// which stay L2-resident (the CUTLASS /
// DeepGEMM "grouped rasterisation", deep_gemm/include/deep_gemm/scheduler.cuh).
// With kRasterM (the 1D2D kernel sets it for tiles wider than tall, BLOCK_N >
// BLOCK_M) the roles swap: bands of kBandM cluster-rows, walking M fastest.
// Measured on the H200 (benches/RESULTS.md v0.17; tools/perf/variant_sweep.py
// with benches/experiments/v0.17/plan_band.json): 128x192 tiles
// 3.5-5.2 % faster on the contiguous layout at K = 2048 (with and without A
// multicast) and 1.9 % on the normal 4096x2112x7168; 256x128 tiles were
// 1.0 % faster to 5.4 % slower (4096x32768x512), so they keep the N bands.
// (DeepGEMM groups along M without multicast on A, along N with it, 8 or 16
// blocks by a footprint rule.)  With A multicast a band is 16 n-blocks, 8
// cluster columns, as DeepGEMM's at 256x128 (v0.35; v0.27 measured 16 cluster
// columns within +-1 % of it while B's loads carried an L2 hint): with
// unhinted B loads the narrower band lets the L2 request coalescer merge more
// of the B reads of the clusters that share an n-block (ptx/tma.cuh,
// tma_load_3d_hint_if) and reads DeepGEMM's DRAM bytes (4096x4096x7168:
// 152.8 -> 128.3 MB; 0.5-1.0 % faster at K >= 7168 in CUPTI and sustained
// loops, a tie at K = 1536-2048; benches/RESULTS.md v0.35).
#pragma once
#include "common.cuh"

namespace cugemm8 {

enum GemmType : uint32_t { kNormal = 0, kGroupedContiguous = 1, kGroupedMasked = 2, kGroupedK = 3 };

template <uint32_t kGemmType, uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N,
          uint32_t kNumMulticast, bool kMulticastOnA, uint32_t kNumGroups, bool kRasterM = false>
struct TileScheduler {
  static constexpr uint32_t kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);
  static constexpr uint32_t kPairN = (kNumMulticast == 2 && kMulticastOnA) ? 2 : 1;
  static constexpr uint32_t kPairM = (kNumMulticast == 2 && !kMulticastOnA) ? 2 : 1;
  static constexpr uint32_t kNumClusterN = ceil_div(kNumNBlocks, kPairN);
  // Bands of 16 n-blocks: with A multicast (kPairN == 2) 8 cluster columns.
  static constexpr uint32_t kBandN = 16 / kPairN;
  static constexpr uint32_t kBandM = 8;
  static constexpr uint32_t kMPasses = (kGemmType == kGroupedContiguous && BLOCK_M == 256) ? 2 : 1;
  static_assert(kGemmType != kGroupedMasked || kPairM == 1, "masked GEMMs multicast A only");
  // Contiguous B multicast pairs two 128-row m-blocks; whether they share
  // an expert (and so B) is decided per tile by the kernel.
  static_assert(kGemmType != kGroupedContiguous || kPairM == 1 || BLOCK_M == 128,
                "contiguous GEMMs multicast B only with BLOCK_M = 128");
  static_assert(kGemmType != kGroupedK || kNumMulticast == 1, "k-grouped GEMMs do not multicast");

  struct Tile {
    uint32_t m_block;   // within the group for masked GEMMs
    uint32_t n_block;
    uint32_t group;     // masked, k-grouped: group index; otherwise 0
    uint32_t valid_m;   // rows of this group that are valid (shape_m, or min(masked_m, m_max))
    uint32_t pass;      // contiguous with BLOCK_M = 256: 0 or 1 (see above); otherwise 0
    bool phantom;       // outside the matrix: compute but never store
  };

  uint32_t shape_m;
  const int32_t* grouped_layout;
  uint32_t cluster_id, num_clusters, rank;
  uint32_t iter = 0;
  uint32_t num_m_blocks = 0, num_cluster_m = 0;
  // Masked-GEMM cursor: the first cluster tile of `group`, and that group's extent.
  uint32_t group = 0, group_base = 0, group_tiles = 0, group_valid_m = 0;

  __device__ __forceinline__ TileScheduler(uint32_t shape_m_, const int32_t* layout, uint32_t cluster_id_,
                                           uint32_t num_clusters_, uint32_t rank_)
      : shape_m(shape_m_), grouped_layout(layout), cluster_id(cluster_id_), num_clusters(num_clusters_),
        rank(rank_) {
    if constexpr (kGemmType == kGroupedMasked) {
      load_group();
    } else {
      num_m_blocks = ceil_div(shape_m, BLOCK_M);
      num_cluster_m = ceil_div(num_m_blocks, kPairM);
    }
  }

  __device__ __forceinline__ void load_group() {
    if (group < kNumGroups) {
      int32_t v = __ldg(grouped_layout + group);
      // masked_m outside [0, m_max] is clamped (documented in the Python API).
      group_valid_m = v < 0 ? 0u : (static_cast<uint32_t>(v) > shape_m ? shape_m : static_cast<uint32_t>(v));
      group_tiles = ceil_div(group_valid_m, BLOCK_M) * kNumClusterN;
    }
  }

  // Cluster tile `ct` of a grid walked in bands of `band` indices of the
  // banded dimension (`num_banded` of them), that dimension fastest within a
  // band and the other (`num_other`) next; the last band is narrower.
  __device__ __forceinline__ static void banded(uint32_t ct, uint32_t band, uint32_t num_banded,
                                                uint32_t num_other, uint32_t& banded_idx, uint32_t& other_idx) {
    const uint32_t b = ct / (band * num_other);
    const uint32_t start = b * band;
    const uint32_t width = min(band, num_banded - start);
    const uint32_t in_band = ct - b * band * num_other;
    other_idx = in_band / width;
    banded_idx = start + in_band % width;
  }

  __device__ __forceinline__ bool next(Tile& t) {
    uint32_t ct = cluster_id + (iter++) * num_clusters;
    uint32_t mc, nc;
    t.pass = 0;
    if constexpr (kGemmType == kGroupedMasked) {
      while (true) {
        if (group >= kNumGroups) return false;
        if (ct < group_base + group_tiles) break;
        group_base += group_tiles;
        ++group;
        load_group();
      }
      const uint32_t local = ct - group_base;
      mc = local / kNumClusterN;
      nc = local % kNumClusterN;
      t.group = group;
      t.valid_m = group_valid_m;
      num_m_blocks = ceil_div(group_valid_m, BLOCK_M);
    } else {
      if constexpr (kMPasses == 2) {
        const uint32_t per_pass = num_cluster_m * kNumClusterN;
        if (ct >= 2 * per_pass) return false;
        t.pass = ct >= per_pass ? 1u : 0u;
        ct -= t.pass * per_pass;
      }
      t.group = 0;
      if constexpr (kGemmType == kGroupedK) {
        // Every group has the full grid of tiles, group after group.
        const uint32_t per_group = num_cluster_m * kNumClusterN;
        if (per_group == 0) return false;
        t.group = ct / per_group;
        if (t.group >= kNumGroups) return false;
        ct -= t.group * per_group;
      }
      if (ct >= num_cluster_m * kNumClusterN) return false;
      if constexpr (kRasterM) {
        banded(ct, kBandM, num_cluster_m, kNumClusterN, mc, nc);
      } else {
        banded(ct, kBandN, kNumClusterN, num_cluster_m, nc, mc);
      }
      t.valid_m = shape_m;
    }
    t.m_block = mc * kPairM + (kPairM == 2 ? rank : 0);
    t.n_block = nc * kPairN + (kPairN == 2 ? rank : 0);
    t.phantom = t.m_block >= num_m_blocks || t.n_block >= kNumNBlocks;
    return true;
  }
};

}  // namespace cugemm8
