// SPDX-License-Identifier: MIT
// Shared definitions for every cugemm8 kernel: integer types (NVRTC ships no
// <cstdint> without CCCL), the sm_90a guard, small constexpr helpers and the
// opaque TMA descriptor type.
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cugemm8 kernels need the arch-specific sm_90a target (wgmma, setmaxnreg): compile with -arch=sm_90a"
#endif

namespace cugemm8 {

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

template <typename T>
__host__ __device__ constexpr T align_up(T a, T b) { return ceil_div(a, b) * b; }

__host__ __device__ constexpr uint32_t constexpr_gcd(uint32_t a, uint32_t b) {
  return b == 0 ? a : constexpr_gcd(b, a % b);
}

__host__ __device__ constexpr uint32_t constexpr_min(uint32_t a, uint32_t b) { return a < b ? a : b; }

// A compile-time unsigned constant carried by value (a tag for generic lambdas).
template <uint32_t V>
struct UConst {
  static constexpr uint32_t value = V;
};

// The driver's CUtensorMap is 128 opaque bytes, 64-byte aligned (cuda.h).  We
// never include <cuda.h> under NVRTC (it needs libc headers), so the kernels
// take this layout-compatible struct by value as a __grid_constant__ param.
struct alignas(64) TmaDescriptor {
  unsigned long long opaque[16];
};

// Stops the kernel with a message; used for layout violations that must never
// turn into silent wrong answers or out-of-bounds accesses.
__device__ __forceinline__ void device_trap() { asm volatile("trap;"); }

// One warp copies src[0, valid) into dst[0, kCount) (shared memory; zeros
// past `valid`), each batch's global loads issued before any of its stores:
// a strided load -> store loop compiles to one dependent round trip per 32
// elements, which at K = 7168 put about 4 of them on the critical path of a
// tile's first WGMMA (benches/RESULTS.md v0.8).  The GEMM kernels' per-warp
// copies of a tile's B scales.  The index is clamped, not tested, so the
// trip counts stay compile-time constants.
template <uint32_t kCount>
__device__ __forceinline__ void warp_copy_f32(float* dst, const float* __restrict__ src, uint32_t valid,
                                              uint32_t lane) {
  constexpr uint32_t kIters = ceil_div(kCount, 32u);
  constexpr uint32_t kBatch = constexpr_min(kIters, 8u);
  __syncwarp();
  #pragma unroll 1
  for (uint32_t it0 = 0; it0 < kIters; it0 += kBatch) {
    float v[kBatch];
    #pragma unroll
    for (uint32_t j = 0; j < kBatch; ++j) {
      const uint32_t i = constexpr_min((it0 + j) * 32u + lane, valid - 1u);
      v[j] = __ldg(src + i);
    }
    #pragma unroll
    for (uint32_t j = 0; j < kBatch; ++j) {
      const uint32_t i = (it0 + j) * 32u + lane;
      if (i < kCount) dst[i] = i < valid ? v[j] : 0.f;
    }
  }
  __syncwarp();
}

// Bits of the GEMM kernels' `flags` argument (fp8_gemm_1d2d.cuh,
// fp8_gemm_swap_ab.cuh).
// (Bit 0 was kFlagEarlyB, v0.9: the producer streamed the first tile's B
// before griddepcontrol.wait behind cugemm8's own quantiser.  It gained
// nothing measurable and its run-time branch in the producer's K loop cost
// 1.2-1.4 us on the 64x32 s16 decode kernels; removed in v0.10,
// benches/RESULTS.md.)
// kFlagBEvictFirst: B's loads carry an L2 evict-first hint.  Set by the host
// when each B tile is read by at most a few CTAs close together in time
// (gemm.py b_evict_first: decode-sized M), so B's lines, read
// once, replace one another in L2 instead of what else L2 holds; with the
// benches' L2 flush that is dirty data, whose write-back plain loads pay
// for (benches/RESULTS.md v0.10: the decode GEMMs 1-11 % faster).  Without
// the flag B's loads carry no hint at all (ptx/tma.cuh, tma_load_3d_hint_if).
constexpr uint32_t kFlagBEvictFirst = 2u;
// kFlagAPow2Scale: with A quantised in the kernel (quant_a.cuh), round each activation scale up to a
// power of two (per_token_cast_to_fp8's pow2_scale).
constexpr uint32_t kFlagAPow2Scale = 4u;
// kFlagBBeforeWait: the warp-MMA kernel (fp8_gemm_warp_mma.cuh) loads its
// first batch of B before griddepcontrol.wait.  Set only by gemm_fp8's fused
// path, where the kernel's predecessor is cugemm8's quantiser, which never
// writes B (ptx/griddep.cuh's rule).
constexpr uint32_t kFlagBBeforeWait = 8u;

}  // namespace cugemm8
