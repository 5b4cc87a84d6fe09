"""Bad input fails before anything changes on the target, naming the value and the fix."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, git_source, run_playbook, seed_target

V1 = {"dflash/__init__.py": "VERSION = 1\n"}
# The real flag definitions, so preflight checks trainer flags with this release's parser.
WITH_FLAGS = {**V1, "dflash/flags.py": (REPO / "dflash" / "flags.py").read_text()}


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under the root with its content (files) or link text (links)."""
    state: dict[str, bytes | str] = {}
    if not root.exists():
        return state
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if rel.startswith("envs/"):
            continue  # the seeded torch env: large, and never touched before the env step
        if rel == ".deploy.generation":
            continue  # the deploy lock's count of takes: a refused rollback took the lock too
        if path.is_symlink():
            state[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            state[rel] = path.read_bytes()
        else:
            state[rel] = "dir"
    return state


def git_commit(repo: Path, files: dict[str, str], tag: str) -> None:
    """A tagged commit of `files` on the shared source, then HEAD back where it was: the
    other cases deploy HEAD."""
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", tag], check=True)
    subprocess.run([*git, "tag", tag], check=True)
    subprocess.run([*git, "reset", "-q", "--hard", "HEAD~1"], check=True)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory, local_envs: Path) -> dict[str, str]:
    """One target with v1 deployed, shared by every bad-input case: each must leave it exactly
    as it was (the snapshot says so), so sharing it costs no independence."""
    base = tmp_path_factory.mktemp("bad-input")
    repo = git_source(base / "source")("v1", WITH_FLAGS)
    root = base / "target" / "dflash"
    seed_target(root, local_envs)
    variables = {
        "dflash_root": str(root), "dflash_source_dir": str(repo), "dflash_launch": False,
        "dflash_verify_json": str(base / "verify.json"),
    }  # fmt: skip
    run = run_playbook("deploy.yml", {**variables, "dflash_ref": "v1"})
    assert run.rc == 0, run.output
    return variables


