"""library/dflash_proxmox.py (the check) and dflash_proxmox_snapshot.py through real
ansible-playbook runs: proxmoxer over the node's HTTPS API with the privilege-separated token,
one module run per container, delegated to the controller. Every refusal is checked to come
before any change: no POST/PUT/DELETE reached the API."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.testbed.bed import API_USER, Testbed
from tests.testbed.node.pveconf import Section
from tests.testbed.sshd import free_port

from .ansible_run import PROXMOX_API_ARGS, PlayRun, module_play, run_playbook
from .conftest import newer_debian

pytestmark = pytest.mark.testbed

WHEELHOUSE = [{"path": "/mnt/wheelhouse"}]
# A node with the NVIDIA driver loaded, as its /proc/devices reads (nvidia-uvm's major varies).
NVIDIA_PROC_DEVICES = "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-uvm\n"


def run(
    bed: Testbed,
    tmp_path: Path,
    args: dict,
    module: str = "dflash_proxmox",
    check: bool = False,
    env: dict | None = None,
    **inventory: object,
) -> dict[str, dict]:
    result: PlayRun = run_playbook(
        [module_play(args, module)], bed.inventory(**inventory), tmp_path, check=check, env=env
    )  # type: ignore[arg-type]
    return result.results(module)


def changes(bed: Testbed, since: int) -> list[str]:
    """API calls that change something (POST/PUT/DELETE) since the mark."""
    return [
        f"{e['subcommand']} {e['path']}" for e in bed.api_calls(since) if e["subcommand"] != "get"
    ]


def test_ready_container_passes_and_an_invisible_vmid_fails(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    mark = bed.trace_mark()
    results = run(bed, tmp_path, {"mounts": WHEELHOUSE}, host_vars={second: {"proxmox_vmid": 999}})
    ok, unknown = results[bed.hostname(first)], results[bed.hostname(second)]
    assert not ok.get("failed"), ok
    assert ok["changed"] is False and ok["status"] == "running" and ok["started"] is False
    assert ok["config"]["unprivileged"] is True and ok["pending"] == []
    assert ok["config"]["mounts"]["/mnt/wheelhouse"] == {
        "key": "mp0",
        "source": str(bed.wheelhouse),
        "read_only": True,
    }
    # said before any change: the wheelhouse bind mount rules out a snapshot, and the fix
    assert ok["snapshot"]["possible"] is False
    assert ok["snapshot"]["reason"].startswith(f"mount point mp0 ({bed.wheelhouse},mp=/mnt/")
    assert unknown["failed"] is True
    assert unknown["msg"] == (
        f"container 999 is not among the containers that token {API_USER}!deploy sees on node "
        f"{bed.node} ({', '.join(map(str, bed.vmids))}): it does not exist there, or the token "
        "lacks VM.Audit on /vms/999; check proxmox_vmid and proxmox_node, or grant it: pveum acl "
        f"modify /vms/999 --tokens '{API_USER}!deploy' --roles PVEVMAdmin"
    )
    assert changes(bed, mark) == []
    # the config read is current=1 (what the container runs with), over the token's HTTPS
    reads = {e["path"]: e["argv"] for e in bed.api_calls(mark)}
    assert "current" in reads[f"/nodes/{bed.node}/lxc/{first}/config"]


def test_token_without_vm_audit_sees_no_container_and_is_told_the_fix(
    bed: Testbed, tmp_path: Path
) -> None:
    first, second = bed.vmids[:2]
    bed.add_token("one", {f"/vms/{first}": "PVEVMAdmin"})  # privilege separated: first only
    mark = bed.trace_mark()
    results = run(
        bed,
        tmp_path,
        {},
        group_vars={
            "proxmox_api_token_id": "one",
            "proxmox_api_token_secret": bed.token_secret("one"),
        },
    )
    assert not results[bed.hostname(first)].get("failed"), results[bed.hostname(first)]
    refused = results[bed.hostname(second)]
    assert refused["failed"] is True
    # the list this token gets is filtered to what it may audit
    assert refused["msg"].startswith(
        f"container {second} is not among the containers that token {API_USER}!one sees on "
        f"node {bed.node} ({first}): it does not exist there, or the token lacks VM.Audit on "
        f"/vms/{second};"
    )
    assert f"pveum acl modify /vms/{second} --tokens '{API_USER}!one'" in refused["msg"]
    assert changes(bed, mark) == []


def test_start_ending_with_warnings_passes_and_a_missing_device_refuses_it(
    bed: Testbed, tmp_path: Path
) -> None:
    warns, refused = bed.vmids[:2]
    bed.stop_container(refused)
    bed.edit_config(refused, values={"dev0": "/dev/nvidia7"})  # a GPU this node lacks
    # A Debian newer than pve-container knows: the start task ends `WARNINGS: 1`, as on PVE 8.
    with newer_debian(bed, warns):
        bed.stop_container(warns)
        results = run(bed, tmp_path, {"start_if_stopped": True, "start_timeout": 30})
    started, failed = results[bed.hostname(warns)], results[bed.hostname(refused)]
    assert not started.get("failed"), started
    assert started["changed"] is True and started["status"] == "running"
    assert started["actions"] == [
        f"started container {warns} (it was stopped; its task ended with WARNINGS: 1)"
    ]
    assert bed.status(warns) == "running"
    assert failed["failed"] is True and failed["changed"] is False
    assert failed["msg"].startswith(
        f"starting container {refused} on node {bed.node} failed: Device /dev/nvidia7 does not "
        "exist (task UPID:"
    )
    assert f"node {bed.node} has no /dev/nvidia7" in failed["msg"]
    assert f"(pct set {refused} -delete devN)" in failed["msg"]
    assert bed.status(refused) == "stopped"


def test_every_task_wait_is_bounded_and_names_the_log(bed: Testbed, tmp_path: Path) -> None:
    slow = bed.vmids[0]
    bed.stop_container(slow)
    bed.delay_tasks("vzstart", 600)  # held until the module has given up on it
    result = run(bed, tmp_path, {"start_if_stopped": True, "start_timeout": 1}, vmids=[slow])
    failed = result[bed.hostname(slow)]
    assert failed["failed"] is True
    assert re.search(
        rf"starting container {slow} on node {bed.node}: task UPID:\S+:vzstart:"
        rf"{slow}:{API_USER}!deploy: still running after 1 s",
        failed["msg"],
    )
    assert "(its log so far: no content)" in failed["msg"]  # an empty log, as Proxmox says
    # the task goes on, as a real one would: the container comes up once it is let go
    bed.delay_tasks("vzstart", 0)
    deadline = time.monotonic() + 60
    while bed.status(slow) != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert bed.status(slow) == "running"


def test_stopped_container_is_refused_unless_start_is_asked(bed: Testbed, tmp_path: Path) -> None:
    stopped = bed.vmids[0]
    bed.stop_container(stopped)
    mark = bed.trace_mark()
    refused = run(bed, tmp_path, {}, vmids=[stopped])[bed.hostname(stopped)]
    assert refused["failed"] is True and refused["changed"] is False
    assert (
        f"container {stopped} on node {bed.node} is stopped; start it (pct start {stopped}) or "
        "set dflash_proxmox_start_if_stopped: true"
    ) in refused["msg"]
    assert changes(bed, mark) == [] and bed.status(stopped) == "stopped"


def test_gpu_passthrough_is_checked_with_cgroup2_rules_and_the_node_majors(
    bed: Testbed, tmp_path: Path
) -> None:
    first, second = bed.vmids[:2]
    devn = {"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"}
    mount = ("lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file")
    # first: GPU 0 and the control devices as devN, GPU 1 mounted with its cgroup2 rule
    bed.edit_config(first, values=devn, lxc=[("lxc.cgroup2.devices.allow", "c 195:* rwm"), mount])
    # second: GPU 1 allowed only by a cgroup v1 rule, nvidia-uvm mounted without a rule for its
    # major (508 on this node), GPU 2 missing
    bed.edit_config(
        second,
        values={"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl"},
        lxc=[
            ("lxc.cgroup.devices.allow", "c 195:* rwm"),
            mount,
            ("lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"),
        ],
    )
    results = run(
        bed,
        tmp_path,
        {"gpus": "{{ want_gpus }}", "proc_devices": NVIDIA_PROC_DEVICES},
        host_vars={first: {"want_gpus": [0, 1]}, second: {"want_gpus": [0, 1, 2]}},
    )
    ok, bad = results[bed.hostname(first)], results[bed.hostname(second)]
    assert not ok.get("failed"), ok
    assert ok["config"]["gpus"] == {"0": "dev0: /dev/nvidia0", "1": f"{mount[0]}: {mount[1]}"}
    assert bad["failed"] is True and "(3 problems)" in bad["msg"]
    assert (
        f"GPU 1 (/dev/nvidia1) is mounted into container {second} ('{mount[0]}: {mount[1]}') and "
        "allowed only by 'lxc.cgroup.devices.allow: c 195:* rwm', a cgroup v1 key that Proxmox "
        f"VE 8 (cgroup v2) ignores; add 'lxc.cgroup2.devices.allow: c 195:* rwm' to "
        f"/etc/pve/lxc/{second}.conf"
    ) in bad["msg"]
    assert (
        f"GPU 2 (/dev/nvidia2) is not passed through to container {second}; add 'dev2: "
        in bad["msg"]
    )
    assert (
        f"the NVIDIA UVM device (/dev/nvidia-uvm, char 508:0 on this node) is mounted into "
        f"container {second}"
    ) in bad["msg"]
    assert "'lxc.cgroup2.devices.allow: c 508:* rwm'" in bad["msg"]
    assert "GPU 0" not in bad["msg"]


def test_pending_devn_is_named_as_pending(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    # A devN set while the containers run stays pending (LXC/Config.pm vmconfig_hotplug_pending
    # does not hotplug devices). Since pve-container 5.0.10 the set itself needs the device
    # (update_pct_config -> LXC/Tools.pm get_device_mode_and_rdev), which this node lacks: the
    # state is written as a node reaches it when /dev/nvidia0 was there at `pct set` time and
    # went away since (a driver unloaded); the doubles' test covers the refusal.
    for vmid in (first, second):
        conf = bed.read_config(vmid)
        conf.pending.options["dev0"] = "/dev/nvidia0"
        bed.write_config(vmid, conf)
    assert "[pve:pending]" in bed.config_text(first)
    results = run(
        bed,
        tmp_path,
        {"gpus": "{{ want_gpus }}"},
        host_vars={first: {"want_gpus": [0]}, second: {"want_gpus": []}},
    )
    gpu, cpu = results[bed.hostname(first)], results[bed.hostname(second)]
    assert gpu["failed"] is True
    assert (
        f"GPU 0 (/dev/nvidia0) is passed to container {first} only as a pending change ('dev0: "
        f"/dev/nvidia0', set while it runs): the running container does not have it; restart "
        f"the container (pct reboot {first}) to apply it"
    ) in gpu["msg"]
    # without GPUs asked for, the pending change is reported on its own, not as present
    assert not cpu.get("failed"), cpu
    assert cpu["pending"] == [{"key": "dev0", "pending": "/dev/nvidia0"}]
    assert cpu["config"]["devices"] == []
    assert any(
        "has pending changes, applied only at its next start: dev0: /dev/nvidia0" in w
        for w in cpu["warnings"]
    )


def test_missing_or_wrong_mount_point_fails(bed: Testbed, tmp_path: Path) -> None:
    first, second = bed.vmids[:2]
    bed.edit_config(first, delete=["mp0"])
    results = run(
        bed,
        tmp_path,
        {"mounts": [{"path": "/mnt/wheelhouse", "source": "{{ wheel_src }}"}]},
        host_vars={first: {"wheel_src": str(bed.wheelhouse)}, second: {"wheel_src": "/srv/other"}},
    )
    gone, wrong = results[bed.hostname(first)], results[bed.hostname(second)]
    assert gone["failed"] is True
    assert (
        f"container {first} has no mount point at /mnt/wheelhouse; add one, e.g. 'mp0: "
        f"{bed.wheelhouse},mp=/mnt/wheelhouse' (pct set {first} -mp0 {bed.wheelhouse},"
        "mp=/mnt/wheelhouse)"
    ) in gone["msg"]
    assert wrong["failed"] is True
    assert (
        f"mount point /mnt/wheelhouse of container {second} comes from {bed.wheelhouse} (mp0), "
        "expected /srv/other"
    ) in wrong["msg"]


def test_snapshot_refusals_come_before_any_change(bed: Testbed, tmp_path: Path) -> None:
    bound, audited = bed.vmids[:2]
    # audited: snapshots possible (no bind mount), but its token may only audit it
    bed.edit_config(audited, delete=["mp0"])
    bed.add_token("audit", {f"/vms/{v}": "PVEAuditor" for v in bed.vmids})
    mark = bed.trace_mark()
    results = run(
        bed,
        tmp_path,
        {"snapshot": {"retain": 2}},
        host_vars={
            audited: {
                "proxmox_api_token_id": "audit",
                "proxmox_api_token_secret": bed.token_secret("audit"),
            }
        },
    )
    blocked, forbidden = results[bed.hostname(bound)], results[bed.hostname(audited)]
    assert blocked["failed"] is True
    assert (
        f"container {bound} cannot be snapshotted: mount point mp0 ({bed.wheelhouse},"
        "mp=/mnt/wheelhouse,ro=1) is a bind mount, and Proxmox snapshots no container with bind "
        f"or device mount points; put /mnt/wheelhouse on a storage-backed volume instead (e.g. "
        f"pct set {bound} -mp0 local-lvm:8,mp=/mnt/wheelhouse"
    ) in blocked["msg"]
    assert "or take no snapshot: dflash_proxmox_snapshot: {}" in blocked["msg"]
    assert forbidden["failed"] is True
    assert (
        f"token {API_USER}!audit may not take snapshots of container {audited} (no VM.Snapshot "
        f"on /vms/{audited}); grant it: pveum acl modify /vms/{audited} --tokens "
        f"'{API_USER}!audit' --roles PVEVMAdmin"
    ) in forbidden["msg"]
    # a name of 41 characters: refused before the API is even asked
    long_prefix = "p" * 26
    mark_long = bed.trace_mark()
    [too_long] = run(
        bed, tmp_path, {"snapshot": {"name_prefix": long_prefix}}, vmids=[audited]
    ).values()
    assert too_long["msg"] == (
        f"the snapshot names of container {audited} would be 41 characters ('{long_prefix}-"
        "20260101120000'), and Proxmox allows at most 40: shorten "
        "dflash_proxmox_snapshot.name_prefix to at most 25 characters; nothing was changed"
    )
    assert bed.api_calls(mark_long) == []
    assert changes(bed, mark) == [] and bed.snapshots(bound) == bed.snapshots(audited) == []


def _seed_snapshots(bed: Testbed, vmid: int) -> None:
    """Two old snapshots of ours and one of the user's, as Proxmox would have them."""
    conf = bed.read_config(vmid)
    parent = None
    for name, when in (
        ("dflash-predeploy-20200101000000", 1577836800),
        ("manual", 1577900000),
        ("dflash-predeploy-20200102000000", 1577923200),
    ):
        snap = Section(dict(conf.current.options), [], "")
        snap.options["snaptime"] = str(when)
        if parent:
            snap.options["parent"] = parent
        conf.snapshots[name] = snap
        parent = name
    conf.current.options["parent"] = parent  # type: ignore[assignment]
    bed.write_config(vmid, conf)


