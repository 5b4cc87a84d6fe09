"""run.sh as the runscript role renders it: the documented field layout, shellcheck-clean,
and hostile values passed through verbatim (no breakage, no injection)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_playbook

# The real field layout of the Proxmox example (README, inventory/proxmox.example.yml).
FIELD = {
    "dflash_target_gpus": "0-4",
    "dflash_drafter_gpus": "5-7",
    "dflash_trainer_args": {
        "target_model": "/models/Qwen3-8B",
        "token_budget": 49152,
        "max_seq_len": 8192,
        "compile_drafter": False,
    },
    "dflash_trainer_env": {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
        "CUDA_MODULE_LOADING": "LAZY",
    },
}
# argv[1:] and the environment as the program exec'd by run.sh sees them.
FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, sys
json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()},
          open(os.environ["CAPTURE"], "w"))
"""


def render(tmp_path: Path, check: bool = False, **variables) -> tuple[object, Path]:
    root = tmp_path / "root"
    (root / "releases" / "r1").mkdir(parents=True, exist_ok=True)
    if not (root / "current").exists():
        (root / "current").symlink_to("releases/r1")
    python = tmp_path / "fake-python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    base = {
        "dflash_root": str(root),
        "dflash_runscript_python": str(python),
        "dflash_runscript_cache_dir": str(root / "cache" / "fp"),
        "dflash_target_gpus": [],
        "dflash_drafter_gpus": [],
        "dflash_trainer_args": {},
        "dflash_trainer_env": {},
    }
    base.update(variables)
    return run_playbook("tests/playbooks/render_runscript.yml", base, check=check), root / "run.sh"


def execute(run_sh: Path, tmp_path: Path) -> dict:
    """What run.sh executes: the supervisor's flags under `supervise`, and under `argv` the
    trainer command it supervises, after the interpreter (as if run.sh exec'd it directly)."""
    capture = tmp_path / "capture.json"
    env = {"PATH": os.environ["PATH"], "DFLASH_RUN_ID": "run-1", "CAPTURE": str(capture)}
    subprocess.run(["bash", str(run_sh)], env=env, check=True)
    seen = json.loads(capture.read_text())
    argv = seen["argv"]
    assert argv[:2] == ["-m", "dflash.supervise"], argv
    split = argv.index("--")
    assert argv[split + 1] == str(tmp_path / "fake-python"), argv
    return {**seen, "supervise": argv[2:split], "argv": argv[split + 2 :]}


