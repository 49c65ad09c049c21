"""``cugemm8 configs``: the kernel configuration the heuristic picks (tile,
stages, multicast, split K, grid, shared memory, waves, the cost model's
estimate) for the benchmark shapes or the shapes in a file.  Pure Python: no
GPU needed."""
from __future__ import annotations

import sys

from .._shapes import load_shapes
from ._common import _positive_int


def cmd_configs(args) -> int:
    """``cugemm8 configs``: the heuristic's choices, as a table (no GPU)."""
    from .. import _config
    if args.shapes:
        try:
            shapes = load_shapes(args.shapes)
        except ValueError as exc:
            print(f"cugemm8 configs: {exc}", file=sys.stderr)
            return 2
        cases = [(s.kind, s.num_groups, s.m, s.n, s.k) for s in shapes]
    else:
        cases = _config.BENCHMARK_CASES
    try:
        print(_config.format_table(cases, num_sms=args.num_sms))
    except (TypeError, ValueError) as exc:
        print(f"cugemm8 configs: {exc}", file=sys.stderr)
        return 2
    return 0


def register(sub) -> None:
    p = sub.add_parser("configs", help="the heuristic's kernel configuration per shape (no GPU needed)",
                       description="Print the configuration select_config picks (tile, stages, multicast, "
                                   "split K, grid, shared memory, waves, the cost model's estimate) for the "
                                   "benchmark shapes, or for the shapes in FILE (the warmup format: see "
                                   "`cugemm8 warmup --help`).")
    p.add_argument("--shapes", metavar="FILE",
                   help="shapes file or @check / @check-quick (default: the benchmark shapes)")
    p.add_argument("--num-sms", type=_positive_int, default=132, help="SMs available (default 132, an H200)")
    p.set_defaults(func=cmd_configs)
