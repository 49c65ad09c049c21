// SPDX-License-Identifier: MIT
// FP8 (e4m3fn) quantisation with DeepSeek-V3 fine-grained scales, writing
// exactly the operands the 1D2D GEMM consumes:
//   * per_token_cast_kernel: 1x128 groups of a [g, m, k] activation; payload
//     [g, m, k] uint8 and scales stored MN-major, [g, ceil(k/128), m_pad]
//     float32 with m_pad = align(m, 4) (padding rows written as 0).
//   * per_block_cast_kernel: 128x128 tiles of a [g, n, k] weight; payload
//     [g, n, k] uint8 and scales [g, ceil(n/128), ceil(k/128)] float32.
//
// Numerics (bit-identical to cugemm8/reference.py):
//   amax  = max |x| over the group / tile (K and N tails zero-padded), NaN
//           propagating; amax = max(amax, min_amax) (NaN kept)
//   scale = amax / 448 (IEEE float32 division), optionally rounded up to the
//           next power of two (exact, integer bit manipulation)
//   q     = e4m3fn(satfinite(x / scale)) (IEEE float32 division, RNE)
//
// NOTES: CuPy compiles with -ftz=true, so every float operation here is done
// either on integer bit patterns or through inline PTX without .ftz; nothing
// is left to the compiler's FTZ/approximate paths:
//   * |x| and the amax reduction are integer ops on the float32 bit patterns.
//     For non-negative IEEE floats, unsigned order of the bit patterns equals
//     numeric order, and every NaN pattern (exp 255, mantissa != 0) is above
//     +Inf's 0x7f800000, so an unsigned max propagates NaN by construction
//     (fmaxf would drop it) and fp32 subnormal inputs are never flushed.
//   * both divisions are `div.rn.f32` (IEEE 754 round-to-nearest-even, with
//     subnormals; PTX ISA §9.7.3.8 "div").  Without .ftz the quotient is the
//     one NumPy computes, also when it is an fp32 subnormal.  (With FTZ it
//     would not matter either: a subnormal fp32 quotient is < 2^-126, far
//     below half of e4m3's smallest subnormal 2^-9, so it rounds to a signed
//     zero in e4m3 both ways; the exact path keeps the argument trivial.)
//   * bf16 -> f32 is a 16-bit shift and f16 -> f32 is `cvt.f32.f16` (no
//     .ftz); both are exact, including fp16 subnormals.
//   * `cvt.rn.satfinite.e4m3x2.f32` (sm_89+, PTX ISA §9.7.9.21 "cvt"): RNE;
//     finite values beyond +-448 (and +-Inf) give +-448 (0x7e/0xfe), NaN
//     gives NaN (0x7f).  x / scale can only be NaN (NaN in the group, or
//     Inf / Inf in a group whose amax is Inf), never Inf: |x| <= amax and
//     scale >= RN(amax / 448), so |x / scale| <= 448 * (1 + 2^-23) rounds to
//     448 at most.  Hence: groups with NaN get a NaN scale and NaN payloads;
//     groups with +-Inf get an Inf scale, NaN at the Inf positions and signed
//     zeros elsewhere (finite / Inf); other groups are unaffected.
#pragma once
#include "common.cuh"

namespace cugemm8 {

// Input element type of the quantisation kernels (template argument).
enum class InDtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

namespace quant {

constexpr uint32_t kGroup = 128;              // quantisation granule along K (and N)
constexpr uint32_t kE4M3MaxBits = 0x43e00000;  // 448.0f
constexpr uint32_t kThreads = 256;            // threads per CTA, both kernels

template <InDtype kIn>
struct InTraits {
  static constexpr uint32_t kBytes = kIn == InDtype::kFloat32 ? 4 : 2;
  static constexpr uint32_t kVec = 16 / kBytes;  // elements per 16-byte load
};

// ---------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------

// 16-byte read-only load that does not allocate in L1 (each byte is read once
// from global memory by this kernel).
__device__ __forceinline__ void ld_global_nc_v4(uint32_t (&r)[4], const void* ptr) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "l"(ptr));
}

