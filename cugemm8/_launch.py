"""Kernel launches, with programmatic dependent launch (PDL) as an opt-in.

Every cugemm8 kernel executes ``griddepcontrol.wait`` before its first
global-memory access that depends on earlier work and
``griddepcontrol.launch_dependents`` right after it
(``cuda_src/ptx/griddep.cuh``).  Both are no-ops unless the kernel is
launched with the programmatic-stream-serialization attribute, which lets it
start (rasterise its CTAs, initialise barriers, prefetch descriptors) while
the previous kernel on the stream is still running (CUDA Programming Guide,
"Programmatic Dependent Launch and Synchronization"; CUDA Driver API
``cuLaunchKernelEx``, ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``).

:func:`set_pdl` turns that attribute on for every cugemm8 launch of the
process.  A launch without it goes through CuPy's own launcher
(``RawKernel.__call__``); a launch with it through ``cuLaunchKernelEx`` of
cuda-bindings (``cuda.bindings.driver``), with the kernel parameters packed
once per launcher.
"""
from __future__ import annotations

import numpy as np

from . import _tma

_state = {"pdl": False}
_SLOT = 128            # bytes per packed kernel parameter (a CUtensorMap is the largest)


def set_pdl(enabled: bool) -> None:
    """Turn programmatic dependent launch on or off for every cugemm8 kernel.

    With PDL on, each launch of the quantisers and the GEMMs on a stream may
    begin while the kernel before it is still running: its set-up
    (CTA launch, barrier initialisation, TMA descriptor prefetch) overlaps
    that kernel's tail, and its first global-memory access waits until that
    kernel has completed (``griddepcontrol.wait``), so results are
    bit-identical to PDL off.  It helps chains of short kernels (decode);
    DeepGEMM offers the same opt-in.  It also works under CUDA-graph capture
    (the graph records programmatic edges).

    Contract for kernels that are not cugemm8's: a kernel of yours launched
    *with* the PDL attribute right after a cugemm8 kernel must itself wait
    (``griddepcontrol.wait`` / ``cudaGridDependencySynchronize``) before
    reading that kernel's output, as PDL requires of any dependent.  Kernels
    launched without the attribute are ordered as usual.

    Arguments:
        enabled: ``True`` or ``False`` (a ``bool``); process-wide, default
            ``False``.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, (bool, np.bool_)):
        raise TypeError(f"set_pdl(enabled) takes a bool, got {type(enabled).__name__}")
    _state["pdl"] = bool(enabled)


def get_pdl() -> bool:
    """Whether cugemm8 launches use programmatic dependent launch (see :func:`set_pdl`)."""
    return _state["pdl"]


def _arg_bytes(arg) -> bytes:
    """The bytes of one kernel parameter as CuPy would pass it: a NumPy scalar
    (including the ``numpy.void`` tensor maps) by value, a CuPy array as its
    device pointer."""
    if isinstance(arg, np.generic):
        return arg.tobytes()
    ptr = getattr(getattr(arg, "data", None), "ptr", None)
    if ptr is None:
        raise TypeError(f"unsupported kernel argument of type {type(arg).__name__}")
    return np.uint64(ptr).tobytes()


class Launcher:
    """One kernel with fixed grid, block, dynamic shared memory and arguments.

    ``launcher()`` launches it on CuPy's current stream, as a programmatic
    dependent launch when ``pdl`` is true (default: :func:`get_pdl`).
    Holds the arguments as given: raw addresses stay raw (a cached launcher
    must not keep the caller's arrays alive).
    """

    __slots__ = ("kern", "grid", "block", "args", "smem", "_ex")

    def __init__(self, kern, grid: tuple, block: tuple, args: tuple, smem: int = 0):
        self.kern, self.grid, self.block, self.args, self.smem = kern, grid, block, args, smem
        self._ex = None

    def __call__(self, pdl: bool | None = None) -> None:
        if not (_state["pdl"] if pdl is None else pdl):
            self.kern(self.grid, self.block, self.args, shared_mem=self.smem)
            return
        ex = self._ex
        if ex is None:
            ex = self._ex = _ExLaunch(self)
        ex()


class _ExLaunch:
    """The ``cuLaunchKernelEx`` form of a :class:`Launcher`: parameters packed
    into 128-byte slots of one host buffer, and one launch config (with the
    PDL attribute) per stream, built on first use."""

    def __init__(self, launcher: Launcher):
        d = _tma._driver()
        self.d = d
        n = len(launcher.args)
        raw = np.zeros((n + 1) * _SLOT, dtype=np.uint8)
        base = (-raw.ctypes.data) % _SLOT
        self.buf = raw
        self.ptrs = np.empty(max(n, 1), dtype=np.uint64)
        for i, arg in enumerate(launcher.args):
            b = _arg_bytes(arg)
            off = base + i * _SLOT
            raw[off:off + len(b)] = np.frombuffer(b, dtype=np.uint8)
            self.ptrs[i] = raw.ctypes.data + off
        self.params = self.ptrs.ctypes.data
        self.func = d.CUfunction(launcher.kern.kernel.ptr)
        self.dims = ((tuple(launcher.grid) + (1, 1))[:3], (tuple(launcher.block) + (1, 1))[:3])
        self.smem = launcher.smem
        self.cfgs: dict = {}          # stream address -> its launch config (never mutated once built)

    def _config(self, stream_ptr: int):
        d = self.d
        cfg = d.CUlaunchConfig()
        (gx, gy, gz), (bx, by, bz) = self.dims
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
        cfg.sharedMemBytes = self.smem
        cfg.hStream = d.CUstream(stream_ptr)
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        return cfg

    def __call__(self) -> None:
        import cupy
        d = self.d
        ptr = cupy.cuda.get_current_stream().ptr
        cfg = self.cfgs.get(ptr)
        if cfg is None:
            # One config per stream, so that threads launching the same
            # cached launcher on different streams never share a mutable one.
            if len(self.cfgs) >= 64:
                self.cfgs = {}
            cfg = self.cfgs[ptr] = self._config(ptr)
        err, = d.cuLaunchKernelEx(cfg, self.func, self.params, 0)
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx failed with {err!r}")


__all__ = ["Launcher", "get_pdl", "set_pdl"]
