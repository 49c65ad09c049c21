"""Tuned configurations (issue 23), CPU only: the file's keys and staleness
rules, corrupt and partial files, concurrent writers, legality validation of
every loaded entry, the candidate family and the winner rule of ``cugemm8
tune``, and the ops' choice between a tuned entry and the heuristic."""
from __future__ import annotations

import json
import multiprocessing
import os
import warnings
from pathlib import Path

import pytest

from cugemm8 import _config, _tune, _tuned, gemm as G

ENV = {"gpu": "NVIDIA H200", "sm_count": 132, "num_sms": 132, "driver": 13000,
       "nvrtc": "13.0.88", "cupy": "14.2.0", "sources": "ab" * 32, "cugemm8": "0.10.0"}


@pytest.fixture
def tuned_file(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    monkeypatch.setenv(_tuned.ENV_VAR, str(path))
    _tuned.reload()
    G._tuned_envs.clear()
    yield path
    monkeypatch.delenv(_tuned.ENV_VAR)
    _tuned.reload()
    G._tuned_envs.clear()


def _cfg(kind="normal", bm=64, bn=48, stages=8, k=7168, sms=88, **kw):
    return _config.make_config(kind, bm, bn, stages, k, num_sms=sms, **kw)


def _entry(kind="normal", m=64, n=2112, k=7168, g=1, env=ENV, cfg=None, **extra):
    return _tuned.entry_for(kind, m, n, k, g, env, cfg or _cfg(kind, k=k), **extra)


# ----------------------------------------------------------------------------
# keys and location
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("m, bucket", [(0, 0), (1, 1), (2, 2), (3, 4), (33, 64), (64, 64), (65, 128),
                                       (4096, 4096), (4097, 8192)])
def test_m_bucket_is_the_next_power_of_two(m, bucket):
    assert _tuned.m_bucket(m) == bucket


def test_m_bucket_rejects_negative_m():
    with pytest.raises(ValueError, match="m must be >= 0"):
        _tuned.m_bucket(-1)


def test_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(_tuned.ENV_VAR, str(tmp_path / "x.json"))
    assert _tuned.tuned_path() == tmp_path / "x.json"
    for off in ("off", "0", "", "none", "FALSE"):
        monkeypatch.setenv(_tuned.ENV_VAR, off)
        assert _tuned.tuned_path() is None
    monkeypatch.delenv(_tuned.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _tuned.tuned_path() == tmp_path / "cache" / "cugemm8" / "tuned.json"


# ----------------------------------------------------------------------------
# round trip, matching, staleness
# ----------------------------------------------------------------------------

def test_written_entry_is_found_for_every_m_of_its_bucket(tuned_file):
    cfg = _cfg()
    _tuned.write_entries([_entry(m=64, cfg=cfg, us=9.0)], tuned_file)
    _tuned.reload()
    for m in (33, 48, 64):
        assert _tuned.lookup("normal", m, 2112, 7168, 1, ENV) == cfg
    for m in (32, 65, 128):
        assert _tuned.lookup("normal", m, 2112, 7168, 1, ENV) is None


@pytest.mark.parametrize("field", _tuned.ENV_FIELDS)
def test_an_entry_from_another_environment_is_never_used(tuned_file, field):
    _tuned.write_entries([_entry(m=64)], tuned_file)
    _tuned.reload()
    other = dict(ENV)
    other[field] = other[field] + 1 if isinstance(other[field], int) else other[field] + "x"
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, other) is None
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) is not None


@pytest.mark.parametrize("change", [{"kind": "masked"}, {"n": 2120}, {"k": 7040}, {"num_groups": 2}])
def test_an_entry_of_another_shape_is_never_used(tuned_file, change):
    _tuned.write_entries([_entry(m=64)], tuned_file)
    _tuned.reload()
    args = {"kind": "normal", "n": 2112, "k": 7168, "num_groups": 1, **change}
    assert _tuned.lookup(args["kind"], 64, args["n"], args["k"], args["num_groups"], ENV) is None


