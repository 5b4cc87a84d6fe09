"""The health gate, history.yml, diff.yml and verify's throughput check over pct on the test
bed: a release that trains too slowly in one container is rolled back there automatically
while the other container takes it; history and diff say so per host. A trainer slowed for
real inside a container is named by verify's `throughput`; the container has no nvidia-smi,
and the report says the gpu check does not apply there.

The throttled trainer's margin, as in tests/integration/test_local_verify_throughput.py: it
is kept stopped 97% of the time (33x slower, whatever the load) until its own figure is a
quarter of the threshold (0.8 x its health check); verify reads it seconds later, under the
throttle."""

from __future__ import annotations

import json
import shlex
import time

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import with_tokens_per_s
from tests.integration.conftest import IDLE_STEP_S, TRAINER_ARGS, add_release
from tests.throttle import SCRIPT

# The trainers idle between steps (IDLE_STEP_S) as the local tests' do: two containers
# training flat out would take both cores from the other pytest worker.
ARGS = TRAINER_ARGS
# A short window (--throughput-window): a throttled trainer fills it in 5 slow steps. It trains
# flat out: its speed is what is judged.
THROTTLED_ARGS = {"target_model": "tiny", "gen_samples": 64, "token_budget": 64,
                  "throughput_window": 5}  # fmt: skip
# The slow release sleeps 2 s more after each step of at most 128 tokens: at most 51 tokens/s.
# Its container's reference is set to 10x that, so the gate (0.5) fires however fast or loaded
# the machine is, as in tests/integration/test_local_health_gate.py.
SLOW_SLEEP_S = IDLE_STEP_S + 2.0
REFERENCE = 10 * TRAINER_ARGS["token_budget"] / SLOW_SLEEP_S


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
        history = f"{pct_playbook.root}/history.jsonl"
        text = with_tokens_per_s(bed.attach(slow_ct, "cat", history).stdout, "v1", REFERENCE)
        bed.attach(slow_ct, "sh", "-c", f"printf %s {shlex.quote(text)} > {history}")

        add_release(trainer_repo, "v2", "dflash/__init__.py", "\n# v2\n")
        # One container gets a trainer flag that sleeps 2 s more after every step (host vars:
        # an extra var would win over them).
        per_host = {
            slow_ct: {"dflash_trainer_args": dict(ARGS, sleep_per_step=SLOW_SLEEP_S)},
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
        assert changes[("run_sh", "trainer_args.sleep_per_step")] == (IDLE_STEP_S, SLOW_SLEEP_S)
        # The figures the two history lines recorded, as measured: on a loaded machine a CPU
        # step can take seconds, so only the direction of the 2 s sleep is certain, not 0.5.
        speed, (_, rolled_back, back) = found["throughput"], hosts[slow_host]
        assert (speed["from"], speed["to"]) == (back["tokens_per_s"], rolled_back["tokens_per_s"])
        assert speed["ratio"] == round(speed["to"] / speed["from"], 3) < 1, speed

        audit = pct_playbook("verify.yml")
        assert audit.rc == 0, audit.output
    finally:
        assert pct_playbook("playbooks/stop.yml").rc == 0


def test_a_throttled_trainer_in_a_container_is_named_and_gpu_does_not_apply(
    bed, pct_playbook, trainer_repo, tmp_path
):
    vmid = bed.vmids[0]
    host, root = bed.hostname(vmid), pct_playbook.root

    def sh(script: str) -> str:
        return bed.attach(vmid, "sh", "-c", script).stdout.strip()

    def status() -> dict:
        return json.loads(sh(f"cat {root}/runs/latest/status.json"))

    def wait(accept, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not accept(status()):
            assert time.monotonic() < deadline, f"{host}: no {what} in {timeout} s: {status()}"
            time.sleep(1)

    run = pct_playbook(
        "deploy.yml", dflash_hosts=host, dflash_source_dir=str(trainer_repo), dflash_ref="v1",
        dflash_launch=True, dflash_trainer_args=THROTTLED_ARGS, dflash_health_timeout=240,
    )  # fmt: skip
    throttle = None
    try:
        assert run.rc == 0, run.output
        # What windows are compared with: the health check with its wait for a CPU left out.
        health_check = json.loads(sh(f"tail -n 1 {root}/history.jsonl"))["unstarved_tokens_per_s"]
        pgid = json.loads(sh(f"cat {root}/trainer.json"))["pid"]
        wait(lambda s: (s.get("throughput_window") or {}).get("steps") == 5, "full window")
        throttle = int(sh(f"setsid python3 -c {shlex.quote(SCRIPT)} {pgid} 0.97 "
                          ">/dev/null 2>&1 </dev/null & echo $!"))  # fmt: skip
        # What verify judges: the fastest of the last 3 windows (unstarved), each under a
        # quarter of the lowest band (0.5, however noisy the health check's steps were).
        limit = 0.5 * health_check / 4
        wait(lambda s: len(last := (s.get("throughput_windows_unstarved") or [])[-3:]) == 3
             and max(last) <= limit, f"3 windows <= {limit:.1f} tokens/s", timeout=360)  # fmt: skip
        audit = pct_playbook(
            "verify.yml", dflash_hosts=host, dflash_verify_min_throughput_ratio=0.8
        )
    finally:
        if throttle is not None:
            bed.attach(vmid, "kill", "-TERM", str(throttle), check=False)
        assert pct_playbook("playbooks/stop.yml", dflash_hosts=host).rc == 0
    assert audit.rc != 0
    result = audit.report["hosts"][host]
    [item] = result["findings"]
    assert item["kind"] == "throughput" and item["pid"] == pgid
    band = result["throughput"]["bands"]["health_check"]
    assert 0.5 <= band <= 0.8
    assert f">= {band:g} x {health_check:.0f} tokens/s (health check of #1 v1" in item["expected"]
    assert "(fastest of this layout, shape and data: this deployment)" in item["expected"]
    assert item["tokens_per_s"] <= limit
    assert "diff.yml -e dflash_diff_from=fastest" in item["hint"]
    assert result["checks"]["gpu"] == "not applicable: no nvidia-smi on the target (a CPU target)"
    assert "check gpu: not applicable: no nvidia-smi" in audit.text
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families((tmp_path / "verify.prom").read_text())
        for s in family.samples
    }
    assert metrics[("dflash_verify_check_applicable", (("check", "gpu"), ("host", host)))] == 0
    assert metrics[("dflash_verify_findings", (("host", host), ("kind", "throughput")))] == 1
