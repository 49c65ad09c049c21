"""One process per GPU without mpirun or torchrun, and each rank's NCCL set-up.

Command line::

    python -m cugemm8.launch --nproc N [--devices 0,1,...] [--timeout S] SCRIPT [ARGS...]
    python -m cugemm8.launch --nproc N [...] -m MODULE [ARGS...]

starts N copies of ``python SCRIPT ARGS...`` (``python -m MODULE ARGS...``)
with this environment added to each child's:

===========================  ==================================================
``CUGEMM8_RANK``             the child's rank, ``0 .. N-1``
``CUGEMM8_WORLD_SIZE``       ``N``
``CUGEMM8_DEVICE``           the CUDA device index the rank uses (``--devices``;
                             default: the rank)
``CUGEMM8_NCCL_ID_FILE``     a fresh path where rank 0 writes the NCCL unique id
                             and the other ranks read it
``NCCL_NVLS_ENABLE=0``,      NVLink multicast (NVLS) off in every process
``TORCH_SYMM_MEM_DISABLE_``  (:data:`MULTICAST_OFF_ENV`); cugemm8 never creates
``MULTICAST=1``,             multicast objects.  Its own "TMA multicast" is a
``NVSHMEM_DISABLE_NVLS=1``   thread-block-cluster feature inside one GPU.
===========================  ==================================================

The script then calls :func:`init_process`::

    from cugemm8 import launch
    with launch.init_process() as ctx:       # device, private stream, NCCL communicator
        ctx.comm.allReduce(x.data.ptr, x.data.ptr, x.size, ctx.nccl.NCCL_FLOAT32,
                           ctx.nccl.NCCL_SUM, ctx.stream.ptr)

The launcher needs no GPU and no NCCL itself (rank 0 makes the unique id).
It exits with 0 when every child does; otherwise with the first non-zero
exit code, after stopping the other children (they may be waiting in NCCL
for the one that died), or 124 after ``--timeout`` seconds.

**The file recipe, without the launcher:** start the N processes any other
way (several shells, a batch system) with the four ``CUGEMM8_*`` variables
set by hand, ``CUGEMM8_NCCL_ID_FILE`` naming the same path in all of them,
one that no earlier run used: rank 0 writes the id there atomically, the
others wait for it, and rank 0 deletes it once the communicator is up.

Inside Python, :func:`run_ranks` does the same for a function (spawned
processes, results returned through a queue); ``examples/tensor_parallel.py``
and ``benches/bench_tp.py`` use it.  With ``N = 1`` everything works on one
GPU (a one-rank NCCL communicator).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import numpy as np

#: Set in the launcher and in every rank before NCCL initialises: no NVLink
#: multicast objects (NVLS) anywhere.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

ENV_RANK = "CUGEMM8_RANK"
ENV_WORLD_SIZE = "CUGEMM8_WORLD_SIZE"
ENV_DEVICE = "CUGEMM8_DEVICE"
ENV_NCCL_ID_FILE = "CUGEMM8_NCCL_ID_FILE"

#: Bytes of an NCCL unique id (``NCCL_UNIQUE_ID_BYTES``).
NCCL_UNIQUE_ID_BYTES = 128

#: Exit code of the launcher when ``--timeout`` expires (as coreutils' ``timeout``).
EXIT_TIMEOUT = 124


def multicast_off() -> None:
    """Force the NVLink-multicast-off variables (:data:`MULTICAST_OFF_ENV`)
    into this process's environment (before NCCL initialises)."""
    os.environ.update(MULTICAST_OFF_ENV)


def check_multicast_off() -> None:
    """Raise RuntimeError unless every :data:`MULTICAST_OFF_ENV` variable has its value."""
    bad = {k: os.environ.get(k) for k, v in MULTICAST_OFF_ENV.items() if os.environ.get(k) != v}
    if bad:
        raise RuntimeError(f"NVLink multicast must stay off; environment has {bad}")


