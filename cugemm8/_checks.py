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
                        f"(use cupy.asarray({name}))")
    raise TypeError(f"{name} must be a cupy.ndarray, got {type(x).__name__}")


def check_on_current_device(arrays: dict, cupy) -> None:
    """Every array in ``arrays`` (name -> array or None) lives on CuPy's current device."""
    dev = cupy.cuda.runtime.getDevice()
    for name, x in arrays.items():
        if x is not None and x.device.id != dev:
            raise ValueError(f"{name} is on device {x.device.id} but the current device is {dev}; "
                             f"run under `with cupy.cuda.Device({x.device.id}):`")
