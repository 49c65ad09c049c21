"""Tuned kernel configurations, measured on this GPU by ``cugemm8 tune``.

The heuristic (:mod:`cugemm8._config`) is fitted to one H200.  ``cugemm8
tune`` times the heuristic's pick and a pruned set of legal alternatives on
the user's own GPU and records the fastest per shape in a JSON file; the ops
then launch a recorded configuration when one matches, else the heuristic's.

**Where.** ``$CUGEMM8_TUNED_FILE`` when set (a path; ``off``, ``0``,
``false``, ``no``, ``none`` or an empty value turn tuned configurations off),
else ``$XDG_CACHE_HOME/cugemm8/tuned.json`` (an absolute XDG_CACHE_HOME only,
else ``~/.cache/cugemm8/tuned.json``).  Entries are never pruned: delete the
file (or one entry) to forget them; ``cugemm8 configs`` marks stale ones.

**Matching.** An entry applies only where its result transfers: the same
GPU name and SM count, the same SM budget (:func:`cugemm8.set_num_sms`), the
same CUDA driver, NVRTC, CuPy and cugemm8 versions (a new release may change
the heuristic the entry was measured against), the same kernel sources (their
SHA-256, :func:`cugemm8._jit.source_hash`), and the same ``kind``, ``n``,
``k``, ``num_groups`` and M bucket (:func:`m_bucket`: the next power of two,
so an entry tuned at M = 64 serves 33 ... 64).  Anything else in the file is
ignored, never used.

**Safety.** The file is read once per process, at the first GEMM that needs
a configuration (:func:`reload` reads it again).  A missing, unreadable,
truncated or otherwise malformed file is treated as empty (one warning).
Every entry is rebuilt with :func:`cugemm8._config.make_config` and checked
with :func:`cugemm8._config.is_legal` for its ``k`` and the current SM
budget before it is used; an entry that fails is skipped.  So a bad file can
cost speed, never a crash or a wrong result.  Writers merge under an
exclusive lock (``fcntl.flock`` on ``<file>.lock``) and replace the file
atomically (write a temporary file in the same folder, ``os.replace``; the
file's permissions and a symlink to it are kept), so a reader never sees a
partial file and two concurrent ``tune`` runs keep both runs' entries.  A
file that cannot be read as a whole (a typo in a hand edit, another format)
is never overwritten: the writer moves it to ``<file>.bad`` first, with a
warning.

File format (version 1)::

    {"format": 1,
     "entries": [{"env": {"gpu": ..., "sm_count": ..., "num_sms": ..., "driver": ...,
                          "nvrtc": ..., "cupy": ..., "sources": ..., "cugemm8": ...},
                  "kind": "normal", "n": 2112, "k": 7168, "num_groups": 1, "m_bucket": 64,
                  "config": {"block_m": 64, "block_n": 32, "num_stages": 16, "num_multicast": 1,
                             "multicast_on_a": false, "num_k_splits": 2, "num_sms": 132,
                             "num_math_warpgroups": 2},
                  "us": 9.1, "heuristic": "64x32 s16 k2 sms132", "heuristic_us": 9.3,
                  "rows": 64, "candidates": 14, "tuned_at": "2026-12-01T15:00:00Z"}, ...]}
``config.num_math_warpgroups`` is optional (2 when absent: files written
before v0.11), and so are ``config.swap_ab`` (``true`` for the swap-AB decode
kernel, :class:`cugemm8._config.GemmConfig`; false when absent: files
written before v0.16) and ``config.warp_mma`` (``true`` for the warp-MMA
decode kernel; false when absent: files written before v0.19; such an
entry is used only for its own ``n`` (its grid), M buckets up to 8 and
the whole device).  The training kinds (``wgrad``, ``k_grouped``: the 1D1D
GEMMs, :mod:`cugemm8._config_1d1d`) record ``{"block_m", "block_n",
"num_stages", "num_sms", "tma_store"}`` instead; their M bucket is that of
D's rows and their ``k`` the total tokens.  A ``tma_store`` entry serves
only calls that allow the TMA epilogue (no ``c`` or ``c`` is ``d``, ``d``
16-byte aligned); others keep the heuristic's pick.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

from . import _config, _config_1d1d

FORMAT = 1
ENV_VAR = "CUGEMM8_TUNED_FILE"
_OFF = ("", "0", "off", "false", "no", "none")
ENV_FIELDS = ("gpu", "sm_count", "num_sms", "driver", "nvrtc", "cupy", "sources", "cugemm8")
CONFIG_FIELDS = ("block_m", "block_n", "num_stages", "num_multicast", "multicast_on_a",
                 "num_k_splits", "num_sms")
#: The training kinds (1D1D GEMMs) and their config fields.
KINDS_1D1D = ("wgrad", "k_grouped")
CONFIG_FIELDS_1D1D = ("block_m", "block_n", "num_stages", "num_sms", "tma_store")

_lock = threading.Lock()
_state: dict = {"loaded": False, "path": None, "entries": [], "problems": []}


# ----------------------------------------------------------------------------
# Location, keys
# ----------------------------------------------------------------------------

def tuned_path() -> Path | None:
    """The tuned-configurations file (see the module docstring), or None when
    ``$CUGEMM8_TUNED_FILE`` turns them off."""
    env = os.environ.get(ENV_VAR)
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cugemm8" / "tuned.json"


def m_bucket(m: int) -> int:
    """The M bucket of a row count: the smallest power of two >= ``m`` (0 for 0).

    ``m`` is what the op hands the heuristic: M (normal), ``m_sum``
    (contiguous) or ``min(expected_m, m_max)`` (masked)."""
    m = int(m)
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    return 0 if m == 0 else 1 << (m - 1).bit_length()


def environment(num_sms: int, device_id: int | None = None) -> dict:
    """The fields that make a tuned result transferable, for the current
    device (or ``device_id``) and an SM budget of ``num_sms``."""
    from . import _device, _jit
    cupy = _device.import_cupy()
    info = _device.device_info(device_id)
    from . import __version__
    return {"gpu": info["name"], "sm_count": info["num_sms"], "num_sms": int(num_sms),
            "driver": int(cupy.cuda.runtime.driverGetVersion()),
            "nvrtc": _jit.nvrtc_release(), "cupy": cupy.__version__,
            "sources": _jit.source_hash(), "cugemm8": __version__}


def shape_key(kind: str, n: int, k: int, num_groups: int, m: int) -> tuple:
    return (kind, int(n), int(k), int(num_groups), m_bucket(m))


def _env_key(env: dict) -> tuple:
    return tuple(env[f] for f in ENV_FIELDS)


# ----------------------------------------------------------------------------
# Reading and validation
# ----------------------------------------------------------------------------

def _entry_problem(e) -> str | None:
    """Why a raw entry is malformed (types only; legality is checked when
    it is used), or None."""
    if not isinstance(e, dict):
        return "not an object"
    env = e.get("env")
    if not isinstance(env, dict) or any(f not in env for f in ENV_FIELDS):
        return "env lacks fields"
    for f in ENV_FIELDS:
        v = env[f]
        if not (isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))):
            return f"env.{f} is not a string or an int"
    if e.get("kind") not in _config.KINDS + KINDS_1D1D:
        return f"unknown kind {e.get('kind')!r}"
    for f in ("n", "k", "num_groups", "m_bucket"):
        v = e.get(f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"{f} is not a non-negative int"
    if e["m_bucket"] & (e["m_bucket"] - 1):
        return "m_bucket is not 0 or a power of two"
    cfg = e.get("config")
    if not isinstance(cfg, dict):
        return "config is not an object"
    training = e["kind"] in KINDS_1D1D
    for f in CONFIG_FIELDS_1D1D if training else CONFIG_FIELDS:
        v = cfg.get(f)
        if f in ("multicast_on_a", "tma_store"):
            if not isinstance(v, bool):
                return f"config.{f} is not a bool"
        elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return f"config.{f} is not a positive int"
    if training:
        return None
    # Optional (entries written before v0.11 lack it: 2 math warpgroups).
    v = cfg.get("num_math_warpgroups", 2)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        return "config.num_math_warpgroups is not a positive int"
    # Optional (entries written before v0.16 lack it: the 1D2D kernel).
    if not isinstance(cfg.get("swap_ab", False), bool):
        return "config.swap_ab is not a bool"
    # Optional (entries written before v0.19 lack it: not the warp-MMA kernel).
    if not isinstance(cfg.get("warp_mma", False), bool):
        return "config.warp_mma is not a bool"
    return None


def parse(text: str) -> tuple[list[dict], list[str]]:
    """The well-formed entries of a tuned file's text and the problems found
    (a malformed file gives no entries and one problem; a malformed entry is
    skipped with one problem each).  Never raises."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:     # RecursionError: absurdly nested JSON
        return [], [f"not valid JSON ({type(exc).__name__}: {str(exc)[:80]})"]
    fmt = data.get("format") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or type(fmt) is not int or fmt != FORMAT
            or not isinstance(data.get("entries"), list)):
        return [], [f"not a format-{FORMAT} tuned file (an object with format {FORMAT} and a list of entries)"]
    entries, problems = [], []
    for i, e in enumerate(data["entries"]):
        why = _entry_problem(e)
        if why is None:
            entries.append(e)
        else:
            problems.append(f"entry {i}: {why}")
    return entries, problems