def test_a_later_write_of_the_same_key_replaces_the_entry(tuned_file):
    first, second = _cfg(bn=48, sms=88), _cfg(bn=32, stages=16, sms=128)
    _tuned.write_entries([_entry(cfg=first)], tuned_file)
    _tuned.write_entries([_entry(cfg=second), _entry(m=8, cfg=first)], tuned_file)
    data = json.loads(tuned_file.read_text())
    assert data["format"] == _tuned.FORMAT and len(data["entries"]) == 2
    _tuned.reload()
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) == second
    assert _tuned.lookup("normal", 8, 2112, 7168, 1, ENV) == first


def test_the_file_is_read_once_until_reload(tuned_file):
    cfg = _cfg()
    _tuned.reload()
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) is None
    _tuned.write_entries([_entry(cfg=cfg)], tuned_file)
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) is None    # deterministic within a process
    _tuned.reload()
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) == cfg


# ----------------------------------------------------------------------------
# corrupt, partial and illegal contents
# ----------------------------------------------------------------------------

def _good_text(tmp_path):
    p = tmp_path / "good.json"
    _tuned.write_entries([_entry(), _entry(m=8)], p)
    return p.read_text()


@pytest.mark.parametrize("how", ["garbage", "truncated", "empty", "list", "wrong format", "entries not list",
                                 "binary"])
def test_a_corrupt_file_gives_a_warning_and_no_entries(tuned_file, tmp_path, how):
    good = _good_text(tmp_path)
    contents = {"garbage": "not json {", "truncated": good[:len(good) // 2], "empty": "",
                "list": "[]", "wrong format": json.dumps({"format": 99, "entries": []}),
                "entries not list": json.dumps({"format": 1, "entries": {}})}
    if how == "binary":
        tuned_file.write_bytes(b"\xff\xfe\x00garbage")
    else:
        tuned_file.write_text(contents[how])
    with pytest.warns(RuntimeWarning, match="tuned configurations file"):
        _tuned.reload()
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) is None
    assert _tuned.entries() == []


@pytest.mark.parametrize("breakage", [
    lambda e: e.pop("env"), lambda e: e["env"].pop("sources"), lambda e: e.update(kind="weird"),
    lambda e: e.update(n="2112"), lambda e: e.update(k=-1), lambda e: e.update(m_bucket=True),
    lambda e: e.update(config=[]), lambda e: e["config"].update(block_n=0),
    lambda e: e["config"].update(num_stages=2.5), lambda e: e["config"].update(multicast_on_a=1),
    lambda e: e["config"].pop("num_sms")])
def test_a_malformed_entry_is_skipped_and_the_rest_used(tuned_file, breakage):
    bad, good = _entry(m=64), _entry(m=8)
    breakage(bad)
    tuned_file.write_text(json.dumps({"format": 1, "entries": [bad, good]}))
    with pytest.warns(RuntimeWarning, match="entry 0"):
        _tuned.reload()
    assert _tuned.lookup("normal", 8, 2112, 7168, 1, ENV) is not None
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) is None


@pytest.mark.parametrize("config, why", [
    ({"block_n": 7}, "block_n"), ({"num_stages": 40}, "stages"), ({"block_m": 96}, "block_m"),
    ({"num_sms": 500}, "SM"), ({"num_k_splits": 2, "num_multicast": 2}, ""),
    ({"block_m": 256, "block_n": 192, "num_stages": 8}, "")])
def test_an_illegal_config_is_never_used(tuned_file, config, why):
    e = _entry(m=64)
    e["config"].update(config)
    tuned_file.write_text(json.dumps({"format": 1, "entries": [e]}))
    _tuned.reload()
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, ENV) is None
    cfg, reason = _tuned.config_from_entry(e, 7168, 132)
    assert cfg is None and reason


def test_an_entry_beyond_the_current_sm_budget_is_not_used(tuned_file):
    _tuned.write_entries([_entry(cfg=_cfg(sms=128))], tuned_file)
    _tuned.reload()
    small = dict(ENV, num_sms=64)          # same file, the budget lowered to 64 SMs
    assert _tuned.lookup("normal", 64, 2112, 7168, 1, small) is None


