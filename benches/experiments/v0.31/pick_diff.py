"""The heuristic's pick changes behind benches/RESULTS.md v0.31 (CPU only):

    python benches/experiments/v0.31/pick_diff.py > benches/experiments/v0.31/pick_diff.log

Over v0.30's grid (benches/experiments/v0.30/pick_diff.py) and the M = 65-128
rows of N = 3072-4224, normal GEMMs on 132 / 128 / 100 SMs, lists the picks
that differ between v0.30's cugemm8/_config.py (git cd038cf) and this
tree's (the 128-row split-K twin of a 64-row one-warpgroup pick,
_split_k_m128_twin)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "benches" / "experiments" / "v0.30"))
import cugemm8._config as cur  # noqa: E402
from pick_diff import KS, MS, NS, diff, module_from  # noqa: E402  (v0.30's grid and helpers)

MS_ALL = sorted(set(MS) | {72, 80, 112, 120})
NS_ALL = sorted(set(NS) | {3584, 4224, 5120})


def picks(mod, sms_list):
    return {(s, m, n, k): str(mod._rank("normal", m, n, k, 1, s, mod.SMEM_LIMIT)[0][1])
            for s in sms_list for m in MS_ALL for n in NS_ALL for k in KS}


old_text = subprocess.run(["git", "-C", str(ROOT), "show", "cd038cf:cugemm8/_config.py"],
                          capture_output=True, text=True, check=True).stdout
old = module_from(old_text, "_config_v030")
diff("m128 twin (v0.30 -> this tree)", picks(old, (132, 128, 100)), picks(cur, (132, 128, 100)))
