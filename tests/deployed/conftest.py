"""Wiring of the deployed-state suite: which targets to assert (--inventory, --hosts), their
facts read once per session, and one test item per host and concern.

Without an inventory every user-facing test skips, so the project's plain `pytest` run (which
collects tests/) stays green on machines with nothing deployed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import testinfra
import testinfra.host

from tests.deployed.state import (
    DEFAULT_PATTERN,
    Selection,
    SelectionError,
    Target,
    ansible_env,
    list_hosts,
    read_targets,
)

NO_TARGET = (
    "no deployed target given: run `pytest tests/deployed --inventory <inventory.yml>` "
    "(tests/deployed/README.md)"
)
_SELECTION = pytest.StashKey[Selection | None]()
_HOSTS = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dflash-deployed", "dflash deployed-state suite (tests/deployed)")
    group.addoption(
        "--inventory",
        dest="dflash_inventory",
        metavar="FILE",
        default=None,
        help="Ansible inventory of the targets to assert (testinfra's --ansible-inventory "
        "works too); select hosts with testinfra's --hosts (default: dflash_targets). "
        "Without an inventory the suite skips.",
    )


def _parse_selection(config: pytest.Config) -> Selection | None:
    # getoption's default also covers a run where this conftest was loaded after the command
    # line was parsed (plain `pytest` from the repo root): then no option of ours was given.
    inventory = config.getoption("dflash_inventory", None) or config.getoption(
        "ansible_inventory", None
    )
    pattern = DEFAULT_PATTERN
    # testinfra's --hosts: an Ansible pattern, or its own `ansible://PATTERN?ansible_inventory=`.
    hosts = config.getoption("hosts", None)
    if hosts:
        scheme, sep, spec = hosts.partition("://")
        if not sep:
            spec = hosts
        elif scheme != "ansible":
            raise pytest.UsageError(
                f"--hosts {hosts}: the deployed suite reads targets through Ansible; give an "
                "inventory with --inventory and an Ansible host pattern (or ansible://PATTERN)"
            )
        spec, _, query = spec.partition("?")
        inventory = inventory or parse_qs(query).get("ansible_inventory", [None])[0]
        pattern = spec or "all"
    if not inventory:
        if hosts:
            raise pytest.UsageError(f"--hosts {hosts}: give the inventory too (--inventory FILE)")
        return None
    path = Path(inventory)
    if not path.is_absolute():
        path = config.invocation_params.dir / path
    if not path.exists():
        raise pytest.UsageError(f"inventory {inventory}: no such file or folder")
    return Selection(path, pattern)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "selftest: the suite's own test (deploys to the local target; not run "
        "while auditing a target with --inventory)",
    )
    # Bad input stops the run here with one line, before anything is collected.
    chosen = _parse_selection(config)
    config.stash[_SELECTION] = chosen
    if chosen is not None:
        try:
            config.stash[_HOSTS] = list_hosts(chosen)
        except SelectionError as err:
            raise pytest.UsageError(str(err)) from err


def selection(config: pytest.Config) -> Selection | None:
    return config.stash.get(_SELECTION, None)


def selected_hosts(config: pytest.Config) -> list[str]:
    return config.stash.get(_HOSTS, [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # One item per host, so each host's verdict on each concern shows on its own line.
    if "target" in metafunc.fixturenames and selection(metafunc.config) is not None:
        metafunc.parametrize("target", selected_hosts(metafunc.config), scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A user auditing a target must not get a deploy of the suite's self-test on the side.
    if selection(config) is None:
        return
    skip = pytest.mark.skip(reason="the suite's self-test does not run while auditing a target")
    for item in items:
        if item.get_closest_marker("selftest"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def target() -> str:
    """Overridden by the per-host parametrization; reached only when no target was given."""
    pytest.skip(NO_TARGET)


@pytest.fixture(scope="session")
def deployed(request: pytest.FixtureRequest) -> dict[str, Target]:
    """Every selected host's facts, read by one ansible-playbook run for the whole session."""
    config = request.config
    chosen = selection(config)
    assert chosen is not None  # `target` skipped otherwise
    return read_targets(chosen, selected_hosts(config))


@pytest.fixture
def state(target: str, deployed: dict[str, Target]) -> Target:
    """This host's facts; a host that could not be read fails every test that needs it."""
    found = deployed[target]
    if found.error:
        # The whole text once, in test_target_is_reachable; here its start, to stay readable.
        summary = found.error if len(found.error) <= 120 else f"{found.error[:120]}..."
        pytest.fail(f"{target}: {summary} (see test_target_is_reachable[{target}])", pytrace=False)
    return found


@pytest.fixture(scope="session")
def _ansible_on_path() -> Iterator[None]:
    # testinfra runs `ansible-inventory` (and over pct `ansible`) from PATH, with the
    # process environment: point both at the venv and the repo's ansible.cfg.
    env = ansible_env()
    with pytest.MonkeyPatch.context() as patch:
        for name in ("ANSIBLE_CONFIG", "PATH"):
            patch.setenv(name, env[name])
        yield


@pytest.fixture
def host(
    target: str, request: pytest.FixtureRequest, _ansible_on_path: None
) -> testinfra.host.Host:
    """testinfra's `host` for this target, through the same inventory, for extra checks of your
    own: local and SSH hosts run commands directly, pct hosts cost one `ansible` run each."""
    chosen = selection(request.config)
    assert chosen is not None
    return testinfra.get_host(
        f"ansible://{target}",
        ansible_inventory=str(chosen.inventory),
        force_ansible=bool(request.config.getoption("force_ansible", False)),
    )


@pytest.fixture
def direct_host(host: testinfra.host.Host) -> testinfra.host.Host:
    """`host` where testinfra drives the connection itself (local, SSH, docker, lxc). Over the
    others (pct) each command is one `ansible` run (~2 s, and testinfra's file checks take
    several), so checks that only confirm the facts document skip there."""
    backend = host.backend
    if backend.force_ansible or backend.ansible_runner.get_host(backend.host) is None:
        pytest.skip(
            f"{backend.host}: testinfra would need one `ansible` run per command over this "
            "connection; the facts document covers it"
        )
    return host


def pytest_report_header(config: pytest.Config) -> str | None:
    chosen = selection(config)
    if chosen is None:
        return None
    return f"dflash deployed state: inventory {chosen.inventory}, hosts {chosen.pattern!r}"
