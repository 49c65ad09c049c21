// SPDX-License-Identifier: MIT
// FP8 (e4m3fn) quantisation with DeepSeek-V3 fine-grained scales, writing
// exactly the operands the 1D2D GEMM consumes:
//   * per_token_cast_kernel: 1x128 groups of a [g, m, k] activation; payload
//     [g, m, k] uint8 and scales stored MN-major, [g, ceil(k/128), m_pad]
//     float32 with m_pad = align(m, 4) (padding rows written as 0).
//   * per_block_cast_kernel: 128x128 tiles of a [g, n, k] weight; payload
//     [g, n, k] uint8 and scales [g, ceil(n/128), ceil(k/128)] float32.
//   * cast_transpose_kernel: the same recipes with the payload written
//     transposed, for the backward pass (per channel along tokens, or per
//     128x128 tile): see its comment at the end of the file.
//
// Numerics (bit-identical to cugemm8/reference/quant.py):
//   amax  = max |x| over the group / tile (K and N tails zero-padded), NaN
//           propagating; amax = max(amax, min_amax) (NaN kept)
//   scale = RN_f32(amax / 448), optionally rounded up to the next power of
//           two (exact, integer bit manipulation)
//   q     = e4m3fn(satfinite(RN_f32(x / scale)))
// RN_f32(a / b) is the IEEE float32 quotient, which the kernels obtain
// exactly without a division instruction (see "Exact division" below): in
// float64 in general, in float32 (Markstein's correction) for 16-bit
// activations with the default min_amax (per_token_cast_kernel and
// gemm_fp8's in-kernel forms), where every input has been checked.
//
// NOTES: CuPy compiles with -ftz=true, so nothing here is float32 arithmetic
// the compiler could flush: integer ops on bit patterns, float64 arithmetic
// (never flushed), and PTX conversions and float32 mul.rn / fma.rn (the
// float32 quotient, ptx/fp32.cuh) spelled out without .ftz:
//   * |x| and the amax reduction are unsigned integer max over |x| bit
//     patterns: NaN propagates by construction (fmaxf would drop it) and
//     fp32 subnormal inputs count with their true value.
//   * Inputs enter float64 exactly (bit embedding, below).
//   * FTZ would not change a payload anyway: a float32 quotient below 2^-126
//     is far below half of e4m3's smallest subnormal (2^-9), so it becomes a
//     signed zero in e4m3 whether or not it was flushed first.
//   * `cvt.rn.satfinite.e4m3x2.f32` (sm_89+, PTX ISA "cvt"): RNE; finite
//     values beyond +-448 (and +-Inf) give +-448 (0x7e/0xfe), NaN gives NaN.
//     With a finite scale x / scale is never beyond +-448 (1 + 2^-23): |x| <=
//     amax and scale >= RN(amax / 448) >= (amax / 448) (1 - 2^-24).  The
//     float32 quotient may be 448 (1 + 2^-23) itself (e.g. bf16 amax
//     0x3f83, x = amax); the conversion's RNE (and satfinite) takes it to
//     448.
//   * Non-finite scales: a group / tile holding a NaN gets a NaN scale and
//     NaN payloads (0x7f); one holding +-Inf (and no NaN) gets an Inf scale,
//     NaN at the +-Inf positions (Inf / Inf) and signed zeros elsewhere
//     (finite / Inf).  Other groups are unaffected.
#pragma once
#include "common.cuh"
#include "ptx/fp32.cuh"
#include "ptx/griddep.cuh"

namespace cugemm8 {

// Input element type of the quantisation kernels (template argument).
enum class InDtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// What A is (the GEMM kernels' kAIn template argument):
//   kAInFp8: the e4m3 payload and its 1x128 scales, as written by
//            per_token_cast_to_fp8 -- every GEMM op;
//   kAInFloat32 / kAInFloat16 / kAInBFloat16 (1 + quant InDtype): the float
//            activations x themselves, quantised inside the kernel
//            (gemm_fp8's one-kernel form: quant_a.cuh in the TMA kernels,
//            fp8_gemm_warp_mma.cuh).
constexpr uint32_t kAInFp8 = 0;
constexpr uint32_t kAInFloat32 = 1 + static_cast<uint32_t>(InDtype::kFloat32);
constexpr uint32_t kAInFloat16 = 1 + static_cast<uint32_t>(InDtype::kFloat16);
constexpr uint32_t kAInBFloat16 = 1 + static_cast<uint32_t>(InDtype::kBFloat16);

// per_token_cast_to_fp8's default min_amax (cugemm8/quant.py _DEFAULT_MIN_AMAX), the
// only one gemm_fp8 uses.
constexpr float kQuantAMinAmax = 1e-4f;

namespace quant {

constexpr uint32_t kGroup = 128;              // quantisation granule along K (and N)
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

// Correctly rounded (RNE) narrowing and exact f16 widening, spelled out so no
// .ftz is added.
__device__ __forceinline__ float cvt_rn_f32_f64(double a) {
  float f;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(a));
  return f;
}

__device__ __forceinline__ float cvt_f32_f16(uint32_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
  return f;
}

__device__ __forceinline__ double mul_rn_f64(double a, double b) {
  double d;
  asm("mul.rn.f64 %0, %1, %2;" : "=d"(d) : "d"(a), "d"(b));
  return d;
}

__device__ __forceinline__ double fma_rn_f64(double a, double b, double c) {
  double d;
  asm("fma.rn.f64 %0, %1, %2, %3;" : "=d"(d) : "d"(a), "d"(b), "d"(c));
  return d;
}

__device__ __forceinline__ float rcp_approx_ftz_f32(float a) {
  float d;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
}

// Packed unsigned max of two 16-bit lanes (PTX ISA "max", .u16x2, sm_90+).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two float32 -> two e4m3fn bytes: `lo` in bits 7:0, `hi` in bits 15:8 (the
// instruction puts its first source operand in the upper byte).
__device__ __forceinline__ uint32_t cvt_e4m3x2(float lo, float hi) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}

