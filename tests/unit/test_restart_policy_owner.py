"""The restart policy has one owner, the supervisor (dflash/flags.py supervise_parser): its keys,
bounds and defaults are published by the release (`python -m dflash.flags describe
supervise`), judged by it before a deploy changes anything (`check supervise`, through
library/dflash_trainer_flags.py), and the toolkit only turns dflash_restart_policy's keys into
flags and names a refusal by the variable that made it (module_utils/dflash_run_spec.py)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_run_spec import (
    RunSpecError,
    supervise_flags,
    supervise_problems,
)
from dflash.supervision import supervisor as supervise
from dflash.supervision.record import Policy
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "library"))
import dflash_trainer_flags

FLAGS_PY = (REPO / "dflash" / "flags.py").read_text()


def described() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "dflash.flags", "describe", "supervise"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)["flags"]


def refusals(policy: dict, hang_after: object = "auto") -> list[str]:
    """What the release (this checkout's dflash/flags.py) refuses of run.sh's supervise flags,
    named as preflight names it."""
    argv = [word for group in supervise_flags(policy, hang_after) for word in group]
    out = subprocess.run(
        [sys.executable, "-m", "dflash.flags", "check", "supervise", *argv],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode in (0, 2), out.stderr
    return supervise_problems(out.stderr.splitlines(), policy, hang_after)


def test_the_supervisor_runs_with_the_defaults_it_publishes():
    flags = described()
    assert set(flags) == {"max_restarts", "window", "backoff", "backoff_max", "hang_after"}
    policy, _, _, _ = supervise.parse(["--root", "/r", "--run-id", "x", "--", "true"])
    assert policy == Policy(
        flags["max_restarts"]["default"], flags["window"]["default"],
        flags["backoff"]["default"], flags["backoff_max"]["default"], None,
    )  # fmt: skip
    assert flags["hang_after"]["default"] == "auto"


def test_the_docs_state_the_defaults_the_supervisor_publishes():
    said = " ".join((REPO / "docs" / "supervision.md").read_text().split())
    flags = described()
    for key in ("max_restarts", "window", "backoff", "backoff_max", "hang_after"):
        default = flags[key]["default"]
        text = f"{default:g}" if isinstance(default, float) else str(default)
        assert re.search(rf"\b{key} {re.escape(text)}\b", said), (key, text)


def test_run_sh_passes_only_the_keys_set_and_the_supervisor_fills_the_rest():
    groups = supervise_flags({"max_restarts": 2, "backoff": 3}, 45)
    assert groups == [["--backoff", "3"], ["--max-restarts", "2"], ["--hang-after", "45"]]
    # The inventory's order of the keys does not change run.sh.
    assert supervise_flags({"backoff": 3, "max_restarts": 2}, 45) == groups
    argv = [word for group in groups for word in group]
    policy, _, _, _ = supervise.parse([*argv, "--root", "/r", "--run-id", "x", "--", "true"])
    defaults = described()
    assert policy == Policy(2, defaults["window"]["default"], 3.0,
                            defaults["backoff_max"]["default"], 45.0)  # fmt: skip
    off = supervise_flags({"enabled": False, "max_restarts": 4, "window": 60}, "auto")
    assert off == [["--max-restarts", "0"], ["--window", "60"], ["--hang-after", "auto"]]


@pytest.mark.parametrize(
    ("policy", "hang_after", "named"),
    [
        (
            {"max_restart": 2}, "auto",
            "dflash_restart_policy.max_restart 2: no such key in this release's restart policy "
            "(did you mean dflash_restart_policy.max_restarts?)",
        ),
        ({"backoff": 0}, "auto", "dflash_restart_policy.backoff 0: '0' must be > 0.0"),
        ({"max_restarts": -1}, "auto", "dflash_restart_policy.max_restarts -1: '-1' must be >= 0"),
        ({"window": "hour"}, "auto", "dflash_restart_policy.window 'hour': 'hour' is not a number"),
        (
            {"backoff": 60, "backoff_max": 30}, "auto",
            "dflash_restart_policy.backoff_max 30 is under dflash_restart_policy.backoff 60",
        ),
        ({}, "soon", "dflash_hang_after 'soon': 'soon' is neither seconds nor auto"),
        ({}, 0, "dflash_hang_after 0: '0' must be seconds > 0, or auto"),
    ],
)  # fmt: skip
def test_each_bad_value_is_refused_by_the_supervisor_and_named_by_its_variable(
    policy, hang_after, named
):
    assert named in " ".join(refusals(policy, hang_after))


def test_good_values_pass_and_the_toolkits_own_key_is_checked_by_the_toolkit():
    assert refusals({"enabled": True, "window": 90.5, "max_restarts": 0}, 600) == []
    assert refusals({}, "auto") == []
    with pytest.raises(RunSpecError, match=r"dflash_restart_policy.enabled 'yes': true or false"):
        supervise_flags({"enabled": "yes"}, "auto")
    with pytest.raises(RunSpecError, match=r"dflash_restart_policy \[3\] must be a mapping"):
        supervise_flags([3], "auto")


def archive(folder: Path, flags_py: str | None) -> str:
    path = folder / "release.tar.gz"
    files = {"dflash/__init__.py": "", **({"dflash/flags.py": flags_py} if flags_py else {})}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_a_release_that_changes_its_policy_is_followed_without_an_edit(tmp_path):
    # A release whose supervisor grew a key and changed a default: the toolkit takes the key
    # as it takes any other and reports the release's default, with no change of its own.
    grown = FLAGS_PY.replace(
        '        default=10.0,\n        help="seconds before a restart',
        '        default=20.0,\n        help="seconds before a restart',
    ).replace(
        "    return parser\n\n\ndef supervise_problems",
        '    policy.add_argument("--grace", type=positive_float, default=30.0)\n'
        "    return parser\n\n\ndef supervise_problems",
    )
    assert grown.count("--grace") == 1 and "default=20.0" in grown
    (tmp_path / "grown").mkdir()
    (tmp_path / "now").mkdir()
    flags = [word for group in supervise_flags({"grace": 5}, "auto") for word in group]
    result = dflash_trainer_flags.check(archive(tmp_path / "grown", grown), [], flags)
    assert result["supervise"]["problems"] == []
    schema = result["supervise"]["schema"]["flags"]
    assert schema["grace"]["default"] == 30.0 and schema["backoff"]["default"] == 20.0

    now = dflash_trainer_flags.check(archive(tmp_path / "now", FLAGS_PY), [], flags)
    assert supervise_problems(now["supervise"]["problems"], {"grace": 5}, "auto") == [
        "dflash_restart_policy.grace 5: no such key in this release's restart policy"
    ]


def test_a_release_from_before_the_supervisors_policy_is_said_unchecked(tmp_path):
    # dflash/flags.py as it was before it held the supervisor's policy: train only.
    old = FLAGS_PY.replace('    "supervise": supervise_parser,\n', "")
    assert old != FLAGS_PY
    flags = ["--backoff", "0", "--hang-after", "auto"]
    result = dflash_trainer_flags.check(archive(tmp_path, old), [], flags)
    assert result["checked"] and result["supervise"] == {
        "checked": False, "problems": [], "schema": None,
    }  # fmt: skip
