"""The README's "Getting started on a CPU" example runs as written, with CuPy
out of reach (CPU only)."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _cpu_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Getting started on a CPU\n(.*?)(?=^## )", readme, re.S | re.M)
    assert section, "README.md has no '## Getting started on a CPU' section"
    blocks = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    assert len(blocks) == 1, f"expected one python block in the section, found {len(blocks)}"
    return blocks[0]


def test_readme_cpu_example_runs_without_cupy():
    # A None entry in sys.modules makes `import cupy` fail, as on a machine
    # without CuPy: the example must not need it.
    code = "import sys\nsys.modules['cupy'] = None\n" + _cpu_example()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("calc_diff "), proc.stdout
    assert re.fullmatch(r"\d+x\d+ s\d+.* sms\d+", lines[1]), lines[1]


def test_readme_cpu_example_in_process():
    ns: dict = {"__name__": "readme_cpu_example"}
    exec(compile(_cpu_example(), "README.md (Getting started on a CPU)", "exec"), ns)
    R, np = ns["R"], ns["np"]
    # The example's claims, checked here too: quantised product near the
    # exact one, the kernel model within the bound.
    assert ns["diff"] < 1e-3
    assert ns["y"].shape == (64, 256) and ns["y"].dtype == np.float64
    bound = R.error_bound(ns["a"], ns["sfa"], ns["b"], ns["sfb"])
    assert np.all(np.isfinite(bound))
