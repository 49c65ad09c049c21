"""``cugemm8 tune``'s engine: candidate configurations per shape, each
checked against the float64 reference and timed on this GPU, the fastest
recorded in the tuned file (:mod:`cugemm8._tuned`).

Candidates (:func:`candidates`): the heuristic's pick, the cost model's
``top`` ranked configurations with multicast allowed, the best multicast and
non-multicast ones whatever their rank, the no-multicast twin of each
multicast one and a multicast (A) twin of the three best plain ones, up
to ``split_k`` split-K configurations whose CTA pairs fill between half and
all of the SMs, the one-math-warpgroup twin of every BLOCK_M = 64
candidate, and for normal GEMMs with ``m`` <= 32 the swap-AB decode
kernel's one-wave configs (:func:`swap_ab_candidates`; the same family
``benches/sweep_configs.py`` sweeps, which imports it from here).  Each config runs on as many CTAs as it has tiles, up
to the SM budget.

Timing (:func:`time_candidates`): CUDA events around each launch, a 256 MB L2
flush before each repetition (outside the timed interval), repetitions
interleaved across candidates in rounds (each round times every candidate
once, in a rotated order), median per candidate; after the first round
candidates slower than ``prune`` x the fastest are dropped.  The heuristic's
pick is kept unless a candidate is faster by more than ``margin`` (1 %), so
noise never replaces it.
"""
from __future__ import annotations

import dataclasses
import datetime
import re
import statistics
import time

from . import _config

#: a candidate must beat the heuristic's median by this fraction to replace it
MARGIN = 0.01
#: candidates slower than this multiple of the fastest after round 1 are dropped
PRUNE = 1.25


# ----------------------------------------------------------------------------
# Candidates (pure Python, no GPU)
# ----------------------------------------------------------------------------

def forced_config(kind: str, m: int, n: int, k: int, num_groups: int, bm: int, bn: int, stages: int,
                  num_sms: int, *, mc: int = 1, on_a: bool = False, splits: int = 1, wgs: int = 2):
    """The config of a BMxBN tile at most ``stages`` deep (fewer if the
    shared memory holds fewer), with ``wgs`` math warpgroups, on as many CTAs
    as it has tiles to run (up to ``num_sms``; a multiple of the cluster
    size), or None if illegal.  ``m`` is the op's m (m_sum for contiguous,
    expected_m for masked)."""
    stages = min(stages, _config.max_stages(bm, bn, k, num_k_splits=splits, num_math_warpgroups=wgs)
                 or stages)
    cluster = mc * splits

    def make(grid):
        return _config.make_config(kind, bm, bn, stages, k, num_multicast=mc, multicast_on_a=on_a,
                                   num_k_splits=splits, num_sms=grid, num_math_warpgroups=wgs)
    try:
        _, executed, _ = _config.tile_counts(make(2), m, n, num_groups)
    except Exception:
        return None
    # Four-way split K: only the clusters of four that can be resident at
    # once (a grid past them runs its last clusters as a second wave).
    limit = _config.split_k4_max_ctas(num_sms) if splits == 4 else num_sms - num_sms % cluster
    cfg = make(max(min(limit, executed), cluster))
    ok, _ = _config.is_legal(cfg, k=k, available_sms=num_sms)
    return cfg if ok else None


_CONFIG_RE = re.compile(r"(\d+)x(\d+) s(\d+)( w1)?(?: (c2A?|c2B|k2|k4))?(?: sms\d+)?")
_SWAP_AB_RE = re.compile(r"(\d+)x(\d+) s(\d+) swapAB(?: k([24]))?(?: sms\d+)?")
_WARP_MMA_RE = re.compile(r"(\d+)x(\d+) u(\d+) warpMMA k(\d+)(?: ctas\d+)?")



def parse_config(text: str, kind: str, m: int, n: int, k: int, num_groups: int, num_sms: int):
    """A config from ``'BMxBN sS [w1] [c2|c2A|c2B|k2|k4]'`` (``w1``: one math
    warpgroup, BLOCK_M 64 only; ``c2`` / ``c2A``: multicast A, ``c2B``:
    multicast B, ``k2`` / ``k4``: split K over two / four CTAs; a trailing
    ``smsN`` is ignored) or
    ``'BMxBN sS swapAB [k2|k4]'`` (the swap-AB kernel, ``normal`` only) with
    the largest legal grid, or ``'8xBN uU warpMMA kS'`` (the warp-MMA kernel,
    ``normal`` only: BN weight rows per CTA, U K blocks ahead, S warps per
    16-row slab; one CTA per BN rows), or None if illegal.  Raises
    ValueError for text in another form."""
    mw = _WARP_MMA_RE.fullmatch(text.strip())
    if mw is not None:
        if kind != "normal" or num_groups != 1:
            return None
        bm, bn, unroll, splits = (int(mw.group(i)) for i in (1, 2, 3, 4))
        cfg = _config.make_config("normal", bm, bn, unroll, k, num_k_splits=splits,
                                  num_sms=_config.warp_mma_grid(n, bn) if bn > 0 else 1, warp_mma=True)
        return cfg if _config.is_legal(cfg, k=k)[0] else None
    ms = _SWAP_AB_RE.fullmatch(text.strip())
    if ms is not None:
        if kind != "normal" or num_groups != 1:
            return None
        return _config.swap_ab_config(m, n, k, int(ms.group(1)), int(ms.group(2)), int(ms.group(3)),
                                      num_sms, int(ms.group(4) or 1))
    mt = _CONFIG_RE.fullmatch(text.strip())
    if mt is None:
        raise ValueError(f"config {text!r} is not of the form 'BMxBN sS [w1] [c2|c2A|c2B|k2|k4]', "
                         f"'BMxBN sS swapAB [k2|k4]' or '8xBN uU warpMMA kS'")
    bm, bn, stages = (int(mt.group(i)) for i in (1, 2, 3))
    tag = mt.group(5)
    return forced_config(kind, m, n, k, num_groups, bm, bn, stages, num_sms,
                         mc=2 if tag in ("c2", "c2A", "c2B") else 1, on_a=tag in ("c2", "c2A"),
                         splits=int(tag[1]) if tag in ("k2", "k4") else 1, wgs=1 if mt.group(4) else 2)