def test_snapshot_with_retention_keeps_the_newest_of_ours(bed: Testbed, tmp_path: Path) -> None:
    first = bed.vmids[0]
    bed.edit_config(first, delete=["mp0"])  # a container Proxmox can snapshot
    _seed_snapshots(bed, first)
    args = {"name_prefix": "dflash-predeploy", "retain": 2}
    result = run(bed, tmp_path, args, "dflash_proxmox_snapshot", vmids=[first])[bed.hostname(first)]
    assert not result.get("failed"), result
    created = result["snapshot"]["created"]
    assert re.fullmatch(r"dflash-predeploy-\d{14}", created)
    assert result["snapshot"]["removed"] == ["dflash-predeploy-20200101000000"]
    assert result["snapshot"]["kept"] == ["dflash-predeploy-20200102000000", created]
    assert result["changed"] is True
    assert sorted(bed.snapshots(first)) == sorted(
        ["manual", "dflash-predeploy-20200102000000", created]
    )
    conf = bed.read_config(first)
    assert conf.current.options["parent"] == created
    assert conf.snapshots[created].options["parent"] == "dflash-predeploy-20200102000000"
    # the removed snapshot's child now hangs off the removed one's parent (none)
    assert "parent" not in conf.snapshots["manual"].options


def test_check_mode_reports_and_changes_nothing(bed: Testbed, tmp_path: Path) -> None:
    first = bed.vmids[0]
    bed.edit_config(first, delete=["mp0"])
    _seed_snapshots(bed, first)
    bed.stop_container(first)
    before, mark = bed.config_text(first), bed.trace_mark()
    check = run(
        bed,
        tmp_path,
        {"start_if_stopped": True, "snapshot": {"retain": 1}},
        check=True,
        vmids=[first],
    )[bed.hostname(first)]
    assert not check.get("failed"), check
    assert check["changed"] is True and check["started"] is True
    assert check["actions"] == [f"would start container {first} (it is stopped)"]
    snap = run(bed, tmp_path, {"retain": 1}, "dflash_proxmox_snapshot", check=True, vmids=[first])[
        bed.hostname(first)
    ]
    would = snap["snapshot"]["created"]
    assert snap["changed"] is True and snap["actions"] == [
        f"would take snapshot {would}",
        "would delete snapshot dflash-predeploy-20200101000000 (retention)",
        "would delete snapshot dflash-predeploy-20200102000000 (retention)",
    ]
    assert bed.config_text(first) == before and bed.status(first) == "stopped"
    assert changes(bed, mark) == []


