"""CPU tests of tools/perf/tensor_power_probe.py: its kernels compile for
sm_90a without spills or WGMMA serialisation and issue exactly the tensor
work (and, in ``promote``, the promotion) of the GEMM's 256x128 tile that
its FLOP count assumes."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tools" / "perf"))
import tensor_power_probe as tpp  # noqa: E402


def test_flops_per_launch_is_two_warpgroups_of_two_sub_tiles():
    # 132 SMs, one K block: 2 warpgroups x 2 sub-tiles x (2 x 64 x 128 x 128).
    assert tpp.flops_per_launch(132, 1) == 132 * 4 * 2 * 64 * 128 * 128
    assert tpp.flops_per_launch(132, 10) == 10 * tpp.flops_per_launch(132, 1)
    assert tpp.SMEM_BYTES == 4 * 64 * 128 + 128 * 128 <= 48 * 1024


@pytest.fixture(scope="module")
def compiled():
    from cugemm8 import _jit
    root = _ROOT / "cuda_src"
    _, log, lowered = _jit._nvrtc_compile(tpp.SRC, ("-std=c++17", "-arch=sm_90a", f"-I{root}", "-Xptxas=-v"),
                                          tpp.names(), "cubin")
    ptx, _, _ = _jit._nvrtc_compile(tpp.SRC, ("-std=c++17", "-arch=compute_90a", f"-I{root}"), tpp.names(), "ptx")
    return log.replace("\0", ""), lowered, ptx.decode() if isinstance(ptx, bytes) else ptx


@pytest.mark.compile
def test_probe_kernels_compile_without_spills_or_serialised_wgmma(compiled):
    log, lowered, _ = compiled
    assert len(lowered) == len(tpp.PATTERNS)
    assert "0 bytes spill stores, 0 bytes spill loads" in log and "bytes spill stores" in log
    assert not re.search(r"[1-9]\d* bytes spill", log), log
    assert "performance loss" not in log.lower() and "warning" not in log.lower(), log


@pytest.mark.compile
def test_probe_sass_is_the_tiles_tensor_work(compiled, sass_tools):
    from cugemm8 import _jit
    sass = _jit.disassemble_ptx(compiled[2])
    bodies = {body.splitlines()[0].strip(): body for body in re.split(r"\n\s*Function : ", sass)[1:]}
    assert len(bodies) == 2
    for name, body in bodies.items():
        # two sub-tiles x four k32 WGMMAs per K block, m64n128k32 e4m3
        assert body.count("QGMMA.64x128x32") == 8, name
        promote = "Lj1E" in name
        # promote: one FMA per accumulator of each sub-tile (2 x 64), chain none in its loop
        assert (body.count("FFMA") >= 128) == promote, name
        # chain: one wait, after its loop; promote: one per sub-tile, in its loop
        assert body.count("WARPGROUP.DEPBAR") == (2 if promote else 1), name
