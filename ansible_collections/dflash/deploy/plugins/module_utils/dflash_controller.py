"""Who made a deployment: history records the controller of every line (dflash_controller: user,
host, toolkit commit, checkout folder, origin remote); a deploy says so when the running
deployment came from another controller, or another checkout on the same one, which the deploy
lock serializes but which its user would not otherwise see."""

from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_lines import last_deployment

# What tells two controllers apart (a toolkit commit differs between two pulls of one checkout).
WHO = ("user", "host", "checkout")


def describe(controller: dict) -> str:
    """`user@host:checkout (remote), toolkit commit abc1234`, with what is known."""
    where = f"{controller.get('user') or '?'}@{controller.get('host') or '?'}"
    if controller.get("checkout"):
        where += f":{controller['checkout']}"
    if controller.get("remote"):
        where += f" ({controller['remote']})"
    if controller.get("toolkit_commit"):
        where += f", toolkit commit {str(controller['toolkit_commit'])[:12]}"
    return where


def other_controller(state: dict, controller: dict) -> str:
    """The line a deploy says when history's newest deployment was made by another controller
    than `controller` (this run's), else "". A line recorded before checkouts were (no
    `checkout`) is compared by user and host only."""
    last = last_deployment(state.get("history") or []) or {}
    theirs = last.get("controller") or {}
    if not theirs:
        return ""
    keys = [key for key in WHO if theirs.get(key) is not None]
    if all(theirs.get(key) == controller.get(key) for key in keys):
        return ""
    return (
        f"The running deployment (release {last.get('release')}, {last.get('time')}) was made "
        f"by another controller: {describe(theirs)}; this run is {describe(controller)}. Both "
        "deploy to this state root: the newer deploy wins (history.yml lists who made each)."
    )