def import_nccl():
    """``cupy.cuda.nccl``, or RuntimeError saying why it is unusable."""
    from cupy.cuda import nccl
    if not getattr(nccl, "available", False):
        raise RuntimeError("cupy.cuda.nccl is not available: CuPy could not load libnccl "
                           "(install nvidia-nccl-cu12 or nvidia-nccl-cu13 to match CuPy)")
    return nccl


def visible_gpus() -> tuple[int, str | None]:
    """(number of visible CUDA devices, reason when it is 0)."""
    try:
        import cupy
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return 0, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return n, (None if n else "no CUDA device visible")


_NCCL_TYPES = {"uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
               "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "bfloat16": "NCCL_BFLOAT16"}


def nccl_type(nccl, dtype) -> int:
    """NCCL's data-type constant for a NumPy / ml_dtypes ``dtype``; ValueError for others."""
    name = np.dtype(dtype).name
    if name not in _NCCL_TYPES:
        raise ValueError(f"dtype {name} has no NCCL type here (have {sorted(_NCCL_TYPES)})")
    return getattr(nccl, _NCCL_TYPES[name])


def stream_ptr() -> int:
    """CuPy's current stream, as the pointer NCCL calls take."""
    import cupy
    return cupy.cuda.get_current_stream().ptr


def all_gather(comm, nccl, x, n_ranks: int):
    """``[n_ranks, *x.shape]``: every rank's ``x`` (rank-major), on every rank
    (``comm`` None: this rank's ``x`` alone, ``n_ranks`` must be 1)."""
    import cupy
    x = cupy.ascontiguousarray(x)
    out = cupy.empty((n_ranks,) + x.shape, dtype=x.dtype)
    if comm is None:
        out[0] = x
        return out
    comm.allGather(x.data.ptr, out.data.ptr, x.size, nccl_type(nccl, x.dtype), stream_ptr())
    return out


def barrier(comm, nccl) -> None:
    """All ranks reach this point (a one-element all-reduce, then a stream sync)."""
    import cupy
    x = cupy.zeros(1, dtype=cupy.float32)
    comm.allReduce(x.data.ptr, x.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream_ptr())
    cupy.cuda.get_current_stream().synchronize()


# ----------------------------------------------------------------------------
# The NCCL unique id through a file
# ----------------------------------------------------------------------------

def write_unique_id(path: str, uid, world_size: int) -> None:
    """Write ``uid`` (128 byte values, as ``cupy.cuda.nccl.get_unique_id()``
    returns them) and ``world_size`` to ``path`` as JSON, atomically (a
    temporary file in the same folder, then ``os.replace``), so a reader never
    sees half a file."""
    uid = [int(v) for v in uid]
    if len(uid) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"uid has {len(uid)} values; an NCCL unique id has {NCCL_UNIQUE_ID_BYTES}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"nccl_unique_id": uid, "world_size": int(world_size)}, f)
    os.replace(tmp, path)


def read_unique_id(path: str, world_size: int, *, timeout_s: float = 600.0,
                   poll_s: float = 0.05) -> tuple:
    """Wait up to ``timeout_s`` seconds for ``path`` (written by
    :func:`write_unique_id`) and return the id as a tuple of 128 ints.

    Raises TimeoutError when the file does not appear, ValueError when it is
    not an id file or was written for another world size.
    """
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no NCCL unique id in {path} after {timeout_s:g} s: is rank 0 running "
                               f"with the same {ENV_NCCL_ID_FILE}?")
        time.sleep(poll_s)
    with open(path) as f:
        try:
            doc = json.load(f)
            uid, n = doc["nccl_unique_id"], int(doc["world_size"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not an NCCL unique-id file ({type(exc).__name__}: {exc})") from None
    if not isinstance(uid, list) or len(uid) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"{path}: the id must be a list of {NCCL_UNIQUE_ID_BYTES} ints")
    if n != world_size:
        raise ValueError(f"{path} was written for world size {n}, this process has {world_size}: "
                         f"a stale file from another run? Use a fresh {ENV_NCCL_ID_FILE}")
    return tuple(int(v) for v in uid)


# ----------------------------------------------------------------------------
# One rank
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class RankContext:
    """What :func:`init_process` set up for this process.

    ``comm`` is a ``cupy.cuda.nccl.NcclCommunicator`` over ``world_size``
    ranks (None when made with ``need_comm=False``), ``nccl`` the
    ``cupy.cuda.nccl`` module (or None), ``stream`` the private non-blocking
    CuPy stream made current (or None with ``use_stream=False``).  Use it as
    a context manager: leaving the block destroys the communicator (aborts it
    when the block raised, so peers stuck in NCCL do not hang this process).
    """
    rank: int
    world_size: int
    device_id: int
    comm: Any = None
    nccl: Any = None
    stream: Any = None

    def say(self, msg: str) -> None:
        """Print ``[rank r/N] msg`` and flush, in one write: with several ranks
        on one terminal (and unbuffered output) the lines stay whole."""
        sys.stdout.write(f"[rank {self.rank}/{self.world_size}] {msg}\n")
        sys.stdout.flush()

    def barrier(self) -> None:
        """Every rank reaches this point (:func:`barrier`); a stream sync without a communicator."""
        if self.comm is None:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            return
        barrier(self.comm, self.nccl)

    def close(self, abort: bool = False) -> None:
        """Destroy the communicator (``abort``: ``ncclCommAbort``, no waiting for peers)."""
        comm, self.comm = self.comm, None
        if comm is None:
            return
        if abort:
            try:
                comm.abort()
            except Exception:
                pass
        else:
            comm.destroy()

    def __enter__(self) -> "RankContext":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None and self.stream is not None:
            self.stream.synchronize()
        self.close(abort=exc_type is not None)
        return False


def _int_setting(name: str, value, env: str, default: int | None) -> int:
    """``value`` if given, else the environment variable ``env``, else ``default``."""
    if value is None:
        text = os.environ.get(env)
        if text is None or not text.strip():
            if default is None:
                raise ValueError(f"{name} is not given and {env} is not set")
            return default
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{env}={text!r} is not an int") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def resolve_rank_settings(*, rank: int | None = None, world_size: int | None = None,
                          device: int | None = None, id_file: str | None = None
                          ) -> tuple[int, int, int, str | None]:
    """``(rank, world_size, device, id_file)`` from the arguments, or from
    ``CUGEMM8_RANK`` / ``CUGEMM8_WORLD_SIZE`` / ``CUGEMM8_DEVICE`` /
    ``CUGEMM8_NCCL_ID_FILE`` where an argument is None.  Without either, one
    process: rank 0 of 1 on device 0.  Needs no GPU.

    Raises:
        TypeError: an argument is not an int (``id_file``: not a str).
        ValueError: a variable is not an int; ``world_size < 1``; ``rank``
            outside ``[0, world_size)``; ``device < 0``; ``world_size > 1``
            without an id file.
    """
    world_size = _int_setting("world_size", world_size, ENV_WORLD_SIZE, 1)
    rank = _int_setting("rank", rank, ENV_RANK, 0)
    device = _int_setting("device", device, ENV_DEVICE, rank)
    if id_file is None:
        id_file = os.environ.get(ENV_NCCL_ID_FILE) or None
    elif not isinstance(id_file, (str, os.PathLike)):
        raise TypeError(f"id_file must be a path (str), got {type(id_file).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1 ({ENV_WORLD_SIZE})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, {world_size}) ({ENV_RANK})")
    if device < 0:
        raise ValueError(f"device={device} must be >= 0 ({ENV_DEVICE})")
    if world_size > 1 and id_file is None:
        raise ValueError(f"world_size={world_size} needs an NCCL unique-id file: set {ENV_NCCL_ID_FILE} "
                         f"(python -m cugemm8.launch does) or pass id_file")
    return rank, world_size, device, (None if id_file is None else os.fspath(id_file))


