// SPDX-License-Identifier: MIT
// Programmatic dependent launch (PDL) from the device side: the two
// `griddepcontrol` instructions (PTX ISA §9.7.13.x "griddepcontrol", sm_90+).
// NVRTC offers no cudaGridDependencySynchronize() /
// cudaTriggerProgrammaticLaunchCompletion() (they live in the runtime's
// device headers), so the instructions are emitted directly.
//
// A kernel launched with the programmatic-stream-serialization attribute
// (cuLaunchKernelEx, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
// may start before the previous kernel on its stream has finished.  Both
// instructions are no-ops in a kernel launched without it, so every cugemm8
// kernel carries them unconditionally and the launch decides.
//
// The rule every cugemm8 kernel follows:
//   1. griddep_wait() before its first global-memory access that depends on
//      earlier work (reads of operands, writes of outputs);
//   2. griddep_launch_dependents() only after that wait.
// Because of (2), a programmatic dependent of a cugemm8 kernel never starts
// before everything that preceded that kernel has completed, so it may read
// memory its immediate predecessor does not write before its own wait (the
// fused bf16-in GEMM streams its weights that way: cugemm8/quant.py).
#pragma once
#include "../common.cuh"

namespace cugemm8 {

// Wait until the prerequisite grids have completed and their memory
// operations are visible to this thread.
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Allow this grid's programmatic dependents to be scheduled once every CTA
// has executed this (or exited).
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace cugemm8