def test_refuses_to_write_malformed_entries(tmp_path):
    e = _entry()
    e["config"]["block_m"] = "64"
    with pytest.raises(ValueError, match="malformed entry"):
        _tuned.write_entries([e], tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_writing_with_tuning_off_and_no_path_raises(monkeypatch):
    monkeypatch.setenv(_tuned.ENV_VAR, "off")
    with pytest.raises(ValueError, match="tuned configurations are off"):
        _tuned.write_entries([_entry()])


def test_a_write_never_overwrites_a_file_it_cannot_read(tmp_path):
    """A hand edit with a typo (or a newer format) is moved aside to
    <file>.bad with a warning, and the new entries go into a fresh file."""
    p = tmp_path / "t.json"
    p.write_text('{"format": 1, "entries": [],}')
    with pytest.warns(RuntimeWarning, match="moved to"):
        _tuned.write_entries([_entry()], p)
    entries, problems = _tuned.read_file(p)
    assert len(entries) == 1 and not problems
    assert (tmp_path / "t.json.bad").read_text() == '{"format": 1, "entries": [],}'


def test_a_write_keeps_the_file_mode_and_follows_a_symlink(tmp_path):
    real = tmp_path / "shared" / "real.json"
    real.parent.mkdir()
    _tuned.write_entries([_entry()], real)
    os.chmod(real, 0o644)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    _tuned.write_entries([_entry(m=8)], link)
    assert link.is_symlink() and len(_tuned.read_file(real)[0]) == 2
    assert (os.stat(real).st_mode & 0o777) == 0o644


def test_absurd_nesting_and_unhashable_env_values_never_raise(tuned_file):
    tuned_file.write_text("[" * 100000)
    with pytest.warns(RuntimeWarning, match="not valid JSON"):
        _tuned.reload()
    assert _tuned.entries() == []
    bad = _entry(m=64)
    bad["env"]["gpu"] = ["NVIDIA H200"]
    tuned_file.write_text(json.dumps({"format": 1, "entries": [bad, _entry(m=8)]}))
    with pytest.warns(RuntimeWarning, match="env.gpu"):
        _tuned.reload()
    assert _tuned.lookup("normal", 8, 2112, 7168, 1, ENV) is not None
    for fmt in (True, 1.0, "1"):
        tuned_file.write_text(json.dumps({"format": fmt, "entries": [_entry()]}))
        with pytest.warns(RuntimeWarning, match="format"):
            _tuned.reload()
    e = _entry()
    e["m_bucket"] = 50
    tuned_file.write_text(json.dumps({"format": 1, "entries": [e]}))
    with pytest.warns(RuntimeWarning, match="power of two"):
        _tuned.reload()


def _hold_lock(path: str, seconds: float) -> None:
    with _tuned._file_lock(Path(path)):
        import time
        time.sleep(seconds)


def test_a_held_lock_times_out_with_a_message(tmp_path):
    path = tmp_path / "t.json"
    ctx = multiprocessing.get_context("spawn")
    holder = ctx.Process(target=_hold_lock, args=(str(path), 8.0))
    holder.start()
    try:
        import time
        deadline = time.monotonic() + 20
        while not (tmp_path / "t.json.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)                       # the holder has the lock by now
        with pytest.raises(OSError, match="has held .*t.json.lock"):
            with _tuned._file_lock(path, timeout_s=0.5):
                pass
    finally:
        holder.join(30)
    with _tuned._file_lock(path, timeout_s=0.5):      # free again
        pass


def test_stale_temporaries_of_killed_writers_are_removed(tmp_path):
    p = tmp_path / "t.json"
    old_tmp, new_tmp = tmp_path / "t.json.abc.tmp", tmp_path / "t.json.def.tmp"
    old_tmp.write_text("{")
    new_tmp.write_text("{")
    os.utime(old_tmp, (0, 0))
    _tuned.write_entries([_entry()], p)
    assert not old_tmp.exists() and new_tmp.exists()


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch):
    monkeypatch.delenv(_tuned.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert _tuned.tuned_path() == Path(os.path.expanduser("~")) / ".cache" / "cugemm8" / "tuned.json"


def test_no_temporary_file_is_left_behind(tmp_path):
    p = tmp_path / "t.json"
    _tuned.write_entries([_entry()], p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.json", "t.json.lock"]


def _writer(path: str, start: int, count: int) -> None:
    for i in range(start, start + count):
        _tuned.write_entries([_entry(m=1, n=8 * (i + 1))], path)


def test_concurrent_writers_keep_every_entry(tmp_path):
    """Four processes merging 10 entries each into one file: every entry
    survives and the file stays valid JSON (flock + atomic replace)."""
    path = tmp_path / "t.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), 10 * p, 10)) for p in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries, problems = _tuned.read_file(path)
    assert not problems
    assert sorted(e["n"] for e in entries) == [8 * (i + 1) for i in range(40)]


def test_a_reader_during_writes_sees_whole_files(tmp_path):
    path = tmp_path / "t.json"
    _tuned.write_entries([_entry()], path)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_writer, args=(str(path), 0, 30))
    proc.start()
    seen = 0
    while proc.is_alive() or seen == 0:
        entries, problems = _tuned.read_file(path)
        assert not problems
        seen += 1
    proc.join(60)
    assert proc.exitcode == 0


# ----------------------------------------------------------------------------
# the ops' choice
# ----------------------------------------------------------------------------

def test_the_ops_launch_a_matching_tuned_entry(tuned_file, monkeypatch):
    monkeypatch.setattr(_tuned, "environment", lambda num_sms, device_id=None: dict(ENV, num_sms=num_sms))
    heur = _config.select_config("normal", 64, 2112, 7168, num_sms=132)
    tuned = _cfg(bn=48, stages=12, sms=88)
    assert tuned != heur
    assert G._choose("normal", 64, 2112, 7168, 1, 0, 132) == (heur, "heuristic")
    _tuned.write_entries([_entry(cfg=tuned)], tuned_file)
    G.reload_tuned_configs()
    assert G._choose("normal", 64, 2112, 7168, 1, 0, 132) == (tuned, "tuned")
    assert G._choose("normal", 128, 2112, 7168, 1, 0, 132)[1] == "heuristic"      # other bucket
    assert G._choose("normal", 64, 2112, 7168, 1, 0, 120)[1] == "heuristic"      # other SM budget


def test_tuning_off_never_reads_the_environment(monkeypatch):
    monkeypatch.setenv(_tuned.ENV_VAR, "off")

    def boom(*a, **k):
        raise AssertionError("environment() must not be needed with tuning off")
    monkeypatch.setattr(_tuned, "environment", boom)
    cfg, source = G._choose("normal", 64, 2112, 7168, 1, 0, 132)
    assert source == "heuristic" and cfg == _config.select_config("normal", 64, 2112, 7168, num_sms=132)


# ----------------------------------------------------------------------------
# the candidate family and the winner rule
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind, m, n, k, g", [("normal", 1, 2112, 7168, 1), ("normal", 4096, 7168, 2048, 1),
                                              ("contiguous", 16384, 4096, 7168, 4),
                                              ("masked", 64, 7168, 2048, 16)])
