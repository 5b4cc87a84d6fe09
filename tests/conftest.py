"""Shared fixtures: real ansible-playbook runs against the local target, and a throwaway git
checkout holding a small dflash/ package, so the lifecycle tests do not depend on the trainer."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import pkgutil
import resource
import subprocess
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    PlaybookRun,
    dflash_package_files,
    git_source,
    local_env_lock,
    run_playbook,
    seed_target,
)

# Before torch loads OpenMP (pytest_configure imports it): idle OpenMP threads sleep instead of
# spinning, as in the trainer (dflash/__init__.py). The trainer's tests run steps in the pytest
# worker itself, three workers on two cores: spinning threads took twice the CPU
# (tests/trainer/test_learning.py: 49 CPU-s against 24).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEPLOYED_SUITE = Path(__file__).resolve().parent / "deployed"
# What `make lint` runs of the suite: the modules' and connection plugins' docs, no torch.
DOCS_TESTS = tuple(
    Path(__file__).resolve().parent / "unit" / name
    for name in ("test_module_docs.py", "test_connection_docs.py")
)
SHARED = "ansible_collections.dflash.deploy.plugins.module_utils"
MODULE_UTILS = REPO / "ansible_collections" / "dflash" / "deploy" / "plugins" / "module_utils"


def _import_the_shared_code() -> None:
    """Every module of the collection dflash.deploy's module_utils, imported now. A test that
    starts Ansible's plugin loader in-process (tests/unit/test_callback.py) installs Ansible's
    collection finder; a module_utils file first imported after that goes through it, and it
    refuses a collection whose package the plain importer already loaded ("collection metadata
    was not loaded"). ansible-playbook installs its finder before any import of ours, so only
    a process that mixes both, as a pytest worker does, needs this."""
    for info in pkgutil.iter_modules([str(MODULE_UTILS)]):
        importlib.import_module(f"{SHARED}.{info.name}")


def pytest_configure(config: pytest.Config) -> None:
    # ansible-core 2.19, imported in-process by some tests, replaces sys.intern; torch._dynamo
    # (imported by the trainer) refuses to load after that. Loading it first (before any test
    # module is collected) keeps one pytest run able to hold both. The deployed-state suite run
    # on its own (`pytest tests/deployed --inventory FILE`, a user's CI) needs no torch: it is
    # spared the ~3 s import, and so is `make lint`'s run of DOCS_TESTS.
    paths = [
        (config.invocation_params.dir / str(arg).split("::")[0]).resolve() for arg in config.args
    ]
    if paths and all(
        p == DEPLOYED_SUITE or DEPLOYED_SUITE in p.parents or p in DOCS_TESTS for p in paths
    ):
        _import_the_shared_code()
        return
    with contextlib.suppress(ImportError):
        import torch._dynamo  # noqa: F401
    _import_the_shared_code()  # (after torch: dflash_proxmox imports ansible)


CPU_AT_SETUP = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """CPU-s of this pytest process and of the processes it has waited for (the playbooks and
    the modules they ran; not a launched trainer, which its supervisor waits for)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF),
                      resource.getrusage(resource.RUSAGE_CHILDREN))
    )  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[CPU_AT_SETUP] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Each test's CPU-s (set-up to teardown) in the JUnit report, as the property `cpu_s`
    (bench/suite_durations.py adds them up by file): what a test costs on a loaded machine,
    where its seconds mostly say what else ran beside it."""
    try:
        return (yield)
    finally:
        if CPU_AT_SETUP in item.stash:
            spent = _cpu_seconds() - item.stash[CPU_AT_SETUP]
            item.user_properties.append(("cpu_s", f"{spent:.2f}"))


@pytest.fixture(autouse=True)
def data_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trainer given a JSONL file prepares it into $DFLASH_DATA_CACHE: a test's own folder,
    never the user's ~/.cache."""
    folder = tmp_path / "data-cache"
    monkeypatch.setenv("DFLASH_DATA_CACHE", str(folder))
    return folder


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """tmpfs(size): a fresh tmpfs of that size (`256k`, `64m`) for the disk-full cases,
    unmounted (detached) after the test. Needs root, as in CI; without it the test skips."""
    mounted: list[Path] = []

    def make(size: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (the test needs root): {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def source_repo(tmp_path: Path) -> Callable[..., Path]:
    """A git checkout with dflash/; call it as commit(name, files) to add a tagged commit."""
    return git_source(tmp_path / "source")


@pytest.fixture
def target_root(tmp_path: Path) -> Path:
    return tmp_path / "target" / "dflash"


# The loopback test bed's tests: every test that needs the bed lives here, and nothing else
# (pytest_collection_modifyitems holds both ways). See pytest_xdist_make_scheduler.
BED_TESTS = "tests/proxmox/"
BED_FIXTURE = "proxmox_testbed"
# The one work unit that holds every bed test (one bed comes up, on one worker).
BED_SCOPE = "testbed"
# Modules of many short tests that share module-scoped fixtures (a warmed compile cache, a
# trained checkpoint, the bad-input cases' deployed target): a module goes to one worker, so
# each such fixture is made once.
WHOLE_MODULES = ("tests/unit/", "tests/trainer/", "tests/integration/test_local_bad_input.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Where a test runs follows what it needs: a test that uses the bed must be in
    tests/proxmox/ (the bed's worker), and one there must use it (or bring up beds itself)."""
    misplaced = [
        item.nodeid
        for item in items
        if (BED_FIXTURE in getattr(item, "fixturenames", ())) != item.nodeid.startswith(BED_TESTS)
        and not item.nodeid.startswith(BED_TESTS + "test_testbed.py")  # beds of its own
    ]
    if misplaced:
        raise pytest.UsageError(
            f"tests that use the loopback test bed belong in {BED_TESTS} and the others "
            f"outside it (the bed's worker runs exactly that folder): {', '.join(misplaced)}"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (`make test` runs three workers) every test on the loopback test bed
    goes to one worker, so one bed comes up; the work goes out longest first (by
    tests/durations.json), so no long test starts last. The modules of WHOLE_MODULES go whole
    (their module-scoped fixtures are made once); the other tests one at a time, to spread the
    long ones. (Scoped by path here: xdist's own `xdist_group` mark is lost under pytest 9,
    which no longer reads the node id that xdist 3.8 rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    seconds = expected_seconds()

    class ByNeed(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(BED_TESTS):
                return BED_SCOPE
            if nodeid.startswith(WHOLE_MODULES):
                return nodeid.split("::", 1)[0]
            return nodeid

        def _assign_work_unit(self, node: object) -> None:
            # The longest work first (the measured seconds of each scope's tests, summed):
            # what is left at the end is short, so no worker idles while one runs a
            # 10-minute test. The whole queue exists before the first unit is handed out;
            # only its order changes (each worker's collection, which xdist indexes, does not).
            if not getattr(self, "ordered", False):
                self.workqueue = OrderedDict(work_order(self.workqueue, seconds))
                self.ordered = True
            super()._assign_work_unit(node)

    return ByNeed(config, log)


# Tests whose `playbook` fixture waits for the local envs one worker builds (`local_envs`).
NEEDS_LOCAL_ENVS = ("tests/integration/", "tests/deployed/")


def work_order(
    units: dict[str, dict[str, bool]], seconds: dict[str, float]
) -> list[tuple[str, dict[str, bool]]]:
    """xdist's work units (scope: {test id: done}), longest first by their tests' measured
    seconds, except that the longest unit needing no local envs comes right after the first
    one needing them: the first worker to take a deploying test builds the envs (~2.5 min in
    a whole run), and the next one starts on that unit instead of waiting for them."""

    def unit_seconds(unit: tuple[str, dict[str, bool]]) -> float:
        return sum(seconds.get(nodeid, unmeasured_seconds(nodeid)) for nodeid in unit[1])

    def needs_envs(unit: tuple[str, dict[str, bool]]) -> bool:
        return any(nodeid.startswith(NEEDS_LOCAL_ENVS) for nodeid in unit[1])

    order = sorted(units.items(), key=unit_seconds, reverse=True)
    first_deploying = next((i for i, unit in enumerate(order) if needs_envs(unit)), None)
    free = next(
        (i for i, unit in enumerate(order) if not needs_envs(unit) and unit[0] != BED_SCOPE),
        None,
    )
    if first_deploying is not None and free is not None and free > first_deploying:
        order.insert(first_deploying + 1, order.pop(free))
    return order


# Seconds of each test in a measured whole run (bench/suite_durations.py --write-seconds writes
# it); a test not in it (new, or under a second) counts as a typical one of its folder. Only the
# order of the work follows these figures: no test's outcome does.
DURATIONS_FILE = Path(__file__).resolve().parent / "durations.json"


def unmeasured_seconds(nodeid: str) -> float:
    if nodeid.startswith(NEEDS_LOCAL_ENVS):
        return 60.0  # a test that deploys
    return 30.0 if nodeid.startswith(BED_TESTS) else 0.5


def expected_seconds() -> dict[str, float]:
    try:
        return json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        return {}


def _run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this run shares (each worker has its own basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """One worker at a time: the others wait here and then find the work done."""
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def local_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local lock's wheelhouse (.build/wheelhouse), filled by the real playbook."""
    with _exclusive(_run_folder(tmp_path_factory) / "wheelhouse.lock"):
        run = run_playbook("playbooks/wheelhouse.yml", {})
    assert run.rc == 0, run.output
    return REPO / ".build" / "wheelhouse"


@pytest.fixture(scope="session")
def local_lock() -> dict:
    """The CPU lock of the embedded local inventory."""
    return local_env_lock()


@pytest.fixture(scope="session")
def local_envs(tmp_path_factory: pytest.TempPathFactory, local_wheelhouse: Path) -> Path:
    """envs/ of the local lock, built once per test run by a real deploy run.

    Building the torch env takes ~40 s; tests that are not about the env start from a
    hard-linked copy of this one, which the env module then checks like any other. The xdist
    workers share it: the first builds it, the others wait for it."""
    shared = _run_folder(tmp_path_factory) / "envcache"
    root, built = shared / "dflash", shared / "built"
    with _exclusive(_run_folder(tmp_path_factory) / "envcache.lock"):
        if not built.exists():
            shared.mkdir(exist_ok=True)
            run = run_playbook("deploy.yml", {"dflash_root": str(root), "dflash_launch": False})
            assert run.rc == 0, run.output
            built.touch()
    return root / "envs"


@pytest.fixture
def playbook(tmp_path: Path, target_root: Path, local_envs: Path) -> Callable[..., PlaybookRun]:
    """Run a playbook of the repo against the local target rooted at `target_root`."""
    target_root.parent.mkdir(parents=True, exist_ok=True)
    report = tmp_path / "reports" / "verify.json"

    def run(name: str, **extravars: object) -> PlaybookRun:
        check = bool(extravars.pop("_check", False))
        tags = extravars.pop("_tags", None)
        env = extravars.pop("_env", None)  # variables of the user's shell
        # These tests deploy small fake packages: no trainer to launch unless a test asks.
        variables = {
            "dflash_root": str(target_root),
            "dflash_verify_json": str(report),
            "dflash_launch": False,
            # tokens/s on a shared CI machine is noise; the health-gate tests turn the gate on,
            # the throughput tests of verify (test_local_verify_throughput.py) its check.
            "dflash_min_throughput_ratio": 0,
            "dflash_verify_min_throughput_ratio": 0,
            # A trainer beside the suite's other workers waits for a CPU by design: the
            # contention tests (test_local_verify_contention.py) turn the check on.
            "dflash_verify_max_cpu_wait": 1,
        }
        variables.update(extravars)
        if variables["dflash_root"] == str(target_root) and not target_root.exists():
            seed_target(target_root, local_envs)
        result = run_playbook(name, variables, check=check, tags=tags, env=env)
        result.report = json.loads(report.read_text()) if report.exists() else None
        return result

    return run


@pytest.fixture
def trainer_repo(source_repo) -> Path:
    """A git checkout holding a copy of the real dflash/ package, tagged v1."""
    return source_repo("v1", dflash_package_files())