__device__ __forceinline__ void st_global_v2(void* ptr, uint32_t a, uint32_t b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(ptr), "r"(a), "r"(b) : "memory");
}

__device__ __forceinline__ void st_global_u32(void* ptr, uint32_t a) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(ptr), "r"(a) : "memory");
}

__device__ __forceinline__ void st_global_f32(float* ptr, float a) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(ptr), "f"(a) : "memory");
}

// IEEE 754 float32 division, round to nearest even, subnormals kept (no .ftz
// whatever -ftz the compiler was given).
__device__ __forceinline__ float div_rn(float a, float b) {
  float d;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
  return f;
}

// Two float32 -> two e4m3fn bytes: `lo` in bits 7:0, `hi` in bits 15:8 (the
// instruction puts its first source operand in the upper byte).
__device__ __forceinline__ uint32_t cvt_e4m3x2(float lo, float hi) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}

// ---------------------------------------------------------------------------
// Element helpers
// ---------------------------------------------------------------------------

// The kVec elements of one 16-byte load as float32 (exact for all types).
template <InDtype kIn>
__device__ __forceinline__ void unpack(const uint32_t (&raw)[4], float (&f)[InTraits<kIn>::kVec]) {
  if constexpr (kIn == InDtype::kFloat32) {
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = __uint_as_float(raw[j]);
  } else if constexpr (kIn == InDtype::kBFloat16) {
    // Element 2j is the low half-word (little-endian).
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = __uint_as_float(raw[j] << 16);
      f[2 * j + 1] = __uint_as_float(raw[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = f16_bits_to_f32(raw[j] & 0xffffu);
      f[2 * j + 1] = f16_bits_to_f32(raw[j] >> 16);
    }
  }
}

// max over |f[j]| as float32 bit patterns (see the NaN note at the top).
template <int kN>
__device__ __forceinline__ uint32_t abs_max_bits(const float (&f)[kN], uint32_t acc) {
#pragma unroll
  for (int j = 0; j < kN; ++j) acc = max(acc, __float_as_uint(f[j]) & 0x7fffffffu);
  return acc;
}

// Smallest power of two >= the positive float with bits `b`; NaN, Inf and
// exact powers of two are returned unchanged.  Equals 2^ceil(log2(s)) exactly
// (a float log2 would round s = 2^e * (1 + 2^-23) down to 2^e).
__device__ __forceinline__ uint32_t round_up_pow2_bits(uint32_t b) {
  const uint32_t exp = b >> 23, mant = b & 0x7fffffu;
  if (exp == 0xffu || mant == 0) return b;
  if (exp != 0) return (exp + 1) << 23;  // exp = 254 cannot occur: scale <= FLT_MAX / 448
  // Subnormal scale (only with min_amax < 448 * 2^-126): round the integer
  // significand up to a power of two; 2^23 is the smallest normal, 0x800000.
  return (mant & (mant - 1)) == 0 ? mant : (1u << (32 - __clz(mant)));
}

// amax bits -> scale, following the recipe at the top of the file.
template <bool kPow2>
__device__ __forceinline__ float amax_to_scale(uint32_t amax_bits, float min_amax) {
  // Clamp with an unsigned compare so a NaN amax (bits > any finite) stays NaN.
  const uint32_t min_bits = __float_as_uint(min_amax);
  const float amax = __uint_as_float(amax_bits < min_bits ? min_bits : amax_bits);
  float scale = div_rn(amax, __uint_as_float(kE4M3MaxBits));
  if constexpr (kPow2) scale = __uint_as_float(round_up_pow2_bits(__float_as_uint(scale)));
  return scale;
}

// kN (4 or 8) float32 values -> kN e4m3fn bytes packed little-endian in words.
template <int kN>
__device__ __forceinline__ void quantize(const float (&f)[kN], float scale, uint32_t (&out)[kN / 4]) {
#pragma unroll
  for (int w = 0; w < kN / 4; ++w) {
    const uint32_t lo = cvt_e4m3x2(div_rn(f[4 * w + 0], scale), div_rn(f[4 * w + 1], scale));
    const uint32_t hi = cvt_e4m3x2(div_rn(f[4 * w + 2], scale), div_rn(f[4 * w + 3], scale));
    out[w] = lo | (hi << 16);
  }
}

template <int kN>
__device__ __forceinline__ void store_payload(uint8_t* ptr, const uint32_t (&w)[kN / 4]) {
  if constexpr (kN == 8) {
    st_global_v2(ptr, w[0], w[1]);
  } else {
    st_global_u32(ptr, w[0]);
  }
}

}  // namespace quant

