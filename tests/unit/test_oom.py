"""OOM kills in the target's memory cgroup: read from cgroup v2's memory.events or v1's
memory.oom_control (module_utils/dflash_memory.py), and verify's `oom_kill` finding for the
kills after the recorded trainer started (module_utils/dflash_state_findings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils import dflash_memory
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state_findings import (
    oom_findings,
)


@pytest.fixture
def cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in /sys/fs/cgroup: the module reads the files its tables name."""
    v1 = tmp_path / "memory"
    counters = ((str(tmp_path / "memory.events"), "oom_kill"),
                (str(v1 / "memory.oom_control"), "oom_kill"))  # fmt: skip
    monkeypatch.setattr(dflash_memory, "OOM_COUNTERS", counters)
    limits = (str(tmp_path / "memory.max"), str(v1 / "memory.limit_in_bytes"))
    monkeypatch.setattr(dflash_memory, "LIMITS", limits)
    return tmp_path


def test_cgroup_v2_counter_and_limit(cgroup: Path) -> None:
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n")
    (cgroup / "memory.max").write_text("2147483648\n")
    assert dflash_memory.memory_facts() == {"oom_kills": 2, "limit_mb": 2048}


def test_cgroup_v1_counter_and_no_limit(cgroup: Path) -> None:
    (cgroup / "memory").mkdir()
    (cgroup / "memory" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"
    )
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert dflash_memory.memory_facts() == {"oom_kills": 7, "limit_mb": None}


def test_nothing_readable_is_none(cgroup: Path) -> None:
    assert dflash_memory.memory_facts() == {"oom_kills": None, "limit_mb": None}


def facts(then: int | None, now: int | None) -> dict:
    record = {"pid": 42, "started_at": "2026-12-04T10:00:00+00:00", "oom_kills": then}
    return {"trainers": {"record": record}, "memory": {"oom_kills": now, "limit_mb": 2048}}


def test_a_kill_after_the_trainer_started_is_a_finding_with_the_numbers() -> None:
    [found] = oom_findings(facts(1, 3))
    assert found["kind"] == "oom_kill" and found["pid"] == 42
    assert found["expected"] == (
        "no process OOM-killed since the trainer started at 2026-12-04T10:00:00+00:00"
    )
    assert found["found"] == (
        "2 process(es) OOM-killed by the kernel since then (the memory limit is 2048 MB)"
    )
    assert "pct set <vmid> -memory <MB>" in found["hint"]


@pytest.mark.parametrize(("then", "now"), [(3, 3), (None, 5), (2, None)])
def test_no_new_kill_or_no_baseline_is_no_finding(then: int | None, now: int | None) -> None:
    assert oom_findings(facts(then, now)) == []
