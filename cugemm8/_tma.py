"""TMA descriptors (``CUtensorMap``) encoded with ``cuTensorMapEncodeTiled``.

Encoded through cuda-bindings (``cuda.bindings.driver``) and handed to the
kernels by value, as the 128 raw bytes of the map wrapped in a ``numpy.void``
scalar: CuPy copies exactly ``itemsize`` bytes of a NumPy scalar argument into
the parameter buffer (CuPy v14.2.0 cupy/cuda/function.pyx ``_pointer``; CuPy
user guide, "Custom user types").

Descriptors depend only on (dtype, address, extents, strides, box, swizzle),
so they are cached; a repeated GEMM call on the same buffers encodes nothing.

Rules enforced by the driver and re-checked by callers before launch
(CUDA Driver API, ``cuTensorMapEncodeTiled``): global address 16-byte aligned;
every extent in [1, 2^32]; every stride (bytes, all but the innermost
dimension) a multiple of 16 and below 2^40; box extents in [1, 256]; with a
swizzle, the box's inner extent in bytes at most the swizzle span.
"""
from __future__ import annotations

import collections
import ctypes
import threading

import numpy as np

_DESC_DTYPE = np.dtype((np.void, 128))
#: All-zero bytes in a kernel's descriptor slot that the instantiation never reads.
NULL_DESCRIPTOR = np.zeros(1, _DESC_DTYPE)[0]
_CACHE_SIZE = 4096
_cache: "collections.OrderedDict[tuple, np.void]" = collections.OrderedDict()
_lock = threading.Lock()

#: element sizes (bytes) of the data types cugemm8 uses
ELEMENT_BYTES = {"u8": 1, "bf16": 2, "f16": 2, "f32": 4}


# The driver bindings are imported with the package when cuda-bindings is
# installed: its import (about 30 ms on the H200 machine: one large extension
# module) was most of the first GEMM call of a new process once kernels load
# from the disk cache (benches/bench_jit.py; benches/RESULTS.md v0.8).  A
# machine without cuda-bindings still imports cugemm8 (CPU-only use).
try:
    from cuda.bindings import driver as _driver_module
except Exception:                      # not installed, or unloadable: reported on first use
    _driver_module = None


def _driver():
    if _driver_module is not None:
        return _driver_module
    from cuda.bindings import driver   # raises the real ImportError
    return driver


def _enums(dtype: str, swizzle: int, l2_256: bool):
    d = _driver()
    dt = {"u8": d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,
          "bf16": d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
          "f16": d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
          "f32": d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[dtype]
    sw = {0: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
          32: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
          64: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
          128: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[swizzle]
    l2 = (d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B if l2_256
          else d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE)
    return d, dt, sw, l2


def check_rules(dtype: str, address: int, dims, strides, box, swizzle: int) -> str | None:
    """Return why the driver would reject this map, or None if it is legal."""
    esize = ELEMENT_BYTES[dtype]
    if address % 16:
        return f"base address {address:#x} is not 16-byte aligned"
    for i, d in enumerate(dims):
        if not 1 <= d <= 2 ** 32:
            return f"extent {d} of dimension {i} is outside [1, 2^32]"
    for i, s in enumerate(strides):
        if s % 16 or not 0 < s < 2 ** 40:
            return f"stride {s} B of dimension {i + 1} is not a positive multiple of 16 below 2^40"
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            return f"box extent {b} of dimension {i} is outside [1, 256]"
    if (box[0] * esize) % 16:
        return f"box inner extent {box[0] * esize} B is not a multiple of 16"
    if swizzle and box[0] * esize > swizzle:
        return f"box inner extent {box[0] * esize} B exceeds the {swizzle} B swizzle span"
    return None


def make_descriptor(dtype: str, address: int, dims, strides, box, *, swizzle: int = 0,
                    l2_256: bool = True) -> np.void:
    """Encode (or fetch from the cache) a tiled TMA map.

    ``dims`` and ``box`` are innermost-first element counts; ``strides`` are
    the byte strides of dimensions 1.. (the innermost is contiguous).
    Raises ``ValueError`` for a map the driver would reject, naming the rule.
    """
    key = (dtype, address, tuple(dims), tuple(strides), tuple(box), swizzle, l2_256)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    why = check_rules(dtype, address, dims, strides, box, swizzle)
    if why is not None:
        raise ValueError(f"TMA descriptor rejected: {why}")
    d, dt, sw, l2 = _enums(dtype, swizzle, l2_256)
    rank = len(dims)
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    err, tmap = d.cuTensorMapEncodeTiled(
        dt, rank, address, [u64(x) for x in dims], [u64(x) for x in strides],
        [u32(x) for x in box], [u32(1)] * rank,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, sw, l2,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with {err!r} for dims={dims} "
                           f"strides={strides} box={box} swizzle={swizzle}")
    raw = ctypes.string_at(tmap.getPtr(), 128)
    desc = np.frombuffer(raw, dtype=_DESC_DTYPE)[0]
    with _lock:
        _cache[key] = desc
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return desc