@pytest.mark.parametrize(
    ("playbook_name", "variables", "expected"),
    [
        ("deploy.yml", {"dflash_ref": "v9.9"}, ["dflash_ref 'v9.9'", "git tag"]),
        ("rollback.yml", {"dflash_release": "a/b"}, ["'a/b'", "contains '/'"]),
        ("rollback.yml", {"dflash_release": "v1..x"}, ["'v1..x'", "contains '..'"]),
        ("rollback.yml", {"dflash_release": "v 1"}, ["'v 1'", "whitespace"]),
        ("rollback.yml", {"dflash_release": "v7"}, ["Unknown rollback target 'v7'", "v1"]),
        ("rollback.yml", {}, ["no earlier deployment", "dflash_release=<id>"]),
        ("deploy.yml", {"dflash_keep_releases": 0}, ["dflash_keep_releases=0", "1 or more"]),
        # The wrong type, refused by the dflash role's argument spec before any task runs.
        (
            "deploy.yml",
            {"dflash_keep_releases": "many"},
            ["argument 'dflash_keep_releases' is of type str and we were unable to convert to int"],
        ),
        (
            "rollback.yml",
            {"dflash_health_steps": "x", "dflash_restart": "maybe"},
            [
                "'dflash_health_steps' is of type str and we were unable to convert to int",
                "'dflash_restart' is of type str and we were unable to convert to bool",
            ],
        ),
        # What the trainer itself would refuse at start, refused by its own parser first.
        (
            "deploy.yml",
            {"dflash_trainer_args": {"target_model": "tiny", "max_stepz": 3}},
            ["unknown flag --max-stepz (did you mean --max-steps?)", "python -m dflash.train"],
        ),
        (
            "deploy.yml",
            {"dflash_trainer_args": {"target_model": "tiny", "seed": "$(id)"}},
            ["argument --seed: '$(id)' is not an integer"],
        ),
        # The restart policy, judged by the release's supervisor and named by its variable.
        (
            "deploy.yml",
            {"dflash_restart_policy": {"max_restart": 2}},
            [
                "dflash_restart_policy on local: python -m dflash.supervise of release",
                "dflash_restart_policy.max_restart 2: no such key in this release's restart "
                "policy (did you mean dflash_restart_policy.max_restarts?)",
                "python -m dflash.flags describe supervise lists the keys",
            ],
        ),
        (
            "deploy.yml",
            {"dflash_restart_policy": {"backoff": 60, "backoff_max": 30}},
            ["dflash_restart_policy.backoff_max 30 is under dflash_restart_policy.backoff 60"],
        ),
        # A typo in a variable name, refused by every playbook; outside the dflash_ prefix too.
        (
            "deploy.yml",
            {"dflash_keep_release": 3},
            [
                "dflash_keep_release is set but unknown",
                "did you mean dflash_keep_releases?",
                "Nothing was changed: correct the name where it is set",
                "a warning instead with dflash_strict_vars: false",
            ],
        ),
        (
            "deploy.yml",
            {"dlfash_ref": "v1"},
            ["dlfash_ref is set but unknown to dflash-deploy (did you mean dflash_ref?)"],
        ),
        ("deploy.yml", {"dflash_dta": "/data/store"}, ["dflash_dta", "did you mean dflash_data?"]),
        ("rollback.yml", {"dflash_relase": "v1"}, ["did you mean dflash_release?"]),
        (
            "verify.yml",
            {"dflash_verfy_json": "/tmp/v.json"},
            ["dflash_verfy_json is set but unknown", "did you mean dflash_verify_json?"],
        ),
        ("history.yml", {"dflash_report": "html"}, ["dflash_report is set but unknown"]),
        ("diff.yml", {"dflash_form": 1}, ["dflash_form is set but unknown"]),
        ("export.yml", {"dflash_export_dri": "/tmp/x"}, ["dflash_export_dri is set but unknown"]),
        ("playbooks/stop.yml", {"dflash_stop_timout": 5}, ["did you mean dflash_stop_timeout?"]),
        (
            "playbooks/wheelhouse.yml",
            {"dflash_wheelhose": "/tmp/w"},
            ["dflash_wheelhose is set but unknown"],
        ),
        # A list or mapping given as a string (-e dflash_trainer_args=max_steps=100): the spec
        # takes 'k=v' for a mapping and 'a,b' for a list, the dflash role's first task does not.
        (
            "deploy.yml",
            {"dflash_trainer_args": "max_steps=100"},
            [
                "dflash_trainer_args must be a mapping of flag: value, got the string "
                """'max_steps=100'; e.g. -e '{"dflash_trainer_args": {"max_steps": 100}}'""",
            ],
        ),
        (
            "rollback.yml",
            {"dflash_trainer_env": "NCCL_DEBUG=INFO", "dflash_protect_releases": "v1"},
            [
                "dflash_protect_releases must be a list of release names, got the string 'v1'; "
                """e.g. -e '{"dflash_protect_releases": ["v1"]}'""",
                "dflash_trainer_env must be a mapping of NAME: value, got the string "
                """'NCCL_DEBUG=INFO'; e.g. -e '{"dflash_trainer_env": {"NCCL_DEBUG": "WARN"}}'""",
            ],
        ),
    ],
)
def test_bad_input_changes_nothing(deployed, playbook_name, variables, expected):
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    run = run_playbook(playbook_name, {**deployed, **variables})
    assert run.rc != 0
    for text in expected:
        assert text in run.output.replace("\n", " ").replace("  ", " ") or text in run.output, (
            text,
            run.output,
        )
    assert snapshot(root) == before


def test_tag_that_cannot_be_a_release_name(source_repo, playbook, target_root):
    repo = source_repo("", V1)
    subprocess.run(["git", "-C", str(repo), "tag", "feature/x"], check=True)
    run = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="feature/x")
    assert run.rc != 0
    assert "release id 'feature/x'" in run.output and "plain name" in run.output
    assert not (target_root / "releases").exists()
    assert not (target_root / "current").exists()


def test_missing_sandbox_parent(source_repo, playbook, tmp_path):
    repo = source_repo("v1", V1)
    missing = tmp_path / "no-such-parent" / "dflash"
    run = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_root=str(missing))
    assert run.rc != 0
    assert f"dflash_root '{missing}'" in run.output and "does not exist" in run.output
    assert not missing.parent.exists()