def test_unreachable_api_unknown_node_untrusted_cert_and_bad_token(
    bed: Testbed, tmp_path: Path
) -> None:
    first, second = bed.vmids[:2]
    closed = free_port()
    results = run(
        bed,
        tmp_path,
        {"api_timeout": 5},
        host_vars={first: {"proxmox_api_port": closed}, second: {"proxmox_node": "pve2"}},
    )
    down, elsewhere = results[bed.hostname(first)], results[bed.hostname(second)]
    assert down["msg"].startswith(f"cannot reach the Proxmox API at https://127.0.0.1:{closed} (")
    assert down["msg"].endswith("check api_host/api_port and that the node is up")
    assert elsewhere["msg"] == (
        f"node 'pve2' is not known to the Proxmox API (nodes: {bed.node}); set proxmox_node to "
        f"the one that holds container {second}"
    )
    # without the node's CA the certificate is not trusted; a wrong secret is refused (401)
    wrong = "not-the-secret-0123456789"
    play = module_play({})
    play["tasks"][0]["environment"] = {}  # the system's CAs only
    result = run_playbook([play], bed.inventory(vmids=[first]), tmp_path)
    untrusted = result.results("dflash_proxmox")[bed.hostname(first)]
    assert untrusted["msg"].startswith(
        f"the certificate of the Proxmox API at https://127.0.0.1:{bed.api_port} is not trusted"
    )
    # The certificate served is named, and the fix for its kind (Proxmox's own here; the
    # self-signed and custom-CA kinds: tests/unit/test_certificate_advice.py).
    assert (
        "it serves subject CN=pve,O=Proxmox Virtual Environment,OU=PVE Cluster Node, "
        "issued by O=PVE Cluster Manager CA,CN=Proxmox Virtual Environment: Proxmox's own "
        "node certificate (pve-ssl.pem): set proxmox_api_ca_file to a copy of the cluster's "
        "/etc/pve/pve-root-ca.pem" in untrusted["msg"]
    ), untrusted["msg"]
    refused = run(
        bed, tmp_path, {}, host_vars={second: {"proxmox_api_token_secret": wrong}}, vmids=[second]
    )[bed.hostname(second)]
    assert refused["msg"].startswith(
        f"the Proxmox API at https://127.0.0.1:{bed.api_port} refused the token "
        f"{API_USER}!deploy (Authentication failed!); check api_user, api_token_id and the secret"
    )
    # the secrets (the right one and the wrong one) appear nowhere in what Ansible returned
    for shown in (json.dumps(result.output), json.dumps(refused)):
        assert wrong not in shown and bed.token_secret() not in shown


