"""Pieces of the test bed and of the Proxmox modules and filters that need no running bed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils import dflash_proxmox_config
from tests.testbed import pytest_plugin
from tests.testbed.mirror import debian_mirror
from tests.testbed.node.access import AuthError, UserConfig, builtin_roles, check
from tests.testbed.node.lxcctl import LxcError, derive_lxc_config
from tests.testbed.node.nodecfg import NodeConfig
from tests.testbed.node.pveconf import format_config, parse
from tests.testbed.node.storage import DEFAULT_STORAGE_CFG, parse_storage_cfg, snapshot_capable
from tests.testbed.node.tasks import read_exit_status

REPO = Path(__file__).resolve().parents[2]

CONF = """#GPU box
arch: amd64
dev0: /dev/null,gid=44
hostname: ct200
memory: 2048
mp0: /srv/wheels,mp=/mnt/wheelhouse,ro=1
parent: snap1
unprivileged: 1
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup.devices.allow: c 508:* rwm
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file

[pve:pending]
delete: memory
dev1: /dev/nvidia0

[snap1]
arch: amd64
hostname: ct200
memory: 1024
snaptime: 1700000000
"""


def load(name: str, path: Path) -> ModuleType:
    """A module or filter plugin (no package to import it from), imported here for its pure
    functions."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


CONFIG = dflash_proxmox_config
SNAPSHOT = load("dflash_proxmox_snapshot", REPO / "library/dflash_proxmox_snapshot.py")
CHANGES = load("dflash_plan_filters", REPO / "filter_plugins/dflash_plan.py")
REDACT = load("dflash_redact_filters", REPO / "filter_plugins/dflash_redact.py")


def test_mirror_is_read_from_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n\n"
        "# comment\nTypes: deb deb-src\nURIs: http://mirror.invalid/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror(apt_dir=tmp_path) == "http://mirror.invalid/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://one.invalid/debian bookworm main\n"
    )
    assert debian_mirror(apt_dir=tmp_path) == "http://one.invalid/debian"
    with pytest.raises(LookupError):
        debian_mirror("trixie", apt_dir=tmp_path)


def test_proxmox_config_round_trip_pending_and_api_shape() -> None:
    conf = parse(CONF)
    assert conf.current.description == "GPU box"
    assert conf.snapshots["snap1"].options["memory"] == "1024"
    assert format_config(conf) == CONF
    # current=1 is the config as it is; without it pending values are merged in and pending
    # deletions applied (AbstractConfig.pm load_current_config)
    assert conf.current.to_api()["memory"] == 2048 and "dev1" not in conf.current.options
    merged = conf.with_pending().to_api()
    assert merged["dev1"] == "/dev/nvidia0" and "memory" not in merged
    items = {item["key"]: item for item in conf.pending_array()}
    assert items["dev1"] == {"key": "dev1", "pending": "/dev/nvidia0"}
    assert items["memory"] == {"key": "memory", "value": "2048", "delete": 1}
    assert items["hostname"] == {"key": "hostname", "value": "ct200"}


def test_lxc_config_is_derived_from_the_proxmox_one(tmp_path: Path) -> None:
    cfg = NodeConfig("pve", str(tmp_path), "/base", "/base-shifted")
    text = derive_lxc_config(200, parse(CONF).current, cfg)
    # unprivileged: uid/gid 0 -> 100000, and the shifted copy of the base below the overlay
    assert f"lxc.rootfs.path = overlay:/base-shifted:{tmp_path}/lxc/200/delta" in text
    assert "lxc.idmap = u 0 100000 65536" in text and "lxc.idmap = g 0 100000 65536" in text
    assert "lxc.mount.entry = /srv/wheels mnt/wheelhouse none rbind,create=dir,ro 0 0" in text
    # cgroup2 device rules are enforced (through this host's v1 controller), after LXC's
    # default list; devN adds its own rule; the config's v1 key is ignored, as on PVE 8
    rules = [line for line in text.splitlines() if line.startswith("lxc.cgroup.devices.")]
    assert rules[0] == "lxc.cgroup.devices.deny = a"
    assert "lxc.cgroup.devices.allow = c 1:3 rw" in rules  # dev0: /dev/null
    assert rules[-1] == "lxc.cgroup.devices.allow = c 195:* rwm"
    assert "lxc.cgroup.devices.allow = c 508:* rwm" not in rules
    assert "# lxc.cgroup.devices.allow = c 508:* rwm  (cgroup v1 key: ignored" in text
    privileged = parse(CONF.replace("unprivileged: 1\n", "")).current
    assert "lxc.idmap" not in derive_lxc_config(200, privileged, cfg)


