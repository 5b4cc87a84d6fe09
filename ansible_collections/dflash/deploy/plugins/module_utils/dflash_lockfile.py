# The deploy lock of a state root: one deploy, rollback or stop at a time (docs/deploy-lock.md).
# `.deploy.lock` is a small JSON document: who holds it (the controller's
# ansible-playbook process), what that run does (action, release, phase) and when it was last
# renewed. Modules that change the state are handed the holder's token and check it before each
# change (a fence), so a run whose lock was taken over can no longer write.
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime

LOCK = ".deploy.lock"
# How many times a run took the lock of this root. Every change of the state happens under the
# lock, so a read that found the lock free is still true while this count is unchanged: a deploy
# that read the target before taking the lock needs no second read (acquire's expect_generation).
GENERATION = ".deploy.generation"
# The run that created the state root with its lock removes it again when nothing else was put
# there (a first deploy refused by preflight leaves no trace).
ROOT_CREATED = "root_created"


class LockError(Exception):
    """The lock is held by another run, or was taken from this one."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def kernel_identity() -> dict:
    """What makes a pid comparable: the same kernel boot and the same pid namespace."""
    try:
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pid_ns = None
    return {"boot_id": _read("/proc/sys/kernel/random/boot_id"), "pid_ns": pid_ns}


def start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (a reused pid has another one)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def token_of(holder: dict) -> str:
    """A run's token: the same for every task of one ansible-playbook process, never reused."""
    key = "|".join(str(holder.get(k)) for k in ("host", "boot_id", "pid_ns", "pid", "pid_start"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def holder_alive(holder: dict) -> bool | None:
    """Whether the holding process still runs, where this machine can tell (same kernel and
    pid namespace); None elsewhere (then only the lease age tells)."""
    here = kernel_identity()
    if not holder.get("pid") or here["boot_id"] is None:
        return None
    if (holder.get("boot_id"), holder.get("pid_ns")) != (here["boot_id"], here["pid_ns"]):
        return None
    return start_ticks(int(holder["pid"])) == holder.get("pid_start")


def describe(lock: dict) -> str:
    """`deploy of v2 by alice@ctl (pid 4242) since 2026-12-01T10:00:00+00:00, phase launch`."""
    holder = lock.get("holder") or {}
    what = f"{lock.get('action') or 'a run'}"
    if lock.get("release"):
        what += f" of {lock['release']}"
    return (
        f"{what} by {holder.get('user', '?')}@{holder.get('host', '?')} "
        f"(pid {holder.get('pid', '?')}) since {lock.get('started', '?')}, "
        f"phase {lock.get('phase', '?')}"
    )


@contextlib.contextmanager
def _locked_file(root: str) -> Iterator[int]:
    """The lock file open and flock'ed for a read-modify-write. A file unlinked by a release
    while this process waited is opened again (flock belongs to the inode, not the name)."""
    path = os.path.join(root, LOCK)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _load(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {"token": None, "torn": True}
    return data if isinstance(data, dict) else {"token": None, "torn": True}


def _store(fd: int, data: dict) -> None:
    # One write of a small document: a kill cannot land inside it.
    payload = (json.dumps(data, sort_keys=True) + "\n").encode()
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, payload)
    os.fsync(fd)


def _age(lock: dict) -> float | None:
    try:
        return round(time.time() - float(lock["renewed_epoch"]), 1)
    except (KeyError, TypeError, ValueError):
        return None


def generation(root: str) -> int:
    """How many times the lock of `root` was taken (0 before the first time; -1 for a damaged
    count, which matches no read)."""
    text = _read(os.path.join(root, GENERATION))
    try:
        return int(text) if text else 0
    except ValueError:
        return -1


def _bump_generation(root: str) -> None:
    # Called with the lock file flock'ed; written aside and renamed, so no read sees half of it.
    path = os.path.join(root, GENERATION)
    with open(f"{path}.tmp", "w", encoding="ascii") as handle:
        handle.write(f"{max(generation(root), 0) + 1}\n")
    os.replace(f"{path}.tmp", path)


def read_lock(root: str) -> dict | None:
    """The lock as it is, with its age and whether its holder lives (where that is knowable)."""
    path = os.path.join(root, LOCK)
    if not os.path.exists(path):
        return None
    try:
        with _locked_file(root) as fd:
            lock = _load(fd)
    except OSError:
        return None
    if lock is None:
        return None
    lock["age_s"] = _age(lock)
    lock["holder_alive"] = holder_alive(lock.get("holder") or {})
    return lock


def acquire(
    root: str, token: str, holder: dict, action: str, release: str | None,
    take_over: str | None = None, from_release: str | None = None,
    expect_generation: int | None = None,
) -> dict:  # fmt: skip
    """Take the lock for `token`, or return who holds it. `take_over` names the token of a
    holder the caller judged dead or expired: only that one is replaced. `release` (what the
    run makes current, once known) and `from_release` (what was current when it began) are its
    intent, which a run that takes over after an interruption reads. `expect_generation` is the
    generation a read of the caller saw with the lock free: `unchanged_since_read` says whether
    no other run took the lock since then (so that read still holds)."""
    created = False
    if not os.path.isdir(root):
        os.mkdir(root, 0o755)
        created = True
    with _locked_file(root) as fd:
        held = _load(fd)
        # A torn document (a write cut short) names no holder: it is replaced, and said so.
        if held and held.get("token") not in (token, None) and held.get("token") != take_over:
            held["age_s"] = _age(held)
            return {"acquired": False, "held_by": held}
        mine = held if held and held.get("token") == token else None
        # The caller's read saw the lock free at this generation: nobody took it since.
        taken = generation(root)
        unchanged = not held and taken >= 0 and expect_generation == taken
        if not mine:
            _bump_generation(root)
        # A run that takes over an interrupted one of its kind carries its intent on: killed
        # again, the next run still finishes what the first began (where it was going, and
        # from where), not what the second knew when it was killed.
        taking_over = bool(take_over and held and held.get("token") == take_over)
        intent = held if taking_over and held.get("action") == action else {}
        lock = mine or {
            "token": token,
            "holder": holder,
            "action": action,
            "release": release or intent.get("release"),
            "from_release": intent.get("from_release") or from_release,
            "started": utc_now(),
            "phase": "locked",
            ROOT_CREATED: created,
        }
        now = time.time()
        lock.update(renewed=utc_now(), renewed_epoch=now, polled_epoch=now)
        if release:
            lock["release"] = release
        _store(fd, lock)
    previous = held if held and held.get("token") != token else None
    return {"acquired": True, "lock": lock, "taken_over": previous,
            "unchanged_since_read": unchanged}  # fmt: skip


def release(root: str, token: str) -> bool:
    """Give the lock up (only its holder can); True when this call released it."""
    if not os.path.exists(os.path.join(root, LOCK)):
        return False
    with _locked_file(root) as fd:
        held = _load(fd)
        if not held or held.get("token") != token:
            return False
        os.unlink(os.path.join(root, LOCK))
    # Only when the run left nothing else there (its count of takes goes with the root).
    if held.get(ROOT_CREATED) and set(os.listdir(root)) <= {GENERATION}:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(root, GENERATION))
            os.rmdir(root)
    return True


def fence(root: str, token: str, polled: bool = True, **fields: object) -> dict:
    """Prove `token` still holds the lock and note where the run is (phase); renews it.
    `polled`: the call comes from a module run the controller started, so its play was alive
    now (`polled_epoch`); a watchdog's renewal from the target says nothing of the play."""
    if not os.path.exists(os.path.join(root, LOCK)):
        raise LockError(
            f"this run's deploy lock {os.path.join(root, LOCK)} is gone; it was broken by hand "
            "or by another run. Nothing more is changed; run again"
        )
    with _locked_file(root) as fd:
        held = _load(fd) or {}
        if held.get("token") != token:
            raise LockError(
                f"this run no longer holds the deploy lock of {root}: "
                f"{describe(held) if held.get('holder') else 'nobody'} holds it now. Nothing "
                "more is changed by this run"
            )
        now = time.time()
        held.update(fields, renewed=utc_now(), renewed_epoch=now)
        if polled:
            held["polled_epoch"] = now
        if "phase" in fields:
            held["phase_since"] = utc_now()
        _store(fd, held)
    return held


@contextlib.contextmanager
def held(root: str, token: str | None, action: str, phase: str, **fields: object) -> Iterator[str]:
    """The lock for one module's change: the run's own (fenced, phase and `fields` noted), or,
    for a module used on its own without a token, one taken and given back around the change."""
    if token:
        fence(root, token, phase=phase, **fields)
        yield token
        return
    holder = {"host": os.uname().nodename, "pid": os.getpid(), **kernel_identity()}
    holder["pid_start"] = start_ticks(os.getpid())
    own = token_of(holder)
    got = acquire(root, own, holder, action, None)
    if not got["acquired"]:
        raise LockError(
            f"another run holds the deploy lock of {root}: {describe(got['held_by'])}; wait "
            "for it to end, then run again"
        )
    try:
        yield own
    finally:
        release(root, own)
