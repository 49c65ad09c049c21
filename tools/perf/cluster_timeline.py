"""When each CTA's producer issues each K block's loads, over the whole grid,
for cugemm8 and DeepGEMM (one GPU call; a diagnostic for issue 20).

    python tools/perf/cluster_timeline.py M N K [M N K ...] [--config "256x128 s3 c2A"]
                                          [--deepgemm] [--launches 3] [--producer-only]
                                          [--variant PLAN.json:NAME] [--json OUT] [--npz OUT]

Both kernels get the same instrumentation, text inserted into a copy of the
source: the producer thread records ``%globaltimer`` and ``%clock64`` right
after its empty-barrier wait for every K block (just before the block's TMA
loads are issued), and each tile's (m-block, n-block).  cugemm8's copy is a
``tools/perf/variant_sweep.py`` tree; DeepGEMM's header
(``deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh`` of the
imported package) is patched in place for the run and restored at exit, with
``DG_JIT_CACHE_DIR`` pointed at a fresh directory so neither the patched
nor the plain kernel is served to the other.  The record buffer's device
address is compiled into both kernels (same process, same context).

Why: Nsight Compute's L2 request-coalescer counters (benches/RESULTS.md
v0.35 items 1-2) show DeepGEMM's reads of one B tile merged 1.6-2.3x more
often than cugemm8's at K >= 7168, with the same tile order, tile, stages
and multicast.  A read can only merge with one of the same lines that is
still pending, so the question is how close in time the CTAs that read the
same (n-block, K block) issue it.  Printed per shape and library, from the
last launch (the earlier ones warm up; L2 flushed before each):

* ``span``: first issue -> last issue over the grid (µs);
* ``kb``: median interval between consecutive K blocks of one tile, and its
  90th percentile (µs);
* ``switch``: median interval from a tile's last K block to the next tile's
  first (the producer's view of the epilogue; µs);
* ``B<200``/``B<500``/``B<1000``: fraction of B loads that have another
  CTA's load of the same (n-block, K block) issued within 200/500/1000 ns
  before them (the merge candidates), ``B nn``: median nearest-neighbour
  gap (µs); ``A<500`` the same for A's loads (per cluster with multicast);
* ``start sd``: standard deviation over CTAs of the first K block's issue
  time of their w-th tile, median over w (µs): how far the persistent
  CTAs drift apart;
* ``rate_sd``: the standard deviation over CTAs of each CTA's mean tile
  time (µs), and ``rate_corr`` the correlation of a CTA's mean over its
  first and second half of tiles (near 1: each CTA keeps its own rate);
  ``by_cta`` / ``by_sm``: the correlation of the CTAs' rates between
  consecutive launches (the warm-up excluded) matched by CTA index and by
  ``%smid``: which of the two the rate follows;
* ``pair``: median |issue time difference| between the two CTAs of a
  cluster for the same K block of their tiles (µs);
* ``tile``: median time from a tile's first K block's issue to the next
  tile's (µs);
* from the math warpgroups' first threads (not with ``--producer-only``):
  ``wait0``/``wait1`` the share of each warpgroup's K loop spent waiting on
  full barriers, ``tail`` the last K block's issue -> warpgroup 0's K loop
  done, ``epi`` -> its TMA store issued, ``wg_skew`` warpgroup 1's K loop
  end minus warpgroup 0's, ``end_spread`` the last CTA's last store after
  the median CTA's (µs).

``start_sd_by_tile`` in the JSON gives the drift tile by tile.  The timed
waits add 4 (cugemm8) and 8 (DeepGEMM) SASS instructions per K block and
warp; ``--producer-only`` leaves the math warpgroups' code as it is.

Times across SMs come from ``%globaltimer`` (32 ns steps on the H200); were
its steps coarser than 64 ns, each CTA's ``%clock64`` would be mapped onto
it (one slope for the grid, an offset per CTA).  The math records carry
``%clock64`` only and are placed between the CTA's own producer records.
Measured with it: benches/RESULTS.md v0.36 item 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(1, str(_HERE.parents[1] / "benches"))
sys.path.insert(2, str(_HERE))

MAX_TILES = 16
MAX_KB = 128           # K <= 16384
SLOT = 2               # (globaltimer, clock64) per record; record 0 of a tile: (m << 32 | n, smid << 32 | 1)
# Per tile: record 0 the header, 1 .. MAX_KB the producer's K blocks, then
# the math warpgroups' (first threads: 0 and 128) records:
MATH0 = MAX_KB + 1     # warpgroup 0's K loop done: (globaltimer, clock64)
MATH1 = MAX_KB + 2     # cycles waited on full barriers in the tile: (warpgroup 0, warpgroup 1)
MATH2 = MAX_KB + 3     # clock64: (warpgroup 0's TMA store issued, warpgroup 1's K loop done)
RECORDS = MAX_KB + 4


_CLK = "[] { unsigned long long c; asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(c)); return c; }()"
_GT = "[] { unsigned long long c; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(c)); return c; }()"
_SMID = "[] { unsigned s; asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(s)); return s; }()"


def _slot(addr: int, tile: str, record: str, index: int, value: str) -> str:
    """C++ statement storing `value` into word `index` of record `record` of
    this CTA's tile `tile` (dropped past MAX_TILES tiles)."""
    return (f"if (({tile}) < {MAX_TILES}u) reinterpret_cast<unsigned long long*>({addr:#x}ull)"
            f"[((static_cast<unsigned long long>(blockIdx.x) * {MAX_TILES} + ({tile})) * {RECORDS} + ({record}))"
            f" * {SLOT} + {index}] = {value};\n")


