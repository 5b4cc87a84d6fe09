"""The deploy lock's rules (module_utils/dflash_lockfile.py) with real files and real
processes as holders: who may take it, who may write under it, and when a holder is dead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lock_watchdog import Watchdog
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lockfile import (
    GENERATION,
    LOCK,
    LockError,
    acquire,
    fence,
    generation,
    held,
    holder_alive,
    kernel_identity,
    read_lock,
    release,
    start_ticks,
    token_of,
)


def holder_of(proc: subprocess.Popen) -> dict:
    holder = {"user": "t", "host": "here", "pid": proc.pid, **kernel_identity()}
    holder["pid_start"] = start_ticks(proc.pid)
    return holder


@pytest.fixture
def sleeper():
    """A real process to hold the lock; the test kills it to make a dead holder."""
    procs: list[subprocess.Popen] = []

    def make() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        procs.append(proc)
        return proc

    yield make
    for proc in procs:
        proc.kill()
        proc.wait()


def test_one_holder_at_a_time_and_only_it_releases(tmp_path: Path, sleeper):
    root = tmp_path / "dflash"
    first, second = holder_of(sleeper()), holder_of(sleeper())
    one, two = token_of(first), token_of(second)
    assert one != two
    got = acquire(str(root), one, first, "deploy", "v2")
    assert got["acquired"] and got["taken_over"] is None and root.is_dir()
    # The same run again (the next task) keeps it; another run is told who holds it.
    assert acquire(str(root), one, first, "deploy", "v2")["acquired"]
    refused = acquire(str(root), two, second, "deploy", "v3")
    assert not refused["acquired"] and refused["held_by"]["release"] == "v2"
    assert refused["held_by"]["holder"]["pid"] == first["pid"]
    assert not release(str(root), two) and (root / LOCK).exists()
    # The run that created the root leaves nothing behind when it changed nothing there.
    assert release(str(root), one) and not root.exists()


def test_a_read_made_with_the_lock_free_holds_until_another_run_takes_it(tmp_path, sleeper):
    """deploy.yml reads the target before it takes the lock; the take says whether that read
    still holds (no run took the lock since), so that it need not be read again."""
    root = tmp_path / "dflash"
    mine, other = holder_of(sleeper()), holder_of(sleeper())
    me, them = token_of(mine), token_of(other)
    read = generation(str(root))  # no root yet: nobody ever took its lock
    assert read == 0
    got = acquire(str(root), me, mine, "deploy", "v1", expect_generation=read)
    assert got["acquired"] and got["unchanged_since_read"]
    (root / "history.jsonl").write_text("{}\n")  # the run put something there: the root stays
    assert release(str(root), me) and root.is_dir()
    read = generation(str(root))
    assert read == 1
    # A whole run between the read and the take: the read no longer holds.
    assert acquire(str(root), them, other, "stop", None)["acquired"] and release(str(root), them)
    got = acquire(str(root), me, mine, "deploy", "v2", expect_generation=read)
    assert got["acquired"] and not got["unchanged_since_read"]
    assert release(str(root), me)
    # A read that saw no count (none given) or a damaged count is never taken as still true.
    assert not acquire(str(root), me, mine, "deploy", "v2")["unchanged_since_read"]
    assert release(str(root), me)
    (root / GENERATION).write_text("garbage\n")
    assert generation(str(root)) == -1
    got = acquire(str(root), me, mine, "deploy", "v2", expect_generation=-1)
    assert not got["unchanged_since_read"] and generation(str(root)) == 1
    # Taking it again as the same run (the next task) is no new take.
    assert acquire(str(root), me, mine, "deploy", "v2")["acquired"] and generation(str(root)) == 1


def test_a_dead_holder_is_seen_and_its_lock_taken_over_by_token(tmp_path: Path, sleeper):
    root = tmp_path / "dflash"
    root.mkdir()
    proc = sleeper()
    dead, live = holder_of(proc), holder_of(sleeper())
    acquire(str(root), token_of(dead), dead, "deploy", "v2")
    fence(str(root), token_of(dead), phase="launch")
    assert holder_alive(dead) is True
    proc.kill()
    proc.wait()
    lock = read_lock(str(root))
    assert lock["holder_alive"] is False and lock["phase"] == "launch"
    # Only a take-over that names the dead holder's token replaces it.
    assert not acquire(str(root), token_of(live), live, "deploy", "v3", take_over="x")["acquired"]
    got = acquire(str(root), token_of(live), live, "deploy", "v3", take_over=token_of(dead))
    assert got["acquired"] and got["taken_over"]["phase"] == "launch"
    # The old run can no longer write: its fence fails and names the new holder.
    with pytest.raises(LockError, match="deploy of v3"):
        fence(str(root), token_of(dead), phase="record")


def test_another_kernel_or_pid_namespace_is_unknowable(tmp_path: Path):
    foreign = {"pid": os.getpid(), "pid_start": start_ticks(os.getpid()), "boot_id": "other"}
    assert holder_alive(foreign) is None
    here = dict(foreign, **kernel_identity())
    assert holder_alive(here) is True
    assert holder_alive(dict(here, pid_start=1)) is False  # a reused pid


def test_a_torn_lock_file_is_replaced(tmp_path: Path, sleeper):
    root = tmp_path / "dflash"
    root.mkdir()
    (root / LOCK).write_text('{"token": "abc", "holder"')
    holder = holder_of(sleeper())
    got = acquire(str(root), token_of(holder), holder, "stop", None)
    assert got["acquired"] and got["taken_over"]["torn"]
    assert json.loads((root / LOCK).read_text())["action"] == "stop"


def test_held_without_a_token_takes_and_gives_back_its_own(tmp_path: Path, sleeper):
    root = tmp_path / "dflash"
    root.mkdir()
    with held(str(root), None, "deploy", "unpack"):
        assert read_lock(str(root))["phase"] == "locked"
    assert read_lock(str(root)) is None
    other = holder_of(sleeper())
    acquire(str(root), token_of(other), other, "deploy", "v9")
    with pytest.raises(LockError, match="deploy of v9"), held(str(root), None, "deploy", "x"):
        pass


def test_watchdog_ends_work_when_the_holder_dies(tmp_path: Path, sleeper):
    root = tmp_path / "dflash"
    root.mkdir()
    proc = sleeper()
    holder = holder_of(proc)
    acquire(str(root), token_of(holder), holder, "deploy", "v2")
    with Watchdog(str(root), token_of(holder), interval_s=0.05) as dog:
        dog.check()  # alive: nothing to say
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while not dog.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(LockError, match="has died"):
            dog.check()


def test_a_play_dead_at_once_is_seen_before_the_next_change(tmp_path: Path, sleeper):
    """check_now looks at once: the seconds between two of the watchdog's looks are when an
    orphaned launch would stop the old trainer or start a new one."""
    root = tmp_path / "dflash"
    root.mkdir()
    proc = sleeper()
    holder = holder_of(proc)
    acquire(str(root), token_of(holder), holder, "rollback", "v7")
    with Watchdog(str(root), token_of(holder), interval_s=600) as dog:
        dog.check_now("start the trainer of release v7")  # alive: nothing to say
        proc.kill()
        proc.wait()
        with pytest.raises(LockError, match=r"has died.*not going on to start the trainer of"):
            dog.check_now("start the trainer of release v7")
        with pytest.raises(LockError, match="has died"):
            dog.check()  # and it stays lost


def test_a_play_out_of_sight_is_dead_once_it_stops_polling(tmp_path: Path):
    """A holder the target cannot see (another host, another pid namespace): its play is alive
    while its module runs note a poll in the lock (fence), dead once none came for the set
    time; the watchdog's own renewals do not count as polls."""
    root = tmp_path / "dflash"
    root.mkdir()
    holder = {"user": "t", "host": "controller", "pid": 4242, "pid_start": 1,
              "boot_id": "another-kernel", "pid_ns": 1}  # fmt: skip
    token = token_of(holder)
    acquire(str(root), token, holder, "rollback", "v7")
    assert holder_alive(holder) is None
    with Watchdog(str(root), token, interval_s=600, poll_timeout_s=30) as dog:
        dog.check_now("stop the old trainers")  # polled at acquire: alive
        lock = json.loads((root / LOCK).read_text())
        lock["polled_epoch"] = time.time() - 31
        (root / LOCK).write_text(json.dumps(lock))
        fence(str(root), token, polled=False)  # a watchdog's renewal: still silent
        with pytest.raises(LockError, match=r"for 3\d s \(more than 30 s\).*not going on to"):
            dog.check_now("stop the old trainers")
    fence(str(root), token)  # a poll (dflash_wait's run): alive again
    with Watchdog(str(root), token, interval_s=600, poll_timeout_s=30) as dog:
        dog.check_now("start the trainer of release v7")
    # Without a poll timeout (a synchronous module's work) silence says nothing.
    lock = json.loads((root / LOCK).read_text())
    lock["polled_epoch"] = time.time() - 3600
    (root / LOCK).write_text(json.dumps(lock))
    with Watchdog(str(root), token, interval_s=600) as dog:
        dog.check_now("build the env")


