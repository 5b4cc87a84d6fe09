"""The order tests/conftest.py hands xdist's work units out in: longest first, and no worker's
first unit waits for the local envs another worker is building."""

from __future__ import annotations

from tests.conftest import work_order


def units(*scopes: tuple[str, list[str]]) -> dict[str, dict[str, bool]]:
    return {scope: dict.fromkeys(nodeids, False) for scope, nodeids in scopes}


def test_the_longest_unit_without_local_envs_follows_the_first_that_needs_them():
    queue = units(
        ("testbed", ["tests/proxmox/test_a.py::t1", "tests/proxmox/test_a.py::t2"]),
        ("tests/integration/test_k.py::kill", ["tests/integration/test_k.py::kill"]),
        ("tests/integration/test_j.py::job", ["tests/integration/test_j.py::job"]),
        ("tests/trainer/test_c.py", ["tests/trainer/test_c.py::a", "tests/trainer/test_c.py::b"]),
        ("tests/unit/test_u.py", ["tests/unit/test_u.py::u"]),
    )
    seconds = {
        "tests/proxmox/test_a.py::t1": 500, "tests/proxmox/test_a.py::t2": 500,
        "tests/integration/test_k.py::kill": 600, "tests/integration/test_j.py::job": 300,
        "tests/trainer/test_c.py::a": 100, "tests/trainer/test_c.py::b": 100,
    }  # fmt: skip
    order = [scope for scope, _ in work_order(queue, seconds)]
    assert order == [
        "testbed",
        "tests/integration/test_k.py::kill",
        "tests/trainer/test_c.py",
        "tests/integration/test_j.py::job",
        "tests/unit/test_u.py",
    ]
    # Every unit is handed out once, with its tests.
    assert dict(work_order(queue, seconds)) == queue


def test_without_deploying_tests_the_order_is_longest_first():
    queue = units(
        ("tests/unit/test_u.py", ["tests/unit/test_u.py::u"]),
        ("tests/trainer/test_c.py", ["tests/trainer/test_c.py::a"]),
    )
    order = work_order(queue, {"tests/trainer/test_c.py::a": 50})
    assert [scope for scope, _ in order] == ["tests/trainer/test_c.py", "tests/unit/test_u.py"]