def test_moved_tag_is_refused(source_repo, playbook, target_root):
    repo = source_repo("v1", V1)
    assert playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1").rc == 0
    source_repo("", {"dflash/__init__.py": "VERSION = 'moved'\n"})
    subprocess.run(["git", "-C", str(repo), "tag", "-f", "v1"], check=True, capture_output=True)
    before = snapshot(target_root)
    run = playbook("deploy.yml", dflash_source_dir=str(repo), dflash_ref="v1")
    assert run.rc != 0
    assert "the tag was moved" in run.output
    assert snapshot(target_root) == before


def test_a_lock_wheel_the_wheelhouse_lacks_is_refused_first(deployed, local_lock):
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    lock = {**local_lock, "wheels": {**local_lock["wheels"], "nosuch-package": "1.0"}}
    lock["sha256"] = {**local_lock["sha256"], "nosuch-package": "0" * 64}
    lock["source"] = {"wheelhouse": str(REPO / ".build" / "wheelhouse")}
    run = run_playbook("deploy.yml", {**deployed, "dflash_env_lock": lock})
    assert run.rc != 0
    assert (
        "the lock pins nosuch-package==1.0" in run.text and "playbooks/wheelhouse.yml" in run.text
    )
    assert snapshot(root) == before


def test_with_strict_vars_off_unknown_names_and_code_changing_env_are_warnings(deployed):
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    run = run_playbook(
        "deploy.yml",
        {**deployed, "dflash_restrat": True, "dlfash_ref": "v1", "dflash_strict_vars": False,
         "dflash_trainer_env": {"LD_PRELOAD": "/x.so"}},
        check=True,
    )  # fmt: skip
    assert run.rc == 0, run.output
    for typo, meant in (("dflash_restrat", "dflash_restart"), ("dlfash_ref", "dflash_ref")):
        warning = f"[WARNING]: {typo} is set but unknown to dflash-deploy"
        assert f"{warning} (did you mean {meant}?)" in run.text
    # The inventory's and Ansible's own variables (ansible_connection, inventory_dir, ...) are
    # far from every dflash name.
    assert run.text.count("is set but unknown to dflash-deploy") == 2, run.output
    assert "dflash_trainer_env sets LD_PRELOAD='/x.so'" in run.text
    # Every variable's type is checked once per play, by the dflash role, not once per role.
    assert run.output.count("Validating arguments against arg spec") == 1, run.output
    assert snapshot(root) == before


def test_code_changing_env_is_refused_by_default_unless_allowed(deployed):
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    strict = {**deployed, "dflash_trainer_env": {"LD_PRELOAD": "/x.so"}}
    run = run_playbook("deploy.yml", strict)
    assert run.rc != 0
    assert "dflash_trainer_env sets LD_PRELOAD='/x.so'" in run.text, run.output
    assert "dflash_trainer_env_allow: [LD_PRELOAD]" in run.text
    assert snapshot(root) == before
    # Listed as meant: neither refused nor warned about.
    allowed = run_playbook(
        "deploy.yml", {**strict, "dflash_trainer_env_allow": ["LD_PRELOAD"]}, check=True
    )
    assert allowed.rc == 0, allowed.output
    assert "dflash_trainer_env sets LD_PRELOAD" not in allowed.text
    assert snapshot(root) == before