// ---------------------------------------------------------------------------
// Exact division without a division instruction
// ---------------------------------------------------------------------------
//
// NOTES: `div.rn.f32` is exact but costs MUFU.RCP + FCHK + 5 FFMA per element
// plus a CALL to a slow path (stack spills around the calls).  The divisor is
// the same for a whole group, so instead, for a finite scale s:
//   Y = 1/s in float64 with |Y s - 1| <= 2^-53 (1 + 2^-20), once per group;
//   q = RN_f32(RN_f64(x Y)): one DMUL and one F2F per element.
// Why q == RN_f32(x / s) whenever x / s is in float32's normal range:
//   * |RN_f64(x Y) - x/s| <= (2^-53 (1 + 2^-20) + 2^-53) |x/s| < 2^-51 |x/s|;
//   * x / s of two 24-bit floats is never a 25-bit midpoint and lies at a
//     relative distance > 2^-49 from every midpoint: with x = A 2^a,
//     s = B 2^b, m = M 2^u (A, B < 2^24, M odd in [2^24, 2^25)), x - s m is
//     a non-zero multiple of 2^(b+u) (equality would need the odd part of A
//     to be a multiple of M >= 2^24), so |x/s - m| >= 2^u / B > 2^-49 m;
//   * so no float32 rounding boundary separates x Y from x / s.
// When x / s is below 2^-126, both are float32 subnormals or zeros of the
// same sign, which e4m3 rounds to the same signed zero.  The scale uses the
// same argument with Y = RN_f64(1/448); it needs amax / 448 to be a normal
// float32, hence the host's rule min_amax >= 448 * 2^-126 (which also keeps
// every finite scale in [2^-126, 2^120], where the MUFU estimate is normal).
// A CPU check of both claims is in tests/test_quant_compile.py.
//
// Exact float32 -> float64 without F2F (16/clk/SM on sm_90, the bottleneck
// otherwise): the bits of a float32 placed in a float64 as (hi = sign |
// |bits| >> 3, lo = bits << 29) are that float times 2^-896, exactly, for
// every finite input including subnormals (both formats' exponent fields and
// subnormal ranges line up).  So x Y = embed(x) (Y 2^896); Y 2^896 <= 2^1022
// stays finite.  Inf / NaN inputs only occur with a non-finite scale, which
// takes the integer-only `quantize_nonfinite` path instead.

constexpr double kInv448 = 0x1.2492492492492p-9;  // RN_f64(1 / 448)

__device__ __forceinline__ double f64_from_words(uint32_t lo, uint32_t hi) {
  double d;
  asm("mov.b64 %0, {%1, %2};" : "=d"(d) : "r"(lo), "r"(hi));
  return d;
}

// float32 bits -> float64 holding (that float) * 2^-896, exact for finite x.
__device__ __forceinline__ double embed_f32_scaled(uint32_t bits) {
  return f64_from_words(bits << 29, (bits & 0x80000000u) | ((bits & 0x7fffffffu) >> 3));
}

// A positive normal float32 -> float64 equal to it times 2^kExtraExp, exact.
template <uint32_t kExtraExp>
__device__ __forceinline__ double embed_normal_rebiased(uint32_t bits) {
  return f64_from_words(bits << 29, (bits >> 3) + ((896u + kExtraExp) << 20));
}

// Y 2^896 for a finite scale s in [2^-126, 2^120]: three Newton steps
// e = 1 - s y, y += y e (each squares the relative error and adds <= 2^-53)
// from the MUFU estimate (relative error ~2^-23).
__device__ __forceinline__ double scaled_reciprocal(float s) {
  const uint32_t s_bits = __float_as_uint(s);
  const double s_scaled = embed_f32_scaled(s_bits);                                // s 2^-896
  double y = embed_normal_rebiased<896>(__float_as_uint(rcp_approx_ftz_f32(s)));  // ~(1/s) 2^896
#pragma unroll
  for (int it = 0; it < 3; ++it) y = fma_rn_f64(y, fma_rn_f64(-s_scaled, y, 1.0), y);
  return y;
}

// ---------------------------------------------------------------------------
// Exact division in float32 arithmetic (16-bit inputs)
// ---------------------------------------------------------------------------
//
// NOTES: the float64 quotient above costs one F2F per element (16 / clk / SM,
// a quarter of a warp instruction per cycle per SM sub-partition); where the
// quotients sit on a kernel's critical path (gemm_fp8's one-kernel form in
// fp8_gemm_warp_mma.cuh) three float32 FMA-pipe operations per element do it
// instead, Markstein's correction of a quotient by its exact remainder
// (P. Markstein, "Computation of elementary functions on the IBM RISC
// System/6000 processor", IBM J. Res. Dev. 34(1), 1990; J.-M. Muller et al.,
// Handbook of Floating-Point Arithmetic, 2nd ed., 2018, section 4.9):
//   y  = RN_f32(1 / s)                     once per group (reciprocal_rn_f32)
//   q0 = RN_f32(x y)
//   r  = RN_f32(x - s q0)                  (one FMA: the remainder, exact here)
//   q  = RN_f32(q0 + r y)                  (one FMA)
// and the sign of x copied onto q (for x = -0, q0 + r y is (-0) + (+0) = +0,
// where x / s is -0).  Where the remainder underflows (bfloat16 x of
// float32's subnormal range over a small scale, quotients far below 2^-10;
// outside the theorem) q may differ from RN_f32(x / s) in the last place:
// e4m3 rounds both to the same signed zero (its smallest subnormal is 2^-9,
// and 2^-10 ties to zero).  Whether q == RN_f32(x / s) at and above 2^-10 is
// not left to the theorem's other condition (q0 within one ulp of x / s):
// the inputs here are
// a finite 16-bit x with |x| <= amax and a scale the cast makes from an
// amax of the same dtype, about 2^30 pairs per dtype and scale recipe, and a
// GPU test compares every one of them with the float64 path: the quotient's
// bits at and above 2^-10, the e4m3 byte everywhere (cuda_src/quant_check.cuh, tests/test_quant_gpu.py::
// test_float32_quotient_is_exact_on_every_16_bit_input).  float32 x keeps the
// float64 path (its inputs cannot be enumerated).

