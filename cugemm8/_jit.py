"""Generic run-time compilation of the templates in ``cuda_src/`` for sm_90a.

This module knows nothing about GEMMs: it turns ``(header, name expression)``
into a loaded, launchable kernel, and offers a compile-only path that needs no
GPU (for CI's resource and SASS checks).

How kernels are built
---------------------
* Source string: one line carrying the SHA-256 of every file under
  ``cuda_src/`` (recursively) followed by ``#include "<header>"``, so any
  header edit changes the cache key.
* NVRTC, called through CuPy's binding (``cupy_backends.cuda.libs.nvrtc``),
  with the options CuPy's ``RawModule(code=...)`` would use
  (:func:`nvrtc_options`): CuPy's include paths, ours, ``-arch=sm_90a`` and
  CuPy's own trailing ``-ftz=true -arch=sm_90``; NVRTC keeps the ``a``
  suffix once any flag carries it (CuPy v14.2.0 cupy/cuda/compiler.py,
  ``_compile_using_nvrtc``; checked by tests/test_kernel_compile.py).
  ``cuda_src/common.cuh`` has an ``#error`` guard on
  ``__CUDA_ARCH_FEAT_SM90_ALL`` so a plain sm_90 build fails loudly.
* Disk cache: cugemm8's own, ``$CUPY_CACHE_DIR/cugemm8`` (see
  :func:`cache_dir`): one cubin and one JSON record (mangled name, SHA-256)
  per kernel, written atomically; a hit is loaded with
  ``cupy.RawModule(path=...)`` without touching NVRTC (CuPy's own cache runs
  an NVRTC preprocessing pass for every key: most of a 73 ms warm start).
  The key (:func:`key_parts`) names no path of this machine, so a cache
  written elsewhere (``cugemm8 warmup --compile-only``, no GPU needed: see
  :func:`prebuild`) is loaded by any machine with the same cugemm8 sources,
  CuPy version and NVRTC release.
  A corrupt or truncated entry fails its hash, is treated as a miss and is
  rebuilt.  ``CUGEMM8_DISABLE_CACHE=1`` (or CuPy's ``CUPY_CACHE_IN_MEMORY=1``)
  compiles every kernel afresh and writes nothing to disk.
* Process cache: one loaded kernel per ``(device, header, name expression)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import _device, _env

#: Extensions of the files whose bytes reach the compiler.
_SOURCE_SUFFIXES = (".cuh", ".cu", ".h", ".hpp")


def cuda_src_dir() -> Path:
    """Directory holding the CUDA C++ templates (package data when installed)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "cuda_src", here.parent / "cuda_src"):
        if (cand / "common.cuh").is_file():
            return cand
    import importlib.util
    spec = importlib.util.find_spec("cugemm8.cuda_src")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    raise FileNotFoundError("cugemm8's cuda_src/ directory was not found")


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


_hash_memo: dict[Path, str] = {}


def source_hash(root: Path | None = None, *, refresh: bool = False) -> str:
    """SHA-256 over the relative paths and bytes of every source under ``root``."""
    root = cuda_src_dir() if root is None else Path(root)
    if refresh or root not in _hash_memo:
        _hash_memo[root] = _tree_hash(root)
    return _hash_memo[root]


def build_source(header: str, root: Path | None = None) -> str:
    """The source string handed to NVRTC for one header."""
    return (f"// cugemm8 cuda_src sha256={source_hash(root)}\n"
            f'#include "{header}"\n')


def compile_options(root: Path | None = None) -> tuple[str, ...]:
    root = cuda_src_dir() if root is None else Path(root)
    return ("-arch=sm_90a", "--std=c++17", f"-I{root}", "-DNDEBUG")


# --------------------------------------------------------------------------
# Loading kernels on the GPU
# --------------------------------------------------------------------------

@dataclasses.dataclass
class JitStats:
    """Counters for tests and the CLI (per process)."""
    builds: int = 0          # RawModule objects created (compile or disk load)
    hits: int = 0            # process-cache hits
    seconds: float = 0.0     # time spent in builds
    compiles: int = 0        # NVRTC compiles of a kernel (disk-cache misses and prebuild)
    disk_hits: int = 0       # kernels loaded from the disk cache without compiling