def _record_code(addr: int, tile: str, kb: str) -> str:
    """C++ statements storing one K block's (globaltimer, clock64)."""
    return ("{\n  const unsigned long long probe_g = " + _GT + ", probe_c = " + _CLK + ";\n"
            + "  " + _slot(addr, tile, f"1 + ({kb})", 0, "probe_g")
            + "  " + _slot(addr, tile, f"1 + ({kb})", 1, "probe_c") + "}\n")


def _header_code(addr: int, tile: str, m: str, n: str) -> str:
    """C++ statements storing a tile's header: (m << 32 | n, smid << 32 | 1)."""
    return ("{\n  " + _slot(addr, tile, "0", 0,
                            f"(static_cast<unsigned long long>({m}) << 32) | static_cast<unsigned>({n})")
            + "  " + _slot(addr, tile, "0", 1, f"(static_cast<unsigned long long>({_SMID}) << 32) | 1ull") + "}\n")


def _math_tile_start() -> str:
    return "++probe_mtile;\nunsigned long long probe_wait = 0;\n"


def _math_loop_done(addr: int) -> str:
    t = "(probe_mtile - 1u)"
    return ("{\n  const unsigned long long probe_c = " + _CLK + ";\n"
            "  if (threadIdx.x == 0) {\n"
            + "    " + _slot(addr, t, MATH0, 0, _GT)
            + "    " + _slot(addr, t, MATH0, 1, "probe_c")
            + "    " + _slot(addr, t, MATH1, 0, "probe_wait")
            + "  }\n  if (threadIdx.x == 128) {\n"
            + "    " + _slot(addr, t, MATH1, 1, "probe_wait")
            + "    " + _slot(addr, t, MATH2, 1, "probe_c")
            + "  }\n}\n")


def _math_epilogue_done(addr: int) -> str:
    return "if (threadIdx.x == 0) { " + _slot(addr, "(probe_mtile - 1u)", MATH2, 0, _CLK).strip() + " }\n"


def _timed_wait(wait: str) -> str:
    return ("{ const unsigned long long probe_w0 = " + _CLK + ";\n" + wait
            + "probe_wait += " + _CLK + " - probe_w0; }\n")


