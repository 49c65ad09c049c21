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

}  // namespace cugemm8