// RN_f32(1 / s) for a finite scale s in [2^-126, 2^120]: two float64 Newton
// steps from the MUFU estimate (relative error ~2^-23 -> ~2^-46 -> within
// 2^-52 of 1 / s), then one rounding to float32, which is correct because
// 1 / s lies at a relative distance > 2^-49 from every float32 midpoint (the
// argument of "Exact division" above with x = 1).
__device__ __forceinline__ float reciprocal_rn_f32(float s) {
  const double sd = embed_normal_rebiased<0>(__float_as_uint(s));                // s, exact
  double y = embed_normal_rebiased<0>(__float_as_uint(rcp_approx_ftz_f32(s)));  // ~1 / s
#pragma unroll
  for (int it = 0; it < 2; ++it) y = fma_rn_f64(y, fma_rn_f64(-sd, y, 1.0), y);
  return cvt_rn_f32_f64(y);
}

// Markstein's correction itself: RN(q0 + r y) with q0 = RN(x y), r =
// RN(x - s q0) (two FMAs after the product), for y = RN_f32(1 / s).  The
// sign of a zero quotient is quotient_f32's business.
__device__ __forceinline__ float markstein_quotient_f32(float x, float s, float y) {
  const float q0 = mul_rn(x, y);
  // -s by its sign bit: a C++ negation compiles to an FADD.FTZ under -ftz=true.
  const float r = fma_rn(__uint_as_float(__float_as_uint(s) ^ 0x80000000u), q0, x);
  return fma_rn(r, y, q0);
}

// RN_f32(x / s) for x = the float32 with bits `x_bits`, y = reciprocal_rn_f32(s)
// (the domain above).
__device__ __forceinline__ float quotient_f32(uint32_t x_bits, float s, float y) {
  const float q = markstein_quotient_f32(__uint_as_float(x_bits), s, y);
  return __uint_as_float(__float_as_uint(q) | (x_bits & 0x80000000u));
}

// ---------------------------------------------------------------------------
// Element helpers
// ---------------------------------------------------------------------------
//
// amax is reduced on the input's own |x| bit patterns: for non-negative IEEE
// values of any width, unsigned order of the patterns is numeric order and
// NaN patterns sit above Inf, so an unsigned max propagates NaN.

// max |x| over the kVec elements of one 16-byte load, as |x| bits of kIn.
template <InDtype kIn>
__device__ __forceinline__ uint32_t abs_max_bits(const uint32_t (&raw)[4], uint32_t acc) {
  if constexpr (kIn == InDtype::kFloat32) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc = max(acc, raw[j] & 0x7fffffffu);
  } else {
    uint32_t m2 = max_u16x2(raw[0] & 0x7fff7fffu, raw[1] & 0x7fff7fffu);
    m2 = max_u16x2(m2, max_u16x2(raw[2] & 0x7fff7fffu, raw[3] & 0x7fff7fffu));
    acc = max(acc, max(m2 & 0xffffu, m2 >> 16));
  }
  return acc;
}

// |x| bits of kIn -> float32 bits (exact).
template <InDtype kIn>
__device__ __forceinline__ uint32_t abs_bits_to_f32_bits(uint32_t a) {
  if constexpr (kIn == InDtype::kFloat32) return a;
  else if constexpr (kIn == InDtype::kBFloat16) return a << 16;
  else return __float_as_uint(cvt_f32_f16(a));
}

// Element j of one 16-byte load as float32 bits (exact).  16-bit elements:
// element 2j is the low half of word j (little-endian).
template <InDtype kIn>
__device__ __forceinline__ uint32_t element_f32_bits(const uint32_t (&raw)[4], int j) {
  if constexpr (kIn == InDtype::kFloat32) {
    return raw[j];
  } else {
    const uint32_t w = raw[j / 2];
    if constexpr (kIn == InDtype::kBFloat16) return (j % 2) ? (w & 0xffff0000u) : (w << 16);
    else return __float_as_uint(cvt_f32_f16((j % 2) ? (w >> 16) : (w & 0xffffu)));
  }
}

// Smallest power of two >= the positive float with bits `b`; NaN, Inf and
// exact powers of two are returned unchanged.  Equals 2^ceil(log2(s)) exactly
// (a float log2 would round s = 2^e * (1 + 2^-23) down to 2^e).
__device__ __forceinline__ uint32_t round_up_pow2_bits(uint32_t b) {
  const uint32_t exp = b >> 23, mant = b & 0x7fffffu;
  if (exp == 0xffu || mant == 0) return b;
  if (exp != 0) return (exp + 1) << 23;  // exp = 254 cannot occur: scale <= FLT_MAX / 448
  // Subnormal (excluded by the host's min_amax rule; kept exact anyway)
  return (mant & (mant - 1)) == 0 ? mant : (1u << (32 - __clz(mant)));
}

