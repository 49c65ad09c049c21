"""Argument parsing and dispatch of the ``cugemm8`` command line."""
from __future__ import annotations

import argparse
import sys

from . import bench, check, configs, info, tune, warmup

SUBCOMMANDS = ("check", "info", "bench", "warmup", "configs", "tune")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cugemm8",
        description="FP8 GEMMs for Hopper with DeepSeek-V3 fine-grained scaling. "
                    "Without a subcommand, runs `check`.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    check.register(sub)
    info.register(sub)
    # `bench` is dispatched before parsing (its arguments are bench_gemm.py's);
    # listed here for --help.
    p = sub.add_parser("bench", help="run benches/bench_gemm.py (source checkout only); "
                                     "arguments are passed through", add_help=False)
    p.set_defaults(func=None)
    warmup.register(sub)
    configs.register(sub)
    tune.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return bench.cmd_bench(argv[1:])
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["check", *argv]
    args = build_parser().parse_args(argv)
    if args.version:
        from .. import __version__
        print(f"cugemm8 {__version__}")
        return 0
    if args.command is None:
        args = build_parser().parse_args(["check"])
    return int(args.func(args) or 0)