@pytest.mark.parametrize("num_sms", [132, 114, 78, 48])
def test_candidates_are_legal_unique_and_start_with_the_heuristic(kind, m, n, k, g, num_sms):
    cands = _tune.candidates(kind, m, n, k, g, num_sms)
    assert cands[0] == _config.select_config(kind, m, n, k, num_groups=g, num_sms=num_sms)
    assert len({str(c) for c in cands}) == len(cands) >= 4
    for c in cands:
        ok, why = _config.is_legal(c, k=k, available_sms=num_sms)
        assert ok, (str(c), why)


def test_parse_config_reads_what_str_writes():
    for c in _tune.candidates("normal", 64, 2112, 7168, 1, 132):
        back = _tune.parse_config(str(c), "normal", 64, 2112, 7168, 1, 132)
        assert (back.block_m, back.block_n, back.num_multicast, back.multicast_on_a, back.num_k_splits) == \
               (c.block_m, c.block_n, c.num_multicast, c.multicast_on_a, c.num_k_splits)
    with pytest.raises(ValueError, match="not of the form"):
        _tune.parse_config("64x32", "normal", 64, 2112, 7168, 1, 132)


def test_candidates_include_one_warpgroup_twins():
    """tune times the one-math-warpgroup twin of every BLOCK_M = 64
    candidate; parse_config reads the "w1" tag back."""
    cands = _tune.candidates("normal", 8, 32768, 512, 1, 132)
    w1 = [c for c in cands if c.num_math_warpgroups == 1 and not c.swap_ab and not c.warp_mma]
    assert w1 and all(c.block_m == 64 for c in w1)
    for c in cands:
        assert _config.is_legal(c, k=512, available_sms=132)[0], c
    back = _tune.parse_config(str(w1[0]), "normal", 8, 32768, 512, 1, 132)
    assert back.num_math_warpgroups == 1 and back.block_n == w1[0].block_n