def test_devn_for_a_device_the_node_lacks_refuses_the_start(tmp_path: Path) -> None:
    cfg = NodeConfig("pve", str(tmp_path), "/base", "/base-shifted")
    conf = parse(CONF.replace("dev0: /dev/null,gid=44", "dev0: /dev/nvidia-absent"))
    with pytest.raises(LxcError, match=r"^Device /dev/nvidia-absent does not exist$"):
        derive_lxc_config(200, conf.current, cfg)


def test_storage_snapshot_feature_follows_the_plugins() -> None:
    storages = parse_storage_cfg(DEFAULT_STORAGE_CFG)
    assert storages["local-lvm"] == {
        "type": "lvmthin",
        "thinpool": "data",
        "vgname": "pve",
        "content": "rootdir,images",
    }
    assert snapshot_capable(storages, "local-lvm:vm-200-disk-0")
    assert snapshot_capable(storages, "local-zfs:subvol-200-disk-0")
    assert not snapshot_capable(storages, "local:200/vm-200-disk-0.raw")  # dir: qcow2 only
    assert snapshot_capable(storages, "local:200/vm-200-disk-0.qcow2")
    assert not snapshot_capable(storages, "/srv/wheels")  # a bind mount point
    assert not snapshot_capable(storages, "gone:vm-200-disk-0")


def test_tokens_acls_and_privilege_separation(tmp_path: Path) -> None:
    (tmp_path / "priv").mkdir()
    (tmp_path / "user.cfg").write_text(
        "user:root@pam:1:0:::::\nuser:ops@pve:1:0::::::\n"
        "token:ops@pve!one:0:1::\ntoken:ops@pve!all:0:0::\n"
        "acl:1:/:ops@pve:PVEVMAdmin:\nacl:1:/vms/200:ops@pve!one:PVEAuditor:\n"
        "acl:0:/vms:ops@pve!one:PVEVMAdmin:\n"
    )
    (tmp_path / "priv" / "token.cfg").write_text("ops@pve!one s1\nops@pve!all s2\n")
    cfg = UserConfig(tmp_path)
    assert cfg.verify_token("ops@pve!one=s1") == "ops@pve!one"
    for bad in ("ops@pve!one=nope", "ops@pve!none=s1", "nobody@pve!one=s1", "garbage"):
        with pytest.raises(AuthError):
            cfg.verify_token(bad)
    # privilege separation: the token's own ACL, within its user's privileges
    assert check(cfg, "ops@pve!one", "/vms/200", ["VM.Audit"]) == ""
    assert check(cfg, "ops@pve!one", "/vms/200", ["VM.Snapshot"]) == (
        "Permission check failed (/vms/200, VM.Snapshot)"
    )
    # an ACL without propagation applies to its own path only
    assert check(cfg, "ops@pve!one", "/vms/201", ["VM.Audit"]) == (
        "Permission check failed (/vms/201, VM.Audit)"
    )
    # without privilege separation a token has its user's privileges
    assert check(cfg, "ops@pve!all", "/vms/201", ["VM.Snapshot", "VM.PowerMgmt"]) == ""
    assert builtin_roles()["PVEAuditor"] >= {"VM.Audit", "Sys.Audit", "Datastore.Audit"}


def test_task_exit_status_is_read_from_the_last_log_line(tmp_path: Path) -> None:
    log = tmp_path / "task"
    cases = {
        "x\nTASK OK\n": "OK",
        "WARN: w\nTASK WARNINGS: 1\n": "WARNINGS: 1",
        "TASK ERROR: Device /dev/x does not exist\n": "Device /dev/x does not exist",
        "half": "unexpected status",
    }
    for text, status in cases.items():
        log.write_text(text)
        assert read_exit_status(log) == status