def split_k_candidates(kind: str, m: int, n: int, k: int, num_groups: int, count: int, num_sms: int) -> list:
    """Up to ``count`` split-K configs whose CTA pairs fill between half and
    all of the SMs in one wave, the fullest first (BLOCK_M 64, and 128 when
    m is above 64)."""
    found = []
    for bm in (64, 128) if m > 64 else (64,):
        for bn in _config.candidate_block_ns(bm):
            cfg = forced_config(kind, m, n, k, num_groups, bm, bn, 16, num_sms, splits=2)
            if cfg is None:
                continue
            ctas = _config.tile_counts(cfg, m, n, num_groups)[1]
            if num_sms // 2 <= ctas <= num_sms:
                found.append((-ctas, bm, bn, cfg))
    return [cfg for *_, cfg in sorted(found, key=lambda e: e[:3])[:count]]


def unique_configs(configs) -> list:
    """``configs`` in order without Nones and without repeats (by name)."""
    out, seen = [], set()
    for c in configs:
        if c is not None and str(c) not in seen:
            seen.add(str(c))
            out.append(c)
    return out


def candidates(kind: str, m: int, n: int, k: int, num_groups: int, num_sms: int, *,
               top: int = 6, split_k: int = 6, extra=(), warp_mma: bool = True) -> list:
    """The candidate configs of one shape (see the module docstring), the
    heuristic's pick first, then ``extra`` (e.g. a reference library's own
    config), without repeats.  ``warp_mma``: whether the warp-MMA kernel
    (not persistent) may be among them, as the ops allow it only on the
    whole device (:func:`cugemm8._config.select_config`)."""
    saved = _config.MULTICAST_KINDS, _config.MULTICAST_TILES
    _config.MULTICAST_KINDS, _config.MULTICAST_TILES = _config.KINDS, None
    try:
        ranked = [cfg for _, cfg in _config.ranked_configs(kind, m, n, k, num_groups=num_groups,
                                                           num_sms=num_sms, warp_mma=warp_mma)]
    finally:
        _config.MULTICAST_KINDS, _config.MULTICAST_TILES = saved
    picked = [_config.select_config(kind, m, n, k, num_groups=num_groups, num_sms=num_sms, warp_mma=warp_mma)]
    picked += list(extra)
    picked += ranked[:top]
    # The best multicast and the best non-multicast configs, whatever their rank.
    picked += [next((c for c in ranked if c.num_multicast == mc), None) for mc in (1, 2)]
    for c in list(picked):
        if c is not None and c.num_multicast == 2:
            picked.append(forced_config(kind, m, n, k, num_groups, c.block_m, c.block_n, c.num_stages,
                                        num_sms))
    # A multicast twin of the best non-multicast tiles, even where the model
    # rules multicast out (small M: halving A's L2 traffic is the question).
    for c in [c for c in ranked if c.num_multicast == 1][:3]:
        picked.append(forced_config(kind, m, n, k, num_groups, c.block_m, c.block_n, c.num_stages,
                                    num_sms, mc=2, on_a=True))
    picked += split_k_candidates(kind, m, n, k, num_groups, split_k, num_sms)
    # The one-math-warpgroup twin (as many stages as fit) of every BLOCK_M =
    # 64 candidate with two.
    for c in list(picked):
        if c is not None and c.block_m == 64 and c.num_math_warpgroups == 2:
            picked.append(forced_config(kind, m, n, k, num_groups, 64, c.block_n, _config.MAX_STAGES,
                                        num_sms, mc=c.num_multicast, on_a=c.multicast_on_a,
                                        splits=c.num_k_splits, wgs=1))
    if kind == "normal":
        picked += swap_ab_candidates(m, n, k, num_sms)
    return unique_configs(picked)


