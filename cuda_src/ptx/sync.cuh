// SPDX-License-Identifier: MIT
// mbarrier, named-barrier, cluster and fence wrappers (PTX ISA §9.7.13
// "Parallel Synchronization and Communication Instructions": mbarrier, bar,
// barrier.cluster, fence).  Each is named after the instruction it emits.
#pragma once
#include "../common.cuh"

namespace cugemm8 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

// Make barrier initialisation visible to the async proxy and to the cluster.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Arrivals at an address computed beforehand (a K loop adds the stage's 8
// bytes to stage 0's instead of converting a pointer each block): this
// CTA's barrier (shared::cta), or a peer's already mapped by mapa_shared
// below (shared::cluster, the default .release.cta semantics; the forms
// below taking a pointer call these).
__device__ __forceinline__ void mbarrier_arrive_addr(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t remote) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { mbarrier_arrive_addr(smem_addr(bar)); }

// Address of the same shared-memory offset in CTA `cta_rank` of this
// cluster, in the shared::cluster window (PTX ISA: mapa).
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t cta_rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(cta_rank));
  return r;
}

// Arrive on the barrier at the same shared-memory offset in CTA `cta_rank` of
// this cluster (mapa translates the address into the cluster window).
//
// By default the arrival has .release.cta semantics: a consumer
// only signals that its WGMMAs (complete after wgmma.wait_group) stopped
// reading the stage, which needs no ordering of its own memory operations at
// cluster scope.  ".release.cluster" compiles to MEMBAR.ALL.GPU before every
// arrival (seen in the SASS), a full GPU-scope fence per warp per K block,
// which cost the 2-CTA multicast kernels 25-50 % (benches/RESULTS.md v0.1).
// CUTLASS's ClusterBarrier::arrive(cta_id) uses the same default-scope form.
//
// kReleaseCluster: .release at cluster scope, so this thread's earlier memory
// operations (and, after a __syncwarp, its warp's) are ordered before the
// peer's acquire-wait on the barrier returns: for a buffer the peer
// overwrites after the wait (split K's partial-tile exchange), which
// .release.cta does not cover across CTAs.  Used once per warp per tile,
// never per K block.
template <bool kReleaseCluster = false>
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  const uint32_t remote = mapa_shared(smem_addr(bar), cta_rank);
  if constexpr (kReleaseCluster) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
  } else {
    mbarrier_arrive_remote(remote);
  }
}

// Asynchronous 16-byte store into a peer CTA's shared memory that signals
// the peer's mbarrier `remote_bar` with complete_tx of 16 bytes on arrival
// (PTX ISA: st.async).  The peer's waiters see the data once the barrier's
// phase completes, like a TMA load's; no fence is needed on this side.
__device__ __forceinline__ void st_async_v4(uint32_t remote_addr, float a, float b, float c, float d,
                                            uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
      ::"r"(remote_addr), "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_bar) : "memory");
}

// Spin on try_wait.parity until the phase of parity %1 has completed; SEM
// is the instruction's memory-ordering qualifier ("" for the default
// .acquire.cta).
#define CUGEMM8_MBARRIER_WAIT_LOOP(SEM)                                  \
  "{\n.reg .pred done;\n"                                               \
  "WAIT_%=:\n"                                                          \
  "mbarrier.try_wait.parity" SEM ".shared::cta.b64 done, [%0], %1;\n"   \
  "@!done bra WAIT_%=;\n}"

// kAcquireCluster: .acquire at cluster scope, pairing with a peer CTA's
// .release.cluster arrival or st.async complete_tx on this barrier (split
// K's partial-tile exchange).
template <bool kAcquireCluster = false>
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (kAcquireCluster) {
    asm volatile(CUGEMM8_MBARRIER_WAIT_LOOP(".acquire.cluster") ::"r"(smem_addr(bar)), "r"(parity) : "memory");
  } else {
    asm volatile(CUGEMM8_MBARRIER_WAIT_LOOP("") ::"r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}

// Shared-memory stores by address (the epilogues' staging of D for TMA).
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// stmatrix.m8n8 (b16): lane l gives the shared-memory address of row l % 8
// of matrix l / 8 (16-byte aligned); register j holds this lane's two
// elements of matrix j (row lane / 4, columns 2 (lane % 4) and + 1).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               ::"r"(addr), "r"(m0), "r"(m1), "r"(m2), "r"(m3) : "memory");
}

__device__ __forceinline__ void stmatrix_x2(uint32_t addr, uint32_t m0, uint32_t m1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};" ::"r"(addr), "r"(m0), "r"(m1) : "memory");
}

__device__ __forceinline__ void st_shared_v2_u32(uint32_t addr, uint32_t x, uint32_t y) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(x), "r"(y) : "memory");
}

// 16-byte shared-memory load by address (the in-kernel quantisation of A).
__device__ __forceinline__ void ld_shared_v4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Named barrier `id` (1..15) over `num_threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The two halves of cluster_sync, for a thread that has work to do between
// them (PTX ISA "barrier.cluster": each thread arrives, then waits, once per
// phase).  Not .aligned: the threads of a warp may reach them apart.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

// Order this thread's generic-proxy shared-memory writes before later
// async-proxy (TMA) reads of them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace cugemm8
