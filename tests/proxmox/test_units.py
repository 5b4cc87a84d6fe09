"""Pieces of the test bed and of dflash_proxmox that need no running bed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.testbed import pytest_plugin
from tests.testbed.mirror import debian_mirror
from tests.testbed.node.lxcctl import derive_lxc_config
from tests.testbed.node.nodecfg import NodeConfig
from tests.testbed.node.pveconf import format_config, parse

REPO = Path(__file__).resolve().parents[2]

CONF = """#GPU box
arch: amd64
dev0: /dev/nvidia0,gid=44
hostname: ct200
memory: 2048
mp0: /srv/wheels,mp=/mnt/wheelhouse,ro=1
parent: snap1
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file

[snap1]
arch: amd64
hostname: ct200
memory: 1024
snaptime: 1700000000
"""


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "dflash_proxmox", REPO / "library/dflash_proxmox.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_proxmox_config_round_trip_and_api_shape() -> None:
    conf = parse(CONF)
    assert conf.current.description == "GPU box"
    assert conf.current.lxc[1] == (
        "lxc.mount.entry",
        "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
    )
    assert conf.snapshots["snap1"].options["memory"] == "1024"
    assert format_config(conf) == CONF
    api = conf.current.to_api()
    assert api["memory"] == 2048 and api["lxc"][0] == ["lxc.cgroup2.devices.allow", "c 195:* rwm"]


def test_lxc_config_is_derived_from_the_proxmox_one(tmp_path: Path) -> None:
    cfg = NodeConfig(node="pve", root=str(tmp_path), base_rootfs="/base")
    text = derive_lxc_config(200, parse(CONF).current, cfg)
    assert f"lxc.rootfs.path = overlay:/base:{tmp_path}/lxc/200/delta" in text
    assert "lxc.mount.entry = /srv/wheels mnt/wheelhouse none rbind,create=dir,ro 0 0" in text
    assert "lxc.net.0.type = empty" in text and "lxc.uts.name = ct200" in text
    assert text.rstrip().endswith(
        "lxc.mount.entry = /dev/nvidia1 dev/nvidia1 none bind,optional,create=file"
    )
    # no /dev/nvidia0 on this machine: not passed through, and said so
    assert (
        "# dev0: /dev/nvidia0 does not exist on this node" in text or Path("/dev/nvidia0").exists()
    )


def test_snapshot_plan_only_counts_our_snapshots() -> None:
    module = load_module()
    snaps = [
        {"name": "dflash-predeploy-20240102000000", "snaptime": 20},
        {"name": "dflash-predeploy-20240101000000", "snaptime": 10},
        {"name": "dflash-predeploy-manual", "snaptime": 5},
        {"name": "other", "snaptime": 1},
        {"name": "current"},
    ]
    name, remove, kept = module.snapshot_plan(snaps, "dflash-predeploy", 2, 1735689600.0)
    assert name == "dflash-predeploy-20250101000000"
    assert remove == ["dflash-predeploy-20240101000000"]
    assert kept == ["dflash-predeploy-20240102000000", name]
    again = [*snaps, {"name": name, "snaptime": 30}]
    assert module.snapshot_plan(again, "dflash-predeploy", 5, 1735689600.0)[0] == f"{name}-2"


def test_devices_and_mounts_are_read_from_both_config_styles() -> None:
    module = load_module()
    api = parse(CONF).current.to_api()
    assert module.passed_devices(api) == {
        "/dev/nvidia0": "dev0: /dev/nvidia0,gid=44",
        "/dev/nvidia1": "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
    }
    assert module.cgroup_allows(api, 195, 1) and not module.cgroup_allows(api, 510, 0)
    assert module.mount_points(api)["/mnt/wheelhouse"] == {
        "key": "mp0", "source": "/srv/wheels", "read_only": True,
    }  # fmt: skip


def test_missing_prerequisites_skip_locally_and_fail_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        pytest_plugin._skip_or_fail("needs root")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set, so not skipping"):
        pytest_plugin._skip_or_fail("needs root")


def run_module_directly(args: dict, env: dict[str, str], tmp_path: Path) -> dict:
    """A real run of the module's code, outside Ansible (AnsibleModule reads a JSON args file)."""
    import json
    import os
    import subprocess
    import sys

    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, str(REPO / "library/dflash_proxmox.py"), str(args_file)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return json.loads(proc.stdout)


def test_https_token_comes_from_the_environment_and_is_never_shown(tmp_path: Path) -> None:
    from tests.testbed.sshd import free_port

    base = {"api_host": "127.0.0.1", "api_port": free_port(), "node": "pve", "vmid": 200}
    no_token = run_module_directly(base, {"PROXMOX_TOKEN_ID": "", "PROXMOX_TOKEN_SECRET": ""},
                                   tmp_path)  # fmt: skip
    assert no_token["failed"] is True
    assert "the https backend needs an API token" in no_token["msg"]
    secret = "5ecr3t-d0-n0t-pr1nt"
    env = {"PROXMOX_TOKEN_ID": "root@pam!deploy", "PROXMOX_TOKEN_SECRET": secret}
    result = run_module_directly(base, env, tmp_path)
    assert result["failed"] is True
    # without `requests` installed the https backend cannot load; with it, the port is closed
    assert ("requests" in result["msg"]) or ("cannot reach the Proxmox API" in result["msg"])
    assert secret not in json_dump(result)
    assert result["invocation"]["module_args"]["api_token_id"] == "root@pam!deploy"


def json_dump(data: object) -> str:
    import json

    return json.dumps(data)
