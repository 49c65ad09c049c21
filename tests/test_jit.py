"""JIT layer: cache keys cover every source byte; a second process loads from
CuPy's disk cache without compiling (GPU)."""
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
        import cupy.cuda.compiler as compiler
        calls = []
        real = compiler._compile_using_nvrtc_no_warning
        def counting(*a, **k):   # CuPy's compile step on a disk-cache miss
            calls.append(1)
            return real(*a, **k)
        compiler._compile_using_nvrtc_no_warning = counting
        from cugemm8 import _config, _jit, gemm
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