def cugemm8_replacements(addr: int, math: bool = True) -> list:
    k = "fp8_gemm_1d2d.cuh"
    loop = "      while (scheduler.next(tile)) {\n        int32_t b_group;\n        bool skip, absent;\n"
    arow = "        const int32_t a_row = static_cast<int32_t>(tile.m_block * BLOCK_M);\n"
    acq = "          uint64_t* bar = producer_acquire(pipe, full_bar, empty_bar, tx_bytes);\n"
    return [
        [k, loop, "      unsigned probe_tile = 0;\n" + loop],
        [k, arow, arow + "        ++probe_tile;\n"
         + _header_code(addr, "probe_tile - 1u", "tile.m_block", "tile.n_block")],
        [k, acq, acq + _record_code(addr, "probe_tile - 1u", "kb")],
    ] + ([] if not math else [
        [k, "    while (scheduler.next(tile)) {\n      int32_t b_group;\n      bool skip, absent;\n",
         "    unsigned probe_mtile = 0;\n    while (scheduler.next(tile)) {\n      int32_t b_group;\n      bool skip, absent;\n"],
        [k, "      if (absent) continue;\n      // Contiguous layout",
         "      if (absent) continue;\n" + _math_tile_start() + "      // Contiguous layout"],
        [k, "              mbarrier_wait(full_bar + stage, pipe.phase);\n              // Read this stage's A scales",
         _timed_wait("              mbarrier_wait(full_bar + stage, pipe.phase);\n") + "              // Read this stage's A scales"],
        [k, "        dispatch_num_former<BLOCK_N>(n0, k_loop);\n",
         "        dispatch_num_former<BLOCK_N>(n0, k_loop);\n" + _math_loop_done(addr)],
        [k, "        if (issued) tma_store_commit();\n      }\n    }\n    // Shared memory must outlive",
         "        if (issued) tma_store_commit();\n      }\n" + _math_epilogue_done(addr) + "    }\n    // Shared memory must outlive"],
    ])


DG_HEADER = "deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh"


def deepgemm_replacements(addr: int, math: bool = True) -> list:
    loop = "            // Persistently schedule over blocks\n            while (scheduler.get_next_block(m_block_idx, n_block_idx)) {\n"
    valid = "                const bool is_tma_multicast_valid = scheduler.is_tma_multicast_valid(m_block_idx);\n"
    wait = "                    // Wait consumer release\n                    empty_barriers[stage_idx]->wait(phase ^ 1);\n"
    return [
        [loop, "            unsigned probe_tile = 0;\n" + loop],
        [valid, valid + "                ++probe_tile;\n"
         + _header_code(addr, "probe_tile - 1u", "m_block_idx", "n_block_idx")],
        [wait, wait + _record_code(addr, "probe_tile - 1u", "k_block_idx")],
    ] + ([] if not math else [
        ["        // Persistently schedule over blocks\n        while (scheduler.get_next_block(m_block_idx, n_block_idx)) {\n",
         "        unsigned probe_mtile = 0;\n        // Persistently schedule over blocks\n"
         "        while (scheduler.get_next_block(m_block_idx, n_block_idx)) {\n"],
        ["            // Decide the number of scales B to load\n",
         _math_tile_start() + "            // Decide the number of scales B to load\n"],
        ["                        // Wait TMA arrivals\n                        full_barriers[stage_idx]->wait(phase);\n",
         _timed_wait("                        full_barriers[stage_idx]->wait(phase);\n")],
        ["            // TMA checks\n", _math_loop_done(addr) + "            // TMA checks\n"],
        ["            __syncwarp();\n        }\n    }\n#else",
         _math_epilogue_done(addr) + "            __syncwarp();\n        }\n    }\n#else"],
    ])


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"instrumentation point not found once in {where}: {old[:60]!r}")
    return text.replace(old, new)


