// SPDX-License-Identifier: MIT
// Warp-MMA FP8 GEMM with DeepSeek-V3 fine-grained scaling ("1D2D": 1x128
// activation scales, 128x128 weight scales) for decode-sized M (1 ... 32
// tokens) on sm_90a:
//
//   D[m, n] = sum_kb SFA[m, kb] * SFB[n / 128, kb] * sum_{k in kb} A[m, k] * B[n, k]
//
// Same operands, layouts and output as fp8_gemm_1d2d.cuh: A [M, K] and B
// [N, K] e4m3 K-major (16-byte aligned rows), SFA MN-major f32 (element (m,
// kb) at sfa[kb * ld_sfa + m]), SFB [ceil(N/128), ceil(K/128)] f32 row-major,
// D [M, N] bf16.
//
// Why: at M <= 32 a decode GEMM is a read of B.  The TMA kernels stream B
// through a shared-memory ring that one producer thread refills and one math
// warpgroup drains block by block, and they stay 1.1-2.6 us above a plain
// read of the same bytes (benches/RESULTS.md v0.10 and v0.15-v0.16:
// 1x2112x7168 8.8 us against 6.2 for 16-byte streaming loads).  Here every
// warp reads its own share of B straight into registers with 16-byte
// streaming loads (ld.global.cs: evict-first, so the read-once weights
// replace one another in L2) and multiplies it there with the warp-level
// m16n8k32 FP8 MMA, the weights as the MMA's A (16 rows) and the tokens as
// its B (8 columns per token tile), so there is no ring, no barrier and no
// producer: the bytes in flight are the loads of every warp of the grid.
//
// Which K each MMA sees.  A dot product does not depend on the order of its
// terms, so the MMA's 32 K slots may hold any 32 bytes of a row as long as
// the weights and the tokens use the same ones.  Lane (g, t) = (lane / 4,
// lane % 4) loads 16 contiguous bytes, K offsets 64j + 16t ... + 15 of the
// K block (j = 0, 1), of weight rows g and g + 8 and of token g; MMA (j, s)
// (s = 0, 1) takes bytes 8s ... 8s + 7 of them: A slots 4t ... 4t + 3 and
// 16 + 4t ... + 3 get bytes 8s ... + 3 and 8s + 4 ... + 7, and so do the
// tokens' B slots (ptx/mma.cuh gives the fragment layouts).  The four MMAs
// (j, s) of a K block cover its 128 bytes once; each 128-byte row segment
// is read by four lanes in two 64-byte halves.
//
// Promotion: as in every cugemm8 kernel, the four MMAs of one 128-wide K
// block accumulate in the tensor core from zero, and the block's partial is
// added into FP32 registers with the scales applied, in the 1D2D kernel's
// order: acc = fma_rn(mul_rn(sfa, sfb), partial, acc).  The sum of a K block
// is the same set of products as the WGMMA kernels'; the tensor core adds
// them in another order, so the result is not bit-identical to theirs (it is
// within the same error bound: cugemm8/reference).
//
// Work split: a CTA owns kSlabs slabs of 16 * kRowTiles weight rows; each
// slab's K blocks are split among kKSplit warps in contiguous shares.  Each
// warp keeps 4 FP32 values per 16 x 8 (row tile x token tile) per lane; at
// the end the kKSplit warps of a slab add their partials through shared
// memory in warp order and the CTA stores its BF16 outputs, bounds-checked
// (rows >= N and tokens >= M are never written).  Loads past N, M or K read
// nothing and count as zero.  Each warp loads kUnroll K blocks (all weights,
// tokens and scales) before their MMAs.
//
// 16-bit float activations (kAIn != kAInFp8: gemm_fp8's one-kernel
// bf16-in form): `a` holds x itself ([M, K_x] bfloat16 / float16, 16-byte
// aligned rows).  The tokens are quantised before the main loop, while
// every warp's first batch of B is in flight, into shared memory: with one
// slab per CTA each warp quantises the 1x128 groups (token, K block) of its
// own K blocks, with several slabs (whose warps read the same K blocks) the
// CTA's warps share all of them; 16 lanes to a group and 8 elements to a
// lane, with the per-token cast's own
// device functions (quant.cuh: amax, scale, the exact quotient in its float32
// form -- three FMA-pipe operations an element instead of a float64 product
// and an F2F, the same bytes on every input, checked exhaustively -- and the
// integer-only bytes of a group holding a NaN or an Inf), so the payload
// bytes and scales
// are bit for bit those per_token_cast_to_fp8 writes and the output is that
// of the cast followed by this kernel on FP8 A.  The payload is stored in
// the MMA's fragment order (K block, half j, token g, lane t: 16 bytes), so
// the main loop reads a lane's 16 bytes with one conflict-free shared load
// where the FP8 form reads global memory.  Only the M real tokens are
// quantised (no lane works on a token past M), each group once per CTA.
// (History: a first form quantised in every warp's registers, each lane
// its own token's 32 elements per block; every warp redid its slab's
// tokens and lanes past M did the same work on zeros: 1.1-1.4x slower than
// the quantiser + GEMM pair on the H200, benches/RESULTS.md v0.20.)
#pragma once
#include "common.cuh"
#include "ptx/fp32.cuh"
#include "ptx/griddep.cuh"
#include "ptx/mma.cuh"
#include "quant.cuh"