def read_file(path: Path) -> tuple[list[dict], list[str]]:
    """(entries, problems) of ``path``; a missing file is empty, no problem."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return [], []
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"unreadable ({type(exc).__name__}: {exc})"]
    return parse(text)


def _load() -> None:
    path = tuned_path()
    entries, problems = read_file(path) if path is not None else ([], [])
    _state.update(loaded=True, path=path, entries=entries, problems=problems)
    _state["index"] = {}
    for e in entries:         # later entries win: the newest write of a key
        _state["index"][(_env_key(e["env"]),) + shape_key(e["kind"], e["n"], e["k"], e["num_groups"],
                                                          e["m_bucket"])] = e
    if problems:
        warnings.warn(f"cugemm8: tuned configurations file {path}: {problems[0]}"
                      + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                      + "; those entries are ignored", RuntimeWarning, stacklevel=4)


def reload() -> None:
    """Read the tuned file again (its entries serve shapes not yet launched:
    call :func:`cugemm8.clear_launch_cache` too, to re-select cached ones)."""
    with _lock:
        _load()


def entries() -> list[dict]:
    """The well-formed entries of the file, as read (for display)."""
    with _lock:
        if not _state["loaded"]:
            _load()
        return list(_state["entries"])


def has_entries() -> bool:
    """Whether the tuned file (read at first use) holds any well-formed entry;
    the ops ask this before they compute their environment."""
    with _lock:
        if not _state["loaded"]:
            _load()
        return _state["path"] is not None and bool(_state["index"])


def entry_config(e: dict, k: int):
    """A well-formed 1D2D entry's :class:`GemmConfig` for its ``k``, not
    checked against the kernel's rules (:func:`config_from_entry` checks)."""
    c = e["config"]
    return _config.make_config(e["kind"], c["block_m"], c["block_n"], c["num_stages"], k,
                               num_multicast=c["num_multicast"], multicast_on_a=c["multicast_on_a"],
                               num_k_splits=c["num_k_splits"], num_sms=c["num_sms"],
                               num_math_warpgroups=c.get("num_math_warpgroups", 2),
                               swap_ab=c.get("swap_ab", False), warp_mma=c.get("warp_mma", False))