def test_entry_keeps_the_warpgroup_count_and_old_entries_default_to_two():
    env = {f: "x" for f in _tuned.ENV_FIELDS}
    cfg = _config.make_config("normal", 64, 128, 6, 512, num_sms=132, num_math_warpgroups=1)
    e = _tuned.entry_for("normal", 8, 32768, 512, 1, env, cfg)
    assert e["config"]["num_math_warpgroups"] == 1
    assert _tuned.config_from_entry(e, 512, 132) == (cfg, "")
    del e["config"]["num_math_warpgroups"]          # an entry written before v0.11
    assert _tuned._entry_problem(e) is None
    old, why = _tuned.config_from_entry(e, 512, 132)
    assert why == "" and old.num_math_warpgroups == 2 and old.block_n == 128
    e["config"]["num_math_warpgroups"] = True
    assert "num_math_warpgroups" in _tuned._entry_problem(e)


def test_swap_ab_candidates_entries_and_config_text():
    """tune times the swap-AB decode kernel's one- and two-wave configs at
    M <= 32 (never at 33 or for the grouped kinds); an entry and the config
    text both read a swap-AB config back; entries written before v0.16
    (no swap_ab field) are the 1D2D kernel's."""
    cands = _tune.candidates("normal", 8, 4096, 7168, 1, 132)
    swap = [c for c in cands if c.swap_ab]
    assert swap and all(c.block_m == 8 and c.num_k_splits in (1, 2) for c in swap)
    assert not [c for c in _tune.candidates("normal", 33, 4096, 7168, 1, 132) if c.swap_ab]
    assert not [c for c in _tune.candidates("masked", 8, 4096, 7168, 2, 132) if c.swap_ab]
    for c in swap:
        assert _config.is_legal(c, k=7168, available_sms=132)[0], c
        assert _tune.parse_config(str(c), "normal", 8, 4096, 7168, 1, 132) == c
    env = {f: "x" for f in _tuned.ENV_FIELDS}
    e = _tuned.entry_for("normal", 8, 4096, 7168, 1, env, swap[0])
    assert e["config"]["swap_ab"] is True
    assert _tuned.config_from_entry(e, 7168, 132) == (swap[0], "")
    e["config"]["swap_ab"] = 1
    assert "swap_ab" in _tuned._entry_problem(e)
    plain = _tuned.entry_for("normal", 8, 4096, 7168, 1, env, _cfg(k=7168))
    assert "swap_ab" not in plain["config"] and not _tuned.config_from_entry(plain, 7168, 132)[0].swap_ab
    assert _tune.parse_config("8x64 s16 swapAB k2", "contiguous", 8, 4096, 7168, 1, 132) is None


