// SPDX-License-Identifier: MIT
// Warp-level FP8 MMA and the streaming 16-byte global loads of the warp-MMA
// decode kernel (fp8_gemm_warp_mma.cuh).
//
// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (PTX ISA §9.7.14.5.14,
// "Matrix Fragments for mma.m16n8k32", sm_89+): per lane, with g = lane / 4
// and t = lane % 4,
//   A (16 x 32, row):  a0 = A[g][4t .. 4t+3],   a1 = A[g+8][4t .. 4t+3],
//                      a2 = A[g][16+4t .. +3],  a3 = A[g+8][16+4t .. +3]
//   B (32 x 8, col):   b0 = B[4t .. 4t+3][g],   b1 = B[16+4t .. +3][g]
//   C / D (16 x 8):    c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// (four e4m3 bytes per 32-bit register, the lowest-addressed byte first).
#pragma once
#include "../common.cuh"

namespace cugemm8 {

struct U32x4 {
  uint32_t x, y, z, w;
};

// d = A * B + c over one 16 x 8 x 32 block (FP32 accumulate in the tensor core).
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                  uint32_t a3, uint32_t b0, uint32_t b1, const float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// The loads are volatile so that none moves above griddep_wait() (a volatile
// asm without memory operands is ordered only against other volatile ones),
// and predicated inside the asm (zeros when `pred` is false) so that a run of
// them stays one straight-line block: with a branch around each, ptxas
// scheduled the MMAs of the first K block between the loads of the next ones
// and the warp waited for each block's data before issuing the next block's
// loads.
//
// 16 bytes at p (zeros when `pred` is false).  kStream: read once
// (ld.global.cs: "cache streaming, likely accessed once", evict-first in L1
// and L2; PTX ISA §9.7.9.9 "Cache Operators"): the weights.  Otherwise
// read-only through the non-coherent (texture) path, cached in L1: the
// activations, which every CTA reads.
template <bool kStream>
__device__ __forceinline__ U32x4 ld_16(const void* p, bool pred) {
  U32x4 v;
  if constexpr (kStream) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
        " @p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(static_cast<uint32_t>(pred)));
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
        " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(static_cast<uint32_t>(pred)));
  }
  return v;
}

// One read-only f32 (zeros when `pred` is false): the scales.
__device__ __forceinline__ float ld_nc_f32(const float* p, bool pred) {
  float v;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b32 %0, 0;\n @p ld.global.nc.f32 %0, [%1];\n}"
      : "=f"(v)
      : "l"(p), "r"(static_cast<uint32_t>(pred)));
  return v;
}

}  // namespace cugemm8
