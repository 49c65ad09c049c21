"""Device discovery and per-device state: what is missing, SM counts, limits.

Nothing here touches the GPU at import time: ``import cugemm8`` works on a
machine with no GPU, no driver and no CuPy.  Every device-needing entry point
calls :func:`require_hopper` first, which raises :class:`DeviceError` with a
one-line reason.
"""
from __future__ import annotations

import functools
import numbers
import threading

#: The compute capability every cugemm8 kernel is built for (sm_90a).
REQUIRED_CC = "90"

#: Opt-in shared memory per block on sm_90 (used when no device is present,
#: e.g. for compile-only checks).  Source: CUDA C Programming Guide,
#: "Technical Specifications per Compute Capability" (227 KB for 9.0).
SM90_SMEM_OPTIN = 232448


class DeviceError(RuntimeError):
    """No usable Hopper GPU (no CuPy, no driver, no device, wrong compute
    capability, or no NVRTC)."""


def import_cupy():
    """Import CuPy, or raise :class:`DeviceError` saying it is missing."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA library load failure
        raise DeviceError(
            f"CuPy is not importable ({type(exc).__name__}: {exc}); "
            "install cugemm8 with the cuda12 or cuda13 extra") from None
    return cupy


def nvrtc_version() -> tuple[int, int]:
    """NVRTC (major, minor) that CuPy loads.  Raises DeviceError if absent."""
    import_cupy()
    try:
        from cupy_backends.cuda.libs import nvrtc
        return tuple(nvrtc.getVersion())
    except Exception as exc:
        raise DeviceError(f"NVRTC is missing or unloadable ({exc}); install cugemm8's "
                          "cuda12 or cuda13 extra (pip install 'cugemm8[cuda12]'), which brings "
                          "the NVRTC wheel (nvidia-cuda-nvrtc-cu12 / nvidia-cuda-nvrtc)") from None


def check_nvrtc_matches_cupy() -> None:
    """Refuse a CUDA 12 CuPy that picked up a CUDA 13 NVRTC (or vice versa).

    cuda-pathfinder searches ``nvidia/cu13/lib`` before
    ``nvidia/cuda_nvrtc/lib``, so a stray CUDA-13 NVRTC wheel in a
    cupy-cuda12x environment makes CuPy compile with NVRTC 13, whose cubins
    need a CUDA 13 driver (see docs/design.md, "Environment hazards").
    """
    cupy = import_cupy()
    major, _ = nvrtc_version()
    cupy_major = int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    if major != cupy_major:
        raise DeviceError(
            f"CuPy is built for CUDA {cupy_major} but loads NVRTC {major}; "
            f"remove the CUDA {major} NVRTC wheel (e.g. nvidia-cuda-nvrtc / "
            f"cuda-bindings>={major}) or install the matching cupy-cuda{major}x")


def nvrtc_unavailable_reason() -> str | None:
    """None if sm_90a kernels can be compiled here (no GPU needed), else why not."""
    try:
        check_nvrtc_matches_cupy()
    except DeviceError as exc:
        return str(exc)
    return None


def _runtime_error(exc: Exception) -> DeviceError:
    text = str(exc)
    if "InsufficientDriver" in text:
        return DeviceError("no usable NVIDIA driver: none is installed, or it is older than this "
                           f"CUDA runtime needs ({text})")
    if "NoDevice" in text:
        return DeviceError(f"no CUDA device visible ({text})")
    return DeviceError(f"CUDA runtime error: {text}")


def _device_count() -> int:
    cupy = import_cupy()
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise _runtime_error(exc) from None


def gpu_unavailable_reason() -> str | None:
    """None if the current device is a usable Hopper GPU and kernels can be
    compiled for it (a matching NVRTC), else a one-line reason."""
    try:
        require_hopper()
        check_nvrtc_matches_cupy()
    except DeviceError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=None)
def _device_info(device_id: int) -> dict:
    cupy = import_cupy()
    try:
        props = cupy.cuda.runtime.getDeviceProperties(device_id)
    except Exception as exc:
        raise _runtime_error(exc) from None
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return {
        "name": name,
        "cc": f"{props['major']}{props['minor']}",
        "num_sms": int(props["multiProcessorCount"]),
        "smem_optin": int(props["sharedMemPerBlockOptin"]),
        "l2_bytes": int(props["l2CacheSize"]),
    }


_checked_devices: set[int] = set()


def current_device_id() -> int:
    """CuPy's current device; raises :class:`DeviceError` without a driver or device."""
    cupy = import_cupy()
    try:
        return cupy.cuda.runtime.getDevice()
    except Exception as exc:
        raise _runtime_error(exc) from None


