"""The heuristic's pick changes behind benches/RESULTS.md v0.30 (CPU only):

    python benches/experiments/v0.30/pick_diff.py > benches/experiments/v0.30/pick_diff.log

Over the grid below (normal GEMMs, 132 / 128 / 100 SMs; the first two
counts at 132 SMs only), counts the picks that differ between
  twin:    v0.29's cugemm8/_config.py (git 1a1d11b) and this tree's
           (the one-warpgroup split-K twin, _split_k_one_wg_twin);
  skew:    this tree's cost model and the same model counting the
           one-warpgroup skew in the busiest rank's K blocks (not landed);
  bn64:    v0.29's model and the same with SPLIT_K_MAX_BLOCK_N = 64 (not landed).
The log is from v0.30's tree (cd038cf); on a later tree the first count
also holds that tree's own changes (v0.31's adds two rows at 132 SMs and two
at 128: benches/experiments/v0.31/pick_diff.py).  v0.31 imports the grid and the
helpers.
"""
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import cugemm8._config as cur  # noqa: E402

MS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 65, 96, 100, 128, 200, 256, 512, 1024, 4096]
NS = [256, 512, 576, 1024, 1536, 2048, 2112, 3072, 4096, 7168, 8192, 16384, 24576, 32768]
KS = [512, 1024, 1536, 2048, 4096, 7168, 8192, 16384]


def module_from(text: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_loader(f"cugemm8.{name}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod.__name__] = mod
    exec(compile(text, f"<{name}>", "exec"), mod.__dict__)
    return mod


def picks(mod, sms_list):
    return {(s, m, n, k): str(mod._rank("normal", m, n, k, 1, s, mod.SMEM_LIMIT)[0][1])
            for s in sms_list for m in MS for n in NS for k in KS}


def diff(name, a, b, show=True):
    changed = [key for key in a if a[key] != b[key]]
    print(f"{name}: {len(changed)} of {len(a)} picks differ")
    for key in changed if show else []:
        print(f"  sms={key[0]} {key[1]}x{key[2]}x{key[3]}: {a[key]} -> {b[key]}")


def main() -> None:
    old_text = subprocess.run(["git", "-C", str(ROOT), "show", "1a1d11b:cugemm8/_config.py"],
                              capture_output=True, text=True, check=True).stdout
    old = module_from(old_text, "_config_v029")
    cur_text = Path(cur.__file__).read_text()
    counted = module_from(cur_text.replace("(split_k_skew(bm, k) if splits == 2 else 0)",
                                           "(split_k_skew(bm, k, wgs) if splits == 2 else 0)"), "_config_counted")
    wide = module_from(old_text, "_config_bn64")
    wide.SPLIT_K_MAX_BLOCK_N = 64

    diff("twin (v0.29 -> this tree)", picks(old, (132, 128, 100)), picks(cur, (132, 128, 100)))
    diff("skew counted in the cost model", picks(cur, (132,)), picks(counted, (132,)))
    diff("SPLIT_K_MAX_BLOCK_N = 64 on v0.29's model", picks(old, (132,)), picks(wide, (132,)), show=False)


if __name__ == "__main__":
    main()
