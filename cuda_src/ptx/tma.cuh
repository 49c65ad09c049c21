// SPDX-License-Identifier: MIT
// Tensor Memory Accelerator wrappers (PTX ISA §9.7.9.25
// "cp.async.bulk.tensor", §9.7.9.26 "cp.async.bulk.wait_group", and
// "prefetch.tensormap").  Descriptors are __grid_constant__ kernel params, so
// their generic address is valid for these instructions.
#pragma once
#include "../common.cuh"
#include "sync.cuh"

namespace cugemm8 {

__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* desc) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(desc)) : "memory");
}

// 3-D tile load into this CTA's shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDescriptor* desc, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)),
        "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// 3-D tile load multicast to every CTA of the cluster in `cta_mask`: the data
// lands at the same shared-memory offset in each, and each CTA's barrier at
// `bar`'s offset receives the byte count.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const TmaDescriptor* desc, uint64_t* bar,
                                                      uint16_t cta_mask, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5, %6}], [%2], %3;"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)),
        "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// An L2 cache policy that marks the lines it fills evict-first (PTX ISA
// §9.7.9.17 "createpolicy"): for data read once, so that it replaces its own
// kind before anything else in L2.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// tma_load_3d with an L2 cache hint (`policy` from createpolicy).
__device__ __forceinline__ void tma_load_3d_hint(void* dst, const TmaDescriptor* desc, uint64_t* bar,
                                                 uint64_t policy, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)),
        "r"(c0), "r"(c1), "r"(c2), "l"(policy) : "memory");
}

// tma_load_3d, carrying the L2 cache hint `policy` (from createpolicy) only
// when `hint` is set: one predicated instruction of each form, no branch.
// A load with a hint, even an evict-normal one, is left out of the L2
// request coalescer's merging of the same lines read by several SMs at about
// the same time (the LRC; Nsight Compute's
// lrc__request_sectors_op_read_coalescing_achieved_type_hardware).  Measured
// on the H200 at 4096x4096x7168, 256x128 with A multicast (benches/RESULTS.md
// v0.35): with an evict-normal hint on every B load 560 request sectors were
// merged and L2 served 35.6 M read sectors, 33.7 M without it (same device
// call); in a later call, without it, 1.4 M merged and 34.3 M served
// (with bands of 8 cluster columns, scheduler.cuh: 2.1 M and 32.6 M;
// DeepGEMM, whose B loads carry no hint: 3.4 M and 31.3 M).
__device__ __forceinline__ void tma_load_3d_hint_if(void* dst, const TmaDescriptor* desc, uint64_t* bar,
                                                    bool hint, uint64_t policy, int32_t c0, int32_t c1,
                                                    int32_t c2) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %7, 0;\n"
      "@p cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n"
      "@!p cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n}"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)),
        "r"(c0), "r"(c1), "r"(c2), "l"(policy), "r"(static_cast<uint32_t>(hint)) : "memory");
}

// tma_load_3d_multicast, with the L2 hint only when `hint` (as above).
__device__ __forceinline__ void tma_load_3d_multicast_hint_if(void* dst, const TmaDescriptor* desc,
                                                              uint64_t* bar, uint16_t cta_mask, bool hint,
                                                              uint64_t policy, int32_t c0, int32_t c1,
                                                              int32_t c2) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %8, 0;\n"
      "@p cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%4, %5, %6}], [%2], %3, %7;\n"
      "@!p cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5, %6}], [%2], %3;\n}"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)),
        "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2), "l"(policy), "r"(static_cast<uint32_t>(hint)) : "memory");
}

// 3-D tile store from shared memory; out-of-bounds parts of the box are
// clipped by the descriptor's extents.
__device__ __forceinline__ void tma_store_3d(const TmaDescriptor* desc, const void* src,
                                             int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
      ::"l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// 3-D tile reduce-add of FP32 from shared memory into global memory (done
// in L2: each element becomes fl32(global + shared), PTX ISA
// "cp.reduce.async.bulk.tensor"); clipped like tma_store_3d.
__device__ __forceinline__ void tma_reduce_add_3d(const TmaDescriptor* desc, const void* src,
                                                  int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
      ::"l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Wait until at most N committed store groups still read shared memory.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Wait until every committed store group has completed (writes done).
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

}  // namespace cugemm8
