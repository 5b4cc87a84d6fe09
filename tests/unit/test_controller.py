"""Who made the running deployment: a deploy names another controller (or another checkout on
the same one), and only then (module_utils/dflash_controller.py)."""

from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_controller import (
    describe,
    other_controller,
)

MINE = {"user": "ana", "host": "ws-1", "toolkit_commit": "1111111", "checkout": "/home/ana/dd",
        "remote": "https://git.example/dd.git"}  # fmt: skip


def state_made_by(controller: dict | None) -> dict:
    entry = {"action": "deploy", "result": "healthy", "release": "v6",
             "time": "2026-12-06T10:00:00+00:00"}  # fmt: skip
    if controller is not None:
        entry["controller"] = controller
    return {"history": [entry, {"action": "restart", "result": "restarted"}]}


def test_the_same_controller_and_checkout_say_nothing():
    assert other_controller(state_made_by(MINE), MINE) == ""
    # A newer toolkit commit of the same checkout is the same controller.
    assert other_controller(state_made_by({**MINE, "toolkit_commit": "2222222"}), MINE) == ""


def test_a_history_without_controllers_says_nothing():
    assert other_controller({"history": []}, MINE) == ""
    assert other_controller(state_made_by(None), MINE) == ""
    # A line from before checkouts were recorded is judged by user and host.
    old = {"user": "ana", "host": "ws-1", "toolkit_commit": "0000000"}
    assert other_controller(state_made_by(old), MINE) == ""


def test_another_checkout_or_host_is_named_with_this_run():
    second = {**MINE, "checkout": "/home/ana/dd-copy", "remote": None}
    said = other_controller(state_made_by(second), MINE)
    assert said.startswith("The running deployment (release v6, 2026-12-06T10:00:00+00:00) was")
    assert "another controller: ana@ws-1:/home/ana/dd-copy, toolkit commit 1111111;" in said
    assert f"this run is {describe(MINE)}." in said
    ci = {"user": "ci", "host": "runner-1"}
    assert "another controller: ci@runner-1; this run is" in other_controller(
        state_made_by(ci), MINE
    )


def test_describe_says_what_is_known():
    assert describe(MINE) == (
        "ana@ws-1:/home/ana/dd (https://git.example/dd.git), toolkit commit 1111111"
    )
    assert describe({}) == "?@?"