def swap_ab_candidates(m: int, n: int, k: int, num_sms: int) -> list:
    """Swap-AB configs (the decode kernel with the weights as the WGMMA's 64
    rows, ``GemmConfig.swap_ab``) for ``m`` up to 32: the token tile that
    holds every M of ``m``'s power-of-two bucket, each weight tile of 64-256 rows, unsplit or split K over a
    CTA pair, where the CTAs (tiles x splits) number between half the SMs
    and two waves; one wave before two, then the fullest first.  (Clusters of 4 ran 1.5x slower on the H200:
    benches/RESULTS.md v0.16.)"""
    if not 1 <= m <= _config.SWAP_AB_BLOCK_MS[-1]:
        return []
    # A tuned entry serves the whole power-of-two bucket of m (_tuned.m_bucket):
    # the token tile covers the bucket's largest m, so one tile holds every M in it.
    bucket = 1 << (m - 1).bit_length()
    bm = min(_config.SWAP_AB_BLOCK_MS[-1], -(-bucket // 8) * 8)
    found = []
    for bn in _config.SWAP_AB_BLOCK_NS:
        for splits in (1, 2):
            ctas = -(-n // bn) * splits
            if num_sms // 2 <= ctas <= 2 * num_sms:
                cfg = _config.swap_ab_config(m, n, k, bm, bn, _config.SWAP_AB_MAX_STAGES, num_sms, splits)
                if cfg is not None:
                    found.append((ctas > num_sms, -ctas, bn, splits, cfg))
    return [cfg for *_, cfg in sorted(found, key=lambda e: e[:4])]


# ----------------------------------------------------------------------------
# Timing (needs a GPU)
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class Measured:
    """One candidate of one shape: its config, status ('ok', 'wrong ...',
    'error ...', 'pruned', 'budget') and CUDA-event times in µs."""
    config: _config.GemmConfig
    status: str = "ok"
    samples: list = dataclasses.field(default_factory=list)

    @property
    def us(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def time_candidates(runs: dict, cp, flush, *, rounds: int, reps: int, deadline: float,
                    prune: float = PRUNE) -> None:
    """Time every ``runs[name] = (Measured, fn)`` in interleaved rounds of
    ``reps`` repetitions each (see the module docstring); stops early at
    ``time.monotonic() > deadline`` (after at least one round)."""
    names = [n for n, (m, _) in runs.items() if m.status == "ok"]
    for r in range(rounds):
        if r and time.monotonic() > deadline:
            break
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for name in order:
            meas, fn = runs[name]
            events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
            for start, end in events:
                flush()
                start.record()
                fn()
                end.record()
            events[-1][1].synchronize()
            meas.samples += [cp.cuda.get_elapsed_time(s, e) * 1e3 for s, e in events]
        if r == 0 and len(names) > 1:
            best = min(runs[n][0].us for n in names)
            for n in list(names):
                if runs[n][0].us > prune * best:
                    runs[n][0].status = "pruned"
                    names.remove(n)


def choose(heuristic: Measured, measured: list, margin: float = MARGIN) -> Measured:
    """The winner: the fastest candidate if it beats the heuristic's pick by
    more than ``margin``, else the heuristic's pick (when it ran; else the
    fastest)."""
    ok = [m for m in measured if m.us is not None and m.status == "ok"]
    if not ok:
        return heuristic
    best = min(ok, key=lambda m: m.us)
    if heuristic.us is not None and heuristic.status == "ok" and best.us >= heuristic.us * (1 - margin):
        return heuristic
    return best


def candidates_1d1d(m: int, n: int, k: int, num_groups: int, num_sms: int, *, top: int = 6) -> list:
    """The 1D1D GEMMs' candidates (the training kinds): the heuristic's pick
    (the TMA epilogue allowed, ``c`` given: what an accumulating wgrad
    launches), then the cost model's ``top`` best of every legal BLOCK_M
    (128 and 256) x BLOCK_N of :data:`cugemm8._config_1d1d.BLOCK_N_CANDIDATES`,
    each with the TMA epilogue where its BLOCK_N allows it and the most
    stages that fit, on as many CTAs as it has tiles (up to ``num_sms``)."""
    from . import _config_1d1d as C1
    pick = C1.select_config(m, n, k, num_groups=num_groups, num_sms=num_sms, with_c=True)
    ranked = C1._rank(m, n, _config._ceil_div(k, C1.BLOCK_K), num_groups, num_sms, True, C1.SMEM_LIMIT,
                      True, C1.BLOCK_M_CANDIDATES)
    out = [pick]
    for _, cfg in ranked:
        if cfg not in out and len(out) < top + 1:
            out.append(cfg)
    return out


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(kind: str, m: int, n: int, k: int, num_groups: int, env: dict, win: Measured,
           heuristic: Measured, candidates: int, flush: str = "write") -> dict:
    """The tuned-file entry of one shape's winner (with its time, the
    heuristic's pick and time, the op's m, the candidate count, the L2
    flush the times were taken after, a UTC time stamp)."""
    from . import _tuned
    return _tuned.entry_for(kind, m, n, k, num_groups, env, win.config,
                            us=round(win.us, 3) if win.us is not None else None,
                            heuristic=str(heuristic.config),
                            heuristic_us=round(heuristic.us, 3) if heuristic.us is not None else None,
                            rows=int(m), candidates=int(candidates), flush=flush, tuned_at=now_utc())
