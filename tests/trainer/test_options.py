"""GPU lists and flag validation: every bad value gets a message naming it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from dflash.config import StepConfig, TrainConfig
from dflash.errors import ConfigError
from dflash.flags import COMPILED
from dflash.flags import train_parser as build_parser
from dflash.topology import parse_gpu_list, resolve_roles
from dflash.warmup import build_parser as warmup_parser

from .conftest import run_module


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", []), ("0-4", [0, 1, 2, 3, 4]), ("5,6,7", [5, 6, 7]), ("0-2,5", [0, 1, 2, 5])],
)
def test_gpu_lists_parse(text, expected):
    assert parse_gpu_list("--drafter-gpus", text) == expected


def test_bad_gpu_list_names_the_flag_and_value():
    with pytest.raises(ConfigError) as err:
        parse_gpu_list("--drafter-gpus", "5-x")
    assert str(err.value) == (
        "--drafter-gpus '5-x': not an integer range; use a list like 5,6,7 or a range like 5-7"
    )
    for bad in ("3-1", "1,,2", "-1", "1,1"):
        with pytest.raises(ConfigError, match=f"--target-gpus '{bad}'"):
            parse_gpu_list("--target-gpus", bad)


def test_roles():
    assert resolve_roles("", "").mode == "cpu"
    with pytest.raises(ConfigError, match="give both"):
        resolve_roles("0", "")
    with pytest.raises(ConfigError, match=r"equal \(colocated\) or disjoint"):
        resolve_roles("0,1", "1,2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_gpus_without_cuda_are_refused():
    with pytest.raises(ConfigError, match="--target-gpus '0': CUDA is not available"):
        resolve_roles("0", "0")


def test_bad_numbers_are_refused_by_name(capsys):
    bad = {"--block-size": "1", "--lr": "0", "--max-steps": "x", "--num-anchors": "-3"}
    for flag, value in [*bad.items(), ("--lr", "nan")]:
        with pytest.raises(SystemExit):
            build_parser().parse_args([flag, value])
        assert f"argument {flag}: '{value}'" in capsys.readouterr().err


def test_the_config_has_a_field_for_every_flag_and_the_step_the_compiled_ones():
    # from_args reads each field from the flag of its name: a flag without one never arrives.
    parser = build_parser()
    dests = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    assert {f.name for f in dataclasses.fields(TrainConfig)} == dests
    assert {f.name for f in dataclasses.fields(StepConfig)} == set(COMPILED)
    config = TrainConfig.from_args(parser.parse_args(["--checkpoint-dir", "ck", "--gamma", "3"]))
    assert (config.checkpoint_dir, config.status_file) == (Path("ck"), Path("status.json"))
    assert (config.data_cache, config.gamma, config.max_seq_len) == (None, 3.0, 3072)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0
    # The same flags give the warm-up the step training compiles (their defaults agree).
    flags = ["--block-size", "8", "--compile-drafter"]
    warmup = StepConfig.from_args(warmup_parser().parse_args(flags))
    trained = TrainConfig.from_args(parser.parse_args(flags))
    assert warmup == StepConfig(**{f: getattr(trained, f) for f in COMPILED})


def test_cli_error_exits_2_and_writes_a_failed_status(tmp_path):
    status = tmp_path / "status.json"
    args = ["--target-gpus", "5-x", "--drafter-gpus", "5-x", "--status-file", str(status)]
    result = run_module("dflash.train", *args, "--run-id", "bad", cwd=tmp_path)
    assert result.returncode == 2
    assert "--target-gpus '5-x': not an integer range" in result.stdout
    written = json.loads(status.read_text())
    assert written["state"] == "failed" and "5-x" in written["error"]
    assert written["run_id"] == "bad"


def test_compile_target_on_the_cpu_needs_static_shapes(tmp_path):
    """CPU batches change shape from step to step: a compiled target would recompile for each;
    the trainer refuses before it loads anything, naming the fix."""
    status = tmp_path / "status.json"
    result = run_module("dflash.train", "--compile-target", "--status-file", str(status),
                        cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "--compile-target: on the CPU the target's batches change shape" in result.stdout
    assert "add --compile-drafter" in result.stdout
    assert json.loads(status.read_text())["state"] == "failed"