def require_hopper(device_id: int | None = None) -> int:
    """Check that ``device_id`` (default: CuPy's current device) is usable.

    Returns the device id.  Raises :class:`DeviceError` naming what is
    missing: CuPy, a CUDA device, or compute capability 9.0 (NVRTC is
    checked by the JIT when a kernel must be compiled).
    """
    if device_id is None:
        if _checked_devices:
            # Fast path for repeated calls: the current device was checked.
            device_id = current_device_id()
            if device_id in _checked_devices:
                return device_id
        else:
            if _device_count() == 0:
                raise DeviceError("no CUDA device visible")
            device_id = current_device_id()
    if device_id in _checked_devices:
        return device_id
    if _device_count() == 0:
        raise DeviceError("no CUDA device visible")
    info = _device_info(device_id)
    if info["cc"] != REQUIRED_CC:
        raise DeviceError(
            f"device {device_id} ({info['name']}) has compute capability "
            f"{info['cc'][0]}.{info['cc'][1:]}; cugemm8 kernels need 9.0 (Hopper, sm_90a)")
    # NVRTC is checked where it is used (cugemm8._jit, before compiling): a
    # kernel loaded from the disk cache needs no NVRTC at all, and loading
    # it for the check cost a warm start tens of milliseconds.
    _checked_devices.add(device_id)
    return device_id


def device_info(device_id: int | None = None) -> dict:
    """Name, compute capability, SM count, opt-in shared memory and L2 size."""
    if device_id is None:
        device_id = current_device_id()
    return dict(_device_info(device_id))


# Per-device SM budget for cugemm8 kernels (set_num_sms / get_num_sms).
_num_sms_override: dict[int, int] = {}
_lock = threading.Lock()


def get_num_sms(device_id: int | None = None) -> int:
    """Number of SMs cugemm8 kernels may occupy on the device.

    Defaults to the device's multiprocessor count; see :func:`set_num_sms`.
    """
    if device_id is None:
        device_id = current_device_id()
    n = _num_sms_override.get(device_id)
    return n if n is not None else _device_info(device_id)["num_sms"]


def is_whole_device(device_id: int) -> bool:
    """Whether the SM budget of ``device_id`` is the whole device: no
    :func:`set_num_sms` limit below its SM count (no device query without
    a limit).  The ops allow kernels whose grid is not persistent (the
    warp-MMA decode kernel) only then."""
    n = _num_sms_override.get(device_id)
    return n is None or n >= _device_info(device_id)["num_sms"]


def set_num_sms(num_sms: int, device_id: int | None = None) -> None:
    """Limit the persistent grid of cugemm8 kernels to ``num_sms`` SMs.

    Applies to the current device (or ``device_id``) only, e.g. to leave SMs
    free for communication kernels running concurrently.  Raises
    ``ValueError`` unless ``1 <= num_sms <=`` the device's SM count,
    ``TypeError`` if ``num_sms`` (or ``device_id``) is not an integer, and
    :class:`DeviceError` without a
    usable device.
    """
    if isinstance(num_sms, bool) or not isinstance(num_sms, numbers.Integral):
        raise TypeError(f"num_sms must be an int, got {type(num_sms).__name__}")
    num_sms = int(num_sms)
    if num_sms < 1:     # before any device lookup: a ValueError on any machine
        raise ValueError(f"num_sms={num_sms} must be >= 1")
    if device_id is not None and (isinstance(device_id, bool)
                                  or not isinstance(device_id, numbers.Integral)):
        raise TypeError(f"device_id must be an int or None, got {type(device_id).__name__}")
    if device_id is None:
        device_id = current_device_id()
    device_id = int(device_id)
    total = _device_info(device_id)["num_sms"]
    if not 1 <= num_sms <= total:
        raise ValueError(f"num_sms={num_sms} must be in [1, {total}] "
                         f"(the SM count of device {device_id})")
    with _lock:
        _num_sms_override[device_id] = num_sms
