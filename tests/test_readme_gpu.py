"""The README's Python example runs as written and gives the right answer (GPU)."""
from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.gpu


def test_readme_example_runs():
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"## Example: from BF16 to BF16\n\n```python\n(.*?)```", readme, re.S).group(1)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    cp, out, x, w = ns["cp"], ns["out"], ns["x"], ns["w"]
    ref = x.astype(cp.float64) @ w.astype(cp.float64).T
    got = out.astype(cp.float64)
    # Against the unquantised product, DeepGEMM's criterion: e4m3 rounding of
    # both operands alone gives ~3.7 % relative L2 error on normal data,
    # i.e. calc_diff ~ 7e-4 (measured 6.8e-4 on the H200).
    den = float(cp.sum(got * got + ref * ref))
    calc_diff = 1.0 - 2.0 * float(cp.sum(got * ref)) / den
    assert calc_diff < 1e-3, calc_diff
    one_call = ns["cugemm8"].gemm_fp8(x, w)
    assert bool(cp.all(one_call.view(cp.uint16) == out.view(cp.uint16)))


def test_readme_training_example_runs():
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"## Example: a weight gradient in FP8 \(training\)\n\n```python\n(.*?)```", readme,
                      re.S).group(1)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    cp, dw, x, dy = ns["cp"], ns["dw"], ns["x"], ns["dy"]
    ref = dy.astype(cp.float64).T @ x.astype(cp.float64)
    got = dw.astype(cp.float64)
    den = float(cp.sum(got * got + ref * ref))
    calc_diff = 1.0 - 2.0 * float(cp.sum(got * ref)) / den
    assert calc_diff < 1e-3, calc_diff      # e4m3 rounding of both operands, as the forward example