// RN_f32(a / 448) in float32 arithmetic for an amax a that is a 16-bit
// value (bfloat16 or float16, widened) or the default min_amax: Markstein's
// correction (markstein_quotient_f32; see "Exact division in float32
// arithmetic" above) with s = 448 and the constant y = RN_f32(1 / 448)
// (a > 0: no sign to copy).  One FMUL and two FFMAs where the float64
// product below takes a DMUL and an F2F.  Equal to RN_f32(a / 448) on every such a
// (a CPU replay with exact rationals over all of them:
// tests/test_quant_compile.py::test_division_by_448_replayed_on_16_bit_amax,
// and on the GPU cuda_src/quant_check.cuh); not claimed for other float32 a.
constexpr float kRcp448 = 0x1.24924ap-9f;           // RN_f32(1 / 448)
__device__ __forceinline__ float div448_f32(float a) {
  return markstein_quotient_f32(a, 448.f, kRcp448);
}

// amax (float32 bits) -> scale, following the recipe at the top of the file.
// kAmax16: amax is a 16-bit value widened and min_amax the default (the
// in-kernel forms' activation_scale): the quotient by 448 in float32
// (div448_f32, the same bits on that domain) instead of the float64 product.
template <bool kPow2, bool kAmax16 = false>
__device__ __forceinline__ float amax_to_scale(uint32_t amax_bits, float min_amax) {
  // Clamp with an unsigned compare so a NaN amax (bits > any finite) stays NaN.
  const uint32_t min_bits = __float_as_uint(min_amax);
  amax_bits = amax_bits < min_bits ? min_bits : amax_bits;
  // amax is a normal float32 here (>= min_amax >= 448 * 2^-126) unless it is
  // Inf / NaN, which pass through unchanged (Inf / 448 = Inf).
  float scale = __uint_as_float(amax_bits);
  if (amax_bits < 0x7f800000u) {
    if constexpr (kAmax16) scale = div448_f32(scale);
    else scale = cvt_rn_f32_f64(mul_rn_f64(embed_normal_rebiased<0>(amax_bits), kInv448));
  }
  if constexpr (kPow2) scale = __uint_as_float(round_up_pow2_bits(__float_as_uint(scale)));
  return scale;
}

// The scale of gemm_fp8's in-kernel quantisation (quant_a.cuh and
// fp8_gemm_warp_mma.cuh) for a 1x128 group whose |x| maximum has bits
// `amax` of kIn: per_token_cast_to_fp8 with its default min_amax
// (kQuantAMinAmax), rounded up to a power of two when `pow2` (the run-time
// kFlagAPow2Scale; the same bits as amax_to_scale<true>).  16-bit kIn takes
// the float32 quotient by 448 (kAmax16: the same bits without a float64
// product; a tie end to end on the H200, benches/RESULTS.md v0.22).
template <InDtype kIn>
__device__ __forceinline__ float activation_scale(uint32_t amax, bool pow2) {
  const float scale =
      amax_to_scale<false, kIn != InDtype::kFloat32>(abs_bits_to_f32_bits<kIn>(amax), kQuantAMinAmax);
  return pow2 ? __uint_as_float(round_up_pow2_bits(__float_as_uint(scale))) : scale;
}

// Zero the elements of one 16-byte load of kIn (starting at column `col`)
// that lie at or past column `end`: the K tail of a row that a 16-byte load
// reads past, counted as the zeros the per-token cast pads K with.
template <InDtype kIn>
__device__ __forceinline__ void zero_past(uint32_t (&raw)[4], uint32_t col, uint32_t end) {
#pragma unroll
  for (uint32_t w = 0; w < 4; ++w) {
    if constexpr (kIn == InDtype::kFloat32) {
      raw[w] = col + w < end ? raw[w] : 0u;
    } else {
      const uint32_t keep = (col + 2 * w < end ? 0x0000ffffu : 0u) | (col + 2 * w + 1 < end ? 0xffff0000u : 0u);
      raw[w] &= keep;
    }
  }
}

// RN_f32(x / s) for x = the float32 with bits `x_bits`, recip =
// scaled_reciprocal(s): the float64 quotient ("Exact division" above).
__device__ __forceinline__ float quotient_f64(uint32_t x_bits, double recip) {
  return cvt_rn_f32_f64(mul_rn_f64(embed_f32_scaled(x_bits), recip));
}

// kVec quotients -> kVec e4m3fn bytes packed little-endian in kVec / 4 words.
template <int kVec>
__device__ __forceinline__ void pack_e4m3(const float (&q)[kVec], uint32_t (&out)[kVec / 4]) {
#pragma unroll
  for (int w = 0; w < kVec / 4; ++w)
    out[w] = cvt_e4m3x2(q[4 * w], q[4 * w + 1]) | (cvt_e4m3x2(q[4 * w + 2], q[4 * w + 3]) << 16);
}

// The kVec elements of one load -> kVec e4m3fn bytes packed little-endian in
// kVec / 4 words.  Finite scale; `recip` = scaled_reciprocal(scale).
template <InDtype kIn>
__device__ __forceinline__ void quantize(const uint32_t (&raw)[4], double recip,
                                         uint32_t (&out)[InTraits<kIn>::kVec / 4]) {
  constexpr int kVec = InTraits<kIn>::kVec;
  float q[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) q[j] = quotient_f64(element_f32_bits<kIn>(raw, j), recip);
  pack_e4m3<kVec>(q, out);
}

// quantize for 16-bit kIn with the float32 quotient: the same bytes for
// every input with a finite scale s (y = reciprocal_rn_f32(s)).
template <InDtype kIn>
__device__ __forceinline__ void quantize_f32(const uint32_t (&raw)[4], float s, float y,
                                             uint32_t (&out)[InTraits<kIn>::kVec / 4]) {
  static_assert(kIn != InDtype::kFloat32, "16-bit inputs only (float32 keeps the float64 quotient)");
  constexpr int kVec = InTraits<kIn>::kVec;
  float q[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) q[j] = quotient_f32(element_f32_bits<kIn>(raw, j), s, y);
  pack_e4m3<kVec>(q, out);
}

