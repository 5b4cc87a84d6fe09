"""Compile once for many hosts: with dflash_compile_cache=warm, one host per fingerprint
compiles and its cache is kept on the controller; the other hosts of that fingerprint, in the
same run or a later one, take it instead of compiling. A host of another build (here: other
flags of the compiled step) is refused the archive, is told why, and compiles its own."""

from __future__ import annotations

import functools
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import local_inventory, run_playbook, seed_target
from tests.integration.test_local_cache import COMPILED


def hosts_inventory(tmp_path: Path, names: tuple[str, ...], envs: Path, **per_host: dict) -> Path:
    """inventory/local.yml's host once per name, each with its own state root, seeded with the
    run's torch env (what is tested here is the compile cache, not the env build)."""
    inventory = local_inventory()
    hosts = inventory["all"]["children"]["dflash_targets"]["hosts"]
    base = hosts.pop("local")
    for name in names:
        seed_target(tmp_path / name, envs)
        hosts[name] = {**base, "dflash_root": str(tmp_path / name), **per_host.get(name, {})}
    path = tmp_path / f"inventory-{'-'.join(names)}.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def compiled_here(output: str, host: str) -> bool:
    return f"changed: [{host}] => (item=warming the CPU)" in output


def fx_entries(root: Path) -> dict[str, bytes]:
    [cache] = (root / "cache").iterdir()
    return {
        str(p.relative_to(cache)): p.read_bytes()
        for p in (cache / "fxgraph").rglob("*") if p.is_file()
    }  # fmt: skip


def cache_step(root: Path) -> dict:
    """What the newest deployment's history line says the deploy did with the compile cache."""
    lines = (root / "history.jsonl").read_text().splitlines()
    return json.loads(lines[-1])["compile_cache"]


@pytest.mark.timeout(3600)  # two compiles and two unpacks, on a loaded machine
def test_one_host_compiles_the_others_take_its_cache(tmp_path, trainer_repo, local_envs):
    store = tmp_path / "store"
    common = {
        "dflash_source_dir": str(trainer_repo), "dflash_ref": "v1", "dflash_launch": False,
        "dflash_compile_cache": "warm", "dflash_compile_cache_store": str(store),
        "dflash_trainer_args": COMPILED,
    }  # fmt: skip
    # A compile on a loaded 2-core machine: the warmup's own bound (1800 s), not the default 600.
    hosts = functools.partial(hosts_inventory, tmp_path, envs=local_envs)
    both = run_playbook("deploy.yml", common, inventory=hosts(("n1", "n2")), timeout=1800)
    assert both.rc == 0, both.output
    assert compiled_here(both.output, "n1") and not compiled_here(both.output, "n2"), both.output
    [archive] = store.iterdir()
    assert fx_entries(tmp_path / "n2") == fx_entries(tmp_path / "n1") != {}
    markers = [json.loads(next((tmp_path / n / "cache").iterdir()).joinpath("built-by.json")
               .read_text()) for n in ("n1", "n2")]  # fmt: skip
    assert markers[0] == markers[1]
    assert not list((tmp_path / "n2" / ".incoming").iterdir()), "the pushed archive was kept"
    assert [cache_step(tmp_path / n)["did"] for n in ("n1", "n2")] == ["compiled", "received"]

    # A host deployed later takes the kept archive: nothing is compiled.
    later = run_playbook("deploy.yml", common, inventory=hosts(("n3",)))
    assert later.rc == 0, later.output
    assert not compiled_here(later.output, "n3"), later.output
    assert fx_entries(tmp_path / "n3") == fx_entries(tmp_path / "n1")

    # An archive kept under this build's name that another build made (tampered or copied by
    # hand) is refused with the reason; the host compiles its own.
    with tarfile.open(archive) as tar:
        marker = json.load(tar.extractfile("built-by.json"))
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "built-by.json").write_text(json.dumps({**marker, "torch": "9.9.9"}))
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(forged / "built-by.json", arcname="built-by.json")
    refused = run_playbook("deploy.yml", common, inventory=hosts(("n4",)), timeout=1800)
    assert refused.rc == 0, refused.output
    assert "n4 does not take" in refused.output and "torch 9.9.9" in refused.output
    assert compiled_here(refused.output, "n4")
    assert cache_step(tmp_path / "n4") == {
        "dir": str(next((tmp_path / "n4" / "cache").iterdir())), "did": "compiled",
        "moved_aside": [],
    }  # fmt: skip
