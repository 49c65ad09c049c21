"""Shared pytest set-up: skip GPU / compile tests with a visible reason, and an
``rng`` fixture seeded from the test's node id.

The markers themselves (``gpu``, ``compile``, ``slow``) are declared in
pyproject.toml.  ``python -m pytest -q -ra`` prints every skip reason.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest


def _device_reason(func_name: str) -> str | None:
    """Call ``cugemm8._device.<func_name>()`` defensively.

    Returns None when the capability is usable, else a one-line reason.  Any
    failure to import or run the probe becomes the reason instead of an error
    at collection time.
    """
    try:
        from cugemm8 import _device
    except Exception as exc:  # ImportError or anything raised while importing
        return f"cugemm8._device unavailable: {type(exc).__name__}: {exc}"
    func = getattr(_device, func_name, None)
    if func is None:
        return f"cugemm8._device unavailable: it has no {func_name}()"
    try:
        reason = func()
    except Exception as exc:
        return f"{func_name}() failed: {type(exc).__name__}: {exc}"
    return None if reason is None else str(reason).strip().splitlines()[0]


@functools.lru_cache(maxsize=None)
def gpu_skip_reason() -> str | None:
    """Why tests marked ``gpu`` cannot run here (None: a Hopper GPU is usable)."""
    return _device_reason("gpu_unavailable_reason")


@functools.lru_cache(maxsize=None)
def compile_skip_reason() -> str | None:
    """Why tests marked ``compile`` cannot run here (None: CuPy and NVRTC work)."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:
        return f"cupy cannot be imported: {type(exc).__name__}: {exc}"
    return _device_reason("nvrtc_unavailable_reason")


def pytest_collection_modifyitems(config, items):
    # Probe only when some collected test needs it (importing CuPy costs time).
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            reason = gpu_skip_reason()
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs a Hopper GPU: {reason}"))
                continue
        if item.get_closest_marker("compile") is not None:
            reason = compile_skip_reason()
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs CuPy + NVRTC: {reason}"))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A NumPy Generator seeded from the test's node id: reproducible per test,
    different between tests (and between parametrisations)."""
    digest = hashlib.sha256(request.node.nodeid.encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))
