"""``cugemm8 bench [...]``: runs ``benches/bench_gemm.py`` (present in a
source checkout, not in an installed package), passing the arguments
through.

Exit codes match the other commands: 2 without a usable Hopper GPU (unless
``--from-json`` re-renders a saved run, which needs none), 2 for a
``--from-json`` file that is missing or not a saved run, 2 when ``--plot``
cannot plot (matplotlib not importable, or no such folder; checked before
the run), and 1 when the plot step itself fails.  Each error is one line on
stderr.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from ._common import _one_line, gpu_reason


def bench_script() -> Path:
    """Where ``benches/bench_gemm.py`` is in a source checkout."""
    return Path(__file__).resolve().parent.parent.parent / "benches" / "bench_gemm.py"


def _load_module(path: Path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("cugemm8_bench_gemm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved_run_problem(path: str) -> str | None:
    """Why ``path`` is not a saved ``bench_gemm.py --json`` result (None: it is)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        return f"cannot read --from-json {path}: {exc.strerror or exc}"
    except (ValueError, UnicodeDecodeError) as exc:
        return f"--from-json {path} is not JSON: {_one_line(exc)}"
    if not isinstance(data, dict) or not {"meta", "rows"} <= set(data):
        return f"--from-json {path} is not a saved benchmark run (no 'meta' and 'rows'; write one with --json)"
    meta, rows = data["meta"], data["rows"]
    if not isinstance(meta, dict) or not isinstance(rows, list):
        return f"--from-json {path}: 'meta' must be an object and 'rows' a list (write one with --json)"
    if not rows:
        return f"--from-json {path} holds no rows: nothing to re-render"
    need = ("kind", "m", "n", "k")
    for i, row in enumerate(rows):
        missing = [key for key in need if not isinstance(row, dict) or key not in row]
        if missing:
            return (f"--from-json {path}: row {i} lacks {', '.join(missing)} "
                    f"(every row of a saved run has {', '.join(need)})")
    return None


def plot_problem(path: str) -> str | None:
    """Why a plot cannot be written to ``path`` (None: it can be tried)."""
    try:
        importlib.import_module("matplotlib")
    except Exception as exc:
        return (f"--plot needs matplotlib, which is not importable ({type(exc).__name__}: {_one_line(exc)}); "
                "install it (pip install matplotlib, or the bench extra)")
    parent = Path(path).parent
    if not parent.is_dir():
        return f"--plot {path}: the folder {parent} does not exist"
    return None


def cmd_bench(argv: list[str]) -> int:
    path = bench_script()
    if not path.is_file():
        print(f"cugemm8 bench: {path} is not here: the benchmarks ship with the source tree, "
              "not with the installed package; run `python benches/bench_gemm.py` from a checkout")
        return 2
    module = _load_module(path)
    args = module.parse_args(list(argv))       # --help and usage errors exit here, as argparse does
    if args.from_json:
        problem = saved_run_problem(args.from_json)
    else:
        reason = gpu_reason()
        problem = None if reason is None else (f"no usable Hopper GPU: {reason} "
                                               "(--from-json FILE re-renders a saved run without one)")
    if problem is None and args.plot:
        problem = plot_problem(args.plot)
    if problem is not None:
        print(f"cugemm8 bench: {problem}", file=sys.stderr)
        return 2
    failures: list[Exception] = []
    if args.plot:
        # This private copy of the module: record what its plot step raises
        # (bench_gemm.main reports a missing matplotlib and returns 0).
        real_plot = module.plot_results

        def plot_results(*a, **k):
            try:
                return real_plot(*a, **k)
            except Exception as exc:
                failures.append(exc)
                raise
        module.plot_results = plot_results
    try:
        rc = int(module.main(list(argv)) or 0)
    except SystemExit as exc:
        if isinstance(exc.code, str):          # bench_gemm's own one-line refusals
            print(exc.code, file=sys.stderr)
            return 2
        raise
    except Exception as exc:
        if not (failures and exc is failures[-1]):
            raise
    if failures:
        exc = failures[-1]
        print(f"cugemm8 bench: --plot {args.plot} failed: {type(exc).__name__}: {_one_line(exc)[:300]}",
              file=sys.stderr)
        return 1
    return rc
