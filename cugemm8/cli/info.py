"""``cugemm8 info``: versions, the GPU, the kernel cache and whether sm_90a
kernels can be compiled and run here.  Works without a GPU; always exits 0."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ._common import _one_line, gpu_reason, nvrtc_reason


def _try(fn, default="unavailable"):
    try:
        return fn()
    except Exception as exc:
        return f"{default} ({_one_line(f'{type(exc).__name__}: {exc}')[:200]})"


def _dist_version(*names: str) -> str:
    from importlib import metadata
    for name in names:
        try:
            return f"{metadata.version(name)} ({name})"
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10} ({v})" if v else f"none ({v})"


def cache_dir() -> Path:
    """CuPy's kernel cache directory (``CUPY_CACHE_DIR`` or ``~/.cupy/kernel_cache``)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or os.path.join("~", ".cupy", "kernel_cache")).expanduser()


def _dir_usage(path: Path) -> str:
    if not path.is_dir():
        return "does not exist yet"
    files = [p for p in path.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return f"{len(files)} files, {size / 2**20:.1f} MiB"


def _gpu_lines() -> list[tuple[str, str]]:
    import cupy as cp
    count = cp.cuda.runtime.getDeviceCount()
    lines = [("GPUs visible", str(count))]
    for i in range(count):
        props = cp.cuda.runtime.getDeviceProperties(i)
        name = props.get("name", "?")
        name = name.decode(errors="replace") if isinstance(name, bytes) else name
        cc = f"{props.get('major', '?')}.{props.get('minor', '?')}"
        mem = props.get("totalGlobalMem", 0) / 2**30
        l2 = props.get("l2CacheSize", 0) / 2**20
        lines.append((f"GPU {i}", f"{name}, compute capability {cc}, "
                      f"{props.get('multiProcessorCount', '?')} SMs, {mem:.1f} GiB, L2 {l2:.0f} MiB, "
                      f"{props.get('sharedMemPerBlockOptin', '?')} B shared memory per block (opt-in)"))
    return lines


def info_lines() -> list[tuple[str, str]]:
    """(key, value) pairs of ``cugemm8 info``; never raises."""
    import platform
    from .. import __version__
    lines = [("cugemm8", f"{__version__} ({Path(__file__).resolve().parent.parent})"),
             ("python", f"{platform.python_version()} ({sys.executable})"),
             ("numpy", _dist_version("numpy")), ("ml_dtypes", _dist_version("ml_dtypes")),
             ("cupy", _dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy")),
             ("cuda-bindings", _dist_version("cuda-bindings"))]
    try:
        import cupy as cp
    except Exception as exc:
        lines.append(("cupy import", _one_line(f"FAILED: {type(exc).__name__}: {exc}")))
        cp = None
    if cp is not None:
        rt = cp.cuda.runtime
        lines += [("CUDA driver", _try(lambda: _cuda_version(rt.driverGetVersion()))),
                  ("CUDA runtime", _try(lambda: _cuda_version(rt.runtimeGetVersion())))]

        def nvrtc():
            from cupy_backends.cuda.libs import nvrtc as lib
            return ".".join(map(str, lib.getVersion()))
        lines.append(("NVRTC", _try(nvrtc)))
        gpu = _try(_gpu_lines, default="no GPU")
        lines += gpu if isinstance(gpu, list) else [("GPUs", gpu)]
    cdir = cache_dir()
    src = "CUPY_CACHE_DIR" if os.environ.get("CUPY_CACHE_DIR") else "default; set CUPY_CACHE_DIR to move it"
    lines.append(("kernel cache", f"{cdir} ({src}): {_try(lambda: _dir_usage(cdir))}"))
    if cp is not None:
        from .warmup import key_summary
        lines.append(("kernel cache key", _try(lambda: f"{key_summary()} (what a prebuilt cache must match; "
                                                      "cugemm8 warmup --check-cache compares)")))
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "0") not in ("", "0"):
        lines.append(("kernel cache note", "CUPY_CACHE_IN_MEMORY is set: nothing is written to disk"))
    env = {k: v for k, v in os.environ.items() if k.startswith("CUGEMM8_")}
    if env:
        lines.append(("CUGEMM8_* set", ", ".join(f"{k}={v}" for k, v in sorted(env.items()))))
    nv = nvrtc_reason()
    lines.append(("compile sm_90a", "yes" if nv is None else f"no: {nv}"))
    gr = gpu_reason()
    lines.append(("run kernels", "yes" if gr is None else f"no: {gr}"))
    return lines


def cmd_info(args) -> int:
    lines = info_lines()
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")
    return 0



def register(sub) -> None:
    p = sub.add_parser("info", help="versions, GPU, kernel cache, what is missing (no GPU needed)")
    p.set_defaults(func=cmd_info)