def test_warp_mma_candidates_entries_and_config_text():
    """tune times the warp-MMA pick (first) where the heuristic picks it, and
    never when warp_mma is off (a reduced SM budget); an entry and the
    config text both read it back; entries without the field are not it."""
    cands = _tune.candidates("normal", 4, 2112, 7168, 1, 132)
    assert cands[0].warp_mma and str(cands[0]) == "8x16 u2 warpMMA k14 ctas132"
    assert not [c for c in _tune.candidates("normal", 4, 2112, 7168, 1, 132, warp_mma=False) if c.warp_mma]
    assert not [c for c in _tune.candidates("normal", 9, 2112, 7168, 1, 132) if c.warp_mma]
    wm = cands[0]
    assert _tune.parse_config(str(wm), "normal", 4, 2112, 7168, 1, 132) == wm
    assert _tune.parse_config(str(wm), "masked", 4, 2112, 7168, 1, 132) is None
    env = {f: "x" for f in _tuned.ENV_FIELDS}
    e = _tuned.entry_for("normal", 4, 2112, 7168, 1, env, wm)
    assert e["config"]["warp_mma"] is True and "swap_ab" not in e["config"]
    assert _tuned.config_from_entry(e, 7168, 132) == (wm, "")
    # an entry for another n (its grid), an M bucket above 8 rows, or a
    # reduced SM budget is not used (the heuristic serves the call)
    for field, value, why in (("n", 4096, "ceil(n / block_n)"), ("m_bucket", 16, "M bucket")):
        bad = dict(e, **{field: value})
        assert _tuned.config_from_entry(bad, 7168, 132)[0] is None
        assert why in _tuned.config_from_entry(bad, 7168, 132)[1]
    whole = dict(e, env=dict(e["env"], sm_count=132))
    assert _tuned.config_from_entry(whole, 7168, 132) == (wm, "")
    assert "whole device" in _tuned.config_from_entry(whole, 7168, 100)[1]
    e["config"]["warp_mma"] = "yes"
    assert "warp_mma" in _tuned._entry_problem(e)
    plain = _tuned.entry_for("normal", 8, 4096, 7168, 1, env, _cfg(k=7168))
    assert "warp_mma" not in plain["config"] and not _tuned.config_from_entry(plain, 7168, 132)[0].warp_mma


def _measured(us, status="ok"):
    m = _tune.Measured(_cfg())
    m.samples, m.status = ([us] if us is not None else []), status
    return m


def test_the_heuristic_stays_unless_beaten_by_more_than_the_margin():
    h = _measured(10.0)
    close, better, wrong = _measured(9.95), _measured(9.5), _measured(1.0, "wrong (calc_diff 1e-1)")
    assert _tune.choose(h, [h, close]) is h
    assert _tune.choose(h, [h, close, better, wrong]) is better
    assert _tune.choose(h, [h, _measured(2.0, "pruned")]) is h
    failed = _measured(None, "error RuntimeError")
    assert _tune.choose(failed, [failed, close]) is close


def test_a_recorded_winner_is_a_valid_entry_that_lookup_finds(tmp_path, monkeypatch):
    monkeypatch.setenv(_tuned.ENV_VAR, str(tmp_path / "t.json"))
    win, heur = _measured(9.0), _tune.Measured(_config.select_config("normal", 48, 2112, 7168, num_sms=132))
    heur.samples = [9.5, 9.6]
    e = _tune.record("normal", 48, 2112, 7168, 1, ENV, win, heur, 7)
    assert e["m_bucket"] == 64 and e["rows"] == 48 and e["us"] == 9.0 and e["heuristic_us"] == 9.55
    assert e["heuristic"] == str(heur.config) and e["candidates"] == 7 and e["tuned_at"].endswith("Z")
    _tuned.write_entries([e])
    _tuned.reload()
    assert _tuned.lookup("normal", 48, 2112, 7168, 1, ENV) == win.config
    _tuned.reload()


def test_time_candidates_interleaves_prunes_and_stops_at_the_deadline():
    """A stand-in for CuPy's events: each launch 'takes' its candidate's time."""
    clock = {"now": 0.0, "log": []}

    class Event:
        def record(self):
            self.t = clock["now"]

        def synchronize(self):
            pass

    import types
    FakeCp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=Event, get_elapsed_time=lambda s, e: e.t - s.t))

    def launch(name, ms):
        def run():
            clock["log"].append(name)
            clock["now"] += ms
        return run
    runs = {n: (_measured(None), launch(n, ms)) for n, ms in (("a", 1.0), ("b", 1.1), ("slow", 2.0))}
    for m, _ in runs.values():
        m.samples = []
    _tune.time_candidates(runs, FakeCp, lambda: None, rounds=3, reps=2, deadline=float("inf"))
    assert runs["slow"][0].status == "pruned" and len(runs["slow"][0].samples) == 2
    assert len(runs["a"][0].samples) == len(runs["b"][0].samples) == 6
    assert runs["a"][0].us == pytest.approx(1000.0)
    assert clock["log"][:6] == ["a", "a", "b", "b", "slow", "slow"]
    assert clock["log"][6:8] == ["b", "b"]             # round 2 starts at the next candidate
    runs = {n: (_measured(None), launch(n, 1.0)) for n in "xy"}
    for m, _ in runs.values():
        m.samples = []
    _tune.time_candidates(runs, FakeCp, lambda: None, rounds=5, reps=1, deadline=-1.0)
    assert all(len(m.samples) == 1 for m, _ in runs.values())     # one round, then the deadline


