"""verify.yml's throughput and gpu findings over pct on the test bed: a real trainer in a
container, slowed for real inside it, is named by `throughput` with both figures; the
container has no nvidia-smi, and the report says the gpu check does not apply there.

The margin, as in tests/integration/test_local_verify_throughput.py: the trainer is kept
stopped 97% of the time (33x slower, whatever the load) until its own figure is a quarter of
the threshold (0.8 x its health check); verify reads it seconds later, under the throttle."""

from __future__ import annotations

import json
import shlex
import time

from prometheus_client.parser import text_string_to_metric_families

from tests.throttle import SCRIPT

ARGS = {"target_model": "tiny", "gen_samples": 64, "token_budget": 64, "throughput_window": 5}


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
        dflash_launch=True, dflash_trainer_args=ARGS, dflash_health_timeout=240,
    )  # fmt: skip
    throttle = None
    try:
        assert run.rc == 0, run.output
        health_check = json.loads(sh(f"tail -n 1 {root}/history.jsonl"))["tokens_per_s"]
        pgid = json.loads(sh(f"cat {root}/trainer.json"))["pid"]
        wait(lambda s: (s.get("throughput_window") or {}).get("steps") == 5, "full window")
        throttle = int(sh(f"setsid python3 -c {shlex.quote(SCRIPT)} {pgid} 0.97 "
                          ">/dev/null 2>&1 </dev/null & echo $!"))  # fmt: skip
        limit = 0.8 * health_check / 4
        wait(lambda s: s["tokens_per_s"] <= limit, f"tokens/s <= {limit:.1f}")
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
    assert f">= 0.8 x {health_check:.0f} tokens/s (health check of #1 v1" in item["expected"]
    assert "(fastest of this layout and shape: this deployment)" in item["expected"]
    assert item["tokens_per_s"] < 0.8 * health_check / 2
    assert "diff.yml -e dflash_diff_from=fastest" in item["hint"]
    assert result["checks"]["gpu"] == "not applicable: no nvidia-smi on the target (a CPU target)"
    assert "check gpu: not applicable: no nvidia-smi" in audit.output
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families((tmp_path / "verify.prom").read_text())
        for s in family.samples
    }
    assert metrics[("dflash_verify_check_applicable", (("check", "gpu"), ("host", host)))] == 0
    assert metrics[("dflash_verify_findings", (("host", host), ("kind", "throughput")))] == 1
