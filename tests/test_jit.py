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


def test_cache_key_covers_source_options_name_and_cupy():
    base = ("src", ("-a", "-b"), "k<1>", "14.2")
    key = _jit.cache_key(*base)
    for i, alt in enumerate(("src2", ("-a",), "k<2>", "14.3")):
        args = list(base)
        args[i] = alt
        assert _jit.cache_key(*args) != key


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
