"""Host-side cost of one GEMM call: validation, config lookup, TMA descriptors
and launch, over 1000 back-to-back calls (issue 4's <= 15 us budget).

On a Hopper GPU it times real calls (M = 64, N = 2112, K = 7168, whose kernel
runs ~13 us): the host time of the enqueue loop alone, and the time per call
until the GPU has finished them all (max of host and kernel time).  Without a GPU (``--stub``, the default there) it times only the Python
path over fake device addresses, with the kernel and the tensor-map encoder
stubbed.

    python benches/bench_host.py [--calls 1000] [--stub]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

sys.path.insert(0, ".")


def _operands_fake(m, n, k):
    import ml_dtypes
    from tests.test_validation import fake, mn_major_sfa
    return (fake((m, k), np.uint8), mn_major_sfa((m, -(-k // 128))), fake((n, k), np.uint8),
            fake((-(-n // 128), -(-k // 128)), np.float32), fake((m, n), np.dtype(ml_dtypes.bfloat16)))


def _stub_device(monkey):
    """Replace what needs a GPU: device queries, the kernel, the encoder."""
    import cupy
    from cugemm8 import _device, _jit, _tma
    info = {"name": "stub", "cc": "90", "num_sms": 132, "smem_optin": 232448, "l2_bytes": 0}
    monkey(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkey(_device, "_device_info", lambda i: info)
    _device._checked_devices.add(0)
    monkey(_jit, "get_kernel", lambda h, n, **kw: (lambda grid, block, args, shared_mem=0: None))

    def make(dtype, address, dims, strides, box, *, swizzle=0, l2_256=True):
        key = (dtype, address, tuple(dims), tuple(strides), tuple(box), swizzle, l2_256)
        return _tma._cache.setdefault(key, np.zeros((), np.dtype((np.void, 128))))
    monkey(_tma, "make_descriptor", make)


def time_calls(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--stub", action="store_true", help="time the Python path only (no GPU needed)")
    args = p.parse_args(argv)
    import cugemm8
    from cugemm8 import _device
    m, n, k = 64, 2112, 7168
    stub = args.stub or _device.gpu_unavailable_reason() is not None
    if stub:
        saved = []
        _stub_device(lambda obj, name, value: (saved.append((obj, name, getattr(obj, name))),
                                               setattr(obj, name, value)))
        a, sfa, b, sfb, out = _operands_fake(m, n, k)
        us = time_calls(lambda: cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out), args.calls)
        print(f"host time per call, Python path only (stubbed launch, no GPU): {us:.1f} us "
              f"over {args.calls} calls")
        return 0
    import cupy as cp
    from tests import gpu_helpers as H
    a, sfa, b, sfb = H.make_operands(cp, np.random.default_rng(0), m, n, k)
    sfa = cugemm8.get_col_major_tma_aligned_tensor(sfa)
    out = cp.empty((m, n), cp.dtype("bfloat16"))
    call = lambda: cugemm8.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)   # noqa: E731
    for _ in range(20):
        call()
    cp.cuda.runtime.deviceSynchronize()
    # Host time: the enqueue loop alone (1000 launches stay below CUDA's
    # launch-queue depth, so the loop does not wait for the GPU); then the
    # time until the GPU has run them all.
    t0 = time.perf_counter()
    for _ in range(args.calls):
        call()
    t1 = time.perf_counter()
    cp.cuda.runtime.deviceSynchronize()
    t2 = time.perf_counter()
    host_us, total_us = (t1 - t0) / args.calls * 1e6, (t2 - t0) / args.calls * 1e6
    print(f"{m}x{n}x{k}: host {host_us:.1f} us per call (enqueue loop, {args.calls} calls); "
          f"{total_us:.1f} us per call until the GPU finished (max of host and kernel time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
