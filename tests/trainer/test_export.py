"""`python -m dflash.export`: a trained checkpoint as a public DFlash drafter folder.

The folder is checked against a fixture written from the public model code (not from ours),
loads back into our drafter with the same logits, is what eval and `train --init-from` read,
and bad input fails with a message and writes nothing.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash import export
from dflash.errors import ConfigError
from dflash.eval import main as eval_main
from dflash.mask import attention_mask
from dflash.model import Drafter, DrafterConfig
from dflash.options import build_drafter
from dflash.public_format import read_config, read_folder
from dflash.target import feature_layer_ids, load_target

from .conftest import FAST, argv, run_module
from .conftest import TRAINED_STEPS as STEPS

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "dflash_public_format.json").read_text())


def run_export(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = export.main(list(args))
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def checkpoint_drafter(trained: Path, target) -> tuple[Drafter, dict]:
    payload = torch.load(trained / f"step-{STEPS:08d}.pt", weights_only=True)
    cfg = DrafterConfig(**payload["drafter_config"])
    drafter = build_drafter(cfg, target.embed_weight(), target.lm_head_weight(), target.device, 0)
    drafter.load_state_dict(payload["drafter"])
    return drafter, payload


def block_logits(drafter: Drafter, target) -> torch.Tensor:
    """Draft logits of one block after a 20-token context (the eval's drafting call)."""
    cfg = drafter.cfg
    ids = torch.randint(0, 120, (1, 21), generator=torch.Generator().manual_seed(1))
    features, _ = target.forward(ids[:, :20])
    block = torch.full((1, cfg.block_size), cfg.mask_token_id)
    block[0, 0] = ids[0, 20]
    anchors = torch.tensor([[20]])
    kept = torch.ones_like(anchors, dtype=torch.bool)
    mask = attention_mask(anchors, kept, 20, cfg.block_size, flex=False)
    positions = 20 + torch.arange(cfg.block_size)[None]
    with torch.no_grad():
        return drafter.logits(drafter(features, block, positions, mask))


@pytest.fixture(scope="module")
def tiny():
    return load_target("tiny", torch.device("cpu"), num_features=5, mask_token_id=None)


def test_export_loads_back_with_the_same_logits(tmp_path, trained, tiny, capsys):
    ours, payload = checkpoint_drafter(trained, tiny)
    code, summary, err = run_export(capsys, "--checkpoint", str(trained), "--out",
                                    str(tmp_path / "f32"), "--dtype", "float32")  # fmt: skip
    assert code == 0, err
    assert summary["step"] == STEPS and summary["changed"] and summary["release"] == "unreleased"
    back = read_folder(tmp_path / "f32")
    assert back.cfg == ours.cfg
    again = build_drafter(back.cfg, tiny.embed_weight(), tiny.lm_head_weight(), tiny.device, 7)
    again.load_state_dict(back.state)
    assert torch.equal(block_logits(again, tiny), block_logits(ours, tiny))

    # bfloat16 (the default, as published): exactly the trained weights rounded to bfloat16.
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--out", str(tmp_path / "bf"))
    assert code == 0, err
    stored = load_file(tmp_path / "bf" / "model.safetensors")
    for name, weight in payload["drafter"].items():
        assert stored[name].dtype == torch.bfloat16
        assert torch.equal(stored[name], weight.to(torch.bfloat16)), name
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["dtype"] == "bfloat16"

    # Provenance: the run that trained it, the code that exported it, checksums of every file.
    origin = json.loads((tmp_path / "bf" / "dflash_export.json").read_text())
    assert origin["step"] == STEPS and origin["trained_by"]["run_id"] == "t1"
    data = origin["trained_by"]["data"]
    assert data == payload["training_data"]
    assert data["kind"] == "self_generated" and data["seed"] == 0
    assert data["generated"] == {
        "target_model": "tiny", "samples": 16, "prompt_len": 16, "new_tokens": 48, "seed": 0
    }  # fmt: skip
    assert len(data["content_sha256"]) == 64 and data["samples"] == data["samples_in_order"]
    assert origin["trained_by"]["code_tree_sha256"] == payload["code_tree_sha256"]
    assert set(origin["exported_by"]) == {"release", "code_tree_sha256", "time"}
    sums = (tmp_path / "bf" / "SHA256SUMS").read_text().split()
    listed = dict(zip(sums[1::2], sums[::2], strict=True))
    assert sorted(listed) == ["config.json", "dflash_export.json", "model.safetensors"]
    for name, sha in listed.items():
        assert export.sha256_file(tmp_path / "bf" / name) == sha
        assert os.stat(tmp_path / "bf" / name).st_mode & 0o777 == 0o644


def shape(formula: str, sizes: dict[str, int]) -> int:
    return math.prod(sizes[word] for word in formula.split(" * "))


def test_export_has_the_public_names_shapes_and_config_keys(tmp_path, trained, capsys):
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--out", str(tmp_path / "x"))
    assert code == 0, err
    config = json.loads((tmp_path / "x" / "config.json").read_text())
    types = {"list": list, "str": str, "int": int, "float": float, "bool": bool, "dict": dict}
    for key, kind in FIXTURE["config_keys"].items():
        assert key in config, key
        assert config[key] is None if kind == "null" else type(config[key]) is types[kind], key
    for key, value in FIXTURE["config_values"].items():
        assert config[key] == value, key
    # Every key a published drafter config has (transformers writes its version itself).
    published = set(FIXTURE["published_config"]) - {"_source", "transformers_version"}
    assert published <= set(config), published - set(config)
    dflash = config["dflash_config"]
    for key, kind in FIXTURE["dflash_config_keys"].items():
        assert type(dflash[key]) is types[kind], key
    ids = dflash["target_layer_ids"]
    assert ids == [1, 2, 3, 4, 5] and all(0 <= i < config["num_target_layers"] for i in ids)
    assert config["layer_types"] == ["full_attention"] * config["num_hidden_layers"]

    sizes = {k: config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")}
    sizes |= {k: config[k] for k in ("head_dim", "intermediate_size")}
    sizes["num_context_layers"] = len(ids)
    expected = {name: [shape(f, sizes) for f in dims] for name, dims in FIXTURE["tensors"].items()}
    for i in range(config["num_hidden_layers"]):
        for name, dims in FIXTURE["tensors_per_layer"].items():
            expected[name.format(i=i)] = [shape(f, sizes) for f in dims]
    stored = load_file(tmp_path / "x" / "model.safetensors")
    assert {name: list(t.shape) for name, t in stored.items()} == expected
    # The frozen embedding and lm_head are the target's: not in the folder.
    assert not any("embed" in name or "lm_head" in name for name in stored)


def test_eval_reads_an_exported_folder_like_its_checkpoint(tmp_path, trained, capsys):
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--out", str(tmp_path / "f"),
                              "--dtype", "float32")  # fmt: skip
    assert code == 0, err
    reports = []
    for where in (trained, tmp_path / "f"):
        out = tmp_path / f"{where.name}.json"
        common = argv("--num-samples 2 --max-new-tokens 12 --out")
        assert eval_main(["--checkpoint", str(where), *common, str(out)]) == 0
        reports.append(json.loads(out.read_text()))
    checkpoint_report, folder_report = reports
    for key in ("tau", "tau_pooled", "tau_per_prompt", "verify_steps", "step", "target_model"):
        assert folder_report[key] == checkpoint_report[key], key


def test_train_init_from_starts_at_the_exported_weights(tmp_path, trained, capsys):
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--out", str(tmp_path / "f"),
                              "--dtype", "float32")  # fmt: skip
    assert code == 0, err
    files = ["--checkpoint-dir", str(tmp_path / "ck"), "--status-file", str(tmp_path / "s.json")]
    # An lr of 1e-30 leaves fp32 weights as they were: step 1's checkpoint shows the start.
    start = [*FAST, "--gen-samples", "16", "--max-steps", "1", "--lr", "1e-30", *files]
    result = run_module("dflash.train", *start, "--init-from", str(tmp_path / "f"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"initialised the drafter from {tmp_path / 'f'}" in result.stdout
    after = torch.load(tmp_path / "ck" / "step-00000001.pt", weights_only=True)["drafter"]
    exported = read_folder(tmp_path / "f").state
    for name, weight in exported.items():
        assert torch.equal(after[name], weight), name

    # A drafter of another shape than the flags build is refused, naming the flag that fits.
    other = [*start[:-4], "--drafter-layers", "3", *files[:1], str(tmp_path / "ck3"), *files[2:]]
    result = run_module("dflash.train", *other, "--init-from", str(tmp_path / "f"), cwd=tmp_path)
    assert result.returncode == 2
    assert "num_layers 2 there, 3 now (--drafter-layers 2)" in result.stdout
    assert not (tmp_path / "ck3").exists()


def test_out_root_names_the_folder_and_leaves_a_complete_export_alone(tmp_path, trained, capsys):
    root = tmp_path / "exports"
    root.mkdir()
    code, first, err = run_export(capsys, "--checkpoint", str(trained), "--out-root", str(root))
    assert code == 0, err
    assert first["name"] == f"unreleased-step{STEPS}" and first["changed"]
    mtime = (root / first["name"] / "model.safetensors").stat().st_mtime_ns
    code, second, err = run_export(capsys, "--checkpoint", str(trained), "--out-root", str(root))
    assert code == 0, err
    assert not second["changed"] and second["files"] == first["files"]
    assert (root / first["name"] / "model.safetensors").stat().st_mtime_ns == mtime
    # The same name in another dtype is not this export: refused, left as it is.
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--out-root", str(root),
                              "--dtype", "float32")  # fmt: skip
    assert code == 2 and "holds something else than a complete float32 export" in err
    assert sorted(p.name for p in root.iterdir()) == [first["name"]]


def test_bad_input_is_refused_and_writes_nothing(tmp_path, trained, capsys):
    out = tmp_path / "out"
    # A folder without a complete checkpoint: empty, then only a truncated one.
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_export(capsys, "--checkpoint", str(empty), "--out", str(out))
    assert code == 2 and f"--checkpoint '{empty}': no complete checkpoint there" in err
    good = trained / f"step-{STEPS:08d}.pt"
    (empty / "step-00000009.pt").write_bytes(good.read_bytes()[:4096])
    code, _, err = run_export(capsys, "--checkpoint", str(empty), "--out", str(out))
    assert code == 2 and "skipping checkpoint" in err and "no complete checkpoint" in err
    code, _, err = run_export(
        capsys, "--checkpoint", str(trained), "--step", "7", "--out", str(out)
    )
    assert code == 2 and "has no checkpoint of --step 7" in err
    assert not out.exists()

    # An out folder that exists and is not empty.
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--out", str(out))
    assert code == 2 and f"--out '{out}' exists and is not empty" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    # A drafter config the format cannot express: a setting it has no key for.
    payload = torch.load(good, weights_only=True)
    payload["drafter_config"]["sliding_window"] = 64
    odd = tmp_path / "odd.pt"
    torch.save(payload, odd)
    code, _, err = run_export(capsys, "--checkpoint", str(odd), "--out", str(tmp_path / "o1"))
    assert code == 2 and "cannot be written as a public DFlash config" in err
    assert "unknown keys ['sliding_window']" in err

    # ... or a target it cannot draft for: the format's fc maps n x the target's width.
    wide = tmp_path / "wide"
    wide.mkdir()
    config = {"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 8,
              "num_attention_heads": 4, "vocab_size": 128}  # fmt: skip
    (wide / "config.json").write_text(json.dumps(config))
    code, _, err = run_export(capsys, "--checkpoint", str(trained), "--target-model", str(wide),
                              "--out", str(tmp_path / "o2"))  # fmt: skip
    assert code == 2 and "hidden size 64 is not the target's 32" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "odd.pt", "out", "wide"]


def test_a_published_config_reads_as_the_drafter_this_trainer_builds():
    published = {k: v for k, v in FIXTURE["published_config"].items() if k != "_source"}
    cfg, ids, target_layers = read_config(published, "published")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (2560, 9728, 5)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 8, 128)
    assert (cfg.rope_theta, cfg.vocab_size, cfg.block_size) == (1e6, 151936, 16)
    assert cfg.mask_token_id == 151669 and cfg.num_features == 5
    # Its layer ids are the spread ones our target takes for 5 features of 36 layers.
    assert ids == feature_layer_ids(target_layers, cfg.num_features) == [1, 9, 17, 25, 33]

    # What this trainer's drafter cannot be is named, not guessed.
    sliding = {**published, "layer_types": ["sliding_attention"] * 5}
    with pytest.raises(ConfigError, match="cannot have layer_types"):
        read_config(sliding, "published")
    with pytest.raises(ConfigError, match="not a DFlash drafter folder"):
        read_config({**published, "architectures": ["Qwen3ForCausalLM"]}, "published")