// ---------------------------------------------------------------------------
// Per-token (1x128) cast
// ---------------------------------------------------------------------------
//
// Work split: one warp handles `chunks_per_task` consecutive chunks of one
// row; a chunk is one 16-byte load per lane, i.e. kChunk = 32 * kVec elements
// (256 for 16-bit inputs = two 128-groups, 128 for float32 = one group).  The
// lanes of a group are consecutive (kLanesPerGroup = 128 / kVec of them), so
// its amax is a butterfly of log2(kLanesPerGroup) xor-shuffles.  Loads of
// kUnroll chunks are issued before any is used (64 bytes in flight per lane).
// Single pass: the group's values stay in registers between amax and cast.
//
// Requirements (checked on the host): k % 16 == 0; the input's base address
// and its row / batch strides are multiples of 16 bytes (last dim contiguous);
// the payload is contiguous [g, m, k].
//
// Arguments:
//   x            input, element (b, i, c) at x + b * x_batch_stride
//                + i * x_row_stride + c (strides in elements, may be 0 or < 0)
//   a            payload, [g, m, k] uint8 (e4m3fn bits), contiguous
//   sfa          scales, physical [g, ceil(k/128), m_pad] float32;
//                rows m..m_pad-1 are written with 0
//   num_rows     g * m
//   tasks_per_row, chunks_per_task: the split above; tasks_per_row *
//                chunks_per_task >= ceil(k / kChunk)
template <InDtype kIn, bool kPow2>
__global__ void __launch_bounds__(quant::kThreads)
per_token_cast_kernel(const void* __restrict__ x, uint8_t* __restrict__ a, float* __restrict__ sfa,
                      uint32_t m, uint32_t k, uint32_t num_rows, int64_t x_batch_stride,
                      int64_t x_row_stride, uint32_t m_pad, uint32_t tasks_per_row,
                      uint32_t chunks_per_task, float min_amax) {
  using Traits = quant::InTraits<kIn>;
  constexpr uint32_t kVec = Traits::kVec;
  constexpr uint32_t kChunk = 32 * kVec;
  constexpr uint32_t kLanesPerGroup = quant::kGroup / kVec;
  constexpr uint32_t kUnroll = 4;
  constexpr uint32_t kWarps = quant::kThreads / 32;
  static_assert(kVec == 4 || kVec == 8, "16-byte loads of 4-byte or 2-byte elements");
  static_assert(kLanesPerGroup <= 32 && 32 % kLanesPerGroup == 0, "a group never straddles warps");

  const uint32_t lane = threadIdx.x % 32;
  const uint32_t task_id = blockIdx.x * kWarps + threadIdx.x / 32;
  if (task_id >= num_rows * tasks_per_row) return;  // warp-uniform: whole warp leaves

  // Locate the row (b, i) and its first chunk
  const uint32_t row = task_id / tasks_per_row;
  const uint32_t first_chunk = (task_id % tasks_per_row) * chunks_per_task;
  const uint32_t b = row / m, i = row - b * m;
  const uint32_t num_groups = (k + quant::kGroup - 1) / quant::kGroup;
  const uint8_t* x_row = static_cast<const uint8_t*>(x) +
      (static_cast<int64_t>(b) * x_batch_stride + static_cast<int64_t>(i) * x_row_stride) *
          static_cast<int64_t>(Traits::kBytes);
  uint8_t* a_row = a + static_cast<uint64_t>(row) * k;
  // sfa[b][kg][i] lives at sfa_row + kg * m_pad
  float* sfa_row = sfa + static_cast<uint64_t>(b) * num_groups * m_pad + i;
  const bool writes_padding = i + 1 == m;  // the last row also zeroes rows m..m_pad-1

  for (uint32_t c0 = 0; c0 < chunks_per_task; c0 += kUnroll) {
    if ((first_chunk + c0) * kChunk >= k) break;  // warp-uniform

    // Issue kUnroll 16-byte loads; lanes past k (or past this task) read zeros
    uint32_t raw[kUnroll][4];
#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) {
      const uint32_t col = (first_chunk + c0 + u) * kChunk + lane * kVec;
      if (c0 + u < chunks_per_task && col < k) {
        quant::ld_global_nc_v4(raw[u], x_row + static_cast<uint64_t>(col) * Traits::kBytes);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) raw[u][j] = 0;
      }
    }