// An activation load's bytes for a finite scale s, with the quotient each
// input takes: float32 for 16-bit kIn when `default_min_amax` (s made with
// kQuantAMinAmax: the domain the exhaustive check covers), else float64.
template <InDtype kIn>
__device__ __forceinline__ void quantize_activation(const uint32_t (&raw)[4], float s,
                                                    uint32_t (&out)[InTraits<kIn>::kVec / 4],
                                                    bool default_min_amax = true) {
  bool f32_quotient = false;
  if constexpr (kIn != InDtype::kFloat32) {
    f32_quotient = default_min_amax;
    if (f32_quotient) quantize_f32<kIn>(raw, s, reciprocal_rn_f32(s), out);
  }
  if (!f32_quotient) quantize<kIn>(raw, scaled_reciprocal(s), out);
}

// Same for a non-finite scale, i.e. RN(x / NaN) = NaN, RN(+-Inf / Inf) = NaN
// and RN(finite / Inf) = signed zero, as e4m3fn bytes (0x7f NaN, 0x00/0x80).
template <InDtype kIn>
__device__ __forceinline__ void quantize_nonfinite(const uint32_t (&raw)[4], float scale,
                                                   uint32_t (&out)[InTraits<kIn>::kVec / 4]) {
  constexpr int kVec = InTraits<kIn>::kVec;
  const bool scale_nan = __float_as_uint(scale) > 0x7f800000u;
#pragma unroll
  for (int w = 0; w < kVec / 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t bits = element_f32_bits<kIn>(raw, 4 * w + j);
      const uint32_t byte = (scale_nan || (bits & 0x7fffffffu) >= 0x7f800000u) ? 0x7fu : (bits >> 31) << 7;
      word |= byte << (8 * j);
    }
    out[w] = word;
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

  // Programmatic dependent launch (ptx/griddep.cuh): wait for the previous
  // grid before reading x, then let the next one (e.g. the GEMM) launch.
  griddep_wait();
  griddep_launch_dependents();
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
      uint32_t amax = quant::abs_max_bits<kIn>(raw[u], 0u);
#pragma unroll
      for (uint32_t off = kLanesPerGroup / 2; off > 0; off /= 2)
        amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float scale =
          quant::amax_to_scale<kPow2>(quant::abs_bits_to_f32_bits<kIn>(amax), min_amax);

      // Write the scale (first lane of each group) and the padding rows
      const uint32_t group = col / quant::kGroup;
      if (chunk_valid && lane % kLanesPerGroup == 0 && group < num_groups) {
        float* dst = sfa_row + static_cast<uint64_t>(group) * m_pad;
        quant::st_global_f32(dst, scale);
        if (writes_padding) {
#pragma unroll
          for (uint32_t p = 1; p < 4; ++p)
            if (i + p < m_pad) quant::st_global_f32(dst + p, 0.0f);
        }
      }

      // Cast and store this lane's kVec payload bytes
      if (chunk_valid && col < k) {
        uint32_t q[kVec / 4];
        if (__float_as_uint(scale) < 0x7f800000u) {
          quant::quantize_activation<kIn>(raw[u], scale, q, min_amax == kQuantAMinAmax);
        } else {
          quant::quantize_nonfinite<kIn>(raw[u], scale, q);
        }
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
  griddep_wait();               // as in per_token_cast_kernel
  griddep_launch_dependents();

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
  // (Row validity lives in one bit-mask register rather than kIters live
  // predicates, which ptxas spilled in an earlier version.)
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
  for (uint32_t it = 0; it < kIters; ++it) amax = quant::abs_max_bits<kIn>(raw[it], amax);
#pragma unroll
  for (uint32_t off = 16; off > 0; off /= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) smem_warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (uint32_t w = 0; w < kWarps; ++w) amax = max(amax, smem_warp_amax[w]);
  const float scale = quant::amax_to_scale<kPow2>(quant::abs_bits_to_f32_bits<kIn>(amax), min_amax);
  const bool scale_finite = __float_as_uint(scale) < 0x7f800000u;
  const double recip = scale_finite ? quant::scaled_reciprocal(scale) : 0.0;

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
      uint32_t q[kVec / 4];
      if (scale_finite) {
        quant::quantize<kIn>(raw[it], recip, q);
      } else {
        quant::quantize_nonfinite<kIn>(raw[it], scale, q);
      }
      quant::store_payload<kVec>(out_base + static_cast<uint64_t>(r) * k, q);
    }
  }
}