def events(raw, num_kb: int):
    """Per-record arrays from the buffer of one launch (the producer's K
    blocks: cta, tile index, m-block, n-block, kb, time in ns on one
    grid-wide scale), per-tile arrays of the math records (``math``), and
    the globaltimer step seen."""
    import numpy as np
    r = raw.reshape(-1, MAX_TILES, RECORDS, SLOT)
    ctas, tiles = [], []
    for c in range(r.shape[0]):
        for t in range(MAX_TILES):
            if int(r[c, t, 0, 1]) & 0xFFFFFFFF != 1:
                break
            ctas.append(c)
            tiles.append(t)
    ctas_a, tiles_a = np.array(ctas, np.int64), np.array(tiles, np.int64)
    cta = np.repeat(ctas_a, num_kb)
    tile = np.repeat(tiles_a, num_kb)
    kb = np.tile(np.arange(num_kb), len(ctas))
    head = r[ctas_a, tiles_a, 0, 0]
    m = np.repeat((head >> np.uint64(32)).astype(np.int64), num_kb)
    n = np.repeat((head & np.uint64(0xFFFFFFFF)).astype(np.int64), num_kb)
    g_raw = r[cta, tile, 1 + kb, 0]
    c_raw = r[cta, tile, 1 + kb, 1]
    ok = (g_raw > 0) & (c_raw > 0)
    cta, tile, kb, m, n, g_raw, c_raw = (x[ok] for x in (cta, tile, kb, m, n, g_raw, c_raw))
    # globaltimer counts ns since the epoch (~1.8e18): subtract in integers
    # first, as a float64 holds it only to 256 ns
    g0 = g_raw.min()
    g = (g_raw - g0).astype(np.float64)
    c0 = {int(q): c_raw[cta == q].min() for q in np.unique(cta)}
    c = np.array([float(int(x) - int(c0[int(q)])) for x, q in zip(c_raw, cta)])
    # globaltimer's step: the largest power of two dividing every reading
    tz = min(int((int(x) & -int(x)).bit_length() - 1) for x in g_raw if int(x))
    step = float(2 ** tz)
    # one slope (ns per cycle) for the grid, an offset per CTA: t = b * c + off
    slope = [np.polyfit(c[cta == q], g[cta == q], 1)[0] for q in np.unique(cta) if (cta == q).sum() > 8]
    b = float(np.median(slope))
    off = {int(q): float(np.mean(g[cta == q] - b * c[cta == q])) for q in np.unique(cta)}
    t = g if step <= 64 else b * c + np.array([off[int(q)] for q in cta])
    tmin = t.min()
    t = t - tmin
    # the math records carry clock64 only: interpolated between the CTA's
    # own producer records (the SM clock moves under the power cap)
    interp = {}
    for q in np.unique(cta):
        sel = cta == q
        o = np.argsort(c[sel])
        interp[int(q)] = (c[sel][o], t[sel][o])

    def cyc_to_t(q, clk):   # a CTA's raw clock64 -> the grid's time scale (ns)
        cc, tt = interp[q]
        x = float(int(clk) - int(c0[q]))
        if x > cc[-1]:
            return float(tt[-1] + b * (x - cc[-1]))
        return float(np.interp(x, cc, tt))
    sm_of = {int(q): int(r[q, 0, 0, 1]) >> 32 for q in np.unique(ctas_a)}
    math = {"cta": ctas_a, "tile": tiles_a, "wait0": [], "wait1": [], "end0": [], "end1": [], "epi0": []}
    for q, w in zip(ctas_a.tolist(), tiles_a.tolist()):
        rec = r[q, w]
        if q not in c0 or rec[MATH0, 1] == 0:
            for k in ("wait0", "wait1", "end0", "end1", "epi0"):
                math[k].append(np.nan)
            continue
        math["end0"].append(cyc_to_t(q, rec[MATH0, 1]))
        math["end1"].append(cyc_to_t(q, rec[MATH2, 1]) if rec[MATH2, 1] else np.nan)
        math["epi0"].append(cyc_to_t(q, rec[MATH2, 0]) if rec[MATH2, 0] else np.nan)
        math["wait0"].append(b * float(rec[MATH1, 0]))
        math["wait1"].append(b * float(rec[MATH1, 1]))
    math = {k: np.asarray(v, np.float64) for k, v in math.items()}
    return {"cta": cta, "tile": tile, "kb": kb, "m": m, "n": n, "t": t, "math": math, "ns_per_cycle": b,
            "sm": sm_of}, step


def _kb_times(ev: dict, kb: int) -> dict:
    """{(cta, tile): issue time of K block `kb`} (ns)."""
    sel = ev["kb"] == kb
    return {(int(q), int(w)): float(x) for q, w, x in zip(ev["cta"][sel], ev["tile"][sel], ev["t"][sel])}


def cta_tile_times(ev: dict) -> dict:
    """Each CTA's tile times, in order: {cta: [ns, ...]} (a tile's first K
    block's issue to the next tile's)."""
    st = _kb_times(ev, 0)
    per = {}
    for (q, w), x in sorted(st.items()):
        if (q, w + 1) in st:
            per.setdefault(q, []).append(st[(q, w + 1)] - x)
    return per


