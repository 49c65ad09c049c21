"""JIT layer: cache keys cover every source byte; a second process loads from
the disk cache without compiling (GPU)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from cugemm8 import _jit


def test_source_carries_tree_hash():
    src = _jit.build_source("fp8_gemm_1d2d.cuh")
    assert _jit.source_hash() in src
    assert '#include "fp8_gemm_1d2d.cuh"' in src


def test_editing_a_header_changes_the_key(tmp_path):
    root = tmp_path / "cuda_src"
    shutil.copytree(_jit.cuda_src_dir(), root)
    before = _jit.source_hash(root, refresh=True)
    nested = root / "ptx" / "sync.cuh"
    nested.write_text(nested.read_text() + "\n// edited\n")
    after = _jit.source_hash(root, refresh=True)
    assert before != after
    assert _jit.build_source("x.cuh", root) != _jit.build_source("x.cuh", _jit.cuda_src_dir())


def test_renaming_a_file_changes_the_key(tmp_path):
    root = tmp_path / "cuda_src"
    shutil.copytree(_jit.cuda_src_dir(), root)
    before = _jit.source_hash(root, refresh=True)
    (root / "scheduler.cuh").rename(root / "scheduler2.cuh")
    assert _jit.source_hash(root, refresh=True) != before


def test_ptxas_report_parser():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
        ptxas info    : Function properties for _Z3fooPf
            8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
        ptxas info    : Used 42 registers, used 1 barriers, 16 bytes smem
        """)
    r = _jit.parse_ptxas_report(log)["_Z3fooPf"]
    assert (r.registers, r.stack_frame, r.spill_stores, r.spill_loads, r.smem_static) == (42, 8, 4, 4, 16)


@pytest.mark.gpu
def test_second_process_loads_from_disk_cache(tmp_path):
    """Process 1 compiles into an empty CUPY_CACHE_DIR; process 2 must load the
    same kernel without a single NVRTC compile."""
    script = textwrap.dedent("""
        import sys
        from cugemm8 import _config, _jit, gemm
        calls = []
        real = _jit._nvrtc_compile
        def counting(*a, **k):   # the JIT's compile step on a disk-cache miss
            calls.append(1)
            return real(*a, **k)
        _jit._nvrtc_compile = counting
        cfg = _config.select_config("normal", 64, 2112, 7168, num_sms=132)
        name = gemm._kernel_name(cfg, 2112, 7168, 0, 1)
        _jit.get_kernel("fp8_gemm_1d2d.cuh", name)
        print(len(calls))
        """)
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CUGEMM8_DISABLE_CACHE", None)
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert int(first.stdout.split()[-1]) >= 1
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert int(second.stdout.split()[-1]) == 0, "the second process compiled instead of loading the cache"


@pytest.mark.gpu
def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    script = textwrap.dedent("""
        from cugemm8 import _config, _jit, gemm
        cfg = _config.select_config("normal", 64, 4096, 7168, num_sms=132)
        k = _jit.get_kernel("fp8_gemm_1d2d.cuh", gemm._kernel_name(cfg, 4096, 7168, 0, 1))
        print(k.num_regs)
        """)
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"))
    assert subprocess.run([sys.executable, "-c", script], env=env, capture_output=True).returncode == 0
    for f in (tmp_path / "cache").rglob("*.cubin"):
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])          # truncate
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.gpu
def test_threads_building_one_kernel_get_one_module():
    import threading
    from cugemm8 import _config, gemm
    cfg = _config.make_config("normal", 128, 120, 4, 896, num_sms=132)
    name = gemm._kernel_name(cfg, 1000, 896, 0, 1)
    before = _jit.stats.builds
    got, errors = [], []

    def work():
        try:
            got.append(_jit.get_kernel("fp8_gemm_1d2d.cuh", name))
        except Exception as exc:       # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({id(k) for k in got}) == 1
    assert _jit.stats.builds == before + 1


@pytest.mark.gpu
def test_processes_compiling_one_kernel_at_once(tmp_path):
    """Four processes build the same kernel into one empty cache at once: all
    succeed and the cache ends with a loadable entry (CuPy writes atomically)."""
    script = textwrap.dedent("""
        from cugemm8 import _config, _jit, gemm
        cfg = _config.make_config("normal", 64, 40, 6, 1040, num_sms=132)
        k = _jit.get_kernel("fp8_gemm_1d2d.cuh", gemm._kernel_name(cfg, 520, 1040, 0, 1))
        print(k.num_regs)
        """)
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    again = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def _parts(**over):
    base = dict(src=_jit.build_source("fp8_gemm_1d2d.cuh"), opts=("-arch=sm_90a", "-DNDEBUG"),
                name_expr="k<1>", cupy_version="14.2.0", nvrtc_version="12.9.86")
    base.update(over)
    src, opts, name = base.pop("src"), base.pop("opts"), base.pop("name_expr")
    return _jit.key_parts(src, opts, name, **base)