#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) {
      const uint32_t chunk = first_chunk + c0 + u;
      const uint32_t col = chunk * kChunk + lane * kVec;
      const bool chunk_valid = c0 + u < chunks_per_task;  // warp-uniform

      // Group amax: this lane's kVec values, then a butterfly over its group
      float f[kVec];
      quant::unpack<kIn>(raw[u], f);
      uint32_t amax = quant::abs_max_bits(f, 0u);
#pragma unroll
      for (uint32_t off = kLanesPerGroup / 2; off > 0; off /= 2)
        amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float scale = quant::amax_to_scale<kPow2>(amax, min_amax);

      // Write the scale (first lane of each group) and the padding rows
      const uint32_t group = col / quant::kGroup;
      if (chunk_valid && lane % kLanesPerGroup == 0 && group < num_groups) {
        float* dst = sfa_row + static_cast<uint64_t>(group) * m_pad;
        quant::st_global_f32(dst, scale);
        if (writes_padding) {
          for (uint32_t p = 1; p < m_pad - i; ++p) quant::st_global_f32(dst + p, 0.0f);
        }
      }

      // Cast and store this lane's kVec payload bytes
      if (chunk_valid && col < k) {
        uint32_t q[kVec / 4];
        quant::quantize(f, scale, q);
        quant::store_payload<kVec>(a_row + col, q);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Per-block (128x128) cast
// ---------------------------------------------------------------------------
//
// One CTA (256 threads) per 128x128 tile.  The tile is read once with 16-byte
// loads into registers (kIters = 128 * 128 / kVec / 256 loads per thread: 8
// for 16-bit inputs, 16 for float32), its amax is reduced (per thread, warp
// butterfly, then 8 warp maxima through shared memory), and the payload is
// cast from the same registers.  Consecutive threads read consecutive 16-byte
// pieces of a row, so every warp load covers whole 512-byte row segments.
//
// Requirements: as for the per-token cast; the payload is contiguous
// [g, n, k] and sfb is contiguous [g, ceil(n/128), ceil(k/128)].
template <InDtype kIn, bool kPow2>
__global__ void __launch_bounds__(quant::kThreads)
per_block_cast_kernel(const void* __restrict__ x, uint8_t* __restrict__ out, float* __restrict__ sfb,
                      uint32_t n, uint32_t k, uint32_t n_blocks, uint32_t k_blocks,
                      int64_t x_batch_stride, int64_t x_row_stride, float min_amax) {
  using Traits = quant::InTraits<kIn>;
  constexpr uint32_t kVec = Traits::kVec;
  constexpr uint32_t kVecsPerRow = quant::kGroup / kVec;
  constexpr uint32_t kIters = quant::kGroup * kVecsPerRow / quant::kThreads;
  constexpr uint32_t kWarps = quant::kThreads / 32;
  static_assert(quant::kGroup * kVecsPerRow % quant::kThreads == 0, "whole loads per thread");
  static_assert(quant::kThreads % kVecsPerRow == 0, "a thread keeps its column in every iteration");

  __shared__ uint32_t smem_warp_amax[kWarps];

  // Locate the tile (b, n-block, k-block)
  const uint32_t tile = blockIdx.x;
  const uint32_t kb = tile % k_blocks;
  const uint32_t nb = (tile / k_blocks) % n_blocks;
  const uint32_t b = tile / k_blocks / n_blocks;
  // Each thread always handles the same kVec columns and rows r0 + it * kRowStep
  constexpr uint32_t kRowStep = quant::kThreads / kVecsPerRow;
  const uint32_t col = kb * quant::kGroup + (threadIdx.x % kVecsPerRow) * kVec;
  const uint32_t r0 = nb * quant::kGroup + threadIdx.x / kVecsPerRow;
  const bool col_valid = col < k;
  const uint8_t* x_base = static_cast<const uint8_t*>(x) +
      (static_cast<int64_t>(b) * x_batch_stride + static_cast<int64_t>(col)) *
          static_cast<int64_t>(Traits::kBytes);
  const int64_t x_row_bytes = x_row_stride * static_cast<int64_t>(Traits::kBytes);

  // Load the whole tile; rows past n and columns past k read as zeros.
  // NOTES: validity is kept as a bit mask in one register rather than kIters
  // predicates: predicates do not survive the division slow-path calls, and
  // saving them cost stack spills (fp16, 64 registers).
  uint32_t row_mask = 0;
#pragma unroll
  for (uint32_t it = 0; it < kIters; ++it)
    row_mask |= static_cast<uint32_t>(r0 + it * kRowStep < n) << it;
  if (!col_valid) row_mask = 0;
  uint32_t raw[kIters][4];
#pragma unroll
  for (uint32_t it = 0; it < kIters; ++it) {
    if (row_mask >> it & 1u) {
      const uint32_t r = r0 + it * kRowStep;
      quant::ld_global_nc_v4(raw[it], x_base + static_cast<int64_t>(r) * x_row_bytes);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) raw[it][j] = 0;
    }
  }

  // Tile amax: per thread, per warp, then across the 8 warps
  uint32_t amax = 0;
#pragma unroll
  for (uint32_t it = 0; it < kIters; ++it) {
    float f[kVec];
    quant::unpack<kIn>(raw[it], f);
    amax = quant::abs_max_bits(f, amax);
  }
#pragma unroll
  for (uint32_t off = 16; off > 0; off /= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) smem_warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (uint32_t w = 0; w < kWarps; ++w) amax = max(amax, smem_warp_amax[w]);
  const float scale = quant::amax_to_scale<kPow2>(amax, min_amax);

  // Write the scale
  if (threadIdx.x == 0)
    quant::st_global_f32(sfb + (static_cast<uint64_t>(b) * n_blocks + nb) * k_blocks + kb, scale);

  // Cast and store the payload from the registers
  if (!col_valid) return;
  uint8_t* out_base = out + (static_cast<uint64_t>(b) * n) * k + col;
#pragma unroll
  for (uint32_t it = 0; it < kIters; ++it) {
    if (row_mask >> it & 1u) {
      const uint32_t r = r0 + it * kRowStep;
      float f[kVec];
      quant::unpack<kIn>(raw[it], f);
      uint32_t q[kVec / 4];
      quant::quantize(f, scale, q);
      quant::store_payload<kVec>(out_base + static_cast<uint64_t>(r) * k, q);
    }
  }
}

}  // namespace cugemm8
