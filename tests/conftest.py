"""Shared pytest set-up: skip GPU / compile tests with a visible reason, and an
``rng`` fixture seeded from the test's node id.

The markers themselves (``gpu``, ``compile``, ``slow``) are declared in
pyproject.toml.  ``python -m pytest -q -ra`` prints every skip reason.
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess

import numpy as np
import pytest


# Tuned configurations (cugemm8 tune) never leak into the suite from the
# user's cache: every test sees an empty tuned file unless it sets its own.
os.environ["CUGEMM8_TUNED_FILE"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"cugemm8-tests-{os.getpid()}-no-tuned.json")


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
        __import__("cupy")
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


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


#: The tools the SASS checks ran with, for the closing summary.
_sass_tools_used: dict[str, str] = {}


@pytest.fixture(scope="session")
def sass_tools() -> tuple[str, str]:
    """``(ptxas, cuobjdump)`` for the SASS checks of the compile tests.

    A missing tool skips the test that needs it, with the reason; under
    ``CI=true`` it fails it instead, so CI never passes without the SASS
    checks (the ``test`` extra brings both tools as wheels).
    """
    from cugemm8 import _jit
    tools = {name: _jit.find_tool(name) for name in ("ptxas", "cuobjdump")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        msg = (f"{' and '.join(missing)} not found (searched: the NVIDIA wheels of this "
               "environment, PATH, $CUDA_PATH/bin, $CUDA_HOME/bin, /usr/local/cuda/bin); "
               "the test extra brings them as wheels (with the cuda13 extra, add "
               "nvidia-cuda-nvcc for a CUDA 13 ptxas)")
        if _ci():
            pytest.fail(f"CI=true and the SASS checks cannot run: {msg}", pytrace=False)
        pytest.skip(msg)
    _sass_tools_used.update(tools)
    return tools["ptxas"], tools["cuobjdump"]


def pytest_terminal_summary(terminalreporter):
    for name, path in _sass_tools_used.items():
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
            version = next((ln.strip() for ln in out.splitlines() if "release" in ln), "")
        except (OSError, subprocess.SubprocessError):
            version = ""
        terminalreporter.write_line(f"SASS checks: {name} {path}" + (f" ({version})" if version else ""))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A NumPy Generator seeded from the test's node id: reproducible per test,
    different between tests (and between parametrisations)."""
    digest = hashlib.sha256(request.node.nodeid.encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))