def test_a_read_only_state_root_is_refused_before_any_change(deployed, tmp_path):
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    mount = ["mount", "--bind", str(root), str(root)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
        run = run_playbook("deploy.yml", deployed)
    finally:
        subprocess.run(["umount", str(root)], check=True)
    assert run.rc != 0
    # Preflight's probe says it, before the deploy lock (which needs a writable root) is taken.
    flat = " ".join(run.output.split())
    assert f"dflash_root '{root}' on local is not writable: creating a file in" in flat, run.output
    assert "failed (Read-only file system)" in flat, run.output
    assert snapshot(root) == before


def test_a_release_whose_package_does_not_import_is_refused_first(deployed):
    root = Path(deployed["dflash_root"])
    repo = Path(deployed["dflash_source_dir"])
    git_commit(repo, {"dflash/__init__.py": "raise RuntimeError('boom at import')\n"}, "broken")
    before = snapshot(root)
    run = run_playbook("deploy.yml", {**deployed, "dflash_ref": "broken"})
    assert run.rc != 0
    flat = " ".join(run.output.split())
    assert "this release's package does not even import" in flat, run.output
    assert "boom at import" in flat and "Nothing was changed on the target" in flat
    assert snapshot(root) == before


def test_a_truncated_store_is_refused_with_the_command_that_prepares_it_again(deployed, tmp_path):
    """The fix names the env by its lock id and prepares with --force over the store there
    (a plain prepare refuses an existing folder)."""
    from dflash.data.prepare import prepare
    from dflash.data.records import Settings

    records = tmp_path / "a.jsonl"
    records.write_text('{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}\n' * 8)
    store = tmp_path / "store"
    prepare([records], store, Settings(64, 128, None), say=lambda _: None)
    tokens = next(store.glob("tokens*"))
    tokens.write_bytes(tokens.read_bytes()[:-4])
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    run = run_playbook("deploy.yml", {**deployed, "dflash_data": str(store)})
    assert run.rc != 0
    flat = " ".join(run.output.split())
    assert f"dflash_data '{store}' on local: {tokens.name} holds " in flat, flat
    assert "/envs/lock-" in flat and f"-m dflash.data prepare --force --out {store} " in flat
    assert snapshot(root) == before


def test_a_store_the_release_does_not_read_is_refused_by_the_releases_own_format(
    deployed, tmp_path
):
    """The store format is the release's own (python -m dflash.contracts): a release whose
    trainer reads store version 2 refuses a version-1 store before any change, and the toolkit
    follows it without an edit of its own."""
    from dflash.data.prepare import prepare
    from dflash.data.records import Settings

    root = Path(deployed["dflash_root"])
    repo = Path(deployed["dflash_source_dir"])
    package = {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "dflash").rglob("*.py")}
    store_format = "dflash/data/store_format.py"
    package[store_format] = package[store_format].replace("\nVERSION = 1\n", "\nVERSION = 2\n")
    assert "VERSION = 2" in package[store_format]
    git_commit(repo, package, "store-v2")
    records = tmp_path / "a.jsonl"
    records.write_text('{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}\n' * 8)
    store = tmp_path / "store"
    prepare([records], store, Settings(64, 128, None), say=lambda _: None)
    before = snapshot(root)
    run = run_playbook(
        "deploy.yml", {**deployed, "dflash_ref": "store-v2", "dflash_data": str(store)}
    )
    assert run.rc != 0
    flat = " ".join(run.output.split())
    assert (
        f"dflash_data '{store}' on local: the store is dflash-token-store version 1, the release "
        "reads dflash-token-store version 2 (release store-v2, python -m dflash.contracts)"
    ) in flat, run.output
    assert f"-m dflash.data prepare --force --out {store} FILE.jsonl" in flat
    assert snapshot(root) == before


def test_a_lock_without_hashes_is_refused_with_the_fix_unless_allowed(deployed, local_lock):
    """A version alone does not say which file was built: a deploy refuses the lock before any
    change, naming the wheels and both ways out; dflash_env_lock_unhashed lets it through."""
    root = Path(deployed["dflash_root"])
    before = snapshot(root)
    lock = {key: value for key, value in local_lock.items() if key != "sha256"}
    run = run_playbook("deploy.yml", {**deployed, "dflash_env_lock": lock})
    assert run.rc != 0
    assert f"pins {len(local_lock['wheels']) + 1} wheel(s) without a sha256" in run.text, run.output
    assert "make env-lock SPEC=" in run.text and "dflash_env_lock_unhashed: true" in run.text
    assert snapshot(root) == before
    # The same lock, allowed: its env is the one deployed (the hashes are part of the lock's
    # id, so a new env would be built): check mode says so and changes nothing.
    allowed = run_playbook(
        "deploy.yml", {**deployed, "dflash_env_lock": lock, "dflash_env_lock_unhashed": True},
        check=True,
    )  # fmt: skip
    assert allowed.rc == 0, allowed.output
    assert "without a sha256" not in allowed.text
    assert snapshot(root) == before
