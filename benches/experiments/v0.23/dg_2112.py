"""DeepGEMM's and cugemm8's picks on the 2112x7168 rows, CUPTI after the benches' flush, same process."""
import sys
sys.path.insert(0, "benches"); sys.path.insert(0, ".")
import cupy as cp
import common, deepgemm_anchor as dga
from cugemm8.cli import Shape, make_operands, gemm_call
from cugemm8.cli._data import poisoned_out
import cugemm8
def main():
    shapes = [(4096, 2112, 7168), (8192, 2112, 7168), (2048, 2112, 7168)]
    print(dga.prewarm([dga.warm_spec((m, n, k)) for m, n, k in shapes]), flush=True)
    flush = common.L2Flush()
    for m, n, k in shapes:
        sh = Shape("normal", m, n, k)
        ops = make_operands(sh, cp, seed=0)
        sfa = cugemm8.get_col_major_tma_aligned_tensor(ops["sfa"])
        dg = dga.gemm_nt(ops["a"], sfa, ops["b"], ops["sfb"])
        ours = gemm_call(sh, ops, poisoned_out(sh, ops, cp))
        for rnd in range(3):
            a = common.kernel_times([ours], reps=30, flush=flush).median
            b = common.kernel_times([dg], reps=30, flush=flush).median
            print(f"{m}x{n}x{k} round {rnd}: cugemm8 {cugemm8.get_gemm_config('normal', m, n, k)} "
                  f"{a:.1f} us, DeepGEMM {b:.1f} us, xDG {b/a:.3f}", flush=True)

if __name__ == '__main__':
    main()