// ---------------------------------------------------------------------------
// Transposing casts for the backward pass (issue 21)
// ---------------------------------------------------------------------------
//
// cast_transpose_kernel<kIn, kPow2, kPerColumn, kTileCols, kStages,
// kCtasPerSm>: tiles of 128 rows x kTileCols columns of x [g, R, C], the payload written
// transposed, out [g, C, r_pad] (r_pad = R rounded up to 16; bytes
// [R, r_pad) of each row are written as zeros), so that the reduction
// dimension R becomes contiguous:
//   * kPerColumn (the wgrad operands, x = activations or output gradients
//     [tokens, channels]): one scale per channel and 128 tokens, i.e. 1x128
//     along R; scale (c, rb) of batch b at sf + b * sf_batch_stride +
//     c * sf_col_stride + rb * sf_block_stride for c < sf_cols, zero for
//     c >= C: row-major [g, C, ceil(R/128)] (sf_cols = C), or the 1D1D
//     GEMM's MN-major TMA-aligned [g, ceil(R/128), align(C, 4)] (sf_cols =
//     align(C, 4), the padding channels zero); bit-identical to
//     per_token_cast_kernel applied to x^T (cugemm8/reference/training.py
//     per_token_cast_to_fp8_t).  Any kTileCols (a column's scale needs only
//     its own 128 rows);
//   * !kPerColumn (weights [n, k] for dgrad): one scale per 128x128 tile
//     (kTileCols = 128), scales sf [g, ceil(C/128), ceil(R/128)], the
//     transposed block scales (cast_transpose_block_fp8: per_block_cast_kernel,
//     then transposes).
// Same recipe and rounding as the casts above (file header).
//
// v0.13 design (issue 21; v0.10 held the tile in registers, 94-224 of them,
// one CTA of 8 warps per SM, load / reduce / cast / store in sequence):
//   * Staging: the tile goes to shared memory with 16-byte cp.async (no
//     registers; rows past R and 16-byte pieces past C zero-filled by the
//     copy itself, src-size 0), in a ring of kStages tiles.  A CTA is
//     persistent over tiles blockIdx.x, + gridDim.x, ... (the host's grid:
//     kCtasPerSm per SM, or one CTA per tile): while it reduces, casts and
//     stores tile i, the loads of tiles i + 1 .. i + kStages - 1 are in
//     flight.  kCtasPerSm CTAs per SM (registers capped to match by
//     __launch_bounds__; their rings must fit in shared memory), the
//     configurations cugemm8/quant.py's transpose_configs lists.
//   * Layout: tile row r (kRowBytes = kTileCols * sizeof(input), 128-byte
//     multiple) holds its 16-byte pieces p at position p ^ ((r / 16) % 8),
//     an XOR swizzle under which both the cp.async writes (8 consecutive
//     pieces of one row per quarter warp) and the column reads below hit 32
//     distinct banks.
//   * Cast: a warp task is one 16-byte piece column of the tile (4 words x
//     128 rows: 8 columns of 16-bit input, 4 of float32); lane = 8 w + k
//     takes word w of rows 16 k .. 16 k + 15 (16 4-byte shared loads), so
//     each of its columns' 16 rows become one 16-byte word of the transposed
//     payload, stored straight to global memory (8 lanes k write one 128-byte
//     run of an output row; no second shared-memory pass).  The per-column
//     amax is the lane's 16 rows, then a 3-step butterfly over k (the 8
//     lanes of one column); the per-tile amax is each thread's own pieces
//     (visible to it after its cp.async wait), a warp butterfly and the 8
//     warp maxima in shared memory.
//   * One __syncthreads per tile with kStages >= 2 (it also frees the
//     previous tile's buffer for the loads issued right after it); two with
//     kStages = 1.  Nothing is written but the payload [g, C, r_pad] and the
//     scales (tests/test_quant_compile.py replays this index math).
template <InDtype kIn, bool kPerColumn, uint32_t kTileCols, uint32_t kStages, uint32_t kCtasPerSm_>
struct TransposeShape {
  static constexpr uint32_t kBytes = quant::InTraits<kIn>::kBytes;
  static constexpr uint32_t kRowBytes = kTileCols * kBytes;          // one tile row in shared memory
  static constexpr uint32_t kPieces = kRowBytes / 16;                // 16-byte pieces per tile row
  static constexpr uint32_t kTileBytes = quant::kGroup * kRowBytes;
  static constexpr uint32_t kSmemBytes = kStages * kTileBytes;       // dynamic shared memory
  static constexpr uint32_t kWarps = quant::kThreads / 32;
  // Static shared memory: the warp maxima of two tiles (64 B), padded to 128
  // B ahead of the 128-byte aligned ring (ptxas reports 128).
  static constexpr uint32_t kStaticSmem = 128;
  // CTAs per SM the kernel is built for (__launch_bounds__: registers
  // capped at 65536 / (256 kCtasPerSm)), at most what shared memory allows:
  // sm_90 has 228 KB per SM and reserves 1 KB per CTA, at most 2048 threads
  // (the host computes the same, quant._transpose_smem_ctas).
  static constexpr uint32_t kCtasPerSm = kCtasPerSm_;
  static constexpr uint32_t kSmemCtas =
      constexpr_min(2048 / quant::kThreads,
                    (228u * 1024u) / (kSmemBytes + kStaticSmem + 1024u));
  static constexpr uint32_t kTasksPerWarp = kPieces / kWarps;        // piece columns per warp
  static constexpr uint32_t kLoadRows = quant::kThreads / kPieces;   // tile rows per cp.async pass
  static constexpr uint32_t kLoadPasses = quant::kGroup / kLoadRows;
  static constexpr uint32_t kColsPerWord = 4 / kBytes;
  static_assert(kPieces == 8 || kPieces == 16 || kPieces == 32, "tile rows of 128, 256 or 512 bytes");
  static_assert(kPerColumn || kTileCols == quant::kGroup, "per-tile scales need 128x128 tiles");
  static_assert(kStages >= 1 && kCtasPerSm >= 1 && kCtasPerSm <= kSmemCtas,
                "kCtasPerSm rings must fit in shared memory");
  static_assert(kTileCols % quant::InTraits<kIn>::kVec == 0, "whole 16-byte pieces");
};

namespace quant {

// 16-byte global -> shared copy (cp.async, L2 only); `src_bytes` < 16 fills
// the rest with zeros (0: nothing is read, `src` need not be valid).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most N of this thread's cp.async groups are pending; the
// completed ones are then visible to this thread.
template <uint32_t N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void ld_shared_v4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr) : "memory");
}

__device__ __forceinline__ void st_global_v4(void* ptr, const uint32_t (&w)[4]) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(w[0]), "r"(w[1]), "r"(w[2]),
               "r"(w[3]) : "memory");
}

// Element h (0: low half) of a 32-bit word of kIn as float32 bits (exact).
template <InDtype kIn, uint32_t kH>
__device__ __forceinline__ uint32_t word_element_f32_bits(uint32_t w) {
  if constexpr (kIn == InDtype::kFloat32) return w;
  else if constexpr (kIn == InDtype::kBFloat16) return kH ? (w & 0xffff0000u) : (w << 16);
  else return __float_as_uint(cvt_f32_f16(kH ? (w >> 16) : (w & 0xffffu)));
}