def test_field_layout_renders_as_documented(tmp_path):
    run, run_sh = render(tmp_path, **FIELD)
    assert run.rc == 0, run.output
    seen = execute(run_sh, tmp_path)
    argv = seen["argv"]
    assert argv[:4] == ["-m", "torch.distributed.run", "--nproc-per-node", "8"]
    # One node: a free rendezvous port (torchrun's fixed 29500 clashed with a second trainer
    # on the same GPU machine: EADDRINUSE, seen in bench/gpu_path.py's run).
    assert argv[4] == "--standalone"
    module = argv.index("-m", 1)
    train = argv[module + 1 :]
    assert train[0] == "dflash.train"
    pairs = dict(zip(train[1::2], train[2::2], strict=False))
    assert pairs["--target-gpus"] == "0,1,2,3,4"
    assert pairs["--drafter-gpus"] == "5,6,7"
    assert pairs["--token-budget"] == "49152" and pairs["--max-seq-len"] == "8192"
    assert "--compile-drafter" not in train
    assert (
        seen["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:512"
    )
    assert seen["env"]["CUDA_MODULE_LOADING"] == "LAZY"
    assert seen["env"]["TORCHINDUCTOR_CACHE_DIR"].endswith("/cache/fp")
    assert seen["env"]["TRITON_CACHE_DIR"].endswith("/cache/fp/triton")
    assert seen["env"]["DFLASH_ROOT"] == str(tmp_path / "root")
    # torchrun waits as long as the toolkit does (dflash_stop_timeout) before killing ranks.
    assert seen["env"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "60"
    assert seen["cwd"] == str(tmp_path / "root" / "releases" / "r1")


def test_an_edited_run_sh_is_shown_in_check_mode_then_written_back_whole(tmp_path):
    run, run_sh = render(tmp_path, **FIELD)
    assert run.rc == 0 and run.changed("localhost") == 1, run.output
    rendered = run_sh.read_text()
    run_sh.write_text(rendered.replace("--token-budget", "--token-budgt"))
    run_sh.chmod(0o644)

    check, _ = render(tmp_path, check=True, **FIELD)
    assert check.rc == 0 and check.changed("localhost") == 1, check.output
    # --diff names the line that comes back; check mode leaves the file as it is.
    assert "-  --token-budgt 49152" in check.output, check.output
    assert "+  --token-budget 49152" in check.output, check.output
    assert "--token-budgt" in run_sh.read_text() and run_sh.stat().st_mode & 0o777 == 0o644

    fixed, _ = render(tmp_path, **FIELD)
    assert fixed.rc == 0 and fixed.changed("localhost") == 1, fixed.output
    assert run_sh.read_text() == rendered and run_sh.stat().st_mode & 0o777 == 0o755
    assert not [p.name for p in run_sh.parent.iterdir() if p.name.startswith(".run.sh.")]
    again, _ = render(tmp_path, **FIELD)
    assert again.rc == 0 and again.changed("localhost") == 0, again.output


def test_a_multi_node_rendezvous_is_the_users_not_standalone(tmp_path):
    rendezvous = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node1:29400"]
    run, run_sh = render(tmp_path, **FIELD, dflash_torchrun_args=rendezvous)
    assert run.rc == 0, run.output
    argv = execute(run_sh, tmp_path)["argv"]
    assert "--standalone" not in argv
    assert argv[4:10] == rendezvous


def test_a_job_gets_the_rendezvous_its_plan_derives(tmp_path):
    job = {"name": "j1", "hosts": ["a", "b"], "nnodes": 2, "world_size": 16,
           "rdzv_id": "j1-0123456789ab", "endpoint": "10.0.0.11:29400", "address": "10.0.0.12",
           "is_host": False}  # fmt: skip
    run, run_sh = render(tmp_path, **FIELD, dflash_runscript_job=job)
    assert run.rc == 0, run.output
    argv = execute(run_sh, tmp_path)["argv"]
    assert "--standalone" not in argv
    assert argv[4:16] == [
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.11:29400",
        "--rdzv-id", "j1-0123456789ab", "--rdzv-conf", "is_host=0", "--local-addr", "10.0.0.12",
    ]  # fmt: skip


HOSTILE = [
    "two words",
    'it\'s "quoted"',
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker}",
    "line1\nline2",
    "--checkpoint-dir=/etc",
    "$HOME ${{PATH}} \\ * ?",
]


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_hostile_values_pass_verbatim_and_shellcheck_is_clean(tmp_path):
    marker = tmp_path / "injected"
    values = [v.format(marker=marker) for v in HOSTILE]
    args = {f"flag_{i}": value for i, value in enumerate(values)}
    env = {f"VAR_{i}": value for i, value in enumerate(values)}
    run, run_sh = render(tmp_path, dflash_trainer_args=args, dflash_trainer_env=env)
    assert run.rc == 0, run.output
    check = subprocess.run(["shellcheck", str(run_sh)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    seen = execute(run_sh, tmp_path)
    assert not marker.exists(), "a value ran as a command"
    for i, value in enumerate(values):
        position = seen["argv"].index(f"--flag-{i}")
        assert seen["argv"][position + 1] == value
        assert seen["env"][f"VAR_{i}"] == value
    # The toolkit's own flags come last and cannot be overridden by a value.
    assert seen["argv"][-6:] == [
        "--checkpoint-dir", f"{tmp_path}/root/checkpoints",
        "--status-file", f"{tmp_path}/root/runs/run-1/status.json",
        "--run-id", "run-1",
    ]  # fmt: skip


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_cpu_layout_runs_python_directly_and_is_shellcheck_clean(tmp_path):
    run, run_sh = render(tmp_path, dflash_trainer_args={"target_model": "tiny"})
    assert run.rc == 0, run.output
    assert subprocess.run(["shellcheck", str(run_sh)]).returncode == 0
    seen = execute(run_sh, tmp_path)
    assert seen["argv"][:4] == ["-m", "dflash.train", "--target-model", "tiny"]
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in seen["env"]


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"dflash_target_gpus": "0-4", "dflash_drafter_gpus": "4-7"}, "GPU [4] is in both"),
        ({"dflash_target_gpus": "0-x", "dflash_drafter_gpus": "5"}, "'0-x' is not a GPU"),
        ({"dflash_target_gpus": [0, 0], "dflash_drafter_gpus": [1]}, "more than once"),
        ({"dflash_target_gpus": [0], "dflash_drafter_gpus": []}, "give both"),
        (
            {"dflash_target_gpus": [0, 1], "dflash_drafter_gpus": [0], "dflash_colocated": True},
            "colocated mode runs both",
        ),
        (
            {"dflash_target_gpus": [0], "dflash_drafter_gpus": [9], "dflash_test_visible": [0, 1]},
            "GPU [9] is not visible",
        ),
        ({"dflash_trainer_args": {"run_id": "x"}}, "which the toolkit sets itself"),
        ({"dflash_trainer_args": {"Bad-Flag": 1}}, "'Bad-Flag' is not a flag name"),
        ({"dflash_trainer_env": {"A B": "1"}}, "'A B' is not an environment variable name"),
        ({"dflash_trainer_env": {"DFLASH_ROOT": "/x"}}, "which run.sh sets itself"),
    ],
)
def test_bad_layouts_and_values_are_refused(tmp_path, variables, expected):
    run, run_sh = render(tmp_path, **variables)
    assert run.rc != 0
    assert expected in " ".join(run.output.split())
    assert not run_sh.exists()


