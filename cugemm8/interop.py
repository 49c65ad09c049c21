"""Zero-copy exchange with other array libraries (JAX, PyTorch, ...) through DLPack.

CuPy has no float8 dtype and its DLPack importer rejects the float8 type codes
(``kDLFloat8_e4m3fn = 10``, DLPack 1.1 ``dlpack.h``), while JAX rejects a
``uint8`` array where it expects ``float8_e4m3fn``.  The bytes are the same, so
this module relabels the ``DLTensor.dtype`` field of the capsule in place
before the consumer reads it: no copy, no kernel (type codes from
dmlc/dlpack ``include/dlpack/dlpack.h`` v1.1; CuPy v14.2.0 cupy/_core/dlpack.pyx
rejects codes it does not know).  BF16 crosses as is (``kDLBfloat``).

Streams: the producer is asked to make the consumer's stream wait for its
work (the DLPack ``stream=`` handshake), so nothing blocks the host.
:func:`to_cupy` hands the producer CuPy's current stream; :func:`to_jax` lets
JAX pass its own stream to CuPy, which records an event on CuPy's current
stream and makes JAX wait for it (``cupy/_core/core.pyx`` ``__dlpack__``).
Launch cugemm8 ops on CuPy's current stream (the default) and convert the
outputs with :func:`to_jax` on that same stream.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import cupy
    import jax

#: DLPack type codes (dmlc/dlpack include/dlpack/dlpack.h, v1.1).
KDL_UINT = 1
KDL_FLOAT8_E4M3FN = 10
#: DLDevice.device_type of host memory (kDLCPU, kDLCUDAHost) and CUDA memory.
_HOST_DEVICES = {1, 3}
_CUDA_DEVICES = {2, 13}

# Offsets (bytes) of DLTensor.dtype.code inside the capsule's payload:
# unversioned DLManagedTensor starts with the DLTensor (data 8, device 8,
# ndim 4 -> dtype at 20); DLManagedTensorVersioned puts version (8),
# manager_ctx (8), deleter (8) and flags (8) before it (32 + 20).
_DTYPE_OFFSET = {b"dltensor": 20, b"dltensor_versioned": 52}

_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]


def _dtype_field(capsule):
    """The two bytes (code, bits) of ``DLTensor.dtype`` inside an unconsumed
    DLPack capsule; ``TypeError`` for anything else."""
    try:
        name = _capsule_get_name(capsule)
    except (TypeError, ValueError) as exc:          # not a capsule at all
        raise TypeError(f"__dlpack__ returned {type(capsule).__name__}, not a DLPack capsule") from exc
    if name not in _DTYPE_OFFSET:                   # consumed ("used_dltensor") or foreign
        raise TypeError(f"__dlpack__ returned a capsule named {name!r}, not an unconsumed DLPack tensor")
    base = _capsule_get_pointer(capsule, name)
    return (ctypes.c_uint8 * 2).from_address(base + _DTYPE_OFFSET[name])


def _relabel_capsule(capsule, code: int, bits: int, *, expect_bits: int = 8) -> None:
    """Rewrite ``DLTensor.dtype`` (code, bits; lanes kept) of an unconsumed capsule."""
    field = _dtype_field(capsule)
    if field[1] != expect_bits:
        raise TypeError(f"expected an {expect_bits}-bit element type, got {field[1]} bits (code {field[0]})")
    field[0], field[1] = code, bits


def _capsule_dtype(capsule) -> tuple[int, int]:
    field = _dtype_field(capsule)
    return int(field[0]), int(field[1])


#: DLPack 1.1 type codes of the FP8 / FP6 / FP4 formats other than e4m3fn
#: (kDLFloat8_e3m4 = 7 ... kDLFloat4_e2m1fn = 17): bytes cugemm8 must never
#: take for e4m3fn.
_OTHER_LOW_PRECISION = {7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz",
                        11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz",
                        14: "float8_e8m0fnu", 15: "float6_e2m3fn", 16: "float6_e3m2fn",
                        17: "float4_e2m1fn"}


class _Relabelled:
    """A DLPack producer that forwards to ``obj`` and relabels e4m3fn <-> uint8.

    The decision is taken on the capsule's own type code, not on the
    producer's dtype object, so it works for every producer (JAX, PyTorch's
    ``torch.float8_e4m3fn``, whose dtype has no ``.name``, CuPy, ...).
    """

    def __init__(self, obj, src_code: int, dst_code: int, *, reject_other_fp8: bool = False):
        self._obj, self._src, self._dst = obj, src_code, dst_code
        self._reject = reject_other_fp8

    def __dlpack_device__(self):
        return self._obj.__dlpack_device__()

    def __dlpack__(self, *, stream=None, **kwargs):
        # Older producers (JAX 0.10) accept only `stream`; drop the rest.
        try:
            capsule = self._obj.__dlpack__(stream=stream, **kwargs)
        except TypeError:
            capsule = self._obj.__dlpack__(stream=stream)
        code, bits = _capsule_dtype(capsule)
        if code == self._src and bits == 8:
            _relabel_capsule(capsule, self._dst, 8)
        elif self._reject and code in _OTHER_LOW_PRECISION:
            raise TypeError(f"x holds {_OTHER_LOW_PRECISION[code]} elements (DLPack type code {code}); "
                            f"cugemm8's FP8 operands are float8_e4m3fn (or uint8 e4m3fn bits)")
        return capsule


def to_cupy(x: Any) -> cupy.ndarray:
    """A CuPy array over the memory of any CUDA DLPack producer, without a copy.

    ``float8_e4m3fn`` arrays (JAX, PyTorch, an ml_dtypes view) arrive as
    ``uint8`` arrays of the same e4m3fn bits, which is what cugemm8's FP8
    operands are.  Other dtypes (bf16, f32, i32, ...) keep their type.

    Args:
        x: an object with ``__dlpack__`` / ``__dlpack_device__`` whose memory
            is on a CUDA device (a JAX array on a GPU, a CUDA torch tensor,
            a CuPy array).

    Returns:
        ``cupy.ndarray`` sharing ``x``'s memory.  Keep ``x`` alive while it is
        used; do not write into it if the producer treats it as immutable (JAX).

    Strides cross as they are: a transposed or sliced tensor arrives as a
    CuPy view with the same strides, and the ops then reject a layout they
    cannot read (e.g. a transposed FP8 operand: "must be K-major").

    Raises:
        TypeError: ``x`` lives in host memory (NumPy, a CPU JAX array or torch
            tensor): copy it with ``cupy.asarray`` or move it to the GPU
            first; it is not a DLPack producer; or it holds another FP8 / FP6
            / FP4 format (e5m2, e4m3fnuz, ...), never taken for e4m3fn.
    """
    import cupy
    if isinstance(x, cupy.ndarray):
        return x
    if isinstance(x, np.ndarray):
        raise TypeError("x is a NumPy (host) array; cugemm8 needs device memory: "
                        "copy it with cupy.asarray(x)")
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"x ({type(x).__name__}) is not a DLPack producer")
    dev_type, _ = x.__dlpack_device__()
    if int(dev_type) in _HOST_DEVICES:
        raise TypeError(f"x ({type(x).__name__}) lives in host memory; cugemm8 needs a CUDA array "
                        "(move it to the GPU first, or copy it with cupy.asarray)")
    if int(dev_type) not in _CUDA_DEVICES:
        raise TypeError(f"x ({type(x).__name__}) is on DLPack device type {int(dev_type)}, not CUDA")
    return cupy.from_dlpack(_Relabelled(x, KDL_FLOAT8_E4M3FN, KDL_UINT, reject_other_fp8=True))


def to_jax(x: cupy.ndarray, *, fp8: bool = False) -> jax.Array:
    """A JAX array over a CuPy array's memory, without a copy.

    Args:
        x: a CuPy array.  With ``fp8=True`` it must be ``uint8`` holding
            e4m3fn bits and arrives in JAX as ``float8_e4m3fn``.

    Returns:
        ``jax.Array`` on the same GPU.  JAX's stream waits for the work
        already queued on CuPy's current stream (DLPack handshake).

    Raises:
        TypeError: ``x`` is not a CuPy array, or ``fp8=True`` with a dtype
            other than uint8.
    """
    import cupy
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"x must be a cupy.ndarray, got {type(x).__module__}.{type(x).__qualname__}")
    import jax.numpy as jnp
    if fp8:
        if x.dtype != np.uint8:
            raise TypeError(f"fp8=True needs uint8 e4m3fn bits, got {x.dtype}")
        return jnp.from_dlpack(_Relabelled(x, KDL_UINT, KDL_FLOAT8_E4M3FN))
    return jnp.from_dlpack(x)


# ----------------------------------------------------------------------------
# JAX-facing ops
# ----------------------------------------------------------------------------

_pending: list = []


def _keep_alive(*refs) -> None:
    """Hold the CuPy views of foreign inputs until the work queued on CuPy's
    current stream has finished, so the producer (JAX) cannot recycle their
    memory under a running kernel.  Never blocks: finished entries are
    dropped on later calls."""
    import cupy
    ev = cupy.cuda.Event(disable_timing=True)
    ev.record()
    _pending.append((ev, refs))
    while _pending and _pending[0][0].done:
        _pending.pop(0)


def _refuse_capture() -> None:
    """The JAX-facing ops make temporaries (row-major scales converted to and
    from the kernels' layout) and hold foreign inputs until an event on the
    stream completes; neither survives CUDA-graph capture, so they refuse it."""
    import cupy
    from ._checks import capturing
    if capturing(cupy):
        raise ValueError("the JAX-facing ops (*_jax) cannot run under CUDA-graph capture: they "
                         "convert scale layouts into temporaries that the graph would keep using "
                         "after they are freed; capture the CuPy ops on arrays from to_cupy instead, "
                         "with sfa converted once by cugemm8.get_col_major_tma_aligned_tensor")


def _pair(name, pair):
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (payload, scale) pair")
    return to_cupy(pair[0]), to_cupy(pair[1])


def gemm_fp8_fp8_bf16_nt_jax(lhs: tuple[jax.Array, jax.Array],
                             rhs: tuple[jax.Array, jax.Array]) -> jax.Array:
    """:func:`cugemm8.gemm_fp8_fp8_bf16_nt` on JAX arrays, returning a JAX array.

    Args:
        lhs: ``(a, sfa)``: ``a`` ``float8_e4m3fn`` (or ``uint8``) ``[m, k]``,
            ``sfa`` float32 ``[m, ceil(k/128)]``, JAX arrays on a GPU.
        rhs: ``(b, sfb)``: ``b`` ``[n, k]``, ``sfb`` float32
            ``[ceil(n/128), ceil(k/128)]``.

    Returns:
        ``jax.Array`` bfloat16 ``[m, n]`` sharing memory with the CuPy output.

    JAX arrays are row-major, so ``sfa`` is converted to the MN-major layout
    (one small copy kernel; see :func:`cugemm8.get_col_major_tma_aligned_tensor`).
    Raises what :func:`cugemm8.gemm_fp8_fp8_bf16_nt` raises, plus
    ``TypeError`` for host arrays.
    """
    _refuse_capture()
    import cupy
    from . import gemm
    a, sfa = _pair("lhs", lhs)
    b, sfb = _pair("rhs", rhs)
    out = cupy.empty((a.shape[0], b.shape[0]), dtype=cupy.dtype("bfloat16"))
    gemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    _keep_alive(a, sfa, b, sfb)
    return to_jax(out)


def per_token_cast_to_fp8_jax(x: jax.Array, *, min_amax: float = 1e-4, pow2_scale: bool = False
                              ) -> tuple[jax.Array, jax.Array]:
    """:func:`cugemm8.per_token_cast_to_fp8` on a JAX array.

    Args:
        x: JAX array on a GPU, ``[m, k]`` or ``[g, m, k]``, float32, float16
            or bfloat16, any ``k`` (the payload comes back with ``ceil(k/16)*16`` columns).
        min_amax, pow2_scale: as for :func:`cugemm8.per_token_cast_to_fp8`
            (keyword-only).

    Returns:
        ``(a, sfa)``: ``a`` ``float8_e4m3fn`` ``[..., m, ceil(k/16)*16]``
        (``x``'s shape when ``k % 16 == 0``; padding columns zero) and
        ``sfa`` float32 ``[..., m, ceil(k/128)]``, row-major (JAX arrays carry no
        strides; :func:`gemm_fp8_fp8_bf16_nt_jax` converts it back).

    Raises:
        TypeError: ``x`` is not a CUDA DLPack producer, or has a wrong dtype.
        ValueError: a shape rule of the quantiser is broken.
    """
    _refuse_capture()
    import cupy
    from . import quant
    xc = to_cupy(x)
    a, sfa = quant.per_token_cast_to_fp8(xc, min_amax=min_amax, pow2_scale=pow2_scale)
    _keep_alive(xc)
    return to_jax(a, fp8=True), to_jax(cupy.ascontiguousarray(sfa))


def per_block_cast_to_fp8_jax(w: jax.Array, *, min_amax: float = 1e-4, pow2_scale: bool = False
                              ) -> tuple[jax.Array, jax.Array]:
    """:func:`cugemm8.per_block_cast_to_fp8` on a JAX array.

    Args:
        w: JAX array on a GPU, ``[n, k]`` or ``[g, n, k]``, float32, float16
            or bfloat16, any ``k`` (as :func:`cugemm8.per_block_cast_to_fp8`).
        min_amax, pow2_scale: as for :func:`cugemm8.per_block_cast_to_fp8`
            (keyword-only).

    Returns:
        ``(b, sfb)``: ``b`` ``float8_e4m3fn`` ``[..., n, ceil(k/16)*16]``
        (``w``'s shape when ``k % 16 == 0``) and ``sfb`` float32
        ``[..., ceil(n/128), ceil(k/128)]``, row-major.

    Raises:
        TypeError: ``w`` is not a CUDA DLPack producer, or has a wrong dtype.
        ValueError: a shape rule of the quantiser is broken.
    """
    _refuse_capture()
    from . import quant
    wc = to_cupy(w)
    b, sfb = quant.per_block_cast_to_fp8(wc, min_amax=min_amax, pow2_scale=pow2_scale)
    _keep_alive(wc)
    return to_jax(b, fp8=True), to_jax(sfb)
