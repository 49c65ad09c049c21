"""What every ``cugemm8`` subcommand shares: the probes of what is missing
(:func:`gpu_reason`, :func:`nvrtc_reason`), table and progress output (rich
when importable, plain text otherwise) and small formatting helpers."""
from __future__ import annotations

import argparse
import math
import sys


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _one_line(text) -> str:
    return " ".join(str(text).split())


def gpu_reason() -> str | None:
    """Why the cugemm8 kernels cannot run here (None: they can)."""
    try:
        from .. import _device
        reason = _device.gpu_unavailable_reason()
    except Exception as exc:  # a broken probe is reported, not raised
        return _one_line(f"device probe failed: {type(exc).__name__}: {exc}")
    return None if reason is None else _one_line(reason)


def nvrtc_reason() -> str | None:
    """Why sm_90a kernels cannot be compiled here (None: they can)."""
    try:
        from .. import _device
        reason = _device.nvrtc_unavailable_reason()
    except Exception as exc:
        return _one_line(f"NVRTC probe failed: {type(exc).__name__}: {exc}")
    return None if reason is None else _one_line(reason)


def _fmt(x: float, spec: str) -> str:
    return "-" if x != x else format(x, spec)


def _numeric(cell) -> bool:
    """True for a number or the '-' placeholder (right-justified columns)."""
    if str(cell) == "-":
        return True
    try:
        float(str(cell))
    except ValueError:
        return False
    return True


def _int_at_least(minimum: int):
    """argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def print_table(title: str, columns, rows, *, file=None) -> None:
    """A rich table when rich is importable, else aligned plain text."""
    file = sys.stdout if file is None else file
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows)]
        print(title, file=file)
        for row in (columns, *rows):
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip(), file=file)
        return
    table = Table(title=title)
    for i, c in enumerate(columns):
        table.add_column(c, justify="right" if rows and all(_numeric(r[i]) for r in rows) else "left")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console = Console(file=file, width=None if file.isatty() else 220)
    console.print(table)


def _progress(total: int, title: str = "cugemm8 check", *, transient: bool = True):
    """(advance(label, message=None), close()) with a rich progress bar on
    stderr when rich is importable, else one plain line per step.
    ``message``, when given, is printed as a line of its own (above the bar
    on a terminal; a plain log line elsewhere)."""
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        count = [0]

        def advance(label, message=None):
            count[0] += 1
            print(f"[{count[0]}/{total}] {message or label}", file=sys.stderr, flush=True)
        return advance, lambda: None
    from rich.console import Console
    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=transient)
    prog.start()
    task = prog.add_task(title, total=total)

    def advance(label, message=None):
        if message is not None:
            prog.console.print(message, markup=False, highlight=False)
        prog.update(task, advance=1, description=f"{title} {label}")
    return advance, prog.stop


def load_shapes_or_report(path: str, command: str):
    """The shapes of a shapes file or preset (:func:`cugemm8._shapes.load_shapes`),
    or None after printing ``cugemm8 <command>: <why>`` on stderr (the
    caller exits 2)."""
    from .._shapes import load_shapes
    try:
        return load_shapes(path)
    except ValueError as exc:
        print(f"cugemm8 {command}: {exc}", file=sys.stderr)
        return None
