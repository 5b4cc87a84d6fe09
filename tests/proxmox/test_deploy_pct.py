"""deploy.yml, verify.yml and rollback.yml unchanged against the test bed: two real LXC
containers (one unprivileged, Proxmox's default, one privileged) reached through dflash_pct
(community.proxmox.proxmox_pct_remote with pipelining), checked through the node's HTTPS API with a
privilege-separated token; only the inventory differs."""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ElementTree

from tests.deployed.suite_run import TRAINER_TESTS, run_suite
from tests.helpers import PlaybookRun, run_playbook
from tests.integration.conftest import TRAINER_ARGS, add_release
from tests.testbed.bed import API_USER, Testbed
from tests.testbed.node.storage import volume_folder

from .conftest import newer_debian

V1 = {"dflash/__init__.py": "VERSION = 1\n", "dflash/train.py": "print('one')\n"}
V2 = {"dflash/__init__.py": "VERSION = 2\n", "dflash/train.py": "print('two')\n"}


def current_in(bed: Testbed, vmid: int, root: str) -> str:
    return bed.attach(vmid, "readlink", f"{root}/current").stdout.strip()


def pct_exec_per_host(bed: Testbed, mark: int) -> dict[int, int]:
    counts = bed.pct_exec_counts(mark)
    return {vmid: counts[vmid] for vmid in bed.vmids}


def test_lifecycle_across_two_containers(bed, pct_playbook, source_repo, bed_lock):
    source_repo("v1", V1)
    repo = str(source_repo("v2", V2))
    root = pct_playbook.root
    hosts = [bed.hostname(v) for v in bed.vmids]

    # v1 from a lock whose index URL holds credentials (its env is there already: the lock id
    # leaves the source out, so nothing is fetched); history gets them redacted.
    index = {"index_url": "https://ci:s3cr3t-t0ken@pypi.invalid/simple"}
    mark = bed.trace_mark()
    first = pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v1",
                         dflash_env_lock=dict(bed_lock, source=index))  # fmt: skip
    assert first.rc == 0, first.output
    assert all(current_in(bed, v, root) == "releases/v1" for v in bed.vmids)
    # Round trips (issue 19): read, lock (the read still holds: not read again), push + unpack
    # (2), cache, switch, run.sh, record with the lock's release (issue 32); a copy and a
    # template alone took seven each.
    assert pct_exec_per_host(bed, mark) == dict.fromkeys(bed.vmids, 8), bed.trace(mark, "pct")
    recorded = json.loads(bed.attach(bed.vmids[0], "tail", "-n1", f"{root}/history.jsonl").stdout)
    assert recorded["lock"]["source"] == {"index_url": "https://REDACTED@pypi.invalid/simple"}
    # In the unprivileged container the state belongs to its root (uid 100000 on the node);
    # the env came from the read-only wheelhouse, which it sees as nobody's.
    [unpriv] = [v for v in bed.vmids if bed.unprivileged(v)]
    owners = bed.attach(unpriv, "stat", "-c", "%u", f"{root}/current/MANIFEST.json",
                        f"{root}/history.jsonl", "/mnt/wheelhouse").stdout.split()  # fmt: skip
    assert owners == ["0", "0", "65534"]
    on_node = bed.root / "lxc" / str(unpriv) / "delta" / root.lstrip("/") / "history.jsonl"
    assert on_node.stat().st_uid == 100000

    mark = bed.trace_mark()
    again = pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v1")
    assert again.rc == 0, again.output
    assert [again.changed(h) for h in hosts] == [0, 0], again.output
    # A no-op: one read, before the lock, which it then never takes (issue 32).
    assert pct_exec_per_host(bed, mark) == dict.fromkeys(bed.vmids, 1), bed.trace(mark, "pct")

    assert pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v2").rc == 0
    clean = pct_playbook("verify.yml")
    assert clean.rc == 0, clean.output
    assert {h: r["verdict"] for h, r in clean.report["hosts"].items()} == dict.fromkeys(hosts, "ok")

    edited, untouched = bed.vmids[1], bed.vmids[0]
    bed.attach(edited, "sh", "-c", f"echo '# hot fix' >> {root}/current/dflash/train.py")
    drift = pct_playbook("verify.yml")
    assert drift.rc != 0
    verdicts = drift.report["hosts"]
    assert verdicts[bed.hostname(untouched)]["verdict"] == "ok"
    assert verdicts[bed.hostname(edited)]["verdict"] == "drift"
    assert [f["path"] for f in verdicts[bed.hostname(edited)]["findings"]] == ["dflash/train.py"]

    mark = bed.trace_mark()
    back = pct_playbook("rollback.yml", dflash_source_dir=repo)
    assert back.rc == 0, back.output
    # v1's env was read with the state (not asked for again): lock, read, run.sh, switch,
    # record with the lock's release.
    assert pct_exec_per_host(bed, mark) == dict.fromkeys(bed.vmids, 5), bed.trace(mark, "pct")
    assert all(current_in(bed, v, root) == "releases/v1" for v in bed.vmids)
    audit = pct_playbook("verify.yml")
    assert audit.rc == 0
    # the credentials reached neither history (deploys and the rollback) nor the report
    for vmid in bed.vmids:
        assert "s3cr3t" not in bed.attach(vmid, "cat", f"{root}/history.jsonl").stdout
    assert "s3cr3t" not in json.dumps(audit.report)


