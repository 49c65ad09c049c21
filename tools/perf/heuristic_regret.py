"""The heuristic's regret on the measured sweeps, before and after a change (CPU only):

    python tools/perf/heuristic_regret.py [--before REV|none] [--after REV] [--all]
                                          [--changed] [--unmeasured]
                                          [--dram-floor RATE,T0 [--floor-mode hard|soft]]

For every shape of every forced-config sweep in ``benches/experiments/``
(the JSONs ``tests/test_config.py`` judges the heuristic by, read in the
order of its ``SWEEP_PATHS``): the pick of the ``before`` model and of the
``after`` model, the measured time of each pick, the fastest measured config
and each pick's regret (its time over the fastest, minus one).  A pick the
sweep did not measure reads ``n/m``; as in the test, a pick is judged by the
same config one stage deeper when only that one was measured (the per-warp
B-scale copies cost some K = 16384 tiles a stage since those sweeps).

A shape measured by several sweeps is judged by the newest (``*`` in the
``use`` column), as the test does; the summary (geomean, max, shares within
3 % and 5 %) is over those picks.  ``--all`` prints the superseded rows too
(marked ``-``; never in the summary).  ``--changed`` prints only the shapes
whose pick changed.

The ``before`` model is ``cugemm8/_config.py`` at git revision ``--before``
(default: c9743ac, the v0.12 heuristic without a DRAM floor), loaded beside
the package; ``none`` prints the ``after`` model only.  The ``after`` model
is the working tree's ``cugemm8/_config.py`` (the ``cugemm8`` on the path), or
the file at ``--after REV``.

``--unmeasured`` also lists, over a wider grid of shapes (the benchmark
cases; normal M = 1 ... 8192 on the DeepSeek-V3 (N, K); masked and
contiguous decode and prefill shapes), every shape whose pick changed and
whose new pick no sweep measured: the shapes a GPU run must confirm.

``--dram-floor RATE,T0`` evaluates a DRAM floor on top of the ``after``
model without editing it: each candidate's score becomes
``max(score, T0 + unique_bytes / RATE)`` (``--floor-mode hard``, the other
tie-breaks of ``_rank`` unchanged) or the 4-norm of the two (``soft``), with
RATE in bytes per SM cycle and T0 in cycles, unique_bytes = A + SFA + B + SFB
+ D of the whole grid (:func:`unique_bytes`).  That floor is the same for
every candidate of a shape, so the soft form can change no pick; the hard
one changes picks only through ties under the floor (issue 18, RESULTS
v0.12's analysis; the lower envelope of the sweeps' fastest times is 3.51 us
+ bytes / 3.96 TB/s: ``--dram-floor 2256,6160`` at 1.755 GHz).

Prints; never asserts.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT))

from cugemm8 import _config as _current  # noqa: E402  (also the package git models import from)
from cugemm8._shapes import DEEPSEEK_NK  # noqa: E402

EXPERIMENTS = _ROOT / "benches" / "experiments"
DEFAULT_BEFORE = "c9743ac"


def sweep_paths() -> list[Path]:
    """The sweeps in tests/test_config.py's SWEEP_PATHS order (oldest first;
    the newest that has a shape judges it), then any other sweep_*.json."""
    text = (_ROOT / "tests" / "test_config.py").read_text()
    block = re.search(r"SWEEP_PATHS\s*=\s*\((.*?)\)\n", text, re.S)
    names = re.findall(r'"(sweep_[^"]+\.json)"', block.group(1)) if block else []
    paths = [EXPERIMENTS / n for n in names]
    paths += [p for p in sorted(EXPERIMENTS.glob("sweep_*.json")) if p not in paths]
    return [p for p in paths if p.exists()]


def load_model(rev: str | None, tag: str):
    """cugemm8/_config.py at git revision ``rev`` as a module of the
    cugemm8 package (so its relative imports resolve); None: the one on the
    path."""
    if rev is None:
        return _current
    src = subprocess.run(["git", "-C", str(_ROOT), "show", f"{rev}:cugemm8/_config.py"],
                         check=True, capture_output=True, text=True).stdout
    name = f"cugemm8._config_{tag}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "cugemm8"
    sys.modules[name] = mod
    exec(compile(src, f"{rev}:cugemm8/_config.py", "exec"), mod.__dict__)
    return mod


def unique_bytes(kind: str, m: int, n: int, k: int, g: int) -> int:
    """Bytes every GEMM of the shape must move through HBM at least once:
    A and its scales (FP8 + FP32 per 128 K), B and its scales (per 128 x 128
    block; one B per group for masked and contiguous), D (BF16).  ``m`` is
    m_sum for contiguous and expected_m (per group) for masked."""
    kb = -(-k // 128)
    rows = g * m if kind == "masked" else m
    b_groups = 1 if kind == "normal" else g
    return (rows * k + rows * kb * 4 + b_groups * (n * k + -(-n // 128) * kb * 4)
            + rows * n * 2)


class FloorModel:
    """``model`` with a DRAM floor on every candidate's score (--dram-floor)."""

    def __init__(self, model, rate: float, t0: float, mode: str):
        self.model, self.rate, self.t0, self.mode = model, rate, t0, mode

    def select_config(self, kind, m, n, k, *, num_groups=1, num_sms=132):
        mdl = self.model
        m_eff = max(m, 1)
        floor = self.t0 + unique_bytes(kind, m_eff, n, k, num_groups) / self.rate
        groups = num_groups if kind == "masked" else 1
        ranked = []
        for score, c in mdl.ranked_configs(kind, m, n, k, num_groups=num_groups, num_sms=num_sms):
            if self.mode == "hard":
                s = max(score, floor)
            else:
                s = (score ** 4 + floor ** 4) ** 0.25
            executed = mdl._executed_tiles(groups, -(-m_eff // c.block_m), -(-n // c.block_n),
                                           c.num_multicast, c.multicast_on_a)
            # _rank's key: score, padded work, then its tie-breaks
            ranked.append(((s, executed * c.block_m * c.block_n, c.num_multicast, c.num_k_splits,
                            -c.block_m, c.block_n, 0 if c.multicast_on_a else 1,
                            -c.num_math_warpgroups), c))
        return min(ranked, key=lambda e: e[0])[1]


def pick(model, shape, num_sms):
    """The model's config for one sweep shape (``m`` in the JSON is per group
    for contiguous: the op passes m_sum)."""
    kind, g = shape["kind"], shape["g"]
    m = shape["m"] * g if kind == "contiguous" else shape["m"]
    return model.select_config(kind, m, shape["n"], shape["k"], num_groups=g, num_sms=num_sms)


def measured(times: dict, cfg) -> float | None:
    us = times.get(str(cfg))
    if us is None:
        us = times.get(str(dataclasses.replace(cfg, num_stages=cfg.num_stages + 1)))
    return us


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def load_shapes():
    """[(sweep name, shape, times, newest?)] over every sweep, and num_sms."""
    rows, newest, sms = [], {}, set()
    for path in sweep_paths():
        data = json.loads(path.read_text())
        sms.add(data["num_sms"])
        for shape in data["shapes"]:
            times = {r["config"]: r["us"] for r in shape["rows"] if r.get("status") == "ok" and r.get("us")}
            if not times:
                continue
            key = (shape["kind"], shape["label"])
            newest[key] = len(rows)
            rows.append((path.stem.removeprefix("sweep_"), shape, times))
    if len(sms) != 1:
        raise SystemExit(f"the sweeps disagree on num_sms: {sorted(sms)}")
    return [(name, shape, times, newest[(shape["kind"], shape["label"])] == i)
            for i, (name, shape, times) in enumerate(rows)], sms.pop()


def fmt_regret(us, best):
    return f"{100 * (us / best - 1):5.1f}%" if us is not None else "   n/m"


def fmt_us(us):
    return f"{us:8.2f}" if us is not None else "     n/m"


def summary(label, regrets):
    if not regrets:
        return f"{label}: no measured picks"
    return (f"{label}: geomean {geomean(regrets):.4f} over {len(regrets)} measured picks, "
            f"max {max(regrets):.4f}, within 3 % {sum(r <= 1.03 for r in regrets)}, "
            f"within 5 % {sum(r <= 1.05 for r in regrets)}")


def wide_grid():
    """Shapes beyond the sweeps, for --unmeasured: (kind, g, m, n, k)."""
    cases = set(_current.BENCHMARK_CASES)
    for n, k in DEEPSEEK_NK:
        for m in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 384, 512,
                  768, 1024, 2048, 4096, 8192):
            cases.add(("normal", 1, m, n, k))
    for n, k in ((4096, 7168), (7168, 2048)):
        for g in (1, 2, 4, 8, 16, 32, 64):
            for m in (8, 16, 32, 64, 128, 256, 512, 1024):
                cases.add(("masked", g, m, n, k))
        for g in (4, 8, 32, 64):
            for per in (128, 256, 512, 1024, 4096, 8192):
                cases.add(("contiguous", g, g * per, n, k))
    return sorted(cases)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=DEFAULT_BEFORE,
                    help=f"git revision of the model to compare with (default {DEFAULT_BEFORE}); 'none': skip")
    ap.add_argument("--after", default=None, help="git revision of the new model (default: the working tree)")
    ap.add_argument("--all", action="store_true", help="also the rows of superseded sweeps")
    ap.add_argument("--changed", action="store_true", help="only the shapes whose pick changed")
    ap.add_argument("--unmeasured", action="store_true",
                    help="list changed picks on a wider grid that no sweep measured")
    ap.add_argument("--dram-floor", metavar="RATE,T0",
                    help="evaluate the after model with a DRAM floor: RATE bytes/cycle, T0 cycles")
    ap.add_argument("--floor-mode", choices=("hard", "soft"), default="hard")
    args = ap.parse_args(argv)

    before = None if args.before.lower() == "none" else load_model(args.before, "before")
    after = load_model(args.after, "after")
    if args.dram_floor:
        rate, t0 = (float(x) for x in args.dram_floor.split(","))
        after = FloorModel(after, rate, t0, args.floor_mode)
        print(f"after = the {args.after or 'working tree'} model with a {args.floor_mode} DRAM floor "
              f"of {t0:g} cycles + unique bytes / {rate:g} B/cycle "
              f"({rate * 1.755e9 / 1e12:.2f} TB/s at 1.755 GHz)")
    shapes, num_sms = load_shapes()

    head = ("sweep", "use", "kind", "shape", "before", "us", "after", "us", "fastest", "us",
            "reg.before", "reg.after")
    out, reg_b, reg_a, unmeasured = [], [], [], []
    for name, shape, times, use in shapes:
        best_cfg = min(times, key=times.get)
        best = times[best_cfg]
        ca = pick(after, shape, num_sms)
        ua = measured(times, ca)
        cb = pick(before, shape, num_sms) if before else None
        ub = measured(times, cb) if before else None
        changed = before is not None and str(cb) != str(ca)
        if use:
            if ua is not None:
                reg_a.append(ua / best)
            else:
                unmeasured.append(f"{shape['kind']} {shape['label']}: {ca} (sweep {name})")
            if before and ub is not None:
                reg_b.append(ub / best)
        if not use and not args.all:
            continue
        if args.changed and not changed:
            continue
        out.append((name, "*" if use else "-", shape["kind"], shape["label"],
                    str(cb) if before else "", fmt_us(ub) if before else "",
                    str(ca) + (" <" if changed else ""), fmt_us(ua), best_cfg, fmt_us(best),
                    fmt_regret(ub, best) if before else "", fmt_regret(ua, best)))
    print(_current.text_table(head, out))
    print()
    if before:
        print(summary(f"before ({args.before})", reg_b))
    after_name = (args.after or "working tree") + (f" + {args.floor_mode} floor {args.dram_floor}"
                                                    if args.dram_floor else "")
    print(summary(f"after ({after_name})", reg_a))
    if unmeasured:
        print("after picks no sweep measured (judged shapes):")
        for line in unmeasured:
            print("  " + line)

    if args.unmeasured and before:
        measured_cfgs = {}
        for name, shape, times, use in shapes:
            kind, g = shape["kind"], shape["g"]
            m = shape["m"] * g if kind == "contiguous" else shape["m"]
            measured_cfgs.setdefault((kind, g, m, shape["n"], shape["k"]), {}).update(times)
        rows = []
        for kind, g, m, n, k in wide_grid():
            cb = before.select_config(kind, m, n, k, num_groups=g, num_sms=num_sms)
            ca = after.select_config(kind, m, n, k, num_groups=g, num_sms=num_sms)
            if str(cb) == str(ca):
                continue
            times = measured_cfgs.get((kind, g, m, n, k), {})
            if measured(times, ca) is not None and measured(times, cb) is not None:
                continue
            rows.append((kind, str(g), str(m), str(n), str(k), str(cb), str(ca),
                         "yes" if times else "no"))
        print()
        print(f"changed picks that no sweep measured ({len(rows)}; 'swept': the shape is in a sweep, "
              "but not both picks):")
        if rows:
            print(_current.text_table(("kind", "G", "m", "n", "k", "before", "after", "swept"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