def test_cache_key_covers_source_options_name_cupy_and_nvrtc():
    key = _jit.cache_key(_parts())
    assert key == _jit.cache_key(_parts())
    for over in ({"src": "src2"}, {"opts": ("-arch=sm_90a",)}, {"opts": ("-DNDEBUG", "-arch=sm_90a")},
                 {"name_expr": "k<2>"}, {"cupy_version": "14.3.0"}, {"nvrtc_version": "12.9.41"},
                 {"nvrtc_version": "13.0.88"}):
        assert _jit.cache_key(_parts(**over)) != key, over


def _machine_options(cupy_dir, cuda_include, root):
    """The shape of nvrtc_options() on one machine (CuPy 14.2)."""
    return (f"-I{cupy_dir}/_core/include/cupy/_cccl/cub", f"-I{cupy_dir}/_core/include/cupy/_cccl/thrust",
            "-arch=sm_90a", "--std=c++17", f"-I{root}", "-DNDEBUG", f"-I{cupy_dir}/_core/include",
            f"-I{cuda_include}", "-ftz=true", "-arch=sm_90", "--device-as-default-execution-space")


def test_cache_key_ignores_where_things_are_installed(tmp_path, monkeypatch):
    """Same sources, CuPy and NVRTC on two machines with different install
    paths give the same key (a prebuilt cache loads); editing a header, or
    another CuPy / NVRTC, does not."""
    here, there = tmp_path / "here", tmp_path / "there"
    roots = []
    for base in (here, there):
        shutil.copytree(_jit.cuda_src_dir(), base / "cugemm8" / "cuda_src")
        roots.append(base / "cugemm8" / "cuda_src")

    def key_on(base, root, **over):
        cupy_dir = base / "site-packages" / "cupy"
        monkeypatch.setattr(_jit, "_cupy_dir", lambda: cupy_dir)
        opts = _machine_options(cupy_dir, base / "site-packages" / "nvidia" / "cu13" / "include", root)
        src = _jit.build_source("fp8_gemm_1d2d.cuh", root)
        parts = _jit.key_parts(src, opts, "k<1>", **{"cupy_version": "14.2.0", "nvrtc_version": "13.0.88",
                                                     **over}, root=root)
        return _jit.cache_key(parts), parts

    key_here, parts = key_on(here, roots[0])
    key_there, _ = key_on(there, roots[1])
    assert key_here == key_there
    assert not any(str(tmp_path) in o for o in parts["options"]), parts["options"]
    assert "-I<cuda_src>" in parts["options"] and "-I<cupy>/_core/include" in parts["options"]
    # a system toolkit's include folder instead of the wheel's: same key
    cupy_dir = there / "site-packages" / "cupy"
    monkeypatch.setattr(_jit, "_cupy_dir", lambda: cupy_dir)
    opts = _machine_options(cupy_dir, "/usr/local/cuda-13.0/include", roots[1])
    src = _jit.build_source("fp8_gemm_1d2d.cuh", roots[1])
    assert _jit.cache_key(_jit.key_parts(src, opts, "k<1>", cupy_version="14.2.0", nvrtc_version="13.0.88",
                                         root=roots[1])) == key_here
    # a real change changes it
    assert key_on(there, roots[1], cupy_version="14.3.0")[0] != key_here
    assert key_on(there, roots[1], nvrtc_version="13.0.48")[0] != key_here
    nested = roots[1] / "ptx" / "sync.cuh"
    nested.write_text(nested.read_text() + "\n// edited\n")
    _jit.source_hash(roots[1], refresh=True)
    assert key_on(there, roots[1])[0] != key_here


def test_loader_options_name_no_path_of_this_machine():
    pytest.importorskip("cupy")
    opts = _jit.portable_options(_jit.nvrtc_options())
    assert opts and not any("/" in o.split(">", 1)[0] or os.sep + "site-packages" in o for o in opts), opts
    assert "-arch=sm_90a" in opts and "-I<cuda_src>" in opts


def test_nvrtc_release_reads_the_wheel_without_loading_nvrtc(monkeypatch):
    from importlib import metadata
    installed = {}

    def version(dist):
        if dist in installed:
            return installed[dist]
        raise metadata.PackageNotFoundError(dist)
    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(_jit, "_nvrtc_release", [])
    monkeypatch.setattr(_jit, "_loaded_nvrtc_release", lambda: "13.0")
    assert _jit.nvrtc_release(refresh=True) == "13.0"              # no wheel: ask NVRTC
    installed["nvidia-cuda-nvrtc-cu12"] = "12.9.86"
    assert _jit.nvrtc_release() == "13.0"                          # memoised
    assert _jit.nvrtc_release(refresh=True) == "12.9.86"
    installed["nvidia-cuda-nvrtc"] = "13.0.88"                     # pathfinder looks in nvidia/cu13 first
    assert _jit.nvrtc_release(refresh=True) == "13.0.88"