def test_the_containers_of_a_node_are_checked_in_one_session(bed: Testbed, tmp_path: Path) -> None:
    """dflash_proxmox_containers (the role's check): one API session and one listing of the
    node for all its containers; every start requested before any is waited for; a container
    that is not ready fails its own entry only."""
    first, second = bed.vmids[:2]
    for vmid in (first, second):
        bed.stop_container(vmid)
    api = {k: v for k, v in PROXMOX_API_ARGS.items() if k != "vmid"}
    entries = [
        {"name": name, **api, "ca_file": "{{ proxmox_api_ca_file }}", "vmid": vmid,
         "start_if_stopped": True, "start_timeout": 60, "mounts": WHEELHOUSE}
        for name, vmid in (("a", first), ("b", second), ("ghost", 999))
    ]  # fmt: skip
    play = {
        "name": "one check for every container",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [{"name": "check", "dflash_proxmox_containers": {"containers": entries},
                   "run_once": True, "delegate_to": "localhost"}],
    }  # fmt: skip
    mark = bed.trace_mark()
    result = run_playbook([play], bed.inventory(), tmp_path)
    answer = next(iter(result.results("check").values()))
    assert not answer.get("failed"), answer
    assert answer["changed"] is True and answer["sessions"] == 1
    found = answer["containers"]
    for name, vmid in (("a", first), ("b", second)):
        assert not found[name].get("failed"), found[name]
        assert found[name]["started"] is True and found[name]["status"] == "running"
        assert found[name]["actions"] == [f"started container {vmid} (it was stopped)"]
        assert bed.status(vmid) == "running"
    assert found["ghost"]["failed"] is True
    assert found["ghost"]["msg"].startswith(
        f"container 999 is not among the containers that token {API_USER}!deploy sees on node "
        f"{bed.node} ("
    )
    paths = [(e["subcommand"], e["path"]) for e in bed.api_calls(mark)]
    assert paths.count(("get", "/version")) == 1
    assert paths.count(("get", f"/nodes/{bed.node}/lxc")) == 1
    # both starts were asked for before the first wait for a start task's end
    posts = [i for i, (verb, path) in enumerate(paths) if verb == "post"]
    waits = [i for i, (verb, path) in enumerate(paths) if "/tasks/" in path]
    assert len(posts) == 2 and max(posts) < min(waits)
    # the secret never reaches the output
    assert bed.token_secret() not in json.dumps(result.output)


