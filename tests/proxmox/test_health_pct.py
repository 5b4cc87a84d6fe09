"""The health gate, history.yml and diff.yml over pct on the test bed: a release that trains
too slowly in one container is rolled back there automatically while the other container takes
it; history and diff say so per host."""

from __future__ import annotations

import json

from tests.integration.conftest import add_release

ARGS = {"target_model": "tiny", "gen_samples": 64}


def test_slow_release_rolled_back_in_one_container_history_and_diff_say_so(
    bed, pct_playbook, trainer_repo, tmp_path
):
    slow_ct, fine_ct = bed.vmids
    slow_host, fine_host = bed.hostname(slow_ct), bed.hostname(fine_ct)
    common = {"dflash_source_dir": str(trainer_repo), "dflash_launch": True,
              "dflash_trainer_args": ARGS, "dflash_health_timeout": 240}  # fmt: skip
    try:
        first = pct_playbook("deploy.yml", dflash_ref="v1", **common)
        assert first.rc == 0, first.output

        add_release(trainer_repo, "v2", "dflash/__init__.py", "\n# v2\n")
        # One container gets a trainer flag that sleeps 2 s after every step (host vars: an
        # extra var would win over them).
        per_host = {
            slow_ct: {"dflash_trainer_args": dict(ARGS, sleep_per_step=2.0)},
            fine_ct: {"dflash_trainer_args": ARGS},
        }
        second = pct_playbook(
            "deploy.yml", host_vars=per_host, dflash_ref="v2", dflash_min_throughput_ratio=0.5,
            **{k: v for k, v in common.items() if k != "dflash_trainer_args"},
        )  # fmt: skip
        assert second.rc != 0
        assert second.recap[slow_host]["failed"] == 1 and second.recap[fine_host]["failed"] == 0
        flat = " ".join(second.output.split())
        assert f"Release v2 failed its health check on {slow_host}: throughput gate" in flat
        assert "Release v1 is current again and its trainer runs" in flat

        listed = pct_playbook("history.yml", dflash_history_json=str(tmp_path / "history.json"))
        assert listed.rc == 0, listed.output
        hosts = json.loads((tmp_path / "history.json").read_text())["hosts"]
        assert [(r["action"], r["release"], r["result"]) for r in hosts[slow_host]] == [
            ("deploy", "v1", "healthy"),
            ("deploy", "v2", "rolled_back"),
            ("rollback", "v1", "healthy"),
        ]
        assert [(r["release"], r["result"]) for r in hosts[fine_host]] == [
            ("v1", "healthy"), ("v2", "healthy")
        ]  # fmt: skip

        diff = pct_playbook(
            "diff.yml", dflash_diff_json=str(tmp_path / "diff.json"),
            dflash_diff_from="current", dflash_diff_to="v2",
        )  # fmt: skip
        assert diff.rc == 0, diff.output
        found = json.loads((tmp_path / "diff.json").read_text())["hosts"][slow_host]
        assert found["files"]["changed"] == ["dflash/__init__.py"]
        assert "+# v2" in found["files"]["text"]["dflash/__init__.py"]
        changes = {(c["section"], c["name"]): (c["from"], c["to"]) for c in found["changes"]}
        assert changes[("run_sh", "trainer_args.sleep_per_step")] == (None, 2.0)
        assert found["throughput"]["ratio"] < 0.5

        audit = pct_playbook("verify.yml")
        assert audit.rc == 0, audit.output
    finally:
        assert pct_playbook("playbooks/stop.yml").rc == 0