def test_snapshot_plan_only_counts_our_snapshots() -> None:
    snaps = [
        {"name": "dflash-predeploy-20240102000000", "snaptime": 20},
        {"name": "dflash-predeploy-20240101000000", "snaptime": 10},
        {"name": "dflash-predeploy-manual", "snaptime": 5},
        {"name": "other", "snaptime": 1},
        {"name": "current"},
    ]
    name, remove, kept = SNAPSHOT.plan(snaps, "dflash-predeploy", 2, 1735689600.0)
    assert name == "dflash-predeploy-20250101000000"
    assert remove == ["dflash-predeploy-20240101000000"]
    assert kept == ["dflash-predeploy-20240102000000", name]
    again = [*snaps, {"name": name, "snaptime": 30}]
    # Two in one second: the next second, as long as the first (Proxmox allows 40 characters;
    # a 25-character prefix with a `-2` suffix would make 42).
    assert SNAPSHOT.plan(again, "dflash-predeploy", 5, 1735689600.0)[0] == (
        "dflash-predeploy-20250101000001"
    )
    longest = "p" * 25
    first = SNAPSHOT.plan([], longest, 5, 1735689600.0)[0]
    second = SNAPSHOT.plan([{"name": first, "snaptime": 1}], longest, 5, 1735689600.0)[0]
    assert len(first) == len(second) == 40 and first != second


def test_gpu_rules_are_cgroup2_with_the_majors_of_the_node() -> None:
    api = parse(CONF).current.to_api()
    assert CONFIG.passed_devices(api)["/dev/nvidia1"].startswith("lxc.mount.entry: ")
    proc = "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-uvm\n\nBlock devices:\n  8 sd\n"
    majors = CONFIG.char_majors(proc)
    assert majors == {"mem": 1, "nvidia": 195, "nvidia-uvm": 508}
    ct = dict(
        api,
        dev1="/dev/nvidiactl",
        lxc=[
            ["lxc.cgroup2.devices.allow", "c 195:* rwm"],
            ["lxc.cgroup.devices.allow", "c 508:* rwm"],
            ["lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file"],
            ["lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"],
        ],
    )
    [problem] = CONFIG.gpu_problems(ct, {}, 200, [1], majors)
    # nvidia-uvm's major is 508 on this node: the 195 rule does not cover it, and the v1 key
    # that would is named as ignored
    assert "'lxc.cgroup.devices.allow: c 508:* rwm', a cgroup v1 key that Proxmox VE 8" in problem
    assert "add 'lxc.cgroup2.devices.allow: c 508:* rwm' to /etc/pve/lxc/200.conf" in problem
    assert CONFIG.gpu_problems(ct, {}, 200, [1], {**majors, "nvidia-uvm": 195}) == []
    [unloaded] = CONFIG.gpu_problems(ct, {}, 200, [1], {"nvidia": 195})
    assert "the node's kernel has no 'nvidia-uvm' device" in unloaded
    # a devN only pending (set while the container runs) is named as pending
    pending = CONFIG.gpu_problems({}, {"dev0": "/dev/nvidia0"}, 200, [0], None)
    assert pending[0].startswith(
        "GPU 0 (/dev/nvidia0) is passed to container 200 only as a "
        "pending change ('dev0: /dev/nvidia0'"
    )
    assert "'dev1: /dev/nvidiactl'" in pending[1] and "'dev2: /dev/nvidia-uvm'" in pending[2]


def test_snapshot_blockers_name_the_mount_point_or_the_storage() -> None:
    config = {"rootfs": "local-lvm:vm-200-disk-0,size=8G", "mp0": "/srv/wheels,mp=/mnt/wheelhouse"}
    bind = CONFIG.snapshot_blockers(config, 200)
    assert bind.startswith("mount point mp0 (/srv/wheels,mp=/mnt/wheelhouse) is a bind mount")
    assert "pct set 200 -mp0 local-lvm:8,mp=/mnt/wheelhouse" in bind
    assert bind.endswith("dflash_proxmox_snapshot: {}")
    device = CONFIG.snapshot_blockers({"mp1": "/dev/sdb1,mp=/data"}, 200)
    assert "is a device mount" in device
    storage = CONFIG.snapshot_blockers({"rootfs": "local:200/vm-200-disk-0.raw,size=8G"}, 200)
    assert storage.startswith("a volume of container 200 (rootfs on local) is on a storage ")


