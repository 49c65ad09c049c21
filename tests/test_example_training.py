"""examples/fp8_training_step.py: the FP8 training step (a SwiGLU MLP's
forward and backward, a MoE expert layer with the k-grouped wgrad, a tiny
regression against BF16) runs and passes its own checks: on the CPU
reference backend everywhere (``--cpu``), and on the GPU with cugemm8's
kernels and with JAX arrays (skipped without a Hopper GPU / JAX)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "examples" / "fp8_training_step.py"


def _module():
    spec = importlib.util.spec_from_file_location("fp8_training_step", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_backend_passes_its_checks(capsys):
    assert _module().main(["--cpu"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "part 3" in out


def test_cpu_layouts_match_the_gpu_backend_contract():
    """The MoE layout the example builds: every expert padded to 128 rows,
    padding rows -1, the padded counts summing to the rows."""
    m_indices, offs, padded = _module().moe_layout([150, 0, 300, 77])
    assert padded == [256, 0, 384, 128] and list(offs) == [0, 256, 256, 640, 768]
    assert len(m_indices) == 768 and (m_indices[150:256] == -1).all() and (m_indices[640:717] == 3).all()


@pytest.mark.gpu
def test_gpu_backend_passes_its_checks(capsys):
    assert _module().main([]) == 0, capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_backend_with_jax_arrays(capsys):
    pytest.importorskip("jax")
    assert _module().main(["--jax"]) == 0, capsys.readouterr().out
    assert "(JAX arrays)" in capsys.readouterr().out
