// SPDX-License-Identifier: MIT
// FP32 arithmetic with explicit IEEE rounding, and the BF16x2 pack, for the
// GEMM kernels' promotion, reductions and epilogues (PTX ISA §9.7.3
// "Floating Point Instructions": mul, fma, add with .rn and no .ftz; cvt).
#pragma once
#include "../common.cuh"

namespace cugemm8 {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// FP32 multiply / fused multiply-add that keep subnormals.  CuPy compiles with
// -ftz=true (appended after user options, CuPy cupy/cuda/compiler.py), which would flush
// subnormal scales such as 1e-40 to zero; the explicit .rn forms without .ftz
// keep the promotion exact to IEEE semantics (cf. flashinfer-ai/flashinfer#2595).
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

// The split-K reductions' additions, for the same reason: a plain `+=`
// compiles to FADD.FTZ under -ftz=true and flushed subnormal partial sums
// (v0.2-v0.5 BLOCK_M = 64 kernels; tests/test_kernel_compile.py now rejects
// any .FTZ arithmetic in the SASS).
__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

}  // namespace cugemm8