stats = JitStats()
_kernels: dict[tuple, object] = {}
# One lock per kernel, so different kernels compile concurrently (NVRTC
# releases the GIL: ``cugemm8 warmup`` builds in threads) while two threads
# asking for the same kernel build it once.
_key_locks: dict[tuple, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(key: tuple) -> threading.Lock:
    with _locks_guard:
        lock = _key_locks.get(key)
        if lock is None:
            lock = _key_locks[key] = threading.Lock()
        return lock


def nvrtc_options(root: Path | None = None) -> tuple[str, ...]:
    """Every NVRTC option of a build, in CuPy's order: CuPy's include paths
    around ours (``cupy._core.core.assemble_cupy_compiler_options``), then
    the options CuPy appends itself (``-ftz=true``, its plain ``-arch=sm_90``:
    NVRTC keeps the ``a`` of ours, CuPy v14.2.0 cupy/cuda/compiler.py
    ``_compile_with_cache_cuda`` / ``_compile_using_nvrtc``)."""
    import cupy._core.core as core
    return core.assemble_cupy_compiler_options(compile_options(root)) + (
        "-ftz=true", "-arch=sm_90", "--device-as-default-execution-space")


# --------------------------------------------------------------------------
# cugemm8's own cubin cache
# --------------------------------------------------------------------------
#
# A disk hit must not touch NVRTC: CuPy's RawModule cache computes its key
# with NVRTC's version and a preprocessing pass over an empty source, which
# cost most of the 73 ms first call of a cached kernel in a new process
# (issue 17, item 6; benches/RESULTS.md v0.8).  So cugemm8 compiles with
# NVRTC itself (the options CuPy would use) and keeps one entry per kernel
# under CuPy's cache directory:
#   <key>.cubin  the sm_90a cubin, loaded by cupy.RawModule(path=...);
#   <key>.json   its mangled name, SHA-256 and key parts, written last (the
#                commit).
# The key (key_parts, cache_key) hashes what decides the cubin, and nothing
# that only locates it on this machine, so caches built on one machine load
# on another (prebuilt caches, issue 22):
#   source           the source string: the SHA-256 of the relative paths and
#                    bytes of every file under cuda_src/, and the header;
#   options          the NVRTC options with each include path replaced by
#                    what it stands for (-I<cuda_src>, -I<cupy>/..., -I<cuda
#                    include>): cuda_src/'s contents are in `source`, CuPy's
#                    headers are CuPy's (its version is a part), and no
#                    cugemm8 source includes a file outside cuda_src/
#                    (tests/test_prebuilt_cache.py builds each header with
#                    those paths removed and gets the same cubin, up to the
#                    per-compile ids NVRTC gives internal symbols);
#   name_expression  the template instantiation;
#   cupy             CuPy's version (its options and headers);
#   nvrtc            the NVRTC release, read without loading NVRTC
#                    (nvrtc_release): the compiler is part of the cubin.
# Entries are written to temporary files and renamed into place (atomic on
# POSIX), so concurrent processes never see half an entry; a truncated or
# altered cubin fails its hash and is rebuilt.  On a miss, explain_miss
# names the key parts in which the closest entry for the same kernel differs
# (CUGEMM8_JIT_DEBUG=1 prints it; so does `cugemm8 warmup --check-cache`).

_CACHE_FORMAT = "cugemm8-cubin-2"


def cache_dir() -> Path:
    """Directory of cugemm8's kernel cache: ``$CUPY_CACHE_DIR/cugemm8``
    (CuPy's default ``~/.cupy/kernel_cache/cugemm8``)."""
    base = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return Path(base) / "cugemm8"


#: NVRTC wheels in cuda-pathfinder's search order (``nvidia/cu13/lib`` before
#: ``nvidia/cuda_nvrtc/lib``, see _device.check_nvrtc_matches_cupy): the first
#: one installed holds the NVRTC CuPy loads.
_NVRTC_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12")
_nvrtc_release: list = []
_SONAME_RE = re.compile(r"libnvrtc\.so\.(\d+\.\d+(?:\.\d+)*)$")


def _loaded_nvrtc_release() -> str:
    """Release of the NVRTC CuPy loads, asking NVRTC itself (loads it):
    ``major.minor.patch`` from the library's file name where it shows one
    (``libnvrtc.so.13.0.88`` of a toolkit), else ``major.minor``."""
    major, minor = _device.nvrtc_version()
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "libnvrtc.so" in line else ""
                m = _SONAME_RE.search(os.path.realpath(path)) if path.startswith("/") else None
                if m and m.group(1).split(".")[:2] == [str(major), str(minor)]:
                    return m.group(1)
    return f"{major}.{minor}"


def nvrtc_release(*, refresh: bool = False) -> str:
    """The NVRTC release kernels are compiled with here, e.g. ``"12.9.86"``
    (a part of the cache key).

    Read from the metadata of the NVRTC wheel CuPy loads (milliseconds;
    NVRTC itself is not loaded, so a disk hit still never touches it).
    Without such a wheel (a system CUDA toolkit, conda) NVRTC is loaded once
    per process and asked (:func:`_loaded_nvrtc_release`).  Memoised.
    """
    if _nvrtc_release and not refresh:
        return _nvrtc_release[0]
    from importlib import metadata
    release = None
    for dist in _NVRTC_WHEELS:
        try:
            release = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    if release is None:
        release = _loaded_nvrtc_release()
    _nvrtc_release[:] = [release]
    return release


def _cupy_dir() -> Path | None:
    """The cupy package's folder (None without CuPy)."""
    try:
        import cupy
        return Path(cupy.__file__).resolve().parent
    except Exception:
        return None


def portable_options(opts, root: Path | None = None) -> tuple[str, ...]:
    """``opts`` with every include path replaced by what it stands for:
    ``-I<cuda_src>`` (cugemm8's sources, hashed into the source string),
    ``-I<cupy>/<path inside the cupy package>`` or ``-I<cuda include>``
    (anything else: the CUDA headers CuPy adds, which no cugemm8 source
    includes).  Other options are kept, in order."""
    root = (cuda_src_dir() if root is None else Path(root)).resolve()
    cupy_dir = _cupy_dir()
    out = []
    for opt in opts:
        for flag in ("-I", "--include-path="):
            if opt.startswith(flag) and len(opt) > len(flag):
                path = Path(opt[len(flag):]).resolve()
                if path == root:
                    opt = f"{flag}<cuda_src>"
                elif cupy_dir is not None and path.is_relative_to(cupy_dir):
                    opt = f"{flag}<cupy>/{path.relative_to(cupy_dir).as_posix()}"
                else:
                    opt = f"{flag}<cuda include>"
                break
        out.append(opt)
    return tuple(out)


def key_parts(src: str, opts, name_expr: str, *, cupy_version: str, nvrtc_version: str,
              root: Path | None = None) -> dict:
    """What a cache key is made of (stored in each entry's JSON record)."""
    return {"format": _CACHE_FORMAT, "source": src, "options": list(portable_options(opts, root)),
            "name_expression": name_expr, "cupy": cupy_version, "nvrtc": nvrtc_version}


def cache_key(parts: dict) -> str:
    """SHA-256 of :func:`key_parts`' dictionary."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _key_here(cupy, src: str, opts, name_expr: str) -> tuple[dict, str]:
    """(parts, key) of a build in this process: the one function the loader,
    :func:`prebuild` and :func:`lookup` compute keys with."""
    parts = key_parts(src, opts, name_expr, cupy_version=cupy.__version__, nvrtc_version=nvrtc_release())
    return parts, cache_key(parts)


def _short(part: str, value) -> str:
    if part == "source":
        m = re.search(r"sha256=([0-9a-f]{12})", str(value))
        header = re.search(r'#include "([^"]+)"', str(value))
        if m:
            return f"cuda_src {m.group(1)}..." + (f", {header.group(1)}" if header else "")
        return repr(value)[:60]
    return str(value)


def explain_miss(directory: Path, parts: dict) -> str:
    """One line: why no valid entry in ``directory`` matches ``parts`` (the
    key parts in which the closest entry for the same kernel differs)."""
    key = cache_key(parts)
    if (directory / f"{key}.json").is_file():
        if not (directory / f"{key}.cubin").is_file():
            return (f"the entry's record {key}.json is there but not its .cubin (copied without the "
                    "*.cubin files? .gitignore ignores them)")
        return "an entry with this key exists but is unreadable or fails its SHA-256 check (it is rebuilt)"
    metas = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            metas.append(json.loads(path.read_text()))
    same = [m for m in metas if isinstance(m, dict) and m.get("name_expression") == parts["name_expression"]]
    if not same:
        return f"no entry for this kernel among the {len(metas)} entries in {directory}"

    def differing(meta):
        there = meta.get("key") or {"format": meta.get("format")}
        return [p for p in parts if there.get(p) != parts[p]]

    best = min(same, key=lambda m: len(differing(m)))
    there = best.get("key") or {"format": best.get("format")}
    notes = []
    for p in differing(best):
        if p == "options":
            here_o, there_o = parts[p], there.get(p) or []
            extra = [o for o in here_o if o not in there_o]
            missing = [o for o in there_o if o not in here_o]
            notes.append(f"options (here only: {' '.join(extra) or '-'}; entry only: {' '.join(missing) or '-'})")
        else:
            notes.append(f"{p} (here {_short(p, parts[p])}, entry {_short(p, there.get(p))})")
    return (f"{len(same)} entr{'y' if len(same) == 1 else 'ies'} for this kernel; the closest differs in "
            + "; ".join(notes))


def _read_entry(directory: Path, key: str):
    """``(cubin path, mangled name)`` of a valid entry, else None."""
    meta_path, cubin_path = directory / f"{key}.json", directory / f"{key}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        data = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("format") != _CACHE_FORMAT or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return None
    return cubin_path, meta["mangled"]


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_entry(directory: Path, key: str, cubin: bytes, mangled: str, name_expr: str,
                 parts: dict | None = None, **info) -> Path:
    """Write one entry (cubin first, then its JSON record: the commit).
    ``parts`` (the key's :func:`key_parts`) and ``info`` go into the record."""
    directory.mkdir(parents=True, exist_ok=True)
    cubin_path = directory / f"{key}.cubin"
    _write_atomic(cubin_path, cubin)
    meta = {"format": _CACHE_FORMAT, "mangled": mangled, "sha256": hashlib.sha256(cubin).hexdigest(),
            "name_expression": name_expr, **info}
    if parts is not None:
        meta["key"] = parts
    _write_atomic(directory / f"{key}.json", json.dumps(meta).encode())
    return cubin_path


def _load(cupy, cubin_path: Path, mangled: str):
    kern = cupy.RawModule(path=str(cubin_path)).get_function(mangled)
    kern.attributes  # load now (inside the timed region), and fail here if the driver refuses it
    return kern


def disk_cache_enabled() -> bool:
    """False under ``CUGEMM8_DISABLE_CACHE=1`` or CuPy's own
    ``CUPY_CACHE_IN_MEMORY=1`` (read at each build, as CuPy reads it)."""
    return not (_env.DISABLE_CACHE or _env._flag("CUPY_CACHE_IN_MEMORY"))


def _compile_cubin(cupy, src: str, opts, name_expr: str) -> tuple[bytes, str, dict]:
    """(cubin, mangled name, record info) of one NVRTC build: the step a
    disk-cache miss and :func:`prebuild` share."""
    _device.check_nvrtc_matches_cupy()
    try:
        cubin, _, lowered = _nvrtc_compile(src, opts, [name_expr], "cubin")
    except RuntimeError as exc:
        raise cupy.cuda.compiler.CompileException(str(exc), src, "cugemm8.cu", opts, "nvrtc") from None
    with _locks_guard:
        stats.compiles += 1
    loaded = ".".join(map(str, _device.nvrtc_version()))
    if _env.JIT_DEBUG and not nvrtc_release().startswith(loaded + ".") and nvrtc_release() != loaded:
        print(f"[cugemm8.jit] note: the key says NVRTC {nvrtc_release()} but NVRTC {loaded} is loaded",
              file=sys.stderr)
    return cubin, lowered[name_expr], {"nvrtc_loaded": loaded}


def _load_or_compile(cupy, src: str, name_expr: str):
    """``(kernel, how)``: the kernel from cugemm8's disk cache (``how`` is
    ``"disk"``), or compiled with NVRTC (``"compiled"``) and cached when
    :func:`disk_cache_enabled`.

    The key (:func:`key_parts`) carries the NVRTC release, read from its
    wheel's metadata: a hit still loads no NVRTC, and a new NVRTC rebuilds
    (an entry of the old one stays on disk until :func:`cache_dir` is
    cleaned)."""
    opts = nvrtc_options()
    parts, key = _key_here(cupy, src, opts, name_expr)
    directory = cache_dir()
    use_disk = disk_cache_enabled()
    if use_disk:
        hit = _read_entry(directory, key)
        if hit is not None:
            try:
                kern = _load(cupy, *hit)
                with _locks_guard:
                    stats.disk_hits += 1
                return kern, "disk"
            except cupy.cuda.driver.CUDADriverError:
                pass   # e.g. a cubin a newer NVRTC wrote for an older driver: rebuild below
        elif _env.JIT_DEBUG:
            print(f"[cugemm8.jit] disk-cache miss for {name_expr}: {explain_miss(directory, parts)}",
                  file=sys.stderr)
    cubin, mangled, info = _compile_cubin(cupy, src, opts, name_expr)
    if not use_disk:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            return _load(cupy, path, mangled), "compiled"
    return _load(cupy, _write_entry(directory, key, cubin, mangled, name_expr, parts, **info), mangled), "compiled"


@dataclasses.dataclass
class PrebuildResult:
    """What :func:`prebuild` did for one kernel."""
    name_expr: str
    path: Path               # the entry's cubin
    status: str              # "compiled", or "cached" (a valid entry was there)
    seconds: float
    size: int                # cubin bytes


def lookup(header: str, name_expr: str) -> tuple[dict, str, tuple | None]:
    """``(key parts, key, hit)`` for ``name_expr`` in :func:`cache_dir`, as
    the loader computes them (no GPU, no NVRTC); ``hit`` is ``(cubin path,
    mangled name)`` of a valid entry, else None (see :func:`explain_miss`)."""
    import cupy
    parts, key = _key_here(cupy, build_source(header), nvrtc_options(), name_expr)
    return parts, key, _read_entry(cache_dir(), key)


def prebuild(header: str, name_expr: str) -> PrebuildResult:
    """Compile ``name_expr`` into the disk cache without a GPU.

    Same source, options, key and entry format as a disk-cache miss of
    :func:`get_kernel`, so a GPU process with the same cugemm8 sources, CuPy
    version and NVRTC release loads the entry without compiling, wherever
    the cache directory was built (``cugemm8 warmup --compile-only``).  A
    valid entry already there is kept.  Needs CuPy and NVRTC, not a GPU;
    raises ``cupy.cuda.compiler.CompileException`` on a compile error.
    """
    import cupy
    t0 = time.perf_counter()
    src, opts = build_source(header), nvrtc_options()
    parts, key = _key_here(cupy, src, opts, name_expr)
    directory = cache_dir()
    hit = _read_entry(directory, key)
    if hit is not None:
        return PrebuildResult(name_expr, hit[0], "cached", time.perf_counter() - t0, hit[0].stat().st_size)
    cubin, mangled, info = _compile_cubin(cupy, src, opts, name_expr)
    path = _write_entry(directory, key, cubin, mangled, name_expr, parts, **info)
    return PrebuildResult(name_expr, path, "compiled", time.perf_counter() - t0, len(cubin))


def get_kernel(header: str, name_expr: str, *, max_dynamic_smem: int = 0, smem_carveout: int | None = None):
    """Return a ``cupy.RawKernel`` for ``name_expr`` declared in ``header``.

    Compiled (or loaded from CuPy's disk cache) on first use per device;
    later calls are a dictionary lookup.  ``max_dynamic_smem`` raises the
    kernel's opt-in dynamic shared-memory limit (bytes); ``smem_carveout``
    sets its preferred shared-memory carveout (percent of the unified
    L1 / shared memory, 100: the most shared memory), both at the first load.

    Raises :class:`cugemm8.DeviceError` when no Hopper GPU / NVRTC is usable
    and ``cupy.cuda.compiler.CompileException`` on a compile error.
    """
    device_id = _device.require_hopper()
    key = (device_id, header, name_expr)
    kern = _kernels.get(key)
    if kern is not None:
        stats.hits += 1
        return kern
    with _lock_for(key):
        kern = _kernels.get(key)
        if kern is not None:
            return kern
        import cupy
        t0 = time.perf_counter()
        src = build_source(header)
        if _env.DUMP_DIR:
            _dump(header, name_expr, src, compile_options())
        kern, how = _load_or_compile(cupy, src, name_expr)
        if max_dynamic_smem:
            kern.max_dynamic_shared_size_bytes = max_dynamic_smem
        if smem_carveout is not None:
            kern.preferred_shared_memory_carveout = smem_carveout
        dt = time.perf_counter() - t0
        with _locks_guard:
            stats.builds += 1
            stats.seconds += dt
        if _env.JIT_DEBUG:
            print(f"[cugemm8.jit] {name_expr}: {'loaded from disk' if how == 'disk' else 'compiled'} "
                  f"in {dt * 1e3:.1f} ms "
                  f"(regs={kern.num_regs}, local={kern.local_size_bytes} B)",
                  file=sys.stderr)
        if _env.PTXAS_VERBOSE:
            # A second, report-only NVRTC pass with -Xptxas=-v (same options).
            print(compile_only(header, [name_expr]).log.replace("\0", ""), file=sys.stderr)
        _kernels[key] = kern
        return kern


def _dump(header: str, name_expr: str, src: str, opts) -> None:
    os.makedirs(_env.DUMP_DIR, exist_ok=True)
    tag = hashlib.sha1(name_expr.encode()).hexdigest()[:12]
    with open(os.path.join(_env.DUMP_DIR, f"{tag}.txt"), "w") as f:
        f.write(f"// {name_expr}\n// options: {' '.join(opts)}\n{src}")
    try:
        rep = compile_only(header, [name_expr], sass=False)
        with open(os.path.join(_env.DUMP_DIR, f"{tag}.ptx"), "w") as f:
            f.write(rep.ptx)
        with open(os.path.join(_env.DUMP_DIR, f"{tag}.log"), "w") as f:
            f.write(rep.log)
    except Exception as exc:  # a dump must never break a launch
        print(f"[cugemm8.jit] dump failed: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------
# Compile-only path (no GPU): resources and SASS
# --------------------------------------------------------------------------

@dataclasses.dataclass
class KernelResources:
    name: str                 # mangled name
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    smem_static: int


@dataclasses.dataclass
class CompileReport:
    log: str                                # NVRTC + ptxas log
    ptx: str
    lowered: dict                           # name expression -> mangled name
    resources: dict                         # mangled name -> KernelResources
    warnings: list                          # ptxas warning lines
    seconds: float
    sass: str | None = None


_RES_RE = re.compile(
    r"Compiling entry function '(?P<name>[^']+)'.*?"
    r"(?P<stack>\d+) bytes stack frame, (?P<ss>\d+) bytes spill stores, "
    r"(?P<sl>\d+) bytes spill loads.*?Used (?P<regs>\d+) registers"
    r"(?:.*?(?P<smem>\d+) bytes smem)?", re.S)


def parse_ptxas_report(log: str) -> dict:
    """Per-kernel registers, stack frame and spills from a ``ptxas -v`` log."""
    out = {}
    for chunk in re.split(r"(?=ptxas info\s*: Compiling entry function)", log):
        m = _RES_RE.search(chunk)
        if m:
            out[m["name"]] = KernelResources(
                m["name"], int(m["regs"]), int(m["stack"]), int(m["ss"]),
                int(m["sl"]), int(m["smem"] or 0))
    return out


def _nvrtc_compile(src: str, opts: tuple, names, want: str):
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(src, "cugemm8.cu", (), ())
    try:
        for ne in names:
            nvrtc.addNameExpression(prog, ne)
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise RuntimeError(f"NVRTC failed ({exc}):\n{log}") from None
        log = nvrtc.getProgramLog(prog)
        lowered = {ne: nvrtc.getLoweredName(prog, ne) for ne in names}
        data = nvrtc.getPTX(prog) if want == "ptx" else nvrtc.getCUBIN(prog)
        return data, log, lowered
    finally:
        nvrtc.destroyProgram(prog)


def _wheel_tool_dirs() -> list[tuple[str, int]]:
    """``(bin folder, CUDA major)`` of the NVIDIA pip wheels on ``sys.path``.

    CUDA 13 wheels share ``nvidia/cu13/bin`` (nvidia-cuda-nvcc, -cuobjdump,
    -nvdisasm); CUDA 12 wheels are splayed, ptxas being in
    nvidia-cuda-nvcc-cu12's ``nvidia/cuda_nvcc/bin``.
    """
    found, seen = [], set()
    for sp in sys.path:
        root = os.path.join(sp or os.curdir, "nvidia")
        if not os.path.isdir(root):
            continue
        for sub in sorted(os.listdir(root)):
            m = re.fullmatch(r"cu(\d+)", sub)
            major = int(m.group(1)) if m else 12 if sub == "cuda_nvcc" else None
            path = os.path.realpath(os.path.join(root, sub, "bin"))
            if major is not None and path not in seen and os.path.isdir(path):
                seen.add(path)
                found.append((path, major))
    return sorted(found, key=lambda dm: -dm[1])         # newest CUDA first


def find_tool(name: str) -> str | None:
    """Path of a CUDA binary tool (``ptxas``, ``cuobjdump``, ``nvdisasm``), or None.

    The first executable found, in this order:

    1. the NVIDIA wheels of this environment of the CUDA major of the NVRTC
       CuPy loads (the ``test`` extra's nvidia-cuda-nvcc-cu12 puts ptxas 12.9
       beside NVRTC 12.9, so the SASS checks see what the JIT builds);
    2. ``PATH``;
    3. ``$CUDA_PATH/bin``, ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``;
    4. NVIDIA wheels of a newer CUDA major (cuobjdump / nvdisasm exist only as
       CUDA 13 wheels, and read CUDA 12 cubins).  Wheels of an older major
       are skipped: an older ptxas rejects the newer PTX ISA.
    """
    try:
        nvrtc_major = _device.nvrtc_version()[0]
    except Exception:       # no CuPy / NVRTC: any wheel will do
        nvrtc_major = None
    wheels = _wheel_tool_dirs()
    dirs = [d for d, major in wheels if nvrtc_major in (None, major)]
    found = shutil.which(name)
    if found:
        dirs.append(os.path.dirname(found))
    dirs += [os.path.join(os.environ[v], "bin") for v in ("CUDA_PATH", "CUDA_HOME")
             if os.environ.get(v)]
    dirs.append("/usr/local/cuda/bin")
    dirs += [d for d, major in wheels if nvrtc_major is not None and major > nvrtc_major]
    for d in dirs:
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def compile_only(header: str, name_exprs, *, sass: bool = False,
                 root: Path | None = None) -> CompileReport:
    """Compile ``name_exprs`` for sm_90a without a GPU and report resources.

    NVRTC runs with the options a launch uses (plus ``-Xptxas=-v``), so the
    register / stack / spill report is the one of the real build.  With
    ``sass=True`` the PTX is also assembled by ``ptxas -arch=sm_90a`` and
    disassembled by ``cuobjdump -sass`` (cuobjdump 13 cannot read the ELF-ABI-v7 cubins NVRTC 12.9 writes,
    so the ptxas output is disassembled).
    """
    names = list(name_exprs)
    src = build_source(header, root)
    opts = nvrtc_options(root)
    t0 = time.perf_counter()
    _, log, lowered = _nvrtc_compile(src, opts + ("-Xptxas=-v",), names, "cubin")
    dt = time.perf_counter() - t0
    ptx, _, _ = _nvrtc_compile(
        src, tuple(o for o in opts if o != "-arch=sm_90") + ("-arch=compute_90a",), names, "ptx")
    if isinstance(ptx, bytes):
        ptx = ptx.decode()
    # ptxas reports some performance problems (e.g. C7514/C7515, WGMMA
    # serialisation) as "info" lines: collect those too.
    warnings = [ln for ln in log.replace("\0", "").splitlines()
                if "warning" in ln.lower() or "performance loss" in ln.lower()]
    rep = CompileReport(log=log, ptx=ptx, lowered=lowered,
                        resources=parse_ptxas_report(log), warnings=warnings, seconds=dt)
    if sass:
        rep.sass = disassemble_ptx(ptx)
    return rep


def disassemble_ptx(ptx: str) -> str:
    ptxas, cuobjdump = find_tool("ptxas"), find_tool("cuobjdump")
    if ptxas is None or cuobjdump is None:
        raise FileNotFoundError(
            f"ptxas ({ptxas}) and cuobjdump ({cuobjdump}) are needed for SASS; "
            "install the CUDA toolkit or the nvidia-cuda-cuobjdump wheel")
    with tempfile.TemporaryDirectory() as tmp:
        p_ptx, p_cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(p_ptx, "w") as f:
            f.write(ptx)
        subprocess.run([ptxas, "-arch=sm_90a", p_ptx, "-o", p_cubin],
                       check=True, capture_output=True, text=True)
        return disassemble_cubin(p_cubin)


def disassemble_cubin(path: str) -> str:
    """``cuobjdump -sass`` of the cubin at ``path`` (any cubin: cugemm8's or
    another library's, e.g. DeepGEMM's JIT cache for tools/perf/sass_loop_count.py)."""
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        raise FileNotFoundError("cuobjdump is needed for SASS; install the CUDA toolkit or the "
                                "nvidia-cuda-cuobjdump wheel")
    # cuobjdump runs nvdisasm, which the wheels install beside it.
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
    res = subprocess.run([cuobjdump, "-sass", path], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()}")
    return res.stdout
