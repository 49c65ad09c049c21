// SPDX-License-Identifier: MIT
// Warpgroup MMA control and shared-memory matrix descriptors (PTX ISA
// §9.7.15.5.1 "Matrix Descriptor Format", §9.7.15.6 wgmma.fence /
// commit_group / wait_group).
#pragma once
#include "../common.cuh"
#include "wgmma_fp8.cuh"

namespace cugemm8 {

// Descriptor of a K-major tile stored with the 128-byte swizzle that TMA's
// CU_TENSOR_MAP_SWIZZLE_128B writes: rows of 128 bytes, 8-row core-matrix
// groups 1024 bytes apart.
//   bits  0-13: start address >> 4
//   bits 16-29: leading-dimension byte offset >> 4 (unused for swizzled K-major)
//   bits 32-45: stride-dimension byte offset >> 4 (1024 B between 8-row groups)
//   bits 49-51: base offset (0: tiles are 1024-byte aligned)
//   bits 62-63: swizzle mode (1 = 128B)
// The constant fields: stride 1024 B (bits 32-45) and the 128B swizzle (bits 62-63).
constexpr uint64_t kSmemDescSw128Hi = (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
// The same with 8-row groups 0 bytes apart: every group reads the first 8
// rows (the 1D2D kernel's in-kernel quantised A: 8 payload rows per stage).
constexpr uint64_t kSmemDescSw128Hi8Rows = 1ull << 62;

__device__ __forceinline__ uint64_t make_smem_desc_sw128(const void* smem_ptr) {
  const uint64_t addr = smem_addr(smem_ptr);
  return kSmemDescSw128Hi | ((addr & 0x3FFFFull) >> 4);
}

// The descriptor split into its variable low word (start address >> 4, to
// which a caller adds byte offsets / 16) and its constant high word (1024-byte
// stride, 128B swizzle), so only 32 bits stay live across a loop.
__device__ __forceinline__ uint32_t smem_desc_sw128_lo(const void* smem_ptr) {
  return static_cast<uint32_t>(make_smem_desc_sw128(smem_ptr));
}
__device__ __forceinline__ uint64_t smem_desc_sw128_from_lo(uint32_t lo) {
  return kSmemDescSw128Hi | lo;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator register across
// the asynchronous WGMMA that reads and writes it.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// The four k32 FP8 WGMMAs of one 128-wide K block into `acc` (the first
// clears it), committed as one group: the GEMM kernels' per-stage MMA.
// `a_lo` / `b_lo` are the low descriptor words (smem_desc_sw128_lo) of the
// stage's A rows of this sub-tile and of its B tile; each k32 step moves 32
// bytes along K inside the 128B-swizzled rows (2 in 16-byte units).
// `kADescHi`: the high word of A's descriptors (kSmemDescSw128Hi, or
// kSmemDescSw128Hi8Rows).
template <uint32_t BLOCK_N, uint32_t kNumAccum, uint64_t kADescHi = kSmemDescSw128Hi>
__device__ __forceinline__ void wgmma_fp8_k128(float* acc, uint32_t a_lo, uint32_t b_lo) {
  #pragma unroll
  for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(acc[i]);
  wgmma_fence();
  #pragma unroll
  for (uint32_t k = 0; k < 4; ++k) {
    WgmmaFp8<BLOCK_N>::mma(acc, kADescHi | (a_lo + k * 2), smem_desc_sw128_from_lo(b_lo + k * 2), k > 0 ? 1u : 0u);
  }
  wgmma_commit_group();
}

}  // namespace cugemm8
