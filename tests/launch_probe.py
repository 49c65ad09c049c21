"""Run by the launcher tests: ``python -m cugemm8.launch --nproc N tests/launch_probe.py``.

Each rank sets itself up with :func:`cugemm8.launch.init_process`, checks
that it runs on its ``CUGEMM8_DEVICE`` with NVLink multicast off, all-reduces
``rank + 1`` over the ranks (expects ``N (N + 1) / 2``), prints one line and
exits 0 when all holds, 1 otherwise.  Not a test module (pytest does not
collect it).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cugemm8 import launch  # noqa: E402


def main() -> int:
    with launch.init_process() as ctx:
        import cupy
        x = cupy.full(4, ctx.rank + 1, dtype=cupy.float32)
        ctx.comm.allReduce(x.data.ptr, x.data.ptr, x.size, ctx.nccl.NCCL_FLOAT32, ctx.nccl.NCCL_SUM,
                           ctx.stream.ptr)
        got = x.get()
        want = ctx.world_size * (ctx.world_size + 1) / 2
        on_device = cupy.cuda.runtime.getDevice() == ctx.device_id == int(os.environ[launch.ENV_DEVICE])
        env_ok = all(os.environ.get(k) == v for k, v in launch.MULTICAST_OFF_ENV.items())
        ok = bool((got == want).all()) and on_device and env_ok
        ctx.say(f"device {ctx.device_id}, multicast off {env_ok}, all-reduce {got[0]:g} (want {want:g}) "
                f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
