"""Prebuilt kernel caches (issue 22): ``cugemm8 warmup --compile-only`` on a
machine without a GPU writes the disk-cache entries a GPU process loads
without compiling.  Compiles one GEMM kernel and the twelve quantisers
(about 10 s on two cores)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cugemm8 import _jit
from tests.test_jit import run_fake_loader

pytestmark = pytest.mark.compile

REPO = Path(__file__).resolve().parent.parent
SHAPE = ("normal", 128, 7168, 2048)


def _env(cache_dir) -> dict:
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    env.pop("CUGEMM8_DISABLE_CACHE", None)
    env.pop("CUPY_CACHE_IN_MEMORY", None)
    return env


def _gemm_name() -> str:
    from cugemm8 import _config, gemm
    kind, m, n, k = SHAPE
    cfg = _config.select_config(kind, m, n, k, num_sms=132)
    return gemm._kernel_name(cfg, n, k, gemm._GEMM_TYPE[kind], 1)


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """A cache built by ``cugemm8 warmup --compile-only`` from a text shapes file."""
    root = tmp_path_factory.mktemp("prebuilt")
    shapes = root / "shapes.txt"
    shapes.write_text("# kind m n k\n" + " ".join(map(str, SHAPE)) + "\n")
    res = subprocess.run([sys.executable, "-m", "cugemm8", "warmup", "--compile-only", "--shapes", str(shapes)],
                         env=_env(root / "cache"), capture_output=True, text=True, timeout=600, cwd=str(REPO))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return root / "cache", shapes, res


def test_compile_only_writes_one_entry_per_kernel(prebuilt):
    cache, _, res = prebuilt
    from cugemm8 import quant
    assert "29 of 29 kernels written to" in res.stdout, res.stdout
    metas = [json.loads(p.read_text()) for p in (cache / "cugemm8").glob("*.json")]
    assert sorted(m["name_expression"] for m in metas) == sorted([_gemm_name(), *quant.all_kernel_names()])
    for meta in metas:
        key = meta["key"]
        assert (cache / "cugemm8" / f"{_jit.cache_key(key)}.cubin").is_file()
        assert key["nvrtc"] == _jit.nvrtc_release() and key["format"] == _jit._CACHE_FORMAT
        # nothing in the key says where this machine keeps its files
        text = json.dumps(key)
        assert str(REPO) not in text and "site-packages" not in text, text
    # progress went to stderr, one line per kernel when not on a terminal
    assert res.stderr.count("compiled, ") == 29, res.stderr


def test_second_process_loads_them_without_compiling(prebuilt):
    """The GPU loader's own key computation and disk path, run in a new
    process (RawModule stubbed, NVRTC forbidden): every kernel is a hit."""
    from cugemm8 import quant
    cache, _, _ = prebuilt
    kernels = [["fp8_gemm_1d2d.cuh", _gemm_name()]] + [["quant.cuh", n] for n in quant.all_kernel_names()]
    got = run_fake_loader(cache, kernels)
    assert got["how"] == ["disk"] * len(kernels) and got["compiles"] == 0, got
    assert all(Path(path).parent == cache / "cugemm8" for path, _ in got["loaded"])


def test_check_cache_and_a_second_compile_only_run(prebuilt):
    cache, shapes, _ = prebuilt
    res = subprocess.run([sys.executable, "-m", "cugemm8", "warmup", "--check-cache", "--shapes", str(shapes)],
                         env=_env(cache), capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert res.returncode == 0 and "29 of 29 kernels" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([sys.executable, "-m", "cugemm8", "warmup", "--compile-only", "--shapes", str(shapes)],
                         env=_env(cache), capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert res.returncode == 0 and res.stdout.count("cached, ") == 29, res.stdout


def test_check_cache_names_the_nvrtc_mismatch(prebuilt, monkeypatch, capsys):
    """A machine with another NVRTC: every kernel misses, and the report says
    which key part differs."""
    from cugemm8 import cli
    cache, shapes, _ = prebuilt
    monkeypatch.setenv("CUPY_CACHE_DIR", str(cache))
    here = _jit.nvrtc_release()
    monkeypatch.setattr(_jit, "_nvrtc_release", ["99.1.2"])
    assert cli.main(["warmup", "--check-cache", "--shapes", str(shapes), "--num-sms", "132"]) == 1
    out = capsys.readouterr().out
    assert "0 of 29 kernels" in out and f"nvrtc (here 99.1.2, entry {here})" in out, out


def test_cubin_does_not_depend_on_the_other_include_paths():
    """Why the key leaves the contents of CuPy's and CUDA's include folders
    out: no cugemm8 source includes from them, so each header builds to the
    same cubin without them."""
    from cugemm8 import quant
    root = str(_jit.cuda_src_dir())
    full = _jit.nvrtc_options()
    bare = tuple(o for o in full if not o.startswith("-I") or o == f"-I{root}")
    assert len(bare) < len(full)
    # NVRTC names internal-linkage symbols after a per-compile id and the
    # process (_INTERNAL_00000000_10_cugemm8_cu_edb7100a_8377...): two builds
    # in one process differ in those eight hex digits only.
    internal = re.compile(rb"(_INTERNAL_[0-9a-f]{8}_\d+_cugemm8_cu_)[0-9a-f]{8}")
    for header, name in (("quant.cuh", quant.kernel_name("per_token", "bfloat16", False)),
                         ("fp8_gemm_1d2d.cuh", _gemm_name())):
        src = _jit.build_source(header)
        a, _, _ = _jit._nvrtc_compile(src, full, [name], "cubin")
        b, _, _ = _jit._nvrtc_compile(src, bare, [name], "cubin")
        assert internal.sub(rb"\1xxxxxxxx", a) == internal.sub(rb"\1xxxxxxxx", b), header
