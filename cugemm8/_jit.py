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
#   <key>.json   its mangled name and SHA-256, written last (the commit).
# The key hashes the source string (which carries the SHA-256 of cuda_src/),
# the options (CuPy's include paths included), the name expression and the
# CuPy version.  Entries are written to temporary files and renamed into
# place (atomic on POSIX), so concurrent processes never see half an entry;
# a truncated or altered cubin fails its hash and is rebuilt.

_CACHE_FORMAT = "cugemm8-cubin-1"


def cache_dir() -> Path:
    """Directory of cugemm8's kernel cache: ``$CUPY_CACHE_DIR/cugemm8``
    (CuPy's default ``~/.cupy/kernel_cache/cugemm8``)."""
    base = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return Path(base) / "cugemm8"


def cache_key(src: str, opts, name_expr: str, cupy_version: str) -> str:
    h = hashlib.sha256()
    for part in (_CACHE_FORMAT, src, "\0".join(opts), name_expr, cupy_version):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


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


def _write_entry(directory: Path, key: str, cubin: bytes, mangled: str, name_expr: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cubin_path = directory / f"{key}.cubin"
    _write_atomic(cubin_path, cubin)
    meta = {"format": _CACHE_FORMAT, "mangled": mangled, "sha256": hashlib.sha256(cubin).hexdigest(),
            "name_expression": name_expr}
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


def _load_or_compile(cupy, src: str, name_expr: str):
    """The kernel from cugemm8's disk cache, or compiled with NVRTC (and
    cached when :func:`disk_cache_enabled`).

    The key holds no NVRTC version (reading it would load NVRTC on every
    warm start): a cached cubin stays valid sm_90a code under another NVRTC,
    so an NVRTC upgrade alone keeps using it.  Remove :func:`cache_dir` to
    rebuild everything with the new compiler."""
    opts = nvrtc_options()
    key = cache_key(src, opts, name_expr, cupy.__version__)
    directory = cache_dir()
    use_disk = disk_cache_enabled()
    if use_disk:
        hit = _read_entry(directory, key)
        if hit is not None:
            try:
                return _load(cupy, *hit)
            except cupy.cuda.driver.CUDADriverError:
                pass   # e.g. a cubin a newer NVRTC wrote for an older driver: rebuild below
    _device.check_nvrtc_matches_cupy()
    try:
        cubin, _, lowered = _nvrtc_compile(src, opts, [name_expr], "cubin")
    except RuntimeError as exc:
        raise cupy.cuda.compiler.CompileException(str(exc), src, "cugemm8.cu", opts, "nvrtc") from None
    mangled = lowered[name_expr]
    if not use_disk:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
            return _load(cupy, path, mangled)
    return _load(cupy, _write_entry(directory, key, cubin, mangled, name_expr), mangled)


def get_kernel(header: str, name_expr: str, *, max_dynamic_smem: int = 0):
    """Return a ``cupy.RawKernel`` for ``name_expr`` declared in ``header``.

    Compiled (or loaded from CuPy's disk cache) on first use per device;
    later calls are a dictionary lookup.  ``max_dynamic_smem`` raises the
    kernel's opt-in dynamic shared-memory limit (bytes).

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
        kern = _load_or_compile(cupy, src, name_expr)
        if max_dynamic_smem:
            kern.max_dynamic_shared_size_bytes = max_dynamic_smem
        dt = time.perf_counter() - t0
        with _locks_guard:
            stats.builds += 1
            stats.seconds += dt
        if _env.JIT_DEBUG:
            print(f"[cugemm8.jit] {name_expr}: built in {dt * 1e3:.1f} ms "
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


def find_tool(name: str) -> str | None:
    """Locate ``ptxas`` / ``cuobjdump``: PATH, CUDA_HOME, /usr/local/cuda, pip wheels."""
    found = shutil.which(name)
    if found:
        return found
    cands = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name),
             os.path.join("/usr/local/cuda/bin", name)]
    for sp in sys.path:
        for sub in ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin", "nvidia/cu12/bin"):
            cands.append(os.path.join(sp, sub, name))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
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
        # cuobjdump runs nvdisasm, which the wheels install beside it.
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
        res = subprocess.run([cuobjdump, "-sass", p_cubin], env=env,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()}")
        return res.stdout
