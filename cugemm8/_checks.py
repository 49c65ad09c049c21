"""Argument checks shared by every public op (GEMMs, quantisers): each raises
``TypeError`` / ``ValueError`` naming the argument and the rule, before any
launch."""
from __future__ import annotations

import numpy as np


def check_device_array(name: str, x, cupy) -> None:
    """``x`` must be a CuPy array (device memory), not a NumPy array or other object."""
    if isinstance(x, cupy.ndarray):
        return
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a NumPy (host) array; cugemm8 needs CuPy device arrays "
                        f"(use cupy.asarray({name}) on a machine with a Hopper GPU; without one, "
                        f"cugemm8.reference has a NumPy version of every op)")
    raise TypeError(f"{name} must be a cupy.ndarray, got {type(x).__name__}")


def check_on_current_device(arrays: dict, cupy) -> None:
    """Every array in ``arrays`` (name -> array or None) lives on CuPy's current device."""
    dev = cupy.cuda.runtime.getDevice()
    for name, x in arrays.items():
        if x is not None and x.device.id != dev:
            raise ValueError(f"{name} is on device {x.device.id} but the current device is {dev}; "
                             f"run under `with cupy.cuda.Device({x.device.id}):`")


def capturing(cupy) -> bool:
    """Whether CuPy's current stream is capturing a CUDA graph.

    A stream that cannot be queried because another stream captures in
    global mode (``cudaErrorStreamCaptureImplicit`` on the legacy stream)
    counts as capturing: work queued there would break that capture anyway.
    """
    try:
        return bool(cupy.cuda.get_current_stream().is_capturing())
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        # Any other error (no driver, no device) is not a capture; the
        # call's own device checks report it.
        return "StreamCapture" in str(exc)


def refuse_temporary_under_capture(what: str, fix: str, cupy) -> None:
    """Raise ``ValueError`` when a call that needs a temporary device buffer
    (``what``) runs under CUDA-graph capture.

    The temporary is freed when the call returns, but the captured kernels
    keep its address: every replay would read and write memory that CuPy has
    since handed to other arrays (a use after free).  So such calls are
    refused during capture, before anything is queued, with ``fix`` saying how
    to make the call temporary-free.
    """
    if capturing(cupy):
        raise ValueError(f"{what}, which would be freed when this call returns while the CUDA graph "
                         f"being captured on the current stream keeps using its address on every "
                         f"replay; {fix}")
