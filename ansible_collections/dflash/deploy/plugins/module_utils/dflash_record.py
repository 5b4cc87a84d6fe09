# One deployment as a history.jsonl line (docs/history-diff.md): built from the
# release's manifest, run.sh and what the caller knows (lock, run.sh values, run id, tokens/s),
# and written by the step that makes it true (the launch once the trainer is healthy, the
# record step otherwise), once: a rerun or a second writer finds it there.
from __future__ import annotations

from datetime import UTC, datetime

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import (
    GOOD_RESULTS,
    last_deployment,
)
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_release import sha256_bytes
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_state import (
    append_history,
    read_history,
    read_run_script,
)

# What makes two lines the same deployment of a state root.
IDENTITY = ("release", "tree_sha256", "run_sh_sha256", "lock_id")


def history_entry(
    root: str, manifest: dict, fields: dict, *, release: str, action: str, result: str,
    previous: str | None, run_sh_text: str | None = None,
) -> dict:  # fmt: skip
    """The line: where the code came from (its manifest), the caller's fields, run.sh as
    deployed (its hash and its text, so a rollback can restore it exactly)."""
    entry = {key: manifest.get(key) for key in ("ref", "commit", "dirty")}
    entry.update(fields)
    if action == "export":
        pass  # an export runs no run.sh: the deployment's own line has it
    elif run_sh_text is None:
        run_sh = read_run_script(root)
        entry.update(run_sh_sha256=run_sh["sha256"], run_sh_text=run_sh["content"])
    else:
        entry.update(run_sh_sha256=sha256_bytes(run_sh_text.encode()), run_sh_text=run_sh_text)
    entry.update(
        time=datetime.now(UTC).isoformat(timespec="seconds"),
        action=action,
        release=release,
        tree_sha256=manifest.get("tree_sha256"),
        previous=previous,
        result=result,
    )
    return entry


def already_recorded(history: list[dict], entry: dict) -> bool:
    """Whether history already says that `entry` is what is deployed: the newest deployment
    line is of the same release, tree, run.sh and env, and (a launched trainer) of the same
    trainer run. Only the newest counts: a rollback to a release whose trainer still runs
    (after a staged deploy) is a new line, although that run was recorded once before."""
    if entry.get("result") not in GOOD_RESULTS:
        return False
    last = last_deployment(history)
    if last is None:
        return False
    run_id = entry.get("run_id")
    same_run = bool(run_id) and last.get("run_id") == run_id
    # A line that adopted a run after history lost its deployment (a rollback of an unrecorded
    # release) does not know the env's lock id; the same run is the same env.
    unknown = {"lock_id"} if same_run and last.get("lock_id") is None else set()
    if any(last.get(key) != entry.get(key) for key in IDENTITY if key not in unknown):
        return False
    return not run_id or same_run


def line_for(history: list[dict], entry: dict, repairs: bool = False) -> dict | None:
    """The line to append for `entry`, or None when history already has it. With `repairs`
    (this run changed the target and no line says so yet) a deployment history already has
    gets a line too, `repaired` naming what (the entry's `why`): every change a playbook
    makes has its line."""
    if not already_recorded(history, entry):
        return entry
    if repairs and entry.get("why"):
        return {**entry, "repaired": entry["why"]}
    return None


def record_once(root: str, entry: dict, repairs: bool = False) -> bool:
    """Append the line for `entry` (line_for) unless there is none; True when one was written."""
    line = line_for(read_history(root), entry, repairs)
    if line is None:
        return False
    append_history(root, line)
    return True
