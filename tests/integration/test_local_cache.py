"""Compile caches on the local target: warm on the CPU fills cache/<fingerprint>, a second warm
does nothing, a release that changes no compiled file starts on that cache as it is, one that
changes the model gets a new cache folder and the old one is left as it was, and the trainer
launched on a warmed cache finds every graph the warmup compiled."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import TRAINER_ARGS, add_release, status_of

# Variables that change Inductor's cache keys and nothing else: one in the shell that runs
# ansible-playbook (the trainer never sees it, so neither may the warmup), one the trainer is
# given (so the warmup must be given it too).
SHELL_ENV = {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}
TRAINER_ENV = {"TORCHINDUCTOR_SCALAR_ASSERTS": "0"}
# A small compiled step keeps the CPU compile short.
COMPILED = dict(
    TRAINER_ARGS, compile_drafter=True, drafter_layers=1, max_seq_len=64, token_budget=128,
    num_anchors=8,
)  # fmt: skip


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*") if p.is_file()
    }  # fmt: skip


def test_warm_fill_noop_and_new_fingerprint(deploy, playbook, trainer_repo, target_root):
    def warm(ref: str):
        return deploy(ref, dflash_launch=False, dflash_compile_cache="warm",
                      dflash_trainer_args=COMPILED)  # fmt: skip

    first = warm("v1")
    assert first.rc == 0, first.output
    [cache] = (target_root / "cache").iterdir()
    built = json.loads((cache / "built-by.json").read_text())
    assert set(built) >= {"compiled_sha256", "torch", "gpu"} and built["torch"] == "2.13.0+cpu"
    assert "--compile-drafter" in built["warmup_flags"]
    entries = snapshot(cache)
    assert len(entries) > 1, "the warmup compiled nothing into the cache"
    assert "warming the CPU" in first.output

    second = warm("v1")
    assert second.rc == 0 and second.changed() == 0, second.output
    assert snapshot(cache) == entries

    # Code outside the compiled step: the same folder, warm as it is (no warmup runs).
    add_release(trainer_repo, "v2", "dflash/__init__.py", "# v2\n")
    third = warm("v2")
    assert third.rc == 0, third.output
    assert sorted((target_root / "cache").iterdir()) == [cache]
    assert snapshot(cache) == entries, "the warm cache was compiled again"
    assert f"TORCHINDUCTOR_CACHE_DIR={cache}" in (target_root / "run.sh").read_text()

    # The model changed: a new folder, compiled anew; the old one is kept as it was. The
    # trainer launched on it finds every graph there, whatever the caller's shell holds.
    add_release(trainer_repo, "v3", "dflash/model.py", "# v3\n")
    fourth = deploy(
        "v3", dflash_compile_cache="warm", dflash_trainer_args=COMPILED,
        dflash_trainer_env=TRAINER_ENV, dflash_health_timeout=900, _env=SHELL_ENV,
    )  # fmt: skip
    assert fourth.rc == 0, fourth.output
    compiled = status_of(target_root)["compile_cache"]
    assert compiled["started_warm"] and compiled["hits"] > 0, compiled
    assert compiled["misses"] == 0, f"the trainer compiled graphs the warmup did not: {compiled}"
    assert "warming the CPU" in fourth.output
    caches = sorted((target_root / "cache").iterdir())
    assert len(caches) == 2 and cache in caches
    assert snapshot(cache) == entries, "the old fingerprint's cache was touched"
    run_sh = (target_root / "run.sh").read_text()
    [new] = [c for c in caches if c != cache]
    assert f"TORCHINDUCTOR_CACHE_DIR={new}" in run_sh

    # Issue 51: a compiled entry damaged on disk (one the running trainer loaded at its start,
    # so it runs on; its next start would load the damage). The warmup and the trainer
    # recorded their files' hashes: verify names it, a plain deploy moves it aside and
    # compiles it anew, and verify is clean again.
    hashes = json.loads((new / "hashes.json").read_text())["files"]
    entry = sorted(path for path in hashes if path.startswith("fxgraph/"))[0]
    with (new / entry).open("r+b") as handle:
        handle.seek(hashes[entry]["size"] // 2)
        handle.write(b"\xff" * 32)
    audit = playbook("verify.yml")
    assert audit.rc == 2, audit.output
    assert f"1 file(s) differ from their recorded hashes: {entry}" in " ".join(audit.output.split())
    again = deploy(
        "v3", dflash_compile_cache="warm", dflash_trainer_args=COMPILED,
        dflash_trainer_env=TRAINER_ENV, dflash_health_timeout=900, _env=SHELL_ENV,
    )  # fmt: skip
    assert again.rc == 0, again.output
    said = " ".join(again.output.split())  # the output wraps long lines
    assert f"moved 1 file(s) of {new} that differ from the hashes recorded" in said, said
    [aside] = (target_root / "cache").glob(f"{new.name}.failed-*")
    assert (aside / entry).is_file()
    assert (new / entry).is_file(), "the entry was not compiled (or received) anew"
    [line] = [json.loads(x) for x in (target_root / "history.jsonl").read_text().splitlines()][-1:]
    assert line["compile_cache"]["moved_aside"] == [str(aside)]
    clean = playbook("verify.yml")
    assert clean.rc == 0, clean.output
    assert "differ from their recorded hashes" not in clean.output
