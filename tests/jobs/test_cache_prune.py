"""The node's code cache is pruned (``jobs/code/prune.py``): entries unused for a week, and the least
recently used while the disk is short of space; never one a running attempt holds or one being made.
The last test runs a real ``--workdir`` job through ``gpucloud worker``: its supervisor prunes before
preparing, and the attempt's own entry survives a prune run from inside the attempt."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from gpucloud.jobs.code.prune import DAY, PrunePolicy, entry_order, hold, prune
from gpucloud.jobs.code.unpack import node_lock
from jobs.test_cli import run

NOW = time.time()


def entry(cache: Path, kind: str, name: str, *, age_days: float, size: int = 100) -> Path:
    path = cache / kind / name
    (path / "tree").mkdir(parents=True)
    (path / "tree" / "data").write_bytes(b"x" * size)
    stamp = NOW - age_days * DAY
    os.utime(path, (stamp, stamp))
    return path


def test_entries_unused_for_a_week_go_and_held_or_recent_ones_stay(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old_code, old_env = entry(cache, "code", "a" * 64, age_days=8), entry(cache, "envs", "k1", age_days=30)
    held, recent = entry(cache, "code", "c" * 64, age_days=9), entry(cache, "envs", "k2", age_days=6)
    with contextlib.ExitStack() as attempt:
        assert hold(held, attempt)
        os.utime(held.with_name(held.name + ".used"), (NOW - 9 * DAY, NOW - 9 * DAY))  # held, yet unused for days
        pruned = prune(cache, now=NOW)
        assert sorted(pruned.aged) == sorted([old_code, old_env]) and pruned.for_space == []
        assert not old_code.exists() and not old_env.exists() and held.is_dir() and recent.is_dir()
    assert prune(cache, now=NOW).aged == [held]  # the attempt ended: nothing holds it any more
    assert recent.is_dir() and sorted(p.name for p in (cache / "code").iterdir() if p.is_dir()) == []


def test_a_pruned_env_takes_its_manifest_with_it_and_leaves_its_lock_files(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = entry(cache, "envs", "k9", age_days=10)
    beside = {suffix: env.with_name(env.name + suffix) for suffix in (".manifest.json", ".used", ".lock", ".inuse")}
    for path in beside.values():
        path.write_text("{}")
        os.utime(path, (NOW - 10 * DAY, NOW - 10 * DAY))
    other = entry(cache, "envs", "k9x", age_days=1).with_name("k9x.manifest.json")  # a longer name, kept
    other.write_text("{}")
    assert prune(cache, now=NOW).aged == [env]
    assert not beside[".manifest.json"].exists() and not beside[".used"].exists()
    assert beside[".lock"].exists() and beside[".inuse"].exists() and other.exists()


def test_an_entry_being_made_is_not_pruned(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    making = entry(cache, "code", "d" * 64, age_days=10)
    with node_lock(making.with_name(making.name + ".lock")):  # what cached_tree holds while it unpacks
        assert prune(cache, now=NOW).aged == [] and making.is_dir()
    assert prune(cache, now=NOW).aged == [making]


def test_hold_says_when_its_entry_was_pruned_just_before(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    gone = entry(cache, "envs", "k3", age_days=20)
    prune(cache, now=NOW)
    with contextlib.ExitStack() as attempt:
        assert hold(gone, attempt) is False  # the caller prepares it again


class Disk:
    """A disk of ``total`` bytes that holds ``other`` bytes besides the cache's files."""

    def __init__(self, cache: Path, total: int, other: int) -> None:
        self.cache, self.total, self.other = cache, total, other

    def __call__(self, _: Path) -> SimpleNamespace:
        used = self.other + sum(f.stat().st_size for f in self.cache.rglob("*") if f.is_file())
        return SimpleNamespace(total=self.total, used=used, free=self.total - used)


def test_short_of_space_the_least_recently_used_go_first_until_a_tenth_is_free(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    oldest, in_use = entry(cache, "code", "e" * 64, age_days=5), entry(cache, "envs", "k4", age_days=4)
    older, newer = entry(cache, "envs", "k5", age_days=3), entry(cache, "code", "f" * 64, age_days=1)
    disk = Disk(cache, total=1000, other=530)  # 4 x 100 in the cache: 930 used, 70 free; 100 wanted
    with contextlib.ExitStack() as attempt:
        assert hold(in_use, attempt)
        os.utime(in_use.with_name(in_use.name + ".used"), (NOW - 4 * DAY, NOW - 4 * DAY))
        pruned = prune(cache, PrunePolicy(max_age_s=7 * DAY, min_free_fraction=0.10), now=NOW, disk_usage=disk)
    assert pruned.aged == [] and pruned.for_space == [oldest] and not pruned.short_of_space
    assert in_use.is_dir() and older.is_dir() and newer.is_dir()  # 170 free after one: enough

    disk.total, disk.other = 10_000, 9500  # 1000 wanted free, 200 free: all three (k4 no longer held) are not enough
    pruned = prune(cache, PrunePolicy(min_free_fraction=0.10), now=NOW, disk_usage=disk)
    assert pruned.for_space == [in_use, older, newer] and pruned.short_of_space  # all gone, still short


def test_the_order_is_age_then_least_recently_used() -> None:
    entries = [SimpleNamespace(path=Path(n), last_used=NOW - d * DAY) for n, d in (("a", 1), ("b", 9), ("c", 3))]
    aged, rest = entry_order(entries, now=NOW, max_age_s=7 * DAY)  # type: ignore[arg-type]
    assert [e.path.name for e in aged] == ["b"] and [e.path.name for e in rest] == ["c", "a"]


PROBE = """\
import json, pathlib, sys
from gpucloud.jobs.code.prune import PrunePolicy, prune
cache = pathlib.Path(sys.argv[1])
pruned = prune(cache, PrunePolicy(max_age_s=-1))  # everything is past this age: only holds protect
pathlib.Path(sys.argv[2]).write_text(json.dumps([str(p) for p in pruned.aged]))
"""


def test_a_running_attempt_keeps_its_entry_and_its_supervisor_prunes_stale_ones(
    tmp_path: Path, gpucloud_home: Path, capsys
) -> None:
    cache = gpucloud_home / "cache"
    stale = entry(cache, "code", "0" * 64, age_days=8)
    work = tmp_path / "project"
    work.mkdir()
    (work / "probe.py").write_text(PROBE)
    seen = tmp_path / "pruned-during-the-attempt.json"
    code, out, err = run(
        capsys, "submit", "--workdir", str(work), "--output", "json", "--",
        sys.executable, "probe.py", str(cache), str(seen),
    )  # fmt: skip
    assert code == 0, err
    job = json.loads(out)
    code, _, err = run(capsys, "worker", "--no-imds", "--once")
    assert code == 0, err
    assert json.loads(seen.read_text()) == []  # the attempt's own snapshot was held while it ran
    ours = cache / "code" / job["code"]["sha256"]
    assert not stale.exists() and ours.is_dir()
    _, logs, _ = run(capsys, "job", "logs", job["job_id"])
    assert f"node cache {cache}: pruned 1 unused for over 7 days" in logs
    assert prune(cache, PrunePolicy(max_age_s=-1)).aged == [ours]  # the attempt is over: no hold left