// Bytes of rows [0, valid) of a 4-row word m (rows 4m .. 4m+3) of a 16-row chunk.
__device__ __forceinline__ uint32_t chunk_row_mask(uint32_t valid, uint32_t m) {
  const uint32_t n = valid > 4 * m ? constexpr_min(valid - 4 * m, 4u) : 0u;
  return n == 4 ? 0xffffffffu : ((1u << (8 * n)) - 1u);
}

// Element h of 16 rows (words w[0..15]) of one column -> 16 e4m3fn bytes.
// Rows at or past `valid` are zero inputs (cp.async zero fill); a finite or
// infinite scale turns them into +0 bytes, a NaN scale needs the mask.
template <InDtype kIn, uint32_t kH>
__device__ __forceinline__ void cast_column_chunk(const uint32_t (&w)[16], float scale, double recip,
                                                  uint32_t valid, uint32_t (&q)[4]) {
  if (__float_as_uint(scale) < 0x7f800000u) {
#pragma unroll
    for (uint32_t m = 0; m < 4; ++m) {
      float f[4];
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j)
        f[j] = cvt_rn_f32_f64(
            mul_rn_f64(embed_f32_scaled(word_element_f32_bits<kIn, kH>(w[4 * m + j])), recip));
      q[m] = cvt_e4m3x2(f[0], f[1]) | (cvt_e4m3x2(f[2], f[3]) << 16);
    }
  } else {
    const bool scale_nan = __float_as_uint(scale) > 0x7f800000u;
#pragma unroll
    for (uint32_t m = 0; m < 4; ++m) {
      uint32_t word = 0;
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j) {
        const uint32_t bits = word_element_f32_bits<kIn, kH>(w[4 * m + j]);
        const uint32_t byte = (scale_nan || (bits & 0x7fffffffu) >= 0x7f800000u) ? 0x7fu : (bits >> 31) << 7;
        word |= byte << (8 * j);
      }
      q[m] = word & chunk_row_mask(valid, m);
    }
  }
}

}  // namespace quant

template <InDtype kIn, bool kPow2, bool kPerColumn, uint32_t kTileCols, uint32_t kStages, uint32_t kCtasPerSm>
__global__ void __launch_bounds__(quant::kThreads, kCtasPerSm)
cast_transpose_kernel(const void* __restrict__ x, uint8_t* __restrict__ out, float* __restrict__ sf,
                      uint32_t rows, uint32_t cols, uint32_t r_pad, uint32_t r_blocks, uint32_t c_tiles,
                      uint32_t num_tiles, int64_t x_batch_stride, int64_t x_row_stride, float min_amax,
                      uint64_t sf_batch_stride, uint32_t sf_col_stride, uint32_t sf_block_stride,
                      uint32_t sf_cols) {
  using Shape = TransposeShape<kIn, kPerColumn, kTileCols, kStages, kCtasPerSm>;
  using Traits = quant::InTraits<kIn>;
  constexpr uint32_t kVec = Traits::kVec;
  constexpr uint32_t kRowBytes = Shape::kRowBytes;
  constexpr uint32_t kPieces = Shape::kPieces;
  constexpr uint32_t kWarps = Shape::kWarps;

  extern __shared__ __align__(128) uint8_t smem_tiles[];
  __shared__ uint32_t smem_warp_amax[2][kWarps];
  griddep_wait();               // as in per_token_cast_kernel
  griddep_launch_dependents();

  const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_tiles));
  const uint8_t* x_bytes = static_cast<const uint8_t*>(x);
  const int64_t x_row_bytes = x_row_stride * static_cast<int64_t>(Traits::kBytes);

  // cp.async of one tile into ring slot `stage` (an empty group past the
  // last tile, so the group count stays uniform).  Thread t copies piece
  // t % kPieces of rows t / kPieces + p * kLoadRows.
  const uint32_t ld_piece = tid % kPieces, ld_row = tid / kPieces;
  auto issue = [&](uint32_t tile, uint32_t stage) {
    if (tile < num_tiles) {
      const uint32_t cb = tile % c_tiles, rest = tile / c_tiles;
      const uint32_t rb = rest % r_blocks, b = rest / r_blocks;
      const uint32_t col = cb * kTileCols + ld_piece * kVec;
      const uint32_t r0 = rb * quant::kGroup + ld_row;
      // The input is padded to whole 16-byte pieces (host): a piece that
      // starts below `cols` lies inside the row.
      const bool col_ok = col < cols;
      const uint8_t* src =
          x_bytes + (static_cast<int64_t>(b) * x_batch_stride + static_cast<int64_t>(col)) *
                        static_cast<int64_t>(Traits::kBytes) +
          static_cast<int64_t>(r0) * x_row_bytes;
      const uint32_t dst = smem_base + stage * Shape::kTileBytes + ld_row * kRowBytes;
#pragma unroll
      for (uint32_t p = 0; p < Shape::kLoadPasses; ++p) {
        const uint32_t r = ld_row + p * Shape::kLoadRows;            // tile row
        const bool ok = col_ok && r0 + p * Shape::kLoadRows < rows;
        const uint8_t* s = src + static_cast<int64_t>(p * Shape::kLoadRows) * x_row_bytes;
        quant::cp_async_16(dst + p * Shape::kLoadRows * kRowBytes + 16 * (ld_piece ^ ((r >> 4) & 7)),
                           ok ? static_cast<const void*>(s) : x, ok ? 16u : 0u);
      }
    }
    quant::cp_async_commit();
  };

  // The cast's lane roles: word `wsub` of a piece column, rows 16 k .. 16 k + 15.
  const uint32_t k = lane % 8, wsub = lane / 8;

  const uint32_t step = gridDim.x;