def test_unreachable_node_is_reported_and_the_others_deployed(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    down, up = bed.vmids[0], bed.vmids[1]
    closed_port = {"ansible_port": 1, "proxmox_api_port": 1}
    run = pct_playbook(
        "deploy.yml", host_vars={down: closed_port}, dflash_source_dir=repo, dflash_ref="v1"
    )
    assert run.rc != 0
    assert run.recap[bed.hostname(up)]["failed"] == 0
    assert run.recap[bed.hostname(down)]["failed"] + run.recap[bed.hostname(down)]["unreachable"]
    assert current_in(bed, up, pct_playbook.root) == "releases/v1"

    audit = pct_playbook("verify.yml", host_vars={down: closed_port})
    assert audit.rc != 0
    assert audit.report["hosts"][bed.hostname(down)]["verdict"] == "unreachable"
    assert audit.report["hosts"][bed.hostname(up)]["verdict"] == "ok"


def test_stopped_container_fails_unless_start_is_asked(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    stopped = bed.vmids[0]
    # A Debian newer than pve-container knows: its start task ends `WARNINGS: 1`, a success.
    with newer_debian(bed, stopped):
        bed.stop_container(stopped)
        refused = pct_playbook("deploy.yml", dflash_source_dir=repo, dflash_ref="v1")
        assert refused.rc != 0
        assert str(stopped) in refused.output and "start_if_stopped" in refused.output
        assert bed.status(stopped) == "stopped"

        started = pct_playbook(
            "deploy.yml", dflash_source_dir=repo, dflash_ref="v1",
            dflash_proxmox_start_if_stopped=True,
        )  # fmt: skip
    assert started.rc == 0, started.output
    assert bed.status(stopped) == "running"
    assert [status for _, status in bed.task_results("vzstart", stopped)] == ["WARNINGS: 1"]
    assert current_in(bed, stopped, pct_playbook.root) == "releases/v1"


def test_missing_gpu_and_unknown_vmid_are_refused_before_any_change(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    no_gpu = pct_playbook(
        "deploy.yml", dflash_source_dir=repo, dflash_ref="v1", dflash_proxmox_gpus=[0]
    )
    assert no_gpu.rc != 0
    assert "/dev/nvidia0" in no_gpu.output
    for vmid in bed.vmids:
        probe = bed.attach(vmid, "test", "-e", f"{pct_playbook.root}/current", check=False)
        assert probe.returncode != 0, "a host without the GPU was deployed to"

    wrong, right = bed.vmids
    unknown = pct_playbook(
        "deploy.yml", host_vars={wrong: {"proxmox_vmid": 999}},
        dflash_source_dir=repo, dflash_ref="v1",
    )  # fmt: skip
    assert unknown.rc != 0
    assert "999" in unknown.output
    assert unknown.recap[bed.hostname(wrong)]["failed"] == 1
    # The other container is not held back by its neighbour's bad inventory entry.
    assert unknown.recap[bed.hostname(right)]["failed"] == 0
    assert current_in(bed, right, pct_playbook.root) == "releases/v1"
    probe = bed.attach(wrong, "test", "-e", f"{pct_playbook.root}/current", check=False)
    assert probe.returncode != 0


def flat(run: PlaybookRun) -> str:
    """The run's output on one line (Ansible wraps long messages)."""
    return " ".join(run.output.split())


def wheelhouse_on_a_volume(bed: Testbed, vmid: int) -> None:
    """The wheelhouse as a storage-backed volume (LVM-thin) filled with the node's wheels,
    instead of the bind mount: a container Proxmox can snapshot (a new mount point takes a
    restart)."""
    volume = f"local-lvm:vm-{vmid}-disk-1"
    bed.stop_container(vmid)
    bed.edit_config(vmid, values={"mp0": f"{volume},mp=/mnt/wheelhouse,size=4G"})
    bed.start_container(vmid)
    folder = volume_folder(bed.root, volume)
    for wheel in bed.wheelhouse.iterdir():
        if not (folder / wheel.name).exists():
            os.link(wheel, folder / wheel.name)


def test_snapshot_only_when_the_deploy_changes_something(bed, pct_playbook, source_repo):
    repo = str(source_repo("v1", V1))
    vmid = bed.vmids[0]
    wheelhouse_on_a_volume(bed, vmid)
    host = bed.hostname(vmid)
    common = {"dflash_hosts": host, "dflash_source_dir": repo,
              "dflash_proxmox_snapshot": {"retain": 1}}  # fmt: skip
    first = pct_playbook("deploy.yml", dflash_ref="v1", **common)
    assert first.rc == 0, first.output
    [before_v1] = bed.snapshots(vmid)
    why = bed.read_config(vmid).snapshots[before_v1].description
    assert why.startswith("taken by dflash-deploy before a deploy: first deployment to ")
    assert "current: none -> v1" in why
    # Nothing to change: no snapshot, so retention (1) keeps the one from before v1.
    again = pct_playbook("deploy.yml", dflash_ref="v1", **common)
    assert again.rc == 0 and again.changed(host) == 0, again.output
    assert f"No snapshot of container {vmid}: this run changes nothing there." in flat(again)
    assert bed.snapshots(vmid) == [before_v1]
    assert [status for _, status in bed.task_results("vzsnapshot", vmid)] == ["OK"]


def test_each_refusal_comes_before_any_change(bed, bed_lock, source_repo, tmp_path):
    """A snapshot asked for a container with a bind mount point, a token without VM.Audit on
    the container, a snapshot name of 41 characters, a devN whose device the node lacks: each
    fails in the check before preflight, naming the container, the value and the fix. (No env
    is seeded: nothing may get as far as using one, and the state root must not even appear.)"""
    repo = str(source_repo("v1", V1))
    first, second = bed.vmids
    root = "/opt/dflash-refused"
    secret = bed.add_token("one", {f"/vms/{first}": "PVEVMAdmin"})
    common = {"dflash_source_dir": repo, "dflash_ref": "v1", "dflash_launch": False}

    def deploy(host_vars: dict, **extravars: object) -> PlaybookRun:
        group_vars = {"dflash_env_lock": bed_lock, "dflash_root": root}
        inventory = bed.inventory(tmp_path / "inv.yml", host_vars=host_vars, group_vars=group_vars)
        return run_playbook("deploy.yml", {**common, **extravars}, inventory=inventory)

    mark = bed.trace_mark()
    limited = {"proxmox_api_token_id": "one", "proxmox_api_token_secret": secret}
    run = deploy({first: {"dflash_proxmox_snapshot": {"retain": 2}}, second: limited})
    assert run.rc != 0 and all(run.recap[bed.hostname(v)]["failed"] == 1 for v in bed.vmids)
    text = flat(run)
    assert f"container {first} cannot be snapshotted: mount point mp0 ({bed.wheelhouse}," in text
    assert "put /mnt/wheelhouse on a storage-backed volume instead" in text
    assert "or take no snapshot: dflash_proxmox_snapshot: {}" in text
    assert f"container {second} is not among the containers that token {API_USER}!one sees" in (
        text
    )
    assert f"the token lacks VM.Audit on /vms/{second}" in text
    bed.stop_container(second)
    bed.edit_config(second, values={"dev0": "/dev/nvidia9"})
    run = deploy({first: {"dflash_proxmox_snapshot": {"name_prefix": "p" * 26}}},
                 dflash_proxmox_start_if_stopped=True)  # fmt: skip
    assert run.rc != 0 and all(run.recap[bed.hostname(v)]["failed"] == 1 for v in bed.vmids)
    text = flat(run)
    assert f"the snapshot names of container {first} would be 41 characters" in text
    assert "shorten dflash_proxmox_snapshot.name_prefix to at most 25 characters" in text
    assert f"starting container {second} on node {bed.node} failed: Device /dev/nvidia9 does " in (
        text
    )
    assert f"node {bed.node} has no /dev/nvidia9" in text
    # Nothing changed: no state root, the stopped container still stopped, and the only change
    # asked of the API was the start that Proxmox refused.
    assert bed.attach(first, "test", "-e", root, check=False).returncode != 0
    assert bed.status(second) == "stopped"
    asked = [e["path"] for e in bed.api_calls(mark) if e["subcommand"] != "get"]
    assert asked == [f"/nodes/{bed.node}/lxc/{second}/status/start"]


def findings_of(run: PlaybookRun) -> dict[str, dict[str, list[dict]]]:
    """host -> kind -> verify's findings of that kind."""
    found: dict[str, dict[str, list[dict]]] = {}
    for host, result in run.report["hosts"].items():
        found[host] = {}
        for item in result["findings"]:
            found[host].setdefault(item["kind"], []).append(item)
    return found


def sh(bed: Testbed, vmid: int, script: str) -> str:
    """A shell script in a container (lxc-attach); its stdout."""
    return bed.attach(vmid, "sh", "-c", script).stdout.strip()


def test_real_trainer_healthy_then_each_drift_named(bed, pct_playbook, trainer_repo, tmp_path):
    """The real trainer, launched over pct in both containers and proven healthy; verify.yml and
    the deployed-state suite pass on it. Then every drift of a running trainer's state is made
    for real in the containers, in two rounds (restoring in between), and verify.yml names each
    with what it expected and what it found; the suite fails on the first round's drifts."""
    args = TRAINER_ARGS
    root = pct_playbook.root
    a, b = bed.vmids
    host_a, host_b = bed.hostname(a), bed.hostname(b)
    run = pct_playbook(
        "deploy.yml", dflash_source_dir=str(trainer_repo), dflash_ref="v1", dflash_launch=True,
        dflash_trainer_args=args, dflash_health_timeout=240,
    )  # fmt: skip
    try:
        assert run.rc == 0, run.output
        for vmid in bed.vmids:
            status = json.loads(bed.attach(vmid, "cat", f"{root}/runs/latest/status.json").stdout)
            manifest = json.loads(bed.attach(vmid, "cat", f"{root}/current/MANIFEST.json").stdout)
            assert status["state"] == "running" and status["step"] >= 1
            assert status["code_tree_sha256"] == manifest["tree_sha256"]
        again = pct_playbook(
            "deploy.yml", dflash_source_dir=str(trainer_repo), dflash_ref="v1",
            dflash_launch=True, dflash_trainer_args=args,
        )  # fmt: skip
        assert [again.changed(h) for h in (host_a, host_b)] == [0, 0], again.output
        audit = pct_playbook("verify.yml")
        assert audit.rc == 0, audit.output
        assert {h: r["verdict"] for h, r in audit.report["hosts"].items()} == {
            host_a: "ok", host_b: "ok"
        }  # fmt: skip
        # The deployed-state suite, as a user runs it against these containers.
        clean = run_suite(pct_playbook.inventory(), tmp_path / "suite-clean.xml")
        assert clean.rc == 0 and not clean.failed, clean.output
        assert clean.passed >= {*TRAINER_TESTS, "test_verify_finds_no_drift"}, clean.output

        # Round 1. B: its trainer frozen (SIGSTOP), so status.json stops moving (heartbeat_stale
        # with B's limit at 3 s), and a cache built by another torch for another tree put in
        # place of its cache (cache). A: another version of a locked package in the env, as
        # `pip install` leaves it (a new dist-info; hard links to the seed env stay untouched).
        frozen = json.loads(sh(bed, b, f"cat {root}/trainer.json"))["pid"]
        sh(bed, b, f"kill -s STOP -- -{frozen}")
        frozen_at = time.monotonic()
        try:
            cache = json.loads(sh(bed, b, f"tail -n 1 {root}/history.jsonl"))["run_sh"][
                "cache_dir"]  # fmt: skip
            foreign = {"torch": "2.11.0+cu130", "triton": "3.3.1", "cuda": "13.0",
                       "gpu": "NVIDIA H200", "tree_sha256": "f" * 64}  # fmt: skip
            sh(bed, b, f"mv {cache} {cache}.aside && mkdir {cache} && "
                       f"echo '{json.dumps(foreign)}' > {cache}/built-by.json")  # fmt: skip
            site = sh(bed, a, f"ls -d {root}/envs/lock-*/lib/python3*/site-packages")
            sh(bed, a, f"cd {site} && mv shellingham-1.5.4.dist-info shellingham-1.5.5.dist-info"
                       " && sed -i 's/^Version: 1.5.4$/Version: 1.5.5/' "
                       "shellingham-1.5.5.dist-info/METADATA")  # fmt: skip
            # The heartbeat (every 2 s) is older than 3 s from here on.
            time.sleep(max(0.0, 4 - (time.monotonic() - frozen_at)))
            limit = {b: {"dflash_heartbeat_max_age": 3}}
            drift = pct_playbook("verify.yml", host_vars=limit)
            suite = run_suite(pct_playbook.inventory(limit), tmp_path / "suite-drift.xml")
        finally:
            sh(bed, b, f"kill -s CONT -- -{frozen}")
        assert drift.rc != 0
        found = findings_of(drift)
        assert {h: sorted(k) for h, k in found.items()} == {
            host_a: ["environment"], host_b: ["cache", "heartbeat_stale"]
        }, drift.output  # fmt: skip
        [item] = found[host_a]["environment"]
        assert item["package"] == "shellingham"
        assert (item["expected"], item["found"]) == ("shellingham==1.5.4", "shellingham==1.5.5")
        [item] = found[host_b]["cache"]
        assert "2.13.0+cpu" in item["expected"] and "2.11.0+cu130" in item["found"]
        assert item["path"] == cache
        [item] = found[host_b]["heartbeat_stale"]
        assert item["pid"] == frozen and "within 3 s" in item["expected"]
        assert "last update" in item["found"]
        # The JUnit report next to the JSON one: one failing test case per drifted host.
        junit = ElementTree.parse(tmp_path / "verify.junit.xml").getroot()
        assert {
            case.get("name"): case.find("failure").get("message") for case in junit.iter("testcase")
        } == {host_a: "1 finding(s): environment", host_b: "2 finding(s): heartbeat_stale, cache"}
        # The deployed-state suite fails on the same drifts, naming host and package / cache.
        assert suite.rc != 0
        assert set(suite.failed) == {
            "test_environment_matches_lock",
            "test_compile_cache_is_this_builds",
            "test_trainer_heartbeat_is_fresh",
            "test_verify_finds_no_drift",
        }, suite.output
        assert f"{host_a}: environment shellingham" in suite.failed["test_environment_matches_lock"]
        assert "shellingham==1.5.5" in suite.failed["test_environment_matches_lock"]
        assert f"{host_b}: cache {cache}" in suite.failed["test_compile_cache_is_this_builds"]
        assert f"{host_b}: heartbeat of trainer pid {frozen}" in suite.failed[
            "test_trainer_heartbeat_is_fresh"]  # fmt: skip
        sh(bed, a, f"cd {site} && mv shellingham-1.5.5.dist-info shellingham-1.5.4.dist-info"
                   " && sed -i 's/^Version: 1.5.5$/Version: 1.5.4/' "
                   "shellingham-1.5.4.dist-info/METADATA")  # fmt: skip
        sh(bed, b, f"rm -rf {cache} && mv {cache}.aside {cache}")

        # Round 2. A: v2 made current without a launch while the v1 trainer keeps running
        # from v1's folder with v1's cache (stale_process, cache), run.sh edited by hand
        # (run_script), and a second trainer started by hand through it (duplicate_trainer).
        # B: its trainer killed (not_running). v2 changes a compiled file, so its cache differs.
        add_release(trainer_repo, "v2", "dflash/model.py", "# v2\n")
        old = json.loads(sh(bed, a, f"cat {root}/trainer.json"))["pid"]
        staged = pct_playbook(
            "deploy.yml", dflash_hosts=host_a, dflash_source_dir=str(trainer_repo),
            dflash_ref="v2", dflash_trainer_args=args,
        )  # fmt: skip
        assert staged.rc == 0, staged.output
        assert current_in(bed, a, root) == "releases/v2"
        sh(bed, a, f"echo '# by hand' >> {root}/run.sh")
        # In the background it is no group leader, so setsid execs in place: $! is the trainer.
        second = int(sh(bed, a, f"DFLASH_RUN_ID=by-hand setsid bash {root}/run.sh "
                                ">/dev/null 2>&1 </dev/null & echo $!"))  # fmt: skip
        bed.attach(b, "pkill", "-KILL", "-f", "dflash[.]train")
        time.sleep(1)
        drift = pct_playbook("verify.yml")
        assert drift.rc != 0
        found = findings_of(drift)
        assert {h: sorted(k) for h, k in found.items()} == {
            host_a: ["cache", "duplicate_trainer", "run_script", "stale_process"],
            host_b: ["not_running"],
        }, drift.output
        [item] = found[host_a]["stale_process"]
        assert item["pid"] == old and "release v2" in item["expected"]
        assert "runs release v1" in item["found"]
        [item] = found[host_a]["cache"]
        assert item["pid"] == old and item["expected"] != cache and cache in item["found"]
        [item] = found[host_a]["run_script"]
        assert item["found"] != item["expected"]
        [item] = found[host_a]["duplicate_trainer"]
        assert item["expected"] == "one trainer" and item["pids"] == sorted([old, second])
        [item] = found[host_b]["not_running"]
        assert "v1" in item["expected"] and item["found"] == "no trainer process"
    finally:
        # Every trainer of the root, the one started by hand included.
        assert pct_playbook("playbooks/stop.yml").rc == 0