def init_process(*, rank: int | None = None, world_size: int | None = None, device: int | None = None,
                 id_file: str | None = None, need_comm: bool = True, use_stream: bool = True,
                 timeout_s: float = 600.0) -> RankContext:
    """Set this process up as one rank: multicast off, its CUDA device, a
    private stream, an NCCL communicator.

    Settings come from the arguments or, where None, from the launcher's
    environment (:func:`resolve_rank_settings`).  In order: the
    :data:`MULTICAST_OFF_ENV` variables are forced; ``cupy.cuda.Device(device)``
    becomes current; with ``use_stream`` a non-blocking CuPy stream becomes
    current (every cugemm8 op and NCCL call through ``stream_ptr()`` then
    queues there); with ``need_comm`` rank 0 creates the NCCL unique id and
    (for ``world_size > 1``) writes it to ``id_file``, the others read it
    (waiting up to ``timeout_s`` seconds), and all create the communicator
    (collective: it returns once every rank has joined), after which rank 0
    deletes the file.  ``world_size == 1`` makes a one-rank communicator
    without any file.

    Returns:
        :class:`RankContext`.

    Raises:
        TypeError, ValueError: as :func:`resolve_rank_settings`; ValueError
            also when ``device`` is not below the number of visible devices.
        RuntimeError: NCCL unusable (``need_comm``).
        TimeoutError: no id file after ``timeout_s`` (ranks other than 0).
        cugemm8.DeviceError: no CuPy or no CUDA device.
    """
    rank, world_size, device, id_file = resolve_rank_settings(
        rank=rank, world_size=world_size, device=device, id_file=id_file)
    multicast_off()
    check_multicast_off()
    from ._device import _device_count
    count = _device_count()
    if device >= count:
        raise ValueError(f"device={device} ({ENV_DEVICE}) but {count} CUDA device(s) are visible")
    import cupy
    cupy.cuda.Device(device).use()
    ctx = RankContext(rank=rank, world_size=world_size, device_id=device)
    if use_stream:
        ctx.stream = cupy.cuda.Stream(non_blocking=True)
        ctx.stream.use()
    if need_comm:
        nccl = import_nccl()
        if rank == 0:
            uid = nccl.get_unique_id()
            if world_size > 1:
                write_unique_id(id_file, uid, world_size)
        else:
            uid = read_unique_id(id_file, world_size, timeout_s=timeout_s)
        ctx.nccl = nccl
        ctx.comm = nccl.NcclCommunicator(world_size, uid, rank)
        if rank == 0 and world_size > 1:
            try:
                os.unlink(id_file)        # every rank has read it: the communicator is up
            except FileNotFoundError:
                pass
    return ctx