def test_explain_miss_names_the_differing_part(tmp_path):
    parts = _parts()
    assert "no entry for this kernel among the 0 entries" in _jit.explain_miss(tmp_path, parts)
    other = _parts(nvrtc_version="13.0.48")
    _jit._write_entry(tmp_path, _jit.cache_key(other), b"cubin", "_Z1kv", "k<1>", other)
    _jit._write_entry(tmp_path, _jit.cache_key(_parts(name_expr="k<2>")), b"cubin", "_Z1kv", "k<2>",
                      _parts(name_expr="k<2>"))
    msg = _jit.explain_miss(tmp_path, parts)
    assert msg.startswith("1 entry for this kernel") and "nvrtc (here 12.9.86, entry 13.0.48)" in msg, msg
    two = _parts(nvrtc_version="13.0.48", cupy_version="14.3.0", opts=("-arch=sm_90a",))
    _jit._write_entry(tmp_path, _jit.cache_key(two), b"cubin", "_Z1kv", "k<1>", two)
    msg = _jit.explain_miss(tmp_path, parts)
    assert "2 entries" in msg and "cupy" not in msg, msg                     # the closest one
    msg = _jit.explain_miss(tmp_path, _parts(src=_jit.build_source("quant.cuh")))
    assert "source (here cuda_src " in msg and "quant.cuh, entry cuda_src" in msg, msg
    msg = _jit.explain_miss(tmp_path, _parts(opts=("-arch=sm_90a", "-DNDEBUG", "-G")))
    assert "options (here only: -G; entry only: -)" in msg, msg
    (tmp_path / "old.json").write_text('{"format": "cugemm8-cubin-1", "name_expression": "k<3>"}')
    assert "format (here cugemm8-cubin-2, entry cugemm8-cubin-1)" in _jit.explain_miss(
        tmp_path, _parts(name_expr="k<3>"))
    (tmp_path / f"{_jit.cache_key(other)}.cubin").unlink()
    assert "not its .cubin" in _jit.explain_miss(tmp_path, other)


_FAKE_LOADER = textwrap.dedent("""
    import json, sys, types
    import cupy
    from cugemm8 import _device, _jit
    def refuse(*a, **k):
        raise AssertionError("the loader compiled (or probed NVRTC) on a disk hit")
    _jit._nvrtc_compile = refuse
    _device.check_nvrtc_matches_cupy = refuse
    loaded = []
    class Module:
        def __init__(self, path):
            self.path = path
        def get_function(self, name):
            loaded.append((self.path, name))
            return types.SimpleNamespace(attributes={})
    fake = types.SimpleNamespace(__version__=cupy.__version__, RawModule=Module, cuda=cupy.cuda)
    out = []
    for header, name in json.loads(sys.argv[1]):
        kern, how = _jit._load_or_compile(fake, _jit.build_source(header), name)
        out.append(how)
    maps = open("/proc/self/maps").read() if sys.platform.startswith("linux") else ""
    print(json.dumps({"how": out, "loaded": loaded, "compiles": _jit.stats.compiles,
                      "disk_hits": _jit.stats.disk_hits, "nvrtc_loaded": "libnvrtc" in maps}))
    """)


def run_fake_loader(cache_dir, kernels) -> dict:
    """Run the GPU loader's disk path (``_jit._load_or_compile``) in a new
    process with a stand-in for ``cupy.RawModule`` and with NVRTC forbidden:
    what a GPU process would do with this cache, without a GPU."""
    import json
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache_dir))
    env.pop("CUGEMM8_DISABLE_CACHE", None)
    env.pop("CUPY_CACHE_IN_MEMORY", None)
    res = subprocess.run([sys.executable, "-c", _FAKE_LOADER, json.dumps(kernels)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_disk_hit_touches_no_nvrtc(tmp_path):
    """An entry written under the loader's key is loaded by a new process
    without compiling and without loading libnvrtc (no GPU: RawModule stubbed)."""
    cupy = pytest.importorskip("cupy")
    name = "cugemm8::per_token_cast_kernel<cugemm8::InDtype::kFloat32, false>"
    src = _jit.build_source("quant.cuh")
    parts, key = _jit._key_here(cupy, src, _jit.nvrtc_options(), name)
    _jit._write_entry(tmp_path / "cugemm8", key, b"\x7fELF not a real cubin", "_Zmangled", name, parts)
    got = run_fake_loader(tmp_path, [["quant.cuh", name]])
    assert got["how"] == ["disk"] and got["compiles"] == 0 and got["disk_hits"] == 1
    assert got["loaded"] == [[str(tmp_path / "cugemm8" / f"{key}.cubin"), "_Zmangled"]]
    if sys.platform.startswith("linux"):
        assert not got["nvrtc_loaded"], "a disk hit loaded libnvrtc"


def test_cache_entry_round_trip_and_corruption(tmp_path):
    path = _jit._write_entry(tmp_path, "abc", b"\x7fELF-cubin-bytes", "_Z3foov", "foo")
    assert _jit._read_entry(tmp_path, "abc") == (path, "_Z3foov")
    path.write_bytes(b"\x7fELF-cubin-byteZ")              # altered payload: a miss
    assert _jit._read_entry(tmp_path, "abc") is None
    assert _jit._read_entry(tmp_path, "missing") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert _jit._read_entry(tmp_path, "bad") is None
    assert not list(tmp_path.glob(".tmp-*")), "temporary files left behind"


def test_cache_dir_follows_cupy_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    assert _jit.cache_dir() == tmp_path / "cugemm8"
