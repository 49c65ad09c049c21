// SPDX-License-Identifier: MIT
// Exhaustive check of the float32 quotient (quant.cuh "Exact division in
// float32 arithmetic") against the float64 one, on every input the 1x128
// activation cast can give it for a 16-bit dtype kIn:
//   amax  every finite non-negative pattern of kIn (the group's max |x|; the
//         cast clamps it to kQuantAMinAmax), one CTA each (blockIdx.x = bits);
//   scale activation_scale<kIn>(amax, pow2), the in-kernel forms' function;
//   x     every finite pattern of kIn with |x| <= amax, both signs.
// For each pair it compares the float32 bits of RN_f32(x / scale) from
// quotient_f32 with those from quotient_f64 (quantize's) where that
// quotient is at least 2^-10 in magnitude (below, e4m3 rounds it to a signed
// zero), and the e4m3 bytes the two give everywhere.  Per amax it also
// compares that scale (activation_scale: a float32 quotient by 448 for
// 16-bit amax) with the float64 one the per-token cast computes
// (amax_to_scale).  Not a GEMM kernel: tests/test_quant_gpu.py runs it.
//
// Arguments:
//   pow2      1: power-of-two scales (kFlagAPow2Scale), 0: plain scales
//   counts    [4] uint64, zeroed by the caller: pairs checked, quotients of
//             magnitude >= 2^-10 whose bits differ, e4m3 bytes that differ,
//             amax whose scale differs from the cast's
//   first     [2] uint32, 0xffffffff by the caller: the first (amax, x) bits
//             whose byte differs (any one, if several do)
#pragma once
#include "quant.cuh"

namespace cugemm8 {

template <InDtype kIn>
__global__ void __launch_bounds__(256)
quotient_check_kernel(uint32_t pow2, unsigned long long* counts, uint32_t* first) {
  static_assert(kIn != InDtype::kFloat32, "16-bit dtypes (their inputs can be enumerated)");
  // Patterns at or above this are Inf / NaN (|x| bits).
  constexpr uint32_t kInf = kIn == InDtype::kBFloat16 ? 0x7f80u : 0x7c00u;
  const uint32_t amax = blockIdx.x;
  if (amax >= kInf) return;
  const float s = quant::activation_scale<kIn>(amax, pow2 != 0);
  const float y = quant::reciprocal_rn_f32(s);
  const double recip = quant::scaled_reciprocal(s);
  if (threadIdx.x == 0) {
    const uint32_t a32 = quant::abs_bits_to_f32_bits<kIn>(amax);
    const float cast = pow2 ? quant::amax_to_scale<true>(a32, kQuantAMinAmax)
                            : quant::amax_to_scale<false>(a32, kQuantAMinAmax);
    if (__float_as_uint(cast) != __float_as_uint(s)) atomicAdd(counts + 3, 1ull);
  }
  unsigned long long checked = 0, quotient_diff = 0, byte_diff = 0;
  for (uint32_t mag = threadIdx.x; mag <= amax; mag += blockDim.x) {
#pragma unroll
    for (uint32_t sign = 0; sign < 2; ++sign) {
      const uint32_t x16 = mag | (sign << 15);
      const uint32_t raw[4] = {x16, 0u, 0u, 0u};  // element 0 of one load
      const uint32_t xb = quant::element_f32_bits<kIn>(raw, 0);
      const float q64 = quant::quotient_f64(xb, recip);
      const float q32 = quant::quotient_f32(xb, s, y);
      ++checked;
      // Quotients below 2^-10 (bytes of zero) may differ in the last place
      // (quant.cuh); their bytes may not.
      quotient_diff += (__float_as_uint(q64) & 0x7fffffffu) >= 0x3a800000u && __float_as_uint(q64) != __float_as_uint(q32);
      if (quant::cvt_e4m3x2(q64, 0.f) != quant::cvt_e4m3x2(q32, 0.f)) {
        ++byte_diff;
        if (atomicCAS(first, 0xffffffffu, amax) == 0xffffffffu) first[1] = x16;
      }
    }
  }
  atomicAdd(counts + 0, checked);
  if (quotient_diff) atomicAdd(counts + 1, quotient_diff);
  if (byte_diff) atomicAdd(counts + 2, byte_diff);
}

}  // namespace cugemm8