def config_from_entry(e: dict, k: int, available_sms: int):
    """Rebuild an entry's :class:`GemmConfig` (a :class:`Gemm1d1dConfig` for
    the training kinds) for its ``k`` and check it against the kernel's rules
    with ``available_sms`` SMs: (config, "") or (None, why not)."""
    c = e["config"]
    if e["kind"] in KINDS_1D1D:
        try:
            cfg = _config_1d1d.make_config(c["block_m"], c["block_n"], c["num_stages"], c["num_sms"],
                                           c["tma_store"])
            ok, why = _config_1d1d.is_legal(cfg, available_sms=available_sms)
        except (TypeError, ValueError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        return (cfg, "") if ok else (None, why)
    try:
        cfg = entry_config(e, k)
        ok, why = _config.is_legal(cfg, k=k, available_sms=available_sms)
    except (TypeError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if ok and cfg.warp_mma:
        # Its grid is one CTA per block_n rows of this n (not persistent),
        # and it takes at most block_m rows, on the whole device only.
        grid = _config.warp_mma_grid(e["n"], cfg.block_n)
        if cfg.num_sms != grid:
            ok, why = False, f"warp_mma num_sms {cfg.num_sms} != ceil(n / block_n) = {grid}"
        elif e["m_bucket"] > cfg.block_m:
            ok, why = False, f"warp_mma serves at most {cfg.block_m} rows, not the M bucket {e['m_bucket']}"
        elif isinstance(e["env"].get("sm_count"), int) and available_sms < e["env"]["sm_count"]:
            ok, why = False, "warp_mma runs on the whole device only, not under a reduced SM budget"
    return (cfg, "") if ok else (None, why)


def lookup(kind: str, m: int, n: int, k: int, num_groups: int, env: dict):
    """The tuned configuration for this call in environment ``env``
    (:func:`environment`), or None (no file, no matching entry, or an entry
    that is not legal here)."""
    with _lock:
        if not _state["loaded"]:
            _load()
        if _state["path"] is None or not _state["index"]:
            return None
        e = _state["index"].get((_env_key(env),) + shape_key(kind, n, k, num_groups, m))
    if e is None:
        return None
    cfg, _ = config_from_entry(e, k, env["num_sms"])
    return cfg


# ----------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------

#: seconds a writer waits for another writer's lock before giving up
LOCK_TIMEOUT_S = 30.0
#: a writer removes ``<file>.*.tmp`` left by killed writers once this old
STALE_TMP_S = 3600.0


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float | None = None):
    """An exclusive advisory lock on ``<path>.lock`` (POSIX ``flock``; where
    ``fcntl`` is missing, no lock: writes stay atomic, concurrent merges may
    then drop the other writer's entries).  Raises ``OSError`` naming the
    lock file after ``timeout_s`` (default :data:`LOCK_TIMEOUT_S`) seconds
    of another process holding it (a stopped ``cugemm8 tune``, say)."""
    import time
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:      # pragma: no cover - not POSIX
            fcntl = None
        if fcntl is not None:
            deadline = time.monotonic() + (LOCK_TIMEOUT_S if timeout_s is None else timeout_s)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError(f"another process has held {lock_path} for "
                                      f"{LOCK_TIMEOUT_S if timeout_s is None else timeout_s:.0f} s "
                                      f"(a stopped cugemm8 tune?); try again") from None
                    time.sleep(0.05)
        yield
    finally:
        os.close(fd)             # closing releases the flock


def _remove_stale_temporaries(path: Path) -> None:
    """Remove ``<file>.*.tmp`` that killed writers left, once an hour old
    (called under the lock, so no live writer owns them)."""
    import time
    now = time.time()
    for tmp in path.parent.glob(path.name + ".*.tmp"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()


def entry_for(kind: str, m: int, n: int, k: int, num_groups: int, env: dict, cfg, **extra) -> dict:
    """A file entry recording ``cfg`` (a :class:`GemmConfig`, or a
    :class:`Gemm1d1dConfig` for the training kinds) for this shape and
    environment."""
    if kind in KINDS_1D1D:
        config = {"block_m": cfg.block_m, "block_n": cfg.block_n, "num_stages": cfg.num_stages,
                  "num_sms": cfg.num_sms, "tma_store": bool(cfg.tma_store)}
    else:
        config = {"block_m": cfg.block_m, "block_n": cfg.block_n, "num_stages": cfg.num_stages,
                  "num_multicast": cfg.num_multicast, "multicast_on_a": bool(cfg.multicast_on_a),
                  "num_k_splits": cfg.num_k_splits, "num_sms": cfg.num_sms,
                  "num_math_warpgroups": cfg.num_math_warpgroups}
        if cfg.swap_ab:
            config["swap_ab"] = True
        if cfg.warp_mma:
            config["warp_mma"] = True
    e = {"env": {f: env[f] for f in ENV_FIELDS}, "kind": kind, "n": int(n), "k": int(k),
         "num_groups": int(num_groups), "m_bucket": m_bucket(m), "config": config}
    e.update(extra)
    return e


def _entry_key(e: dict) -> tuple:
    return (_env_key(e["env"]),) + shape_key(e["kind"], e["n"], e["k"], e["num_groups"], e["m_bucket"])


def write_entries(new: list[dict], path: Path | None = None) -> Path:
    """Merge ``new`` into the tuned file (an entry with the same environment
    and shape key replaces the old one; other entries are kept, malformed
    ones dropped) under the file lock, and replace the file atomically.
    Returns the path.  Raises ``ValueError`` if tuned configurations are
    turned off and no ``path`` is given, ``OSError`` if the folder cannot be
    written."""
    path = tuned_path() if path is None else Path(path)
    if path is None:
        raise ValueError(f"tuned configurations are off ({ENV_VAR}={os.environ.get(ENV_VAR)!r}); "
                         f"set it to a file path")
    for e in new:
        why = _entry_problem(e)
        if why is not None:
            raise ValueError(f"refusing to write a malformed entry: {why}")
    path = Path(os.path.realpath(path))          # a symlinked file is updated where it lives
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path):
        _remove_stale_temporaries(path)
        old, problems = read_file(path)
        file_level = [p for p in problems if not p.startswith("entry ")]
        if file_level and path.exists():
            # Never overwrite what could not be read (a hand edit with a typo,
            # a newer format): keep it beside the new file and say so.
            aside = path.with_name(path.name + ".bad")
            os.replace(path, aside)
            warnings.warn(f"cugemm8: tuned configurations file {path}: {file_level[0]}; "
                          f"moved to {aside} and written anew", RuntimeWarning, stacklevel=2)
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        merged: dict = {}
        for e in old + list(new):
            merged[_entry_key(e)] = e
        data = {"format": FORMAT, "entries": list(merged.values())}
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return path
