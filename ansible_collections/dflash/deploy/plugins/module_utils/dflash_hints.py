# The commands a fix hint names, decided in one place: each restores what history recorded for
# the current release, never whatever the controller's working tree holds today (after a
# rollback, a plain deploy.yml would replace the rolled-back release). Standard library only.
from __future__ import annotations

import re

WORKTREE = "WORKTREE"  # a manifest's `ref` when the release was built from a working tree
_COMMIT_RELEASE = re.compile(r"^g[0-9a-f]{12}$")


def restart_command(facts: dict, restart: bool = False) -> str:
    """Start the current release again as its deployment recorded it (its env, its exact
    run.sh, whatever -e settings it was made with): a rollback to the release that is current,
    which keeps it current; `restart` replaces a trainer that runs (hung, stale, two)."""
    release = (facts.get("current") or {}).get("release")
    forced = " -e dflash_restart=true" if restart else ""
    return f"ansible-playbook rollback.yml -e dflash_release={release}{forced}"


def redeploy_command(facts: dict) -> str:
    """Put the current release's files back as its manifest lists them: a deploy of the ref
    that builds that same release id (its tag, or its commit for a g<commit12> release). A
    release built from a dirty working tree (wt-<tree12>) has no ref that builds it again."""
    current = facts.get("current") or {}
    release = current.get("release")
    manifest = current.get("manifest") or {}
    if release and manifest.get("ref") == release:  # a tag
        return f"ansible-playbook deploy.yml -e dflash_ref={release}"
    if release and _COMMIT_RELEASE.match(release):
        return f"ansible-playbook deploy.yml -e dflash_ref={release[1:]}"
    return (
        f"ansible-playbook deploy.yml from the checkout whose dflash/ is release {release} "
        "(built from a working tree: no tag or commit names it), or roll back to another "
        "release with rollback.yml -e dflash_release=<id from history.yml>"
    )


def stopped_on_purpose(facts: dict) -> dict | None:
    """The trainer stop.yml stopped, and nothing started since: who stopped it, when, and the
    command that starts it again as recorded; None otherwise."""
    trainers = facts.get("trainers") or {}
    record = trainers.get("record") or {}
    if trainers.get("processes") or not record.get("stopped_by"):
        return None
    return {
        "by": record["stopped_by"],
        "at": record.get("stopped_at"),
        "release": (facts.get("current") or {}).get("release"),
        "hint": restart_command(facts),
    }