namespace cugemm8 {

// Shared memory of one configuration (the cross-warp reduction):
// cugemm8/_config.py:warp_mma_smem_size implements the same formula.
template <uint32_t kTokenTiles, uint32_t kRowTiles, uint32_t kKSplit, uint32_t kSlabs>
struct WarpMmaSmem {
  static constexpr uint32_t kPerWarp = kRowTiles * kTokenTiles * 16u * 8u;   // f32 values
  static constexpr uint32_t kTotal = kKSplit > 1 ? kSlabs * kKSplit * kPerWarp * 4u : 0u;
};
// The float-A form's tokens after it (16-byte aligned: kTotal is a multiple
// of 512): per K block 8 tokens x 128 payload bytes in fragment order, then
// per K block the 8 tokens' scales.
template <uint32_t SHAPE_K>
struct WarpMmaQuantASmem {
  static constexpr uint32_t kNumKBlocks = (SHAPE_K + 127u) / 128u;
  static constexpr uint32_t kPayload = kNumKBlocks * 8u * 128u;
  static constexpr uint32_t kTotal = kPayload + kNumKBlocks * 8u * 4u;
};

// Registers a thread of the float-A form may take
// (cugemm8/_config.py:WARP_MMA_QUANT_A_REGISTERS, which places its CTAs):
// its launch bounds ask ptxas for as many CTAs per SM as that allows
// (16-bit x fits without spills; unbounded, float16 x took 155).  FP8 A asks
// for none (0: ptxas's own choice, 92-98 registers; an explicit 1 gave
// 100-109).
constexpr uint32_t kWarpMmaQuantARegisters = 128;
// Steps (2 groups of 128 elements each) a warp of the float-A form
// quantises per round, their loads in flight together
// (cugemm8/_config.py:WARP_MMA_QUANT_A_STEPS, the one-round rule).
constexpr uint32_t kWarpMmaQuantSteps = 4;
template <uint32_t kAIn>
constexpr uint32_t warp_mma_min_ctas(uint32_t threads) {
  return kAIn == kAInFp8 ? 0u : 65536u / (threads * kWarpMmaQuantARegisters);
}

// Arguments:
//   shape_m   rows of A / D (M), 1 ... 8 * kTokenTiles
//   flags     kFlagBBeforeWait (common.cuh; FP8 A only) or 0; with float A
//             also kFlagAPow2Scale (power-of-two activation scales)
//   num_k_blocks  ceil(K / 128), the kernel's SHAPE_K in K blocks, as a
//             run-time value on purpose: the K loop's trip count and each
//             block's guard then stay run-time branches, and ptxas keeps a
//             batch's loads ahead of its MMAs.  With a compile-time count it
//             folded the guards and moved the MMAs of the first block
//             between the loads of the next (SASS of <2112, 7168, 1, 1, 1,
//             8, 4>: about one K block in flight per warp instead of
//             kUnroll).  The kernel traps unless it equals ceil(SHAPE_K / 128).
//   a, ld_a   A and its row stride in bytes (a multiple of 16); with float A
//             (kAIn != kAInFp8) the activations x
//   sfa, ld_sfa  A's scales, MN-major: element (m, kb) at sfa[kb * ld_sfa + m]
//             (FP8 A only; not read for float A)
//   b, ld_b   B and its row stride in bytes (a multiple of 16)
//   sfb       B's scales, row-major [ceil(N/128), ceil(K/128)]
//   d, ld_d   D and its row stride in elements
//   shape_k_x float A only: x's columns K_x (SHAPE_K is K_x rounded up to a
//             multiple of 16; the columns past K_x count as zeros, as the
//             per-token cast pads them); not read for FP8 A
template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t kTokenTiles, uint32_t kRowTiles, uint32_t kKSplit,
          uint32_t kSlabs, uint32_t kUnroll, uint32_t kAIn = kAInFp8>
__global__ void __launch_bounds__(32 * kKSplit * kSlabs, warp_mma_min_ctas<kAIn>(32 * kKSplit * kSlabs))
fp8_gemm_warp_mma_kernel(uint32_t shape_m, uint32_t num_k_blocks, uint32_t flags, const uint8_t* __restrict__ a, uint32_t ld_a,
                         const float* __restrict__ sfa, uint32_t ld_sfa, const uint8_t* __restrict__ b,
                         uint32_t ld_b, const float* __restrict__ sfb, uint16_t* __restrict__ d,
                         uint32_t ld_d, uint32_t shape_k_x) {
  constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, 128u);
  constexpr uint32_t kSlabRows = 16u * kRowTiles;
  using Smem = WarpMmaSmem<kTokenTiles, kRowTiles, kKSplit, kSlabs>;
  // Float A: x's element type.
  constexpr bool kQuantA = kAIn != kAInFp8;
  constexpr InDtype kXDtype = static_cast<InDtype>(kQuantA ? kAIn - 1u : 0u);
  using XTraits = quant::InTraits<kXDtype>;
  static_assert(kAIn <= kAInBFloat16, "kAIn: kAInFp8 or a float dtype (quant.cuh)");
  static_assert(!kQuantA || kTokenTiles == 1, "float A: one token tile of 8 (gemm_fp8's M <= 8)");
  static_assert(!kQuantA || XTraits::kBytes == 2, "float A: 16-bit x (gemm_fp8 quantises float32 x apart)");
  static_assert(SHAPE_K % 16 == 0 && SHAPE_K > 0, "K: a positive multiple of 16 (16-byte rows)");
  static_assert(SHAPE_N % 8 == 0 && SHAPE_N > 0, "N: a positive multiple of 8");
  static_assert(kTokenTiles == 1 || kTokenTiles == 2 || kTokenTiles == 4, "token tiles of 8: 8, 16 or 32 tokens");
  static_assert(kRowTiles == 1 || kRowTiles == 2, "16 or 32 weight rows per warp");
  static_assert(kKSplit >= 1 && kKSplit <= kNumKBlocks, "every warp of a slab runs at least one K block");
  static_assert(kKSplit * kSlabs <= 32, "at most 1024 threads");
  static_assert(kUnroll >= 1 && kUnroll <= 8, "1 ... 8 K blocks in flight per warp");
  // A slab never straddles a 128-row block of B scales.
  static_assert(128u % kSlabRows == 0, "slab rows divide 128");