def test_deploy_changes_names_what_a_deploy_changes_in_place() -> None:
    run_sh = {"layout": "cpu", "trainer_args": {"a": 1}, "trainer_env": {}, "torchrun_args": []}
    state = {
        "root": "/opt/dflash",
        "releases": ["v1"],
        "current": {"release": "v1"},
        "deployment": {
            "lock_id": "lock-1",
            "run_sh": dict(run_sh, cache_dir="/c"),
            "run_sh_sha256": "abc",
        },
        "run_sh": {"sha256": "abc"},
        "trainers": {
            "record": {"pid": 7, "release": "v1", "run_sh_sha256": "abc"},
            "processes": [
                {"pid": 7, "job": 7, "status": {"state": "running", "code_tree_sha256": "t1"}}
            ],
        },
    }
    # The trainer is kept only when it runs the tree and the run.sh this deploy makes.
    same = CHANGES.deploy_changes(state, "v1", "lock-1", run_sh, "t1", "abc")
    assert same == []
    assert CHANGES.deploy_changes(state, "v2", "lock-1", run_sh, "t2", "abc") == [
        "release v2 is new on the target",
        "current: v1 -> v2",
        "the trainer is restarted: the trainer's status.json names another code tree",
    ]
    changed = CHANGES.deploy_changes(
        state, "v1", "lock-2", dict(run_sh, trainer_args={"a": 2}), "t1", "def", env_changed=True
    )
    assert changed == [
        "env lock-2 built",
        "lock: lock-1 -> lock-2",
        "run.sh trainer_args changes",
        "the trainer is restarted: the trainer was started from another run.sh",
    ]
    edited = dict(state, run_sh={"sha256": "hand"})
    assert "run.sh differs from the one deployed (it is rewritten)" in CHANGES.deploy_changes(
        edited, "v1", "lock-1", run_sh, launch=False
    )
    assert CHANGES.deploy_changes(state, "v1", "lock-1", run_sh, "t1", "abc", restart=True) == [
        "the trainer is restarted: dflash_restart is set"
    ]
    stopped = {"root": "/r", "deployment": state["deployment"], "releases": ["v1"],
               "current": {"release": "v1"}, "run_sh": {"sha256": "abc"}}  # fmt: skip
    assert CHANGES.deploy_changes(stopped, "v1", "lock-1", run_sh, "t1", "abc") == [
        "the trainer is started: no trainer runs"
    ]
    fresh = CHANGES.deploy_changes({"root": "/r"}, "v1", "lock-1", run_sh, launch=False)
    assert fresh[0] == "first deployment to /r"


def test_index_url_credentials_are_redacted_and_given_back_for_the_same_index() -> None:
    lock = {
        "torch": "2.11.0+cu128",
        "source": {"index_url": "https://ci:t0ken@pypi.example.org:8443/simple"},
    }
    clean = REDACT.redact_lock(lock)
    assert clean["source"]["index_url"] == "https://REDACTED@pypi.example.org:8443/simple"
    assert lock["source"]["index_url"].startswith("https://ci:t0ken@")  # the input is untouched
    assert REDACT.redact_lock({"source": {"wheelhouse": "/mnt/w"}}) == {
        "source": {"wheelhouse": "/mnt/w"}
    }
    assert REDACT.unredact_lock(clean, lock) == lock
    other = {"source": {"index_url": "https://ci:t0ken@other.example.org/simple"}}
    assert REDACT.unredact_lock(clean, other) == clean


def test_missing_prerequisites_skip_locally_and_fail_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        pytest_plugin._skip_or_fail("needs root")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set, so not skipping"):
        pytest_plugin._skip_or_fail("needs root")
