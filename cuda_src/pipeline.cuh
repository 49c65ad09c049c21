// SPDX-License-Identifier: MIT
// The shared-memory stage ring of the GEMM kernels (fp8_gemm_1d2d.cuh,
// fp8_gemm_1d1d.cuh): kNumStages stages, each guarded by a *full* mbarrier
// (one producer arrival plus the stage's TMA bytes) and an *empty* mbarrier
// (one arrival per consumer warp of every CTA that reads the stage).  Producer
// and consumers walk the ring in the same order, each with its own
// PipeState; a stage's barriers complete once per lap, so the parity of the
// lap (`phase`) tells a waiter which completion it waits for (PTX ISA
// §9.7.13.15 "mbarrier": phase completion and test_wait.parity; the CUTLASS
// PipelineTmaAsync pattern, cutlass/pipeline/sm90_pipeline.hpp).
#pragma once
#include "common.cuh"
#include "ptx/sync.cuh"

namespace cugemm8 {

template <uint32_t kNumStages>
struct PipeState {
  uint32_t stage = 0, phase = 0;
  // The next stage; the phase flips at each lap.
  __device__ __forceinline__ void advance() {
    if (++stage == kNumStages) stage = 0, phase ^= 1;
  }
};

// Called by one thread before any arrival: a full barrier expects
// `full_arrivals` arrivals (the producer's, plus its transaction bytes; the
// 1D2D kernel's in-kernel quantisation of A adds its converter warp's), an
// empty one `empty_arrivals`.
template <uint32_t kNumStages>
__device__ __forceinline__ void init_stage_barriers(uint64_t* full_bar, uint64_t* empty_bar,
                                                    uint32_t empty_arrivals, uint32_t full_arrivals = 1) {
  for (uint32_t s = 0; s < kNumStages; ++s) {
    mbarrier_init(full_bar + s, full_arrivals);
    mbarrier_init(empty_bar + s, empty_arrivals);
  }
}

// Producer: wait until every consumer released the stage (the previous lap's
// completion of its empty barrier), then arrive on its full barrier with the
// bytes the loads issued next will deliver.  Returns the full barrier the
// loads complete on.
template <uint32_t kNumStages>
__device__ __forceinline__ uint64_t* producer_acquire(const PipeState<kNumStages>& p, uint64_t* full_bar,
                                                      uint64_t* empty_bar, uint32_t tx_bytes) {
  mbarrier_wait(empty_bar + p.stage, p.phase ^ 1);
  uint64_t* bar = full_bar + p.stage;
  mbarrier_arrive_expect_tx(bar, tx_bytes);
  return bar;
}

}  // namespace cugemm8
