"""``cugemm8 configs``: the kernel configuration the heuristic picks (tile,
stages, multicast, split K, grid, shared memory, waves, the cost model's
estimate) for the benchmark shapes or the shapes in a file.  Pure Python: no
GPU needed."""
from __future__ import annotations

import sys

from ._common import _positive_int, load_shapes_or_report


def cmd_configs(args) -> int:
    """``cugemm8 configs``: the heuristic's choices, as a table (no GPU)."""
    from .. import _config
    training = []
    if args.shapes:
        shapes = load_shapes_or_report(args.shapes, "configs")
        if shapes is None:
            return 2
        cases = [(s.kind, s.num_groups, s.m, s.n, s.k) for s in shapes if s.kind in _config.KINDS]
        training = [s for s in shapes if s.kind not in _config.KINDS]
    else:
        cases = _config.BENCHMARK_CASES
    try:
        if cases:
            print(_config.format_table(cases, num_sms=args.num_sms))
        if training:
            print(("\n" if cases else "") + training_table(training, args.num_sms))
    except (TypeError, ValueError) as exc:
        print(f"cugemm8 configs: {exc}", file=sys.stderr)
        return 2
    _print_tuned(list(cases) + [(s.kind, s.num_groups, s.m, s.n, s.k) for s in training], args.num_sms)
    return 0


def training_table(shapes, num_sms: int) -> str:
    """The 1D1D kernel's picks (cugemm8/_config_1d1d.py) for the training
    shapes (``wgrad``, ``k_grouped``): the config without ``c``, in "c = d"
    the one chosen for in-place accumulation (the TMA epilogue's reduce-add)
    and in "c not d" the one for ``c`` another array (the register
    epilogue); "same" when one agrees with the config without ``c``."""
    from .. import _config, _config_1d1d
    head = ("kind", "G", "m", "n", "k", "config (no c)", "c = d", "c not d", "smem")
    rows = []
    for s in shapes:
        cfg = _config_1d1d.select_config(s.m, s.n, s.k, num_groups=s.num_groups, num_sms=num_sms)
        in_place = _config_1d1d.select_config(s.m, s.n, s.k, num_groups=s.num_groups, num_sms=num_sms, with_c=True)
        other_c = _config_1d1d.select_config(s.m, s.n, s.k, num_groups=s.num_groups, num_sms=num_sms, with_c=True,
                                             tma_store=False)
        rows.append((s.kind, str(s.num_groups), str(s.m), str(s.n), str(s.k), str(cfg),
                     *("same" if c == cfg else str(c) for c in (in_place, other_c)), str(cfg.smem_bytes)))
    return _config.text_table(head, rows)


def _us(value) -> str:
    """A recorded time for display ("-" for anything that is not a sane number)."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return "-"
    return f"{v:.1f}" if 0 <= v < 1e12 else "-"


def tuned_rows(cases, num_sms: int, entries: list, env_here: dict | None) -> list[tuple]:
    """One row per case that the tuned file has an entry for (same kind, n,
    k, num_groups, M bucket and SM budget): the heuristic's pick, the tuned
    one, their recorded times, and whether the entry applies here (its
    environment equals ``env_here``; without a GPU it cannot be checked) or
    which environment field makes it stale."""
    from .. import _config, _config_1d1d, _tuned
    rows = []
    for kind, g, m, n, k in cases:
        key = _tuned.shape_key(kind, n, k, g, m)
        found = [e for e in entries
                 if _tuned.shape_key(e["kind"], e["n"], e["k"], e["num_groups"], e["m_bucket"]) == key
                 and e["env"].get("num_sms") == num_sms]
        if not found:
            continue
        e = found[-1]
        if env_here is not None:
            exact = [x for x in found if all(x["env"].get(f) == env_here[f] for f in _tuned.ENV_FIELDS)]
            e = exact[-1] if exact else e
        cfg, why = _tuned.config_from_entry(e, k, num_sms)
        if cfg is None:
            status = f"ignored: {why}"
        elif env_here is None:
            status = f"recorded on {e['env'].get('gpu')} (no GPU here to match)"
        elif exact:
            status = "used"
        else:
            diff = [f for f in _tuned.ENV_FIELDS if e["env"].get(f) != env_here[f]]
            status = "stale: " + ", ".join(diff) + " differ"
        c = e["config"]
        if kind in _tuned.KINDS_1D1D:
            heur = _config_1d1d.select_config(m, n, k, num_groups=g, num_sms=num_sms, with_c=True)
            tuned = (f"{c['block_m']}x{c['block_n']} s{c['num_stages']} sms{c['num_sms']}"
                     + (" tma" if c["tma_store"] else ""))
        else:
            heur = _config.select_config(kind, m, n, k, num_groups=g, num_sms=num_sms)
            # Not legal here: the entry's own fields, as the same text.
            tuned = str(cfg if cfg is not None else _tuned.entry_config(e, k))
        us = e.get("us")
        h_us = e.get("heuristic_us")
        rows.append((kind, str(g), str(m), str(n), str(k), str(heur), tuned, _us(h_us), _us(us),
                     str(e.get("tuned_at", "-"))[:24], status))
    return rows


def _print_tuned(cases, num_sms: int) -> None:
    """The tuned file's picks for ``cases`` beside the heuristic's (if any)."""
    from .. import _tuned
    from ._common import gpu_reason, print_table
    path = _tuned.tuned_path()
    if path is None:
        print(f"\ntuned configurations: off ({_tuned.ENV_VAR})")
        return
    entries, problems = _tuned.read_file(path)
    if not entries and not problems:
        print(f"\ntuned configurations: none ({path} has no entries; `cugemm8 tune` writes them)")
        return
    env_here = None
    if gpu_reason() is None:
        try:
            env_here = _tuned.environment(num_sms)
        except Exception:          # a report must not die on the environment query
            env_here = None
    rows = tuned_rows(cases, num_sms, entries, env_here)
    print()
    for why in problems[:5]:
        print(f"tuned file {path}: {why} (ignored)")
    if rows:
        print_table(f"tuned configurations ({path}), {num_sms} SMs",
                    ("kind", "G", "m", "n", "k", "heuristic", "tuned", "heur µs", "tuned µs", "tuned at",
                     "status"), rows)
    else:
        print(f"tuned configurations: {len(entries)} entries in {path}, none for these shapes at {num_sms} SMs")


def register(sub) -> None:
    p = sub.add_parser("configs", help="the heuristic's kernel configuration per shape (no GPU needed)",
                       description="Print the configuration select_config picks (tile, stages, multicast, "
                                   "split K, grid, shared memory, waves, the cost model's estimate) for the "
                                   "benchmark shapes, or for the shapes in FILE (the warmup format: see "
                                   "`cugemm8 warmup --help`).  Training shapes (wgrad, k_grouped) get a "
                                   "second, shorter table: the 1D1D kernel's tile, stages and grid, without "
                                   "and with c.")
    p.add_argument("--shapes", metavar="FILE",
                   help="shapes file or a preset: @normal, @decode, @grouped, @check, @check-quick "
                        "(default: the benchmark shapes)")
    p.add_argument("--num-sms", type=_positive_int, default=132, help="SMs available (default 132, an H200)")
    p.set_defaults(func=cmd_configs)
