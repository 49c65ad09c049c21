"""Sample SM clock and power while looping one GEMM (ours, then cuBLASLt)."""
import subprocess, sys, time, statistics
sys.path.insert(0, '.'); sys.path.insert(1, 'benches')
import cupy as cp
import common
from cugemm8.cli import Shape, make_operands, poisoned_out, gemm_call

def sample(fn, seconds=2.5):
    for _ in range(3): fn()
    cp.cuda.runtime.deviceSynchronize()
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
                         stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    t0 = time.time(); n = 0
    while time.time() - t0 < seconds:
        for _ in range(20): fn()
        cp.cuda.runtime.deviceSynchronize(); n += 20
    p.terminate(); out = p.communicate()[0].strip().splitlines()
    vals = [tuple(float(x) for x in l.split(',')) for l in out if l.strip()]
    vals = vals[len(vals)//4: -2]
    ev_s = cp.cuda.Event(); ev_e = cp.cuda.Event(); ev_s.record()
    for _ in range(50): fn()
    ev_e.record(); ev_e.synchronize()
    us = cp.cuda.get_elapsed_time(ev_s, ev_e) * 1e3 / 50
    return statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals), us

for m, n, k in [(4096, 7168, 16384), (4096, 4096, 7168)]:
    s = Shape("normal", m, n, k)
    ops = make_operands(s, cp, seed=0)
    out = poisoned_out(s, ops, cp)
    ours = gemm_call(s, ops, out)
    clk, pw, us = sample(ours)
    print(f"{m}x{n}x{k} cugemm8  : SM clock {clk:.0f} MHz, power {pw:.0f} W, back-to-back {us:.1f} us/call, {2*m*n*k/us/1e6:.0f} TFLOPS", flush=True)
    try:
        tb = common.torch_blockwise_gemm(ops["a"], ops["sfa"], ops["b"], ops["sfb"])
        clk, pw, us = sample(tb)
        print(f"{m}x{n}x{k} cuBLASLt : SM clock {clk:.0f} MHz, power {pw:.0f} W, back-to-back {us:.1f} us/call, {2*m*n*k/us/1e6:.0f} TFLOPS", flush=True)
    except Exception as e:
        print("cublas failed", e)
    # zero inputs: data-dependent power?
    za = {**ops, "a": cp.zeros_like(ops["a"]), "b": cp.zeros_like(ops["b"])}
    zero = gemm_call(s, za, out)
    clk, pw, us = sample(zero)
    print(f"{m}x{n}x{k} zeros    : SM clock {clk:.0f} MHz, power {pw:.0f} W, back-to-back {us:.1f} us/call, {2*m*n*k/us/1e6:.0f} TFLOPS", flush=True)
    del ops, out, za
    common.release_memory()