  extern __shared__ __align__(16) uint8_t smem[];
  const uint32_t warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
  const uint32_t g = lane / 4u, t = lane % 4u;
  const uint32_t slab_in_cta = warp / kKSplit, split = warp % kKSplit;
  const uint32_t n0 = (blockIdx.x * kSlabs + slab_in_cta) * kSlabRows;
  if (num_k_blocks != kNumKBlocks) device_trap();
  // Warp `split`'s K blocks: a contiguous share, the first num_k_blocks % kKSplit one more.
  const uint32_t per = num_k_blocks / kKSplit, extra = num_k_blocks % kKSplit;
  const uint32_t kb_begin = split * per + min(split, extra);
  const uint32_t kb_end = kb_begin + per + (split < extra ? 1u : 0u);

  float acc[kRowTiles][kTokenTiles][4];
  #pragma unroll
  for (uint32_t r = 0; r < kRowTiles; ++r)
    #pragma unroll
    for (uint32_t tt = 0; tt < kTokenTiles; ++tt)
      #pragma unroll
      for (uint32_t i = 0; i < 4; ++i) acc[r][tt][i] = 0.f;

  // Rows and tokens this lane loads (a row or token past the tensor loads
  // nothing).  Slabs past N do no work but still take part in the reduction.
  bool row_ok[kRowTiles][2];
  const uint8_t* b_row[kRowTiles][2];
  #pragma unroll
  for (uint32_t r = 0; r < kRowTiles; ++r)
    #pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t n = n0 + r * 16u + h * 8u + g;
      row_ok[r][h] = n < SHAPE_N;
      b_row[r][h] = b + static_cast<uint64_t>(row_ok[r][h] ? n : 0u) * ld_b + t * 16u;
    }
  bool tok_ok[kTokenTiles];
  const uint8_t* a_row[kTokenTiles];
  #pragma unroll
  for (uint32_t tt = 0; tt < kTokenTiles; ++tt) {
    const uint32_t m = tt * 8u + g;
    tok_ok[tt] = m < shape_m;
    a_row[tt] = a + static_cast<uint64_t>(tok_ok[tt] ? m : 0u) * ld_a + t * 16u;
  }
  // Float A: the CTA's quantised tokens (WarpMmaQuantASmem, written by
  // x_quantize): lane (g, t)'s 16 bytes of half j of K block kb at xq_lane +
  // (kb * 2 + j) * 512, the scale of token m of K block kb at xs[kb * 8 + m].
  uint8_t* xq = smem + Smem::kTotal;
  float* xs = reinterpret_cast<float*>(xq + WarpMmaQuantASmem<SHAPE_K>::kPayload);
  const uint8_t* xq_lane = xq + lane * 16u;
  // The scales' columns of this lane's accumulators: tokens 8tt + 2t, + 1.
  bool sfa_ok[kTokenTiles][2];
  #pragma unroll
  for (uint32_t tt = 0; tt < kTokenTiles; ++tt)
    #pragma unroll
    for (uint32_t e = 0; e < 2; ++e) sfa_ok[tt][e] = tt * 8u + 2u * t + e < shape_m;
  const float* sfb_row = sfb + (n0 < SHAPE_N ? n0 / 128u : 0u) * kNumKBlocks;

  // One batch: kUnroll K blocks of this warp's weights, tokens and scales.
  struct Batch {
    U32x4 wb[kUnroll][kRowTiles][2][2];     // [block][row tile][rows g, g + 8][half j]
    U32x4 xa[kUnroll][kTokenTiles][2];      // [block][token tile][half j]
    float sa[kUnroll][kTokenTiles][2], sb[kUnroll];
  };
  // The batch at kb0's loads (blocks past kb_end load nothing): the weights
  // (HBM) in load_b, then the tokens and scales (L2 / L1 hits) in load_xs
  // (float A: B's scales in load_b, the tokens from shared memory).
  auto load_b = [&](Batch& bt, uint32_t kb0) {
    #pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) {
      const uint32_t kb = kb0 + u;
      #pragma unroll
      for (uint32_t j = 0; j < 2; ++j) {
        // K offset of this lane's 16 bytes; K % 16 == 0, so they are all in or all out.
        const uint32_t koff = kb * 128u + j * 64u;
        const bool k_ok = kb < kb_end && koff + t * 16u < SHAPE_K;
        #pragma unroll
        for (uint32_t r = 0; r < kRowTiles; ++r)
          #pragma unroll
          for (uint32_t h = 0; h < 2; ++h)
            bt.wb[u][r][h][j] = ld_16<true>(b_row[r][h] + koff, k_ok && row_ok[r][h]);
      }
      // Float A: B's scales go out with B (the tokens come from shared
      // memory).  Issued in load_xs, as for FP8 A, the first batch's
      // scales went out only after the quantisation (1.2 % slower on the
      // one-kernel rows, benches/RESULTS.md v0.21).
      if constexpr (kQuantA) bt.sb[u] = ld_nc_f32(sfb_row + kb, kb < kb_end);
    }
  };
  auto load_xs = [&](Batch& bt, uint32_t kb0) {
    if constexpr (kQuantA) {
      // The tokens from shared memory (quantised before the loop).
      #pragma unroll
      for (uint32_t u = 0; u < kUnroll; ++u) {
        const uint32_t kb = kb0 + u;
        const bool kb_ok = kb < kb_end;
        #pragma unroll
        for (uint32_t j = 0; j < 2; ++j) {
          U32x4 v{0u, 0u, 0u, 0u};
          if (kb_ok && tok_ok[0]) v = *reinterpret_cast<const U32x4*>(xq_lane + (kb * 2u + j) * 512u);
          bt.xa[u][0][j] = v;
        }
        #pragma unroll
        for (uint32_t e = 0; e < 2; ++e) bt.sa[u][0][e] = kb_ok && sfa_ok[0][e] ? xs[kb * 8u + 2u * t + e] : 0.f;
      }
    } else {
      #pragma unroll
      for (uint32_t u = 0; u < kUnroll; ++u) {
        const uint32_t kb = kb0 + u;
        #pragma unroll
        for (uint32_t j = 0; j < 2; ++j) {
          const uint32_t koff = kb * 128u + j * 64u;
          const bool k_ok = kb < kb_end && koff + t * 16u < SHAPE_K;
          #pragma unroll
          for (uint32_t tt = 0; tt < kTokenTiles; ++tt)
            bt.xa[u][tt][j] = ld_16<false>(a_row[tt] + koff, k_ok && tok_ok[tt]);
        }
      }
      #pragma unroll
      for (uint32_t u = 0; u < kUnroll; ++u) {
        const uint32_t kb = kb0 + u;
        const bool kb_ok = kb < kb_end;
        #pragma unroll
        for (uint32_t tt = 0; tt < kTokenTiles; ++tt)
          #pragma unroll
          for (uint32_t e = 0; e < 2; ++e)
            bt.sa[u][tt][e] = ld_nc_f32(sfa + static_cast<uint64_t>(kb) * ld_sfa + tt * 8u + 2u * t + e,
                                        kb_ok && sfa_ok[tt][e]);
        bt.sb[u] = ld_nc_f32(sfb_row + kb, kb_ok);
      }
    }
  };
  // Float A: the tokens -> e4m3 payload and scales in shared memory (see
  // the top of the file).  A warp takes 2 groups a step (16 lanes each,
  // lane `piece` holding elements 8 piece ... + 7 of the group) and
  // kQuantSteps steps a round, their loads in flight together.  With one
  // slab per CTA every warp quantises the groups of its own K blocks
  // (group id = (kb - kb_begin) * M + m) and only waits for its own lanes;
  // with several slabs, whose warps all read the same K blocks, the CTA's
  // warps take the CTA's groups (id = kb * M + m) in turns and wait for
  // one another.  Elements at or past K_x count as zeros.  x_load issues a
  // round's loads, x_quantize waits for them and stores the round's payload
  // and scales.
  constexpr uint32_t kQuantSteps = kWarpMmaQuantSteps;
  constexpr uint32_t kXVec = XTraits::kVec;                  // 8 elements per 16-byte load
  // A round: each step's 16 bytes of x and its group's place, kb * 8 + m
  // (kNoGroup: no group, the step past this warp's last).
  constexpr uint32_t kNoGroup = 0xffffffffu;
  struct XRound {
    uint32_t raw[kQuantSteps][4], pos[kQuantSteps];
  };
  constexpr bool kQuantPerWarp = kSlabs == 1;
  const uint32_t x_sub = lane / 16u, x_piece = lane % 16u;
  const uint32_t x_kb0 = kQuantPerWarp ? kb_begin : 0u;
  const uint32_t x_groups = shape_m * (kQuantPerWarp ? kb_end - kb_begin : num_k_blocks);
  const uint32_t x_stride = kQuantPerWarp ? 2u : kKSplit * kSlabs * 2u;
  auto x_load = [&](XRound& xr, uint32_t g0) {
    #pragma unroll
    for (uint32_t h = 0; h < kQuantSteps; ++h) {
      const uint32_t gid = g0 + h * x_stride + x_sub;
      const bool ok = gid < x_groups;
      const uint32_t m = ok ? gid % shape_m : 0u, kb = ok ? x_kb0 + gid / shape_m : 0u;
      xr.pos[h] = ok ? kb * 8u + m : kNoGroup;
      const uint32_t col = kb * 128u + x_piece * kXVec;
      const U32x4 v = ld_16<false>(a + static_cast<uint64_t>(m) * ld_a + static_cast<uint64_t>(col) * 2u,
                                   ok && col < shape_k_x);
      xr.raw[h][0] = v.x, xr.raw[h][1] = v.y, xr.raw[h][2] = v.z, xr.raw[h][3] = v.w;
    }
  };
  // Steps are quantised and stored one at a time (a step's registers are
  // free after it); steps past the warp's last group are skipped
  // (warp-uniform: g0 + h * x_stride is the same for both halves).
  auto x_quantize = [&](XRound& xr, uint32_t g0) {
    if constexpr (kQuantA) {      // (the FP8 form has no such phase)
      static_assert(128u / kXVec == 16u, "16 lanes of 8 elements per 128-element group");
      const bool pow2 = (flags & kFlagAPow2Scale) != 0;
      uint32_t amax[kQuantSteps];
      #pragma unroll
      for (uint32_t h = 0; h < kQuantSteps; ++h) {
        const uint32_t col = (xr.pos[h] / 8u) * 128u + x_piece * kXVec;
        // (gemm_fp8 passes rows of whole 16-byte pieces, K_x % 8 == 0, so no
        // load straddles K_x; a forced launch with another K_x stays exact.)
        if (xr.pos[h] != kNoGroup && col + kXVec > shape_k_x) quant::zero_past<kXDtype>(xr.raw[h], col, shape_k_x);
        amax[h] = quant::abs_max_bits<kXDtype>(xr.raw[h], 0u);
      }
      #pragma unroll
      for (uint32_t off = 8u; off > 0; off /= 2u) {
        #pragma unroll
        for (uint32_t h = 0; h < kQuantSteps; ++h) amax[h] = max(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], off));
      }
      #pragma unroll
      for (uint32_t h = 0; h < kQuantSteps; ++h) {
        if (g0 + h * x_stride >= x_groups) break;
        const float scale = quant::activation_scale<kXDtype>(amax[h], pow2);
        const bool finite = __float_as_uint(scale) < 0x7f800000u;
        // A non-finite scale's reciprocal would be garbage: 1 stands in,
        // and the group's bytes are replaced below.  The float32 quotient
        // (quant.cuh: the float64 one's bytes, checked on every input).
        uint32_t q[kXVec / 4];
        quant::quantize_activation<kXDtype>(xr.raw[h], finite ? scale : 1.0f, q);
        if (__any_sync(0xffffffffu, !finite)) {
          if (!finite) quant::quantize_nonfinite<kXDtype>(xr.raw[h], scale, q);
        }
        const uint32_t pos = xr.pos[h];
        if (pos == kNoGroup) continue;
        // Element 8 piece of group (kb, m) = (pos / 8, pos % 8): half j =
        // piece / 8, lane t = piece % 8 / 2, byte 8 (piece % 2).
        const uint32_t off = ((pos / 8u * 2u + x_piece / 8u) * 32u + pos % 8u * 4u + x_piece % 8u / 2u) * 16u +
                             x_piece % 2u * 8u;
        *reinterpret_cast<uint2*>(xq + off) = make_uint2(q[0], q[1]);
        if (x_piece == 0) xs[pos] = scale;
      }
    }
  };
  // The MMAs and promotion of the batch at kb0.
  auto compute = [&](const Batch& bt, uint32_t kb0) {
    #pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) {
      if (kb0 + u >= kb_end) break;
      #pragma unroll
      for (uint32_t r = 0; r < kRowTiles; ++r)
        #pragma unroll
        for (uint32_t tt = 0; tt < kTokenTiles; ++tt) {
          float part[4] = {0.f, 0.f, 0.f, 0.f};
          #pragma unroll
          for (uint32_t j = 0; j < 2; ++j) {
            const U32x4& w0 = bt.wb[u][r][0][j];
            const U32x4& w1 = bt.wb[u][r][1][j];
            const U32x4& x = bt.xa[u][tt][j];
            mma_m16n8k32_e4m3(part, w0.x, w1.x, w0.y, w1.y, x.x, x.y, part);
            mma_m16n8k32_e4m3(part, w0.z, w1.z, w0.w, w1.w, x.z, x.w, part);
          }
          const float s0 = mul_rn(bt.sa[u][tt][0], bt.sb[u]), s1 = mul_rn(bt.sa[u][tt][1], bt.sb[u]);
          acc[r][tt][0] = fma_rn(s0, part[0], acc[r][tt][0]);
          acc[r][tt][1] = fma_rn(s1, part[1], acc[r][tt][1]);
          acc[r][tt][2] = fma_rn(s0, part[2], acc[r][tt][2]);
          acc[r][tt][3] = fma_rn(s1, part[3], acc[r][tt][3]);
        }
    }
  };
  // __syncwarp() between a batch's loads and the MMAs: without it ptxas
  // moved the MMAs of the first block up between the loads of the next ones.
  // (A two-batch software pipeline -- the next batch's loads issued before
  // this one's MMAs -- was never faster on the H200: benches/RESULTS.md v0.19.)
  //
  // griddep_wait() comes before the first global access unless the host sets
  // kFlagBBeforeWait: only gemm_fp8's fused path does, whose predecessor is
  // cugemm8's own quantiser writing A and its scales only, so the first
  // batch of B may stream in while that kernel runs (the rule in
  // ptx/griddep.cuh: a dependent of a cugemm8 kernel may read before its
  // wait what its immediate predecessor does not write).
  // The loop over the warp's batches when the first batch's weights are
  // already in flight in `bt` (loaded before the wait, or before the tokens'
  // quantisation).
  auto loop_from_first_batch = [&](Batch& bt) {
    #pragma unroll 1
    for (uint32_t kb0 = kb_begin; kb0 < kb_end; kb0 += kUnroll) {
      if (kb0 != kb_begin) load_b(bt, kb0);
      load_xs(bt, kb0);
      __syncwarp();
      compute(bt, kb0);
    }
  };
  if constexpr (kQuantA) {
    // The first batch of B streams in while the CTA quantises its tokens.
    // The first round of x goes out before B (x is small; behind the
    // grid's first batches of B it waited about 2 us on the H200).
    griddep_wait();
    griddep_launch_dependents();
    XRound xr;
    uint32_t g0 = kQuantPerWarp ? 0u : warp * 2u;
    x_load(xr, g0);
    Batch bt;
    load_b(bt, kb_begin);
    #pragma unroll 1
    while (true) {
      x_quantize(xr, g0);
      g0 += x_stride * kQuantSteps;
      if (g0 >= x_groups) break;
      x_load(xr, g0);
    }
    if constexpr (kQuantPerWarp) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    loop_from_first_batch(bt);
  } else if ((flags & kFlagBBeforeWait) == 0) {
    griddep_wait();
    griddep_launch_dependents();
    #pragma unroll 1
    for (uint32_t kb0 = kb_begin; kb0 < kb_end; kb0 += kUnroll) {
      Batch bt;
      load_b(bt, kb0);
      load_xs(bt, kb0);
      __syncwarp();
      compute(bt, kb0);
    }
  } else {
    // The same loop with the first batch's weights loaded before the wait.
    // (Its own copy: one loop for both, with the first load_b behind a
    // branch, or peeled, ran the FP8 op 3-17 % slower at K <= 1536 on the
    // H200, benches/RESULTS.md v0.19.)
    Batch bt;
    load_b(bt, kb_begin);
    griddep_wait();
    griddep_launch_dependents();
    loop_from_first_batch(bt);
  }

  // Epilogue: value (row, token) of the slab; row = 16r + 8h + g, token = 8tt + 2t + e.
  constexpr uint32_t kOutPerSlab = kSlabRows * kTokenTiles * 8u;
  if constexpr (kKSplit == 1) {
    #pragma unroll
    for (uint32_t r = 0; r < kRowTiles; ++r)
      #pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t n = n0 + r * 16u + h * 8u + g;
        #pragma unroll
        for (uint32_t tt = 0; tt < kTokenTiles; ++tt)
          #pragma unroll
          for (uint32_t e = 0; e < 2; ++e) {
            const uint32_t m = tt * 8u + 2u * t + e;
            if (n < SHAPE_N && m < shape_m)
              d[static_cast<uint64_t>(m) * ld_d + n] =
                  static_cast<uint16_t>(pack_bf16x2(acc[r][tt][h * 2 + e], 0.f) & 0xffffu);
          }
      }
  } else {
    // Partials in shared memory as [slab][split][token][row], then each
    // output summed over the splits in order (deterministic).
    float* red = reinterpret_cast<float*>(smem);
    float* mine = red + (slab_in_cta * kKSplit + split) * Smem::kPerWarp;
    #pragma unroll
    for (uint32_t r = 0; r < kRowTiles; ++r)
      #pragma unroll
      for (uint32_t h = 0; h < 2; ++h)
        #pragma unroll
        for (uint32_t tt = 0; tt < kTokenTiles; ++tt)
          #pragma unroll
          for (uint32_t e = 0; e < 2; ++e)
            mine[(tt * 8u + 2u * t + e) * kSlabRows + r * 16u + h * 8u + g] = acc[r][tt][h * 2 + e];
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < kSlabs * kOutPerSlab; i += blockDim.x) {
      const uint32_t slab = i / kOutPerSlab, within = i % kOutPerSlab;
      const uint32_t m = within / kSlabRows, row = within % kSlabRows;
      const uint32_t n = (blockIdx.x * kSlabs + slab) * kSlabRows + row;
      if (n >= SHAPE_N || m >= shape_m) continue;
      const float* p = red + slab * kKSplit * Smem::kPerWarp + within;
      float s = p[0];
      #pragma unroll
      for (uint32_t w = 1; w < kKSplit; ++w) s = add_rn(s, p[w * Smem::kPerWarp]);
      d[static_cast<uint64_t>(m) * ld_d + n] = static_cast<uint16_t>(pack_bf16x2(s, 0.f) & 0xffffu);
    }
  }
}

}  // namespace cugemm8