def cta_rates(ev: dict) -> dict:
    """Each CTA's mean tile time (ns), for CTAs with at least two tiles timed."""
    import numpy as np
    return {q: float(np.mean(v)) for q, v in cta_tile_times(ev).items() if len(v) >= 2}


def launch_correlations(evs: list) -> dict:
    """Across consecutive launches: the correlation of the CTAs' rates
    matched by CTA index and matched by SM (``%smid``).  A rate that follows
    the SM and not the CTA index belongs to the hardware, not to the tiles
    (the CTA -> SM placement changes between launches)."""
    import numpy as np
    by_cta, by_sm = [], []
    for a, b in zip(evs, evs[1:]):
        ra, rb = cta_rates(a), cta_rates(b)
        common = sorted(set(ra) & set(rb))
        if len(common) > 2:
            by_cta.append(float(np.corrcoef([ra[q] for q in common], [rb[q] for q in common])[0, 1]))
        sa = {a["sm"][q]: v for q, v in ra.items()}
        sb = {b["sm"][q]: v for q, v in rb.items()}
        common = sorted(set(sa) & set(sb))
        if len(common) > 2:
            by_sm.append(float(np.corrcoef([sa[q] for q in common], [sb[q] for q in common])[0, 1]))
    return {"by_cta": float(np.mean(by_cta)) if by_cta else float("nan"),
            "by_sm": float(np.mean(by_sm)) if by_sm else float("nan")}


def _near_before(keys, t, windows):
    """For records grouped by `keys`, the fraction that have another record
    of the same key within each window (ns) before them, and the median
    nearest-neighbour gap."""
    import numpy as np
    order = np.lexsort((t, keys))
    k, tt = keys[order], t[order]
    prev_gap = np.full(tt.shape, np.inf)
    same = k[1:] == k[:-1]
    prev_gap[1:][same] = tt[1:][same] - tt[:-1][same]
    next_gap = np.full(tt.shape, np.inf)
    next_gap[:-1][same] = tt[1:][same] - tt[:-1][same]
    nn = np.minimum(prev_gap, next_gap)
    fin = np.isfinite(nn)
    return ([float(np.mean(prev_gap <= w)) for w in windows],
            float(np.median(nn[fin])) / 1e3 if fin.any() else float("nan"))