# ----------------------------------------------------------------------------
# Many ranks of a Python function (spawned processes)
# ----------------------------------------------------------------------------

def _rank_main(target, rank: int, n: int, device: int, id_file: str, result_queue, opts: dict,
               need_comm: bool) -> None:
    """Spawned child: :func:`init_process`, then ``target``; its result (or
    the failure) goes to ``result_queue`` as ``(rank, dict)``."""
    ctx = None
    try:
        ctx = init_process(rank=rank, world_size=n, device=device, id_file=id_file, need_comm=need_comm)
        if rank == 0 and ctx.comm is not None:
            ctx.say(f"NCCL {ctx.nccl.get_version()}, {n} ranks, NCCL_NVLS_ENABLE="
                    f"{os.environ['NCCL_NVLS_ENABLE']}")
        result = target(rank, n, ctx.comm, ctx.nccl, opts, ctx.say)
        ctx.stream.synchronize()
        ctx.close()
        result_queue.put((rank, result))
    except BaseException as exc:
        traceback.print_exc()
        sys.stderr.flush()
        if ctx is not None:
            ctx.close(abort=True)             # do not wait for peers that may be stuck
        result_queue.put((rank, {"ok": False, "failures": [f"rank {rank}: {type(exc).__name__}: {exc}"]}))
        sys.exit(1)