#pragma unroll
  for (uint32_t s = 0; s + 1 < kStages; ++s) issue(blockIdx.x + s * step, s);
  uint32_t stage = 0, parity = 0;
  for (uint32_t tile = blockIdx.x; tile < num_tiles; tile += step) {
    if constexpr (kStages == 1) issue(tile, 0);
    quant::cp_async_wait<(kStages >= 2 ? kStages - 2 : 0)>();
    const uint32_t tile_smem = smem_base + stage * Shape::kTileBytes;

    if constexpr (!kPerColumn) {
      // Tile amax, part 1: this thread's own pieces, then its warp's.
      uint32_t a = 0;
#pragma unroll
      for (uint32_t p = 0; p < Shape::kLoadPasses; ++p) {
        const uint32_t r = ld_row + p * Shape::kLoadRows;
        uint32_t raw[4];
        quant::ld_shared_v4(raw, tile_smem + r * kRowBytes + 16 * (ld_piece ^ ((r >> 4) & 7)));
        a = quant::abs_max_bits<kIn>(raw, a);
      }
#pragma unroll
      for (uint32_t off = 16; off > 0; off /= 2) a = max(a, __shfl_xor_sync(0xffffffffu, a, off));
      if (lane == 0) smem_warp_amax[parity][warp] = a;
    }
    __syncthreads();            // the tile (and warp maxima) visible to all; slot stage - 1 free
    if constexpr (kStages >= 2) issue(tile + (kStages - 1) * step, (stage + kStages - 1) % kStages);

    const uint32_t cb = tile % c_tiles, rest = tile / c_tiles;
    const uint32_t rb = rest % r_blocks, b = rest / r_blocks;
    const uint32_t c0 = cb * kTileCols;
    const uint32_t row0 = rb * quant::kGroup + 16 * k;             // this lane's first row
    const uint32_t valid = row0 < rows ? constexpr_min(rows - row0, 16u) : 0u;
    uint8_t* out_chunk = out + static_cast<uint64_t>(b) * cols * r_pad + row0;

    float tile_scale = 0.0f;
    double tile_recip = 0.0;
    if constexpr (!kPerColumn) {
      uint32_t a = 0;
#pragma unroll
      for (uint32_t w = 0; w < kWarps; ++w) a = max(a, smem_warp_amax[parity][w]);
      tile_scale = quant::amax_to_scale<kPow2>(quant::abs_bits_to_f32_bits<kIn>(a), min_amax);
      if (__float_as_uint(tile_scale) < 0x7f800000u) tile_recip = quant::scaled_reciprocal(tile_scale);
      if (tid == 0)
        quant::st_global_f32(sf + (static_cast<uint64_t>(b) * c_tiles + cb) * r_blocks + rb, tile_scale);
    }

    const uint32_t chunk_smem = tile_smem + 16 * k * kRowBytes + 4 * wsub;
#pragma unroll
    for (uint32_t t = 0; t < Shape::kTasksPerWarp; ++t) {
      const uint32_t piece = warp * Shape::kTasksPerWarp + t;      // piece column of the tile
      uint32_t w[16];
#pragma unroll
      for (uint32_t i = 0; i < 16; ++i)
        w[i] = quant::ld_shared_u32(chunk_smem + 16 * (piece ^ k) + i * kRowBytes);

      // Per-column amax (float32 |x| bits) of this word's columns
      uint32_t amax[Shape::kColsPerWord];
      if constexpr (kPerColumn) {
        if constexpr (Traits::kBytes == 2) {
          uint32_t m2 = 0;
#pragma unroll
          for (uint32_t i = 0; i < 16; ++i) m2 = quant::max_u16x2(m2, w[i] & 0x7fff7fffu);
#pragma unroll
          for (uint32_t off = 1; off < 8; off *= 2)
            m2 = quant::max_u16x2(m2, __shfl_xor_sync(0xffffffffu, m2, off));
          amax[0] = quant::abs_bits_to_f32_bits<kIn>(m2 & 0xffffu);
          amax[1] = quant::abs_bits_to_f32_bits<kIn>(m2 >> 16);
        } else {
          uint32_t a = 0;
#pragma unroll
          for (uint32_t i = 0; i < 16; ++i) a = max(a, w[i] & 0x7fffffffu);
#pragma unroll
          for (uint32_t off = 1; off < 8; off *= 2) a = max(a, __shfl_xor_sync(0xffffffffu, a, off));
          amax[0] = a;
        }
      }

      const uint32_t c_word = c0 + (4 * piece + wsub) * Shape::kColsPerWord;  // first column of the word
      auto column = [&](auto h_tag) {
        constexpr uint32_t h = decltype(h_tag)::value;
        const uint32_t c = c_word + h;
        float scale = tile_scale;
        double recip = tile_recip;
        if constexpr (kPerColumn) {
          scale = quant::amax_to_scale<kPow2>(amax[h], min_amax);
          recip = __float_as_uint(scale) < 0x7f800000u ? quant::scaled_reciprocal(scale) : 0.0;
          if (k == 0 && c < sf_cols)
            quant::st_global_f32(sf + b * sf_batch_stride + static_cast<uint64_t>(c) * sf_col_stride +
                                     static_cast<uint64_t>(rb) * sf_block_stride,
                                 c < cols ? scale : 0.0f);
        }
        uint32_t q[4];
        quant::cast_column_chunk<kIn, h>(w, scale, recip, valid, q);
        if (valid != 0 && c < cols) quant::st_global_v4(out_chunk + static_cast<uint64_t>(c) * r_pad, q);
      };
      column(UConst<0>{});
      if constexpr (Shape::kColsPerWord == 2) column(UConst<1>{});
    }
    if constexpr (kStages == 1) __syncthreads();   // the slot is reloaded next
    stage = stage + 1 == kStages ? 0 : stage + 1;
    parity ^= 1;
  }
}

}  // namespace cugemm8