def test_the_restart_policy_is_the_supervisors_flags(tmp_path):
    run, run_sh = render(
        tmp_path, dflash_trainer_args={"target_model": "tiny"},
        dflash_restart_policy={"max_restarts": 2, "backoff": 3}, dflash_hang_after="45",
    )  # fmt: skip
    assert run.rc == 0, run.output
    flags = execute(run_sh, tmp_path)["supervise"]
    # Only the keys set: the supervisor keeps its own defaults for the rest
    # (tests/unit/test_restart_policy_owner.py).
    assert flags == ["--backoff", "3", "--max-restarts", "2", "--hang-after", "45"]
    off, run_sh = render(tmp_path, dflash_trainer_args={"target_model": "tiny"},
                         dflash_restart_policy={"enabled": False})  # fmt: skip
    assert off.rc == 0, off.output
    assert execute(run_sh, tmp_path)["supervise"][:2] == ["--max-restarts", "0"]


# The toolkit's own key; the supervisor's keys and values are judged by the release being
# deployed (test_local_bad_input.py, tests/unit/test_restart_policy_owner.py).
@pytest.mark.parametrize(
    ("variables", "named"),
    [({"dflash_restart_policy": {"enabled": "sometimes"}}, "dflash_restart_policy.enabled")],
)
def test_a_bad_restart_policy_is_named(tmp_path, variables, named):
    run, run_sh = render(tmp_path, dflash_trainer_args={"target_model": "tiny"}, **variables)
    assert run.rc != 0 and named in run.output, run.output
    assert not run_sh.exists()


def test_trainer_args_add_to_the_defaults_flag_by_flag(tmp_path):
    """-e dflash_trainer_args={checkpoint_every: 20} keeps the default target_model: tiny; null
    leaves a default's flag out; a flag set wins over its default."""
    run, run_sh = render(tmp_path, dflash_trainer_args={"checkpoint_every": 20})
    assert run.rc == 0, run.output
    argv = execute(run_sh, tmp_path)["argv"]
    assert argv[:6] == ["-m", "dflash.train", "--target-model", "tiny", "--checkpoint-every", "20"]
    run, run_sh = render(tmp_path, dflash_trainer_args={"target_model": None, "seed": 3})
    assert run.rc == 0, run.output
    argv = execute(run_sh, tmp_path)["argv"]
    assert "--target-model" not in argv and argv[:4] == ["-m", "dflash.train", "--seed", "3"]
    run, run_sh = render(tmp_path, dflash_trainer_args={"target_model": "/models/Qwen3-8B"})
    assert run.rc == 0, run.output
    assert execute(run_sh, tmp_path)["argv"][2:4] == ["--target-model", "/models/Qwen3-8B"]