def test_concurrent_takers_get_one_winner(tmp_path: Path, sleeper):
    root = tmp_path / "dflash"
    root.mkdir()
    holders = [holder_of(sleeper()) for _ in range(6)]
    results: list[bool] = []
    barrier = threading.Barrier(len(holders))

    def take(holder: dict) -> None:
        barrier.wait()
        results.append(acquire(str(root), token_of(holder), holder, "deploy", None)["acquired"])

    threads = [threading.Thread(target=take, args=(h,)) for h in holders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 5 + [True]


def test_a_rollback_killed_twice_keeps_the_first_ones_intent(tmp_path: Path, sleeper):
    """A plain rollback (no release named) from v6 notes v7 when it switches current, and is
    killed; a plain rerun takes over, is killed in its health wait; the third run must still
    go to v7, from v6: the second run's own lock carried the intent on."""
    root = str(tmp_path / "dflash")
    os.mkdir(root)
    holders = []
    for _ in range(3):
        proc = sleeper()
        holders.append((proc, holder_of(proc)))

    def kill(index: int) -> None:
        holders[index][0].kill()
        holders[index][0].wait()

    (_, first), (_, second), (_, third) = holders
    acquire(root, token_of(first), first, "rollback", None, from_release="v6")
    acquire(root, token_of(first), first, "rollback", "v7")  # noted at the switch of current
    kill(0)
    got = acquire(root, token_of(second), second, "rollback", None, take_over=token_of(first),
                  from_release="v7")  # fmt: skip
    assert got["taken_over"]["release"] == "v7"
    assert (got["lock"]["release"], got["lock"]["from_release"]) == ("v7", "v6")
    kill(1)
    got = acquire(root, token_of(third), third, "rollback", None, take_over=token_of(second),
                  from_release="v7")  # fmt: skip
    assert (got["taken_over"]["release"], got["taken_over"]["from_release"]) == ("v7", "v6")
    # Another action does not inherit a rollback's intent: a deploy names its own release.
    kill(2)
    deployer = holder_of(sleeper())
    got = acquire(root, token_of(deployer), deployer, "deploy", None, take_over=token_of(third),
                  from_release="v7")  # fmt: skip
    assert (got["lock"]["release"], got["lock"]["from_release"]) == (None, "v7")
