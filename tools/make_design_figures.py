"""Draw the figures of docs/design.md into docs/figures/ (no GPU needed).

    python tools/make_design_figures.py

* pipeline.png   - schematic timeline of the warp-specialised main loop;
* sfa_layout.png - the SFA scale tensor row-major vs MN-major TMA-aligned;
* raster.png     - the persistent scheduler's tile order (bands of 16);
* tiles.png      - which rows / K blocks each math warpgroup owns per BLOCK_M;
* promotion.png  - error of promoted vs unpromoted accumulation against K,
                   from the models in cugemm8.reference.

Deterministic: fixed data and seeds, the Agg backend, and PNG metadata
without the matplotlib version or a date, so rerunning changes no bytes on
the same matplotlib version.  The timeline is a schematic (made-up unit
durations), not a measurement.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "figures"
META = {"Software": None}          # keep the PNG free of version strings
DPI = 130

C_TMA = "#4C72B0"       # TMA load in flight
C_FULL = "#8CB8E8"      # stage full, read by WGMMA
C_MMA = "#DD8452"       # WGMMA (4 x k32)
C_PROMO = "#55A868"     # promotion FFMAs
C_WAIT = "#BBBBBB"


def _save(fig, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / name, dpi=DPI, metadata=META)
    plt.close(fig)
    print(f"wrote {(OUT / name).relative_to(ROOT)}")


# ----------------------------------------------------------------------------
# (a) pipeline timeline
# ----------------------------------------------------------------------------

def _simulate(num_kb=9, stages=4, issue_gap=0.25, latency=2.6, t_mma=1.0, t_promo=0.7,
              wg_skew=0.12):
    """Event times of a toy model of the main loop (BLOCK_M = 128: both math
    warpgroups read every stage, each for its own 64 rows)."""
    issue, ready, free = [], [], []
    mma = {0: [], 1: []}
    promo_end = {0: 0.0, 1: 0.0}
    for kb in range(num_kb):
        empty_at = free[kb - stages] if kb >= stages else 0.0
        t = max(issue[-1] + issue_gap if issue else 0.0, empty_at)
        issue.append(t)
        ready.append(t + latency)
        releases = []
        for wg in (0, 1):
            start = max(ready[kb] + wg * wg_skew, promo_end[wg])
            end = start + t_mma
            mma[wg].append((start, end))
            releases.append(end)
            promo_end[wg] = end + t_promo
        free.append(max(releases))
    return issue, ready, free, mma, stages, t_promo


def figure_pipeline() -> None:
    issue, ready, free, mma, stages, t_promo = _simulate()
    num_kb = len(issue)
    rows = ["TMA thread\n(producer WG)"] + [f"stage {s}" for s in range(stages)] + \
           ["math WG 0\n(rows 0-63)", "math WG 1\n(rows 64-127)"]
    y = {name: len(rows) - 1 - i for i, name in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(13, 5.4))
    h = 0.6

    def bar(row, t0, t1, color, text="", size=7):
        ax.add_patch(Rectangle((t0, y[row] - h / 2), t1 - t0, h, facecolor=color, edgecolor="black",
                               linewidth=0.6, zorder=2))
        if text:
            ax.text((t0 + t1) / 2, y[row], text, ha="center", va="center", fontsize=size, zorder=3)

    for kb in range(num_kb):
        s = kb % stages
        stage_row = f"stage {s}"
        # The producer waits on empty[s] (from the previous round) then issues.
        if kb >= stages:
            waited = issue[kb] - (issue[kb - 1] + 0.25)
            if waited > 1e-9:
                bar(rows[0], issue[kb - 1] + 0.25, issue[kb], C_WAIT, "")
        bar(rows[0], issue[kb], issue[kb] + 0.2, C_TMA, "")
        if kb >= stages:
            ax.text(issue[kb] + 0.1, y[rows[0]] + 0.42, f"kb{kb}", ha="center", fontsize=6.5)
        elif kb == 0:
            ax.text(issue[stages - 1] / 2 + 0.1, y[rows[0]] + 0.42, f"kb0-kb{stages - 1}", ha="center",
                    fontsize=6.5)
        bar(stage_row, issue[kb], ready[kb], C_TMA, f"TMA kb{kb}")
        bar(stage_row, ready[kb], free[kb], C_FULL, f"kb{kb}")
        for wg, row in ((0, rows[-2]), (1, rows[-1])):
            t0, t1 = mma[wg][kb]
            bar(row, t0, t1, C_MMA, f"MMA kb{kb}", size=6.5)
            bar(row, t1, t1 + t_promo, C_PROMO, "FFMA", size=6)
        # Release arrow: the last warpgroup's arrive on empty[s] frees the stage.
        ax.add_patch(FancyArrowPatch((free[kb], y[rows[-2]] + h / 2), (free[kb], y[stage_row] - h / 2),
                                     arrowstyle="-|>", mutation_scale=7, color="#C44E52", linewidth=0.8,
                                     zorder=1))
        if kb + stages < num_kb:
            ax.add_patch(FancyArrowPatch((free[kb], y[stage_row] + h / 2),
                                         (issue[kb + stages], y[rows[0]] - h / 2),
                                         arrowstyle="-|>", mutation_scale=7, color="#C44E52",
                                         linewidth=0.6, linestyle=(0, (2, 2)), zorder=1))
    ax.set_yticks([y[r] for r in rows], rows, fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.2)
    end = max(t1 for t0, t1 in mma[1]) + t_promo + 0.3
    ax.set_xlim(-0.2, end)
    ax.set_xlabel("time (schematic units, not measured)")
    ax.set_title("Warp-specialised main loop, BLOCK_M = 128, 4 stages: the producer refills a stage as soon "
                 "as both math warpgroups released it;\nrelease comes right after the WGMMA wait, before the "
                 "promotion FFMAs, so the next TMA load overlaps the promotion", fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", linewidth=0.6) for c in
               (C_TMA, C_FULL, C_MMA, C_PROMO, C_WAIT)]
    labels = ["TMA load in flight (full barrier pending)", "stage full: read by WGMMA",
              "4 x wgmma k32 + wait_group 0", "promotion: final += SFA*SFB*acc (FFMA)",
              "producer waits on empty barrier"]
    handles.append(FancyArrowPatch((0, 0), (1, 0), arrowstyle="-|>", color="#C44E52"))
    labels.append("arrive on empty[s] (release) -> next load into that stage")
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.2)
    fig.tight_layout()
    _save(fig, "pipeline.png")


# ----------------------------------------------------------------------------
# (b) SFA layout
# ----------------------------------------------------------------------------

def figure_sfa_layout(m=6, kb=3) -> None:
    m_pad = -(-m // 4) * 4
    colors = ["#4C72B0", "#DD8452", "#55A868"]
    fig = plt.figure(figsize=(13, 4.6))
    gs = fig.add_gridspec(2, 2, width_ratios=[1, 4.2], hspace=0.9, wspace=0.12)

    # Logical [m, kb] matrix.
    ax = fig.add_subplot(gs[:, 0])
    for i in range(m):
        for j in range(kb):
            ax.add_patch(Rectangle((j, m - 1 - i), 1, 1, facecolor=colors[j], alpha=0.35, edgecolor="black"))
            ax.text(j + 0.5, m - 0.5 - i, f"s{i}{j}", ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.2, kb + 0.2)
    ax.set_ylim(-0.3, m + 0.3)
    ax.set_xticks([j + 0.5 for j in range(kb)], [f"kb={j}" for j in range(kb)], fontsize=8)
    ax.set_yticks([m - 0.5 - i for i in range(m)], [f"m={i}" for i in range(m)], fontsize=8)
    ax.set_title(f"SFA, logical [m, ceil(k/128)] = [{m}, {kb}]\nfloat32", fontsize=9)
    ax.set_aspect("equal")
    for s in ax.spines.values():
        s.set_visible(False)

    def strip(ax, order, title, note):
        n = len(order)
        for pos, cell in enumerate(order):
            if cell is None:
                ax.add_patch(Rectangle((pos, 0), 1, 1, facecolor="white", edgecolor="black", hatch="///"))
                ax.text(pos + 0.5, 0.5, "pad", ha="center", va="center", fontsize=6.5)
            else:
                i, j = cell
                ax.add_patch(Rectangle((pos, 0), 1, 1, facecolor=colors[j], alpha=0.35 if j else 0.9,
                                       edgecolor="black"))
                ax.text(pos + 0.5, 0.5, f"s{i}{j}", ha="center", va="center", fontsize=7)
        for b in range(0, n + 1, 4):
            ax.plot([b, b], [-0.35, 1.35], color="black", linewidth=1.4 if b % 4 == 0 else 0.5)
            ax.text(b, -0.55, f"{4 * b} B", ha="center", va="top", fontsize=6.5)
        ax.set_xlim(-0.3, n + 0.3)
        ax.set_ylim(-1.2, 1.6)
        ax.axis("off")
        ax.set_title(title, fontsize=9, loc="left")
        ax.text(0, 1.45, note, fontsize=7.5, va="bottom")

    row_major = [(i, j) for i in range(m) for j in range(kb)]
    strip(fig.add_subplot(gs[0, 1]), row_major,
          f"row-major (what a NumPy quantiser returns): strides (4*kb, 4) = ({4 * kb}, 4) bytes",
          f"the kb=0 scales of consecutive rows (dark) are {4 * kb} bytes apart; a TMA box needs a contiguous "
          "inner extent that is a multiple of 16 bytes")
    mn_major = []
    for j in range(kb):
        mn_major += [(i, j) for i in range(m)] + [None] * (m_pad - m)
    strip(fig.add_subplot(gs[1, 1]), mn_major,
          f"MN-major, TMA-aligned (what the kernel reads): strides (4, 4*m_pad) bytes, m_pad = {m_pad}",
          "each K-block column is one contiguous run starting on a 16-byte boundary: "
          "one TMA box of BLOCK_M floats per stage; pad rows hold 0")
    _save(fig, "sfa_layout.png")


# ----------------------------------------------------------------------------
# (c) scheduler raster order
# ----------------------------------------------------------------------------

def raster_order(num_m_blocks: int, num_cluster_n: int, band: int = 16):
    """(mc, nc) of each cluster tile index, as scheduler.cuh's next() (normal GEMM)."""
    out = []
    for ct in range(num_m_blocks * num_cluster_n):
        b = ct // (band * num_m_blocks)
        start = b * band
        width = min(band, num_cluster_n - start)
        in_band = ct - b * band * num_m_blocks
        out.append((in_band // width, start + in_band % width))
    return out


def figure_raster(mb=6, nb=40, ctas=8, band=16) -> None:
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 1, figsize=(14, 6.4), gridspec_kw={"height_ratios": [1, 1], "hspace": 0.55})

    # Top: no multicast.
    ax = axes[0]
    order = raster_order(mb, nb, band)
    for ct, (mc, nc) in enumerate(order):
        ax.add_patch(Rectangle((nc, mb - 1 - mc), 1, 1, facecolor=cmap(ct % ctas), alpha=0.55,
                               edgecolor="white"))
        ax.text(nc + 0.5, mb - 0.5 - mc, str(ct), ha="center", va="center", fontsize=5.5)
    for x in range(0, nb + 1, band):
        ax.plot([x, x], [0, mb], color="black", linewidth=1.6)
    ax.set_xlim(0, nb)
    ax.set_ylim(0, mb)
    ax.set_xticks([x + 0.5 for x in range(0, nb, 4)], [str(x) for x in range(0, nb, 4)], fontsize=7)
    ax.set_yticks([mb - 0.5 - i for i in range(mb)], [str(i) for i in range(mb)], fontsize=7)
    ax.set_xlabel("n-block", fontsize=8)
    ax.set_ylabel("m-block", fontsize=8)
    ax.set_title(f"{mb} m-blocks x {nb} n-blocks, no multicast, {ctas} persistent CTAs, bands of {band} "
                 f"n-blocks (thick lines). Number = tile index; colour = CTA (tile index mod {ctas}); "
                 f"CTA b runs b, b+{ctas}, b+{2 * ctas}, ...", fontsize=8.5)

    # Bottom: multicast on A, an odd number of n-blocks: the last cluster has a phantom half.
    ax = axes[1]
    nb2 = 39
    ncl = -(-nb2 // 2)
    clusters = ctas // 2
    band_cl = band // 2                     # scheduler.cuh: kBandN = 16 / kPairN cluster columns
    order = raster_order(mb, ncl, band_cl)
    for ct, (mc, nc) in enumerate(order):
        for rank in (0, 1):
            n_block = 2 * nc + rank
            phantom = n_block >= nb2
            ax.add_patch(Rectangle((n_block, mb - 1 - mc), 1, 1,
                                   facecolor="#E0E0E0" if phantom else cmap(ct % clusters),
                                   alpha=1.0 if phantom else (0.55 if rank == 0 else 0.35),
                                   edgecolor="black" if phantom else "white",
                                   linestyle="--" if phantom else "-"))
            ax.text(n_block + 0.5, mb - 0.5 - mc, str(ct) if not phantom else f"{ct}\nph.", ha="center",
                    va="center", fontsize=5.5)
    for x in range(0, 2 * ncl + 1, 2 * band_cl):
        ax.plot([x, x], [0, mb], color="black", linewidth=1.6)
    ax.set_xlim(0, 2 * ncl)
    ax.set_ylim(0, mb)
    ax.set_xticks([x + 0.5 for x in range(0, 2 * ncl, 4)], [str(x) for x in range(0, 2 * ncl, 4)], fontsize=7)
    ax.set_yticks([mb - 0.5 - i for i in range(mb)], [str(i) for i in range(mb)], fontsize=7)
    ax.set_xlabel("n-block", fontsize=8)
    ax.set_ylabel("m-block", fontsize=8)
    ax.set_title(f"{mb} x {nb2} n-blocks with multicast of A (clusters of 2 CTAs, {clusters} clusters): a cluster "
                 f"tile is two adjacent n-blocks of one m-block (same number, rank 0 darker); bands of {band_cl} "
                 f"cluster columns ({band} n-blocks);\nn-block {nb2} does not exist, so rank 1 of the last column runs a phantom "
                 f"tile ('ph.'): it loads and computes in lock-step but stores nothing", fontsize=8.5)
    _save(fig, "raster.png")


# ----------------------------------------------------------------------------
# (d) which warpgroup does what per BLOCK_M
# ----------------------------------------------------------------------------

def figure_tiles() -> None:
    c0, c1 = "#4C72B0", "#DD8452"
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.6, 1, 1]})

    # BLOCK_M = 64: both warpgroups on the same 64 rows, even / odd K blocks.
    ax = axes[0]
    for kb in range(8):
        ax.add_patch(Rectangle((kb, 0), 1, 64, facecolor=c0 if kb % 2 == 0 else c1, alpha=0.6,
                               edgecolor="black"))
        ax.text(kb + 0.5, 32, f"kb{kb}\nWG{kb % 2}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, 8)
    ax.set_ylim(256, 0)
    ax.set_xlabel("K blocks of the A tile (128 wide each)", fontsize=8)
    ax.set_ylabel("tile row", fontsize=8)
    ax.set_title("BLOCK_M = 64 (split K)\nWG0 takes even K blocks, WG1 odd; WG1 adds its FP32\n"
                 "tile into WG0's through shared memory; WG0 stores", fontsize=8.5)

    for ax, bm in ((axes[1], 128), (axes[2], 256)):
        for sub in range(bm // 64):
            wg = (sub % 2)
            wave = sub // 2
            ax.add_patch(Rectangle((0, sub * 64), 1, 64, facecolor=c0 if wg == 0 else c1,
                                   alpha=0.6 if wave == 0 else 0.35, edgecolor="black"))
            ax.text(0.5, sub * 64 + 32, f"rows {sub * 64}-{sub * 64 + 63}\nWG{wg}, sub-tile {wave}",
                    ha="center", va="center", fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(256, 0)
        ax.set_xticks([])
        ax.set_title(f"BLOCK_M = {bm}\n" + ("each WG owns 64 rows; both read every K block" if bm == 128 else
                                         "each WG owns two 64-row sub-tiles\n(rows 64w and 64w+128): two final\n"
                                         "accumulators, one temporary"), fontsize=8.5)
    fig.suptitle("Two math warpgroups (WG0, WG1) in every tile: who computes which rows and K blocks",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, "tiles.png")


# ----------------------------------------------------------------------------
# (e) promoted vs unpromoted accumulation
# ----------------------------------------------------------------------------

PROMOTION_KS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def promotion_errors(ks=PROMOTION_KS, m=4, n=8, seed=0):
    """Max relative error (over an m x n output) of the two accumulation models
    against the float64 reference, for all-positive uniform [0, 1) data."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from cugemm8 import reference as R
    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        x = rng.uniform(0.0, 1.0, size=(m, k)).astype(np.float32)
        w = rng.uniform(0.0, 1.0, size=(n, k)).astype(np.float32)
        a, sfa = R.per_token_cast_to_fp8(x)
        b, sfb = R.per_block_cast_to_fp8(w)
        ref = R.ref_gemm_nt(a, sfa, b, sfb)
        pro = R.promoted_accumulation_model(a, sfa, b, sfb, tensor_core="hopper").astype(np.float64)
        unp = R.unpromoted_accumulation_model(a, sfa, b, sfb).astype(np.float64)
        rows.append((k, ref[0, 0], pro[0, 0], unp[0, 0],
                     float(np.max(np.abs(pro - ref) / np.abs(ref))),
                     float(np.max(np.abs(unp - ref) / np.abs(ref)))))
    return rows


def figure_promotion() -> None:
    rows = promotion_errors()
    ks = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.loglog(ks, [r[5] for r in rows], "o-", color="#C44E52",
              label="unpromoted: whole K in the 13-bit tensor-core accumulator")
    ax.loglog(ks, [r[4] for r in rows], "s-", color="#4C72B0",
              label="promoted every 128 K into FP32 (H200 tensor-core model)")
    ax.axhline(2.0 ** -8, color="gray", linestyle=":", linewidth=1)
    ax.text(ks[0], 2.0 ** -8 * 1.15, "BF16 relative rounding bound (2^-8)", fontsize=7, color="gray")
    ax.set_xlabel("K")
    ax.set_ylabel("max relative error vs float64 reference")
    ax.set_xticks(ks, [str(k) for k in ks], fontsize=7)
    ax.set_title("All-positive data (uniform [0, 1), 4 x 8 outputs), per-token / per-block FP8\n"
                 "models: cugemm8.reference.{un,}promoted_accumulation_model", fontsize=9)
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    _save(fig, "promotion.png")


def main() -> int:
    figure_pipeline()
    figure_sfa_layout()
    figure_raster()
    figure_tiles()
    figure_promotion()
    if "--table" in sys.argv:
        print("K, ref[0,0], promoted[0,0], unpromoted[0,0], max rel promoted, max rel unpromoted")
        for r in promotion_errors():
            print(f"{r[0]:6d} {r[1]:.4f} {r[2]:.4f} {r[3]:.4f} {r[4]:.2e} {r[5]:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
