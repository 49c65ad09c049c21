"""How many thread-block clusters of each size fit on the GPU at once, for a kernel's footprint (one GPU call, seconds).

    python tools/perf/cluster_occupancy.py [--threads 384] [--smem 219904] [--sizes 1,2,4,8,16]

A cluster's CTAs must run on SMs of one GPC (CUDA C++ Programming Guide,
"Thread Block Clusters"), so a cluster size that does not divide every
GPC's SM count leaves SMs idle: a persistent GEMM launched with clusters of
C covers ``max active clusters x C`` SMs, not all of them.  This asks the
driver (``cuOccupancyMaxActiveClusters``, through cuda-bindings) for a
placeholder kernel with the GEMM's threads and dynamic shared memory
(defaults: the 256x128 s3 tile's 384 threads and 219904 bytes), one CTA an
SM, for each cluster size, and prints the SMs each size covers.  Issue 20
(benches/RESULTS.md v0.37): multicasting both A and B needs clusters of 4;
they pay only if they cover (nearly) all 132 SMs of the H200.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SRC = r"""extern "C" __global__ void placeholder(int* p) {
  extern __shared__ int s[];
  if (p) p[threadIdx.x] = s[threadIdx.x];
}"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=384, help="threads per CTA")
    ap.add_argument("--smem", type=int, default=219904, help="dynamic shared memory per CTA (bytes)")
    ap.add_argument("--sizes", default="1,2,4,8,16", help="cluster sizes (above 8: non-portable)")
    args = ap.parse_args(argv)
    from cugemm8 import _device
    reason = _device.gpu_unavailable_reason()
    if reason is not None:
        print(f"no usable Hopper GPU ({reason}): nothing to ask")
        return 2
    import cupy as cp
    from cuda.bindings import driver as d
    kern = cp.RawModule(code=SRC, options=("-arch=sm_90a",)).get_function("placeholder")
    kern.max_dynamic_shared_size_bytes = args.smem
    func = d.CUfunction(kern.kernel.ptr)
    d.cuFuncSetAttribute(func, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    print(f"{sms} SMs; {args.threads} threads and {args.smem} B of shared memory a CTA")
    for c in (int(x) for x in args.sizes.split(",") if x):
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = max(c, sms // c * c), 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = args.threads, 1, 1
        cfg.sharedMemBytes = args.smem
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = c, 1, 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        err, n = d.cuOccupancyMaxActiveClusters(func, cfg)
        if err != d.CUresult.CUDA_SUCCESS:
            print(f"cluster of {c:2d}: {err!r}")
            continue
        print(f"cluster of {c:2d}: {n:3d} clusters at once, {n * c:3d} of {sms} SMs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