def summarise(ev: dict, num_kb: int, multicast_a: bool) -> dict:
    import numpy as np
    cta, tile, kb, m, n, t = (ev[x] for x in ("cta", "tile", "kb", "m", "n", "t"))
    out = {"span": float(t.max() - t.min()) / 1e3, "records": int(t.size)}
    order = np.lexsort((kb, tile, cta))
    cta_o, tile_o, kb_o, t_o = cta[order], tile[order], kb[order], t[order]
    same_tile = (cta_o[1:] == cta_o[:-1]) & (tile_o[1:] == tile_o[:-1])
    d = np.diff(t_o)
    out["kb"] = float(np.median(d[same_tile])) / 1e3
    out["kb_p90"] = float(np.percentile(d[same_tile], 90)) / 1e3
    switch = (cta_o[1:] == cta_o[:-1]) & (tile_o[1:] == tile_o[:-1] + 1) & (kb_o[:-1] == num_kb - 1) & (kb_o[1:] == 0)
    out["switch"] = float(np.median(d[switch])) / 1e3 if switch.any() else float("nan")
    out["switch_p90"] = float(np.percentile(d[switch], 90)) / 1e3 if switch.any() else float("nan")
    windows = (200.0, 500.0, 1000.0)
    # B: every CTA loads its own (A multicast); A: rank 0 of a cluster with multicast
    b_key = n * RECORDS + kb
    fr, nn = _near_before(b_key, t, windows)
    out.update({"B<200": fr[0], "B<500": fr[1], "B<1000": fr[2], "B_nn": nn})
    a_sel = (cta % 2 == 0) if multicast_a else np.ones(cta.shape, bool)
    fr, nn = _near_before((m * RECORDS + kb)[a_sel], t[a_sel], windows)
    out.update({"A<200": fr[0], "A<500": fr[1], "A<1000": fr[2], "A_nn": nn})
    first = kb == 0
    sds = []
    for w in np.unique(tile[first]):
        s = first & (tile == w)
        if s.sum() > 16:
            sds.append(float(np.std(t[s])))
    out["start_sd"] = float(np.median(sds)) / 1e3 if sds else float("nan")
    out["start_sd_by_tile"] = [x / 1e3 for x in sds]
    # each CTA's own rate: its mean tile time (first K block to the next
    # tile's), spread over the CTAs, and whether a CTA keeps its rate (the
    # correlation of its mean over its first and its second half of tiles)
    means = list(cta_rates(ev).values())
    out["rate_sd"] = float(np.std(means)) / 1e3 if len(means) > 2 else float("nan")
    halves = [(np.mean(v[:len(v) // 2]), np.mean(v[len(v) // 2:])) for v in cta_tile_times(ev).values() if len(v) >= 4]
    out["rate_corr"] = float(np.corrcoef(np.array(halves).T)[0, 1]) if len(halves) > 2 else float("nan")
    # the two CTAs of a cluster (blockIdx.x ^ 1), same tile index and K block
    key = (cta // 2) * (MAX_TILES * RECORDS) + tile * RECORDS + kb
    order = np.lexsort((cta, key))
    k2, t2 = key[order], t[order]
    pair = k2[1:] == k2[:-1]
    out["pair"] = float(np.median(np.abs(t2[1:] - t2[:-1])[pair])) / 1e3 if pair.any() else float("nan")
    # the math warpgroups, per tile (times from each CTA's clock64)
    mt = ev["math"]
    start, lastkb = _kb_times(ev, 0), _kb_times(ev, num_kb - 1)
    keys = list(zip(mt["cta"].tolist(), mt["tile"].tolist()))
    st = np.array([start.get(k, np.nan) for k in keys])
    lk = np.array([lastkb.get(k, np.nan) for k in keys])
    loop = mt["end0"] - st

    def med(x):
        x = x[np.isfinite(x)]
        return float(np.median(x)) if x.size else float("nan")
    out["tile"] = med(np.array([d for v in cta_tile_times(ev).values() for d in v])) / 1e3
    out["wait0"] = med(mt["wait0"] / loop)
    out["wait1"] = med(mt["wait1"] / loop)
    out["tail"] = med(mt["end0"] - lk) / 1e3
    out["epi"] = med(mt["epi0"] - mt["end0"]) / 1e3
    out["wg_skew"] = med(mt["end1"] - mt["end0"]) / 1e3
    last_store = {}   # each CTA's last tile's store issue
    for (q, _), v in zip(keys, mt["epi0"]):
        if np.isfinite(v):
            last_store[q] = max(v, last_store.get(q, v))
    ends = list(last_store.values())
    out["end_spread"] = float(max(ends) - np.median(ends)) / 1e3 if ends else float("nan")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dims", nargs="+", type=int, help="M N K, repeated")
    p.add_argument("--config", default="256x128 s3 c2A", help="cugemm8's forced config (DeepGEMM picks its own)")
    p.add_argument("--deepgemm", action="store_true", help="also DeepGEMM (its tree on PYTHONPATH)")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--producer-only", action="store_true",
                   help="no math-side records (the timed full-barrier waits add 4 (cugemm8) and 8 "
                        "(DeepGEMM) SASS instructions per K block and warp)")
    p.add_argument("--variant", metavar="PLAN.json:NAME",
                   help="cugemm8's kernel from that tools/perf/variant_sweep.py plan variant "
                        "(its root and replacements), instrumented the same way")
    p.add_argument("--json")
    p.add_argument("--npz", help="save each run's raw records here (numpy .npz)")
    args = p.parse_args(argv)
    if len(args.dims) % 3:
        p.error("dims must be M N K triples")
    shapes = [tuple(args.dims[i:i + 3]) for i in range(0, len(args.dims), 3)]
    if any(k // 128 > MAX_KB for _, _, k in shapes):
        p.error(f"K must be at most {MAX_KB * 128}")
    if args.deepgemm:
        os.environ["DG_JIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="dg_probe_cache_")

    import cupy as cp
    import numpy as np

    import common
    import cugemm8
    from cugemm8 import _jit, gemm as G
    from cugemm8.cli import Shape, bf16_to_f64, calc_diff, gemm_call, make_operands, poisoned_out, reference
    from sweep_configs import parse_config
    from variant_sweep import make_tree, variant

    num_sms = cugemm8.get_num_sms()
    buf = cp.zeros(num_sms * MAX_TILES * RECORDS * SLOT, dtype=cp.uint64)
    addr = int(buf.data.ptr)
    flush = common.L2Flush()
    tmp = Path(tempfile.mkdtemp(prefix="cugemm8_cluster_timeline_"))
    spec = {"replace": cugemm8_replacements(addr, not args.producer_only)}
    label = "cugemm8"
    if args.variant:
        plan_path, name = args.variant.rsplit(":", 1)
        vspec = json.loads(Path(plan_path).read_text())["variants"][name]
        spec = dict(vspec, replace=[list(r) for r in vspec.get("replace", [])] + spec["replace"])
        label = f"cugemm8:{name}"
    tree = make_tree(_jit.cuda_src_dir(), spec, tmp / "probe")

    dg_path = dg_saved = None
    if args.deepgemm:
        import deepgemm_anchor
        dg_mod, reason = deepgemm_anchor.load()
        if dg_mod is None:
            print(reason)
            args.deepgemm = False
        else:
            dg_path = Path(dg_mod.__file__).parent / "include" / DG_HEADER
            dg_saved = dg_path.read_text()
            text = dg_saved
            for old, new in deepgemm_replacements(addr, not args.producer_only):
                text = _replace_once(text, old, new, str(dg_path))
            dg_path.write_text(text)

    results, raws = [], {}

    def capture(run, label, shape, multicast_a):
        evs = []
        for i in range(args.launches):
            buf.fill(0)
            flush()
            run()
            cp.cuda.runtime.deviceSynchronize()
            raw = cp.asnumpy(buf)
            evs.append(events(raw, shape[2] // 128))
        ev, step = evs[-1]
        s = summarise(ev, shape[2] // 128, multicast_a)
        s.update(launch_correlations([e for e, _ in (evs[1:] if len(evs) > 2 else evs)]))
        s.update(lib=label, shape="x".join(map(str, shape)), gt_step_ns=step)
        raws[f"{label}_{s['shape']}_events"] = np.stack([ev[x].astype(np.float64) for x in ("cta", "tile", "m", "n", "kb", "t")])
        raws[f"{label}_{s['shape']}_raw"] = raw
        results.append(s)
        return s

    try:
        for m, n, k in shapes:
            shape = Shape("normal", m, n, k)
            ops = make_operands(shape, cp, seed=0)
            ref, _ = reference(ops, shape, cp)
            cfg = parse_config(args.config.replace("c2A", "c2"), shape, num_sms)
            with variant(tree, spec), G._forced_config(cfg):
                out = poisoned_out(shape, ops, cp)
                run = gemm_call(shape, ops, out)
                s = capture(run, label, (m, n, k), cfg.num_multicast == 2 and cfg.multicast_on_a)
                s["config"] = str(cfg)
                s["calc_diff"] = float(calc_diff(bf16_to_f64(out, cp), ref, cp))
            if args.deepgemm:
                sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
                dg_run = deepgemm_anchor.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
                s = capture(dg_run, "deepgemm", (m, n, k), True)
                s["config"] = "its own"
                s["calc_diff"] = float(calc_diff(common.torch_to_f64(dg_run.out, m), ref, cp))
    finally:
        if dg_path is not None:
            dg_path.write_text(dg_saved)

    cols = ["span", "tile", "kb", "kb_p90", "switch", "B<200", "B<500", "B<1000", "B_nn",
            "A<500", "start_sd", "rate_sd", "rate_corr", "by_cta", "by_sm", "pair", "wait0", "wait1", "tail", "epi", "wg_skew",
            "end_spread"]
    print(f"{'shape':17s} {'lib':16s} " + " ".join(f"{c:>9s}" for c in cols) + "  (µs, fractions)")
    for s in results:
        print(f"{s['shape']:17s} {s['lib']:16s} " + " ".join(f"{s[c]:9.3f}" for c in cols)
              + f"  diff {s['calc_diff']:.1e} gt step {s['gt_step_ns']:.0f} ns")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.npz:
        np.savez_compressed(args.npz, **raws)
    return 0


if __name__ == "__main__":
    sys.exit(main())