def test_the_role_checks_the_containers_when_the_first_host_is_not_one(
    bed: Testbed, tmp_path: Path
) -> None:
    """A play whose first host has no proxmox_vmid (reached over SSH, or local): the check
    still runs once for the containers after it, and that host skips it."""
    plain = tmp_path / "plain.yml"
    plain.write_text(json.dumps({"all": {"hosts": {"aaa-plain": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"
    }}}}))  # fmt: skip
    play = {
        "name": "the dflash_proxmox role over a mixed play",
        "hosts": "all",
        "gather_facts": False,
        "vars": {"dflash_env_lock": {}},
        "tasks": [
            {"name": "check", "ansible.builtin.import_role": {
                "name": "dflash_proxmox", "rolespec_validate": False}},  # as deploy.yml does
            {"name": "answer", "ansible.builtin.debug": {
                "msg": "{{ dflash_proxmox_result.status | default('none') }}"}},
        ],
    }  # fmt: skip
    mark = bed.trace_mark()
    result = run_playbook([play], [plain, bed.inventory()], tmp_path)
    assert result.rc == 0, [
        (task["task"]["name"], host, answer.get("msg"))
        for task in result.output["plays"][0]["tasks"]
        for host, answer in task["hosts"].items()
        if answer.get("failed")
    ]
    said = {host: r["msg"] for host, r in result.results("answer").items()}
    assert said == {"aaa-plain": "none", **{bed.hostname(v): "running" for v in bed.vmids}}
    paths = [(e["subcommand"], e["path"]) for e in bed.api_calls(mark)]
    assert paths.count(("get", "/version")) == 1