def _collect(result_queue, results: dict, timeout_s: float, *, once: bool) -> None:
    """Move ``(rank, result)`` items from the queue into ``results``: one
    (waiting up to ``timeout_s``) when ``once``, else until none arrives within ``timeout_s``."""
    while True:
        try:
            rank, res = result_queue.get(timeout=timeout_s)
        except queue.Empty:
            return
        results[rank] = res
        if once:
            return


def run_ranks(target: Callable, n: int, opts: dict, *, timeout_s: float, need_comm: bool = True,
              devices: list[int] | None = None) -> tuple[dict, str | None]:
    """Start ``n`` spawned processes running ``target(rank, n, comm, nccl, opts, say)``.

    ``target`` must be picklable (a module-level function); rank ``r`` runs
    on ``devices[r]`` (default: device ``r``) after :func:`init_process`
    (the unique id through a file in a fresh temporary folder).  Returns
    ``(results {rank: dict}, error str or None)``.  A process that dies, or
    running past ``timeout_s``, stops the others (they may be waiting in NCCL
    for it).
    """
    import multiprocessing as mp
    devices = list(range(n)) if devices is None else [int(d) for d in devices]
    if n < 1 or len(devices) != n:
        raise ValueError(f"n={n} ranks need n >= 1 and one device each, got devices {devices}")
    multicast_off()
    ctx = mp.get_context("spawn")
    result_queue = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="cugemm8-ranks-")
    id_file = os.path.join(tmp, "nccl_id.json")
    procs = [ctx.Process(target=_rank_main, name=f"rank{r}",
                         args=(target, r, n, devices[r], id_file, result_queue, opts, need_comm))
             for r in range(n)]
    try:
        for p in procs:
            p.start()
        results, error = {}, None
        deadline = time.monotonic() + timeout_s
        while True:
            _collect(result_queue, results, 0.5, once=True)
            codes = [p.exitcode for p in procs]
            if all(c is not None for c in codes):
                break
            dead = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if dead:
                error = f"rank {dead[0][0]} exited with code {dead[0][1]}"
                break
            if time.monotonic() > deadline:
                error = f"timed out after {timeout_s:.0f} s"
                break
        if error is not None:
            for p in procs:
                if p.is_alive():
                    p.terminate()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        _collect(result_queue, results, 0.5, once=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    codes = [p.exitcode for p in procs]
    if error is None and any(c != 0 for c in codes):
        error = f"exit codes {codes}"
    if error is None and len(results) != n:
        error = f"results from ranks {sorted(results)} only"
    return results, error


# ----------------------------------------------------------------------------
# The launcher (python -m cugemm8.launch)
# ----------------------------------------------------------------------------

def parse_devices(text: str) -> list[int]:
    """``"0,2,3"`` -> ``[0, 2, 3]``: distinct device indices ``>= 0``."""
    try:
        devs = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices wants comma-separated ints, got {text!r}") from None
    if not devs or any(d < 0 for d in devs) or len(set(devs)) != len(devs):
        raise argparse.ArgumentTypeError(f"--devices wants distinct ints >= 0, got {text!r}")
    return devs


def child_env(base: dict, *, rank: int, world_size: int, device: int, id_file: str) -> dict:
    """The environment of rank ``rank``'s process: ``base`` plus the four
    ``CUGEMM8_*`` variables and :data:`MULTICAST_OFF_ENV` (which override ``base``)."""
    env = dict(base)
    env.update(MULTICAST_OFF_ENV)
    env.update({ENV_RANK: str(rank), ENV_WORLD_SIZE: str(world_size), ENV_DEVICE: str(device),
                ENV_NCCL_ID_FILE: id_file})
    return env


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cugemm8.launch",
        description="Start one process per GPU (no mpirun, no torchrun): N copies of `python SCRIPT "
                    "ARGS...` with CUGEMM8_RANK, CUGEMM8_WORLD_SIZE, CUGEMM8_DEVICE and "
                    "CUGEMM8_NCCL_ID_FILE set and NVLink multicast off; the script calls "
                    "cugemm8.launch.init_process().")
    p.add_argument("--nproc", type=int, required=True, help="number of processes (ranks), >= 1")
    p.add_argument("--devices", type=parse_devices, default=None,
                   help="CUDA device of each rank, comma-separated (default: 0,1,...,N-1)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop every rank after this many seconds (exit 124; default: no limit)")
    p.add_argument("-m", "--module", action="store_true",
                   help="run SCRIPT as a module (python -m SCRIPT)")
    p.add_argument("script", help="the Python script (or, with -m, module) each rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def launch(command: list[str], nproc: int, *, devices: list[int] | None = None,
           timeout_s: float | None = None, env: dict | None = None, poll_s: float = 0.1) -> int:
    """Run ``command`` (an argv list) as ``nproc`` ranks and wait for them.

    Each child gets :func:`child_env` of ``env`` (default ``os.environ``)
    with a fresh id file in a temporary folder (removed at the end).  Returns
    0 when every child exits 0; else the first non-zero exit code seen, the
    others terminated (then killed after 10 s); :data:`EXIT_TIMEOUT` when
    ``timeout_s`` expires.  The children share this process's stdout and
    stderr.

    Raises:
        ValueError: ``nproc < 1``, an empty ``command``, or ``devices`` not
            one distinct index ``>= 0`` per rank.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, (int, np.integer)):
        raise TypeError(f"nproc must be an int, got {type(nproc).__name__}")
    if nproc < 1:
        raise ValueError(f"nproc={nproc} must be >= 1")
    if not command:
        raise ValueError("command is empty: give the script to run")
    devices = list(range(nproc)) if devices is None else [int(d) for d in devices]
    if len(devices) != nproc or len(set(devices)) != nproc or min(devices) < 0:
        raise ValueError(f"devices {devices} must be {nproc} distinct indices >= 0, one per rank")
    base = dict(os.environ if env is None else env)
    tmp = tempfile.mkdtemp(prefix="cugemm8-launch-")
    id_file = os.path.join(tmp, "nccl_id.json")
    procs = []
    code = 0
    try:
        for r in range(nproc):
            procs.append(subprocess.Popen(command, env=child_env(base, rank=r, world_size=nproc,
                                                                 device=devices[r], id_file=id_file)))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                code = failed[0]
                break
            if all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"cugemm8.launch: timed out after {timeout_s:g} s; stopping every rank",
                      file=sys.stderr, flush=True)
                code = EXIT_TIMEOUT
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        code = 130
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    if code not in (0, EXIT_TIMEOUT, 130):
        ranks = [r for r, p in enumerate(procs) if p.returncode == code]
        print(f"cugemm8.launch: rank {ranks[0] if ranks else '?'} exited with code {code}; "
              f"the others were stopped", file=sys.stderr, flush=True)
    return code


def _stop(procs: list) -> None:
    """Terminate the children still running, kill those left after 10 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.nproc < 1:
        build_parser().error(f"--nproc {args.nproc} must be >= 1")
    if args.devices is not None and len(args.devices) != args.nproc:
        build_parser().error(f"--devices names {len(args.devices)} device(s) for --nproc {args.nproc}")
    if args.timeout is not None and args.timeout <= 0:
        build_parser().error("--timeout must be > 0")
    multicast_off()
    command = [sys.executable] + (["-m"] if args.module else []) + [args.script] + list(args.args)
    return launch(command, args.nproc, devices=args.devices, timeout_s=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