# ----------------------------------------------------------------------------
# the command line without a GPU
# ----------------------------------------------------------------------------

def test_tune_without_a_gpu_says_so(capsys):
    from cugemm8.cli import _common
    if _common.gpu_reason() is None:
        pytest.skip("a GPU is present")
    from cugemm8.cli._main import main
    assert main(["tune", "--shapes", "@normal"]) == 2
    assert "no usable Hopper GPU" in capsys.readouterr().err


def test_tune_rejects_unknown_kinds_and_bad_shapes(capsys, tmp_path):
    from cugemm8.cli._main import main
    for bad in (["--budget-s", "0"], ["--budget-s", "-5"], ["--budget-s", "nan"], ["--split-k", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(["tune", "--shapes", "@normal", *bad])
        assert exc.value.code == 2
        capsys.readouterr()
    assert main(["tune", "--shapes", "@normal", "--kinds", "dense"]) == 2
    assert "unknown kind(s) dense" in capsys.readouterr().err
    assert main(["tune", "--shapes", "@nope"]) == 2
    assert "unknown shapes preset" in capsys.readouterr().err
    assert main(["tune", "--shapes", "@grouped", "--kinds", "normal"]) == 2
    assert "no shapes of the chosen kinds" in capsys.readouterr().err


def test_configs_shows_the_tuned_pick_beside_the_heuristic(tuned_file, capsys):
    from cugemm8.cli import configs
    tuned = _cfg(bn=48, stages=12, sms=88)
    _tuned.write_entries([_entry(cfg=tuned, us=9.0, heuristic_us=9.5, tuned_at="2026-12-01T00:00:00Z")],
                         tuned_file)
    entries, _ = _tuned.read_file(tuned_file)
    cases = [("normal", 1, 64, 2112, 7168), ("normal", 1, 128, 2112, 7168)]
    rows = configs.tuned_rows(cases, 132, entries, ENV)
    assert len(rows) == 1
    assert rows[0][6] == str(tuned) and rows[0][-1] == "used" and rows[0][7:9] == ("9.5", "9.0")
    stale = configs.tuned_rows(cases, 132, entries, dict(ENV, sources="cd" * 32))
    assert stale[0][-1] == "stale: sources differ"
    assert "no GPU here" in configs.tuned_rows(cases, 132, entries, None)[0][-1]
    assert configs.tuned_rows(cases, 120, entries, ENV) == []
    illegal = _entry(cfg=tuned, us=10 ** 400)
    illegal["config"]["num_stages"] = 7          # odd stages at BLOCK_M = 64: illegal
    rows = configs.tuned_rows(cases, 132, [illegal], None)
    assert rows[0][-1].startswith("ignored:") and rows[0][8] == "-"


def test_presets_name_the_benchmark_tables():
    from cugemm8 import _shapes
    assert len(_shapes.load_shapes("@normal")) == 18
    assert len(_shapes.load_shapes("@decode")) == 48
    grouped = _shapes.load_shapes("@grouped")
    assert {s.kind for s in grouped} == {"contiguous", "masked"}
    assert all(s.m % 128 == 0 for s in grouped if s.kind == "contiguous")


def test_corrupt_file_never_breaks_get_gemm_config_on_a_cpu(tuned_file):
    tuned_file.write_text("{{{")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # num_sms given: the heuristic, the file is not even read
        assert G.get_gemm_config("normal", 64, 2112, 7168, num_sms=132) == \
               _config.select_config("normal", 64, 2112, 7168, num_sms=132)
    assert os.path.exists(tuned_file)


# ----------------------------------------------------------------------------
# the training kinds (1D1D GEMMs)
# ----------------------------------------------------------------------------

def _cfg_1d1d(bm=128, bn=128, stages=5, sms=132, tma=True):
    from cugemm8 import _config_1d1d
    return _config_1d1d.make_config(bm, bn, stages, sms, tma)


def test_a_training_entry_round_trips_and_is_validated(tuned_file):
    from cugemm8 import _config_1d1d
    cfg = _cfg_1d1d()
    e = _tuned.entry_for("wgrad", 2112, 7168, 4096, 1, ENV, cfg, us=140.0)
    assert e["config"] == {"block_m": 128, "block_n": 128, "num_stages": 5, "num_sms": 132, "tma_store": True}
    _tuned.write_entries([e, _tuned.entry_for("k_grouped", 4096, 7168, 32768, 4, ENV, _cfg_1d1d(bn=160))],
                         tuned_file)
    _tuned.reload()
    assert _tuned.lookup("wgrad", 2112, 7168, 4096, 1, ENV) == cfg
    assert _tuned.lookup("wgrad", 3000, 7168, 4096, 1, ENV) == cfg                # same M bucket (4096)
    assert _tuned.lookup("wgrad", 2048, 7168, 4096, 1, ENV) is None               # another bucket
    assert _tuned.lookup("wgrad", 2112, 7168, 8192, 1, ENV) is None               # k (tokens) is exact
    assert _tuned.lookup("k_grouped", 4096, 7168, 32768, 4, ENV).block_n == 160
    assert isinstance(_tuned.lookup("k_grouped", 4096, 7168, 32768, 4, ENV), _config_1d1d.Gemm1d1dConfig)
    # malformed and illegal training entries are skipped
    for bad in ({"tma_store": 1}, {"num_stages": 0}, {"block_n": 144, "tma_store": True}):
        x = _tuned.entry_for("wgrad", 64, 512, 1024, 1, ENV, _cfg_1d1d())
        x["config"].update(bad)
        why = _tuned._entry_problem(x)
        cfg2, why2 = _tuned.config_from_entry(x, 1024, 132) if why is None else (None, why)
        assert cfg2 is None and why2, bad


def test_the_1d1d_ops_use_a_tuned_entry_only_where_its_epilogue_is_allowed(tuned_file, monkeypatch):
    from cugemm8 import _device, gemm_1d1d as G1
    monkeypatch.setattr(_tuned, "environment", lambda num_sms, device_id=None: dict(ENV, num_sms=num_sms))
    monkeypatch.setattr(_device, "require_hopper", lambda device_id=None: 0)
    monkeypatch.setattr(_device, "get_num_sms", lambda device_id=None: 132)
    heur = G1.get_gemm_1d1d_config(2112, 7168, 4096, with_c=True)
    tuned = _cfg_1d1d(bn=96, stages=6)
    assert tuned != heur
    _tuned.write_entries([_tuned.entry_for("wgrad", 2112, 7168, 4096, 1, ENV, tuned)], tuned_file)
    G.reload_tuned_configs()
    assert G1.get_gemm_1d1d_config(2112, 7168, 4096, with_c=True) == tuned
    # c another array (no TMA epilogue): the tuned TMA entry does not apply
    assert not G1.get_gemm_1d1d_config(2112, 7168, 4096, with_c=True, tma_store=False).tma_store
    # with num_sms given (no device asked) the heuristic's pick, as for the 1D2D ops
    assert G1.get_gemm_1d1d_config(2112, 7168, 4096, with_c=True, num_sms=132) == heur


def test_training_candidates_start_with_the_heuristic_and_are_legal():
    from cugemm8 import _config_1d1d
    for m, n, k, g in ((2112, 7168, 4096, 1), (32768, 512, 4096, 1), (4096, 7168, 8 * 4096, 8), (100, 8, 128, 1)):
        cands = _tune.candidates_1d1d(m, n, k, g, 132, top=5)
        assert cands[0] == _config_1d1d.select_config(m, n, k, num_groups=g, num_sms=132, with_c=True)
        assert len(cands) == len(set(cands)) <= 6
        for c in cands:
            assert _config_1d1d.is_legal(c, available_sms=132) == (True, "ok"), c
