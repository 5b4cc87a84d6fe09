"""The compile cache's canaries and hashes, for real on the CPU (tiny target, --compile-drafter):
the warmup compares its compiled step with the uncompiled one and records the hashes of what it
compiled, the trainer compares its first warm step with the eager one and checks the next ones,
the supervisor moves a cache that failed aside and restarts the trainer cold, and before every
start moves aside the files that differ from their hashes; a crash in compiled code names the
entry it ran.

A damaged cache is made by hand: Inductor keeps each compiled graph's wrapper module in
<cache>/<xx>/<key>.py, and a process that finds the graph in the cache loads that file as it is
(torch/_inductor/output_code.py write_to_disk writes it only when missing), so code appended
there is what the next process runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dflash.cache_files import HASHES, check, entry_files, record
from dflash.compile_watch import CANARY_STEPS, CacheSuspect, CacheWatch, Canary
from dflash.supervision.files import move_aside
from dflash.supervision.record import CACHE_SUSPECT_EXIT, CANARY_FAILED

from .conftest import FAST, REPO, argv, cli_env, read_status, run_module
from .test_supervise import RUN_ID, Supervised

# Not in `make test-quick`: real Inductor compiles on the CPU.
pytestmark = pytest.mark.slow

# The smallest compiled step: one drafter layer, two rows of 64 tokens, 8 anchors a row.
COMPILED = argv("--compile-drafter --drafter-layers 1 --max-seq-len 64 --token-budget 128 "
                "--num-anchors 8")  # fmt: skip
TRAINER = [*FAST, *COMPILED, "--gen-samples", "16", "--max-steps", "3", "--status-interval", "0.2"]
# A line a wrapper module ends its `call` with (a Runner's method, or a function before).
WRAPPER_CALL = re.compile(r"^(call = |def call\()", re.MULTILINE)
TAMPER = """
# Tampered with by tests/trainer/test_compile_canary.py: every float output times {scale}.
_untampered_call = call


def call(args):
    return tuple(
        out * {scale} if isinstance(out, torch.Tensor) and out.is_floating_point() else out
        for out in _untampered_call(args)
    )
"""


def cache_env(cache: Path) -> dict[str, str]:
    """What run.sh exports for the trainer and the warmup."""
    return {**cli_env(), **cache_vars(cache)}


def cache_vars(cache: Path) -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}


def warmup(cache: Path):
    return run_module(
        "dflash.warmup", *COMPILED, cwd=cache.parent, env=cache_env(cache), timeout=900
    )


def tamper(cache: Path, scale: str) -> list[Path]:
    """Make every compiled graph in the cache return its float outputs times `scale`."""
    wrappers = [path for path in cache.glob("*/*.py") if WRAPPER_CALL.search(path.read_text())]
    assert wrappers, (
        f"no Inductor wrapper module (<cache>/<xx>/<key>.py defining `call`) in {cache}: the "
        "cache's layout changed, and this test no longer damages anything"
    )
    for path in wrappers:
        path.write_text(path.read_text() + TAMPER.format(scale=scale))
    return wrappers


def rehash(cache: Path) -> None:
    """Record the cache's files as they are now: a compiler's bug, written and recorded as
    compiled, which no hash can tell from good code (only the canary's comparison can)."""
    (cache / HASHES).unlink()
    record(cache)


def text_section(path: Path) -> tuple[int, int]:
    """(offset, size) of an ELF64 file's .text: the kernels' machine code."""
    data = path.read_bytes()
    shoff = int.from_bytes(data[0x28:0x30], "little")
    entsize, count, names = (
        int.from_bytes(data[at : at + 2], "little") for at in (0x3A, 0x3C, 0x3E)
    )

    def header(i: int) -> tuple[int, int, int]:
        at = shoff + i * entsize  # sh_name, then sh_offset at +0x18 and sh_size at +0x20
        return tuple(
            int.from_bytes(data[at + a : at + b], "little")
            for a, b in ((0, 4), (0x18, 0x20), (0x20, 0x28))
        )

    strtab = header(names)[1]
    for i in range(count):
        name, offset, size = header(i)
        if data[strtab + name : strtab + name + 6] == b".text\0":
            return offset, size
    raise AssertionError(f"{path} has no .text section")


def break_kernels(cache: Path) -> list[str]:
    """Overwrite the machine code of every compiled kernel in place (ud2, an illegal
    instruction, end to end), as a damaged disk or a stray write would: a process that has
    the .so mapped runs the new bytes at its next call. Returns their paths in the cache."""
    kernels = sorted(cache.glob("*/*.so"))
    assert kernels, f"no compiled kernel (<cache>/<xx>/<key>.so) in {cache}: the layout changed"
    for path in kernels:
        offset, size = text_section(path)
        with path.open("r+b") as handle:
            handle.seek(offset)
            handle.write(b"\x0f\x0b" * (size // 2))
    return [str(path.relative_to(cache)) for path in kernels]


@pytest.fixture(scope="module")
def clean_warmup(tmp_path_factory):
    """A warmup on an empty cache folder: the folder it filled and what it printed."""
    cache = tmp_path_factory.mktemp("warmed") / "cache"
    return cache, warmup(cache)


@pytest.fixture
def warm_copy(clean_warmup, tmp_path) -> Path:
    """A copy of the warmed cache, as a deployment's cache/<fingerprint> folder."""
    cache = tmp_path / "cache" / "0123456789abcdef"
    shutil.copytree(clean_warmup[0], cache)
    return cache


def one_json_line(stdout: str) -> dict:
    [line] = [json.loads(text) for text in stdout.splitlines() if text.startswith("{")]
    return line


def test_a_warmup_on_a_clean_cache_passes_its_canary(clean_warmup):
    cache, result = clean_warmup
    assert result.returncode == 0, result.stdout + result.stderr
    line = one_json_line(result.stdout)
    assert line["device"] == "cpu" and line["first_step_s"] > 0 and line["warm_step_s"] > 0
    canary = line["canary"]
    assert canary["ok"] is True
    assert canary["tolerance"] == {"loss_rel_err": 1e-3, "grad_rel_err": 1e-3}
    assert canary["loss_rel_err"] <= 1e-3 and canary["grad_rel_err"] <= 1e-3
    assert canary["loss_compiled"] == pytest.approx(canary["loss_eager"], rel=1e-3)
    assert any((cache / "fxgraph").rglob("*")), "the warmup compiled nothing into the cache"


def test_a_warmup_on_a_tampered_cache_fails_its_canary(warm_copy):
    tamper(warm_copy, "2.0")
    result = warmup(warm_copy)
    assert result.returncode == CACHE_SUSPECT_EXIT, result.stdout + result.stderr
    canary = one_json_line(result.stdout)["canary"]  # printed before the exit
    # The compiled graphs are the decoder layers: doubled outputs of the last one are
    # normalised away by the drafter's final norm (eager), so the loss may agree; their
    # gradients, doubled too, do not.
    tolerance = canary["tolerance"]
    assert canary["ok"] is False and (
        canary["loss_rel_err"] > tolerance["loss_rel_err"]
        or canary["grad_rel_err"] > tolerance["grad_rel_err"]
    ), canary
    assert f"the compile cache {warm_copy} is suspect" in result.stderr

    # The deploy's warmup module, on that cache: moved aside with why, then a cold warmup passes.
    args = {
        "root": str(warm_copy.parent.parent), "python": sys.executable, "code_dir": str(REPO),
        "cache_dir": str(warm_copy), "flags": COMPILED, "disk_reserve_mb": 0,
    }  # fmt: skip
    ansible = Path(sys.executable).with_name("ansible")
    env = {**cli_env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}  # fmt: skip
    ran = subprocess.run(
        [str(ansible), "localhost", "-c", "local", "-m", "dflash_warmup", "-a", json.dumps(args)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    reply = json.loads(ran.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    [aside] = warm_copy.parent.glob(f"{warm_copy.name}.failed-*")
    assert reply["moved_aside"] == str(aside)
    assert "canary" in json.loads((aside / "FAILED.json").read_text())["reason"]
    kept = [path for path in aside.glob("*/*.py") if "Tampered with" in path.read_text()]
    assert kept, "the suspect cache is kept as it was, entries and all"
    assert one_json_line(reply["output"])["canary"]["ok"] is True
    assert any((warm_copy / "fxgraph").rglob("*")), "the cold warmup compiled into a new folder"


def test_a_trainer_on_a_warm_cache_hits_it_and_passes_its_canary(warm_copy):
    folder = warm_copy.parent.parent
    files = ["--checkpoint-dir", str(folder / "ck"), "--status-file", str(folder / "status.json")]
    env = cache_env(warm_copy)
    result = run_module("dflash.train", *TRAINER, *files, cwd=folder, env=env, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    cache = read_status(folder / "status.json")["compile_cache"]
    assert cache["dir"] == str(warm_copy) and cache["fingerprint"] == warm_copy.name
    assert cache["started_warm"] is True and cache["first_step_s"] > 0
    # The warmup compiled the very graphs the trainer looks up.
    assert cache["hits"] > 0 and cache["misses"] == 0, cache
    canary = cache["canary"]
    assert canary["ok"] is True and canary["step"] == CANARY_STEPS, canary
    # Its first step agreed with the eager one (fp32 on the CPU: the order of sums only).
    assert canary["eager"]["loss_rel_err"] <= 1e-3 and canary["eager"]["grad_rel_err"] <= 1e-3
    assert check(warm_copy) == {
        "checked": len(entry_files(warm_copy)), "damaged": [], "unrecorded": [], "gone": [],
    }  # fmt: skip


def test_two_drafter_ranks_on_a_warm_cache_each_compare_with_the_eager_step(warm_copy):
    """Under DDP (two gloo ranks, data parallel): the comparison runs on each rank's own batch
    outside DDP's hooks and collectives, the ranks agree on it, and training goes on."""
    folder = warm_copy.parent.parent
    files = ["--checkpoint-dir", str(folder / "ck"), "--status-file", str(folder / "status.json")]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "dflash.train", *TRAINER, "--cpu-ranks", "--dist-timeout", "120",
        "--target-gpus", "0,1", "--drafter-gpus", "0,1", *files,
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=folder, env=cache_env(warm_copy), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    canary = read_status(folder / "status.json")["compile_cache"]["canary"]
    assert canary["ok"] is True and canary["step"] == CANARY_STEPS, canary
    assert canary["eager"]["grad_rel_err"] <= 1e-3, canary


def test_a_warmup_records_the_hashes_of_what_it_compiled(clean_warmup):
    cache, result = clean_warmup
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = json.loads((cache / HASHES).read_text())["files"]
    files = entry_files(cache)
    assert set(recorded) == set(files) and any(path.endswith(".so") for path in files)
    assert not any(path.startswith("locks/") for path in recorded)
    assert check(cache)["damaged"] == []


def test_a_cache_whose_values_are_wrong_but_finite_fails_the_trainers_canary(warm_copy):
    """A compiled graph that runs and returns finite, wrong numbers: the finite-values check
    alone passed it (the held-out run's `canary ok`); the first step against the eager one
    does not."""
    tamper(warm_copy, "2.0")
    rehash(warm_copy)
    folder = warm_copy.parent.parent
    files = ["--checkpoint-dir", str(folder / "ck"), "--status-file", str(folder / "status.json")]
    result = run_module(
        "dflash.train", *TRAINER, *files, cwd=folder, env=cache_env(warm_copy), timeout=900
    )
    assert result.returncode == CACHE_SUSPECT_EXIT, result.stdout + result.stderr
    canary = read_status(folder / "status.json")["compile_cache"]["canary"]
    assert canary["ok"] is False and canary["step"] == 1, canary
    assert canary["reason"].startswith(
        "the compiled step disagrees with the eager one at step 1: relative loss error"
    ), canary
    error = float(re.search(r"gradient error (\S+)", canary["reason"])[1])
    assert error > 1e-3, canary  # doubled layer outputs: the gradients are far off
    assert f"the compile cache {warm_copy} is suspect: {canary['reason']}" in result.stdout


def test_a_cache_that_gives_nan_is_moved_aside_and_the_trainer_restarts_cold(
    warm_copy, tmp_path, monkeypatch
):
    tamper(warm_copy, "float('nan')")
    rehash(warm_copy)  # recorded as compiled: the supervisor's check before the start passes it
    for name, value in cache_vars(warm_copy).items():  # the supervisor's and trainer's env
        monkeypatch.setenv(name, value)
    # The longest back-off there is: the restart must not wait for it.
    run = Supervised(tmp_path / "root", argv("--backoff 300 --hang-after 600"), TRAINER)
    try:
        assert run.proc.wait(timeout=600) == 0, run.text()
    finally:
        run.close()

    # The first trainer said why it failed; the supervisor kept it in supervisor.json.
    record = run.record()
    first = record["attempts"][0]
    assert first["exit"] == CACHE_SUSPECT_EXIT
    assert first["compile_cache"]["started_warm"] is True
    why = (
        "the compiled step disagrees with the eager one at step 1: relative loss error nan "
        "(tolerance 0.001), gradient error nan (tolerance 0.001)"
    )
    assert first["compile_cache"]["canary"] == {"ok": False, "step": 1, "reason": why}
    assert f"the compile cache {warm_copy} is suspect: {why}" in first["error"]
    assert record["restarts"]["count"] == 1 and record["state"] == "stopped"
    reason = f"{CANARY_FAILED}: {why}"
    assert record["restarts"]["last_reason"] == reason

    # The folder was moved aside, with FAILED.json saying why; the log says so.
    [line] = run.history()
    assert (line["action"], line["result"], line["reason"]) == ("restart", "restarted", reason)
    assert line["exit"] == CACHE_SUSPECT_EXIT and line["down_s"] < 300
    aside = Path(line["cache_moved_aside"])
    assert aside.parent == warm_copy.parent
    assert re.fullmatch(rf"{warm_copy.name}\.failed-\d{{8}}T\d{{6}}Z", aside.name)
    failed = json.loads((aside / "FAILED.json").read_text())
    assert failed["reason"] == reason and failed["run_id"] == RUN_ID and failed["time"]
    assert any((aside / "fxgraph").rglob("*"))
    assert f"moved aside to {aside}" in run.text()

    # The restarted trainer started cold in a new folder of the same name, compiled and trained.
    status = read_status(run.run_dir / "status.json")
    assert status["attempt"] == 1 and status["state"] == "stopped" and status["step"] == 3
    assert math.isfinite(status["loss"])
    cache = status["compile_cache"]
    assert cache["dir"] == str(warm_copy) and cache["started_warm"] is False
    assert cache["misses"] > 0 and cache["canary"] is None  # a cold start has no canary
    assert any((warm_copy / "fxgraph").rglob("*"))


# A trainer that keeps running on the compiled step, saving often.
RUNNING = [*FAST, *COMPILED, *argv("--gen-samples 16 --max-steps 100000 --checkpoint-every 2 "
                                   "--status-interval 0.2 --sleep-per-step 0.1")]  # fmt: skip
FATAL_SIGNALS = {-signal.SIGILL, -signal.SIGSEGV, -signal.SIGBUS}


def test_kernels_damaged_under_a_running_trainer_are_named_moved_aside_and_compiled_anew(
    warm_copy, tmp_path, monkeypatch
):
    """The held-out run's case: a kernel's .so damaged in place while the trainer runs. It
    crashes in that kernel; the restart line names the compiled entry it crashed in and the
    files that differ from their hashes, which are moved aside before the restart, so the
    restarted trainer compiles them anew instead of loading the damage warm."""
    for name, value in cache_vars(warm_copy).items():
        monkeypatch.setenv(name, value)
    run = Supervised(tmp_path / "root", argv("--backoff 0.5 --hang-after 600"), RUNNING)
    try:
        run.status(lambda s: s.get("state") == "running" and s.get("step", 0) >= 2, timeout=900)
        broken = break_kernels(warm_copy)
        # The restarted trainer's canary judged its first steps.
        back = run.status(
            lambda s: s.get("attempt") == 1 and (s.get("compile_cache") or {}).get("canary"),
            timeout=900,
        )
        os.killpg(run.proc.pid, signal.SIGTERM)
        assert run.proc.wait(timeout=120) == 0, run.text()
    finally:
        run.close()

    first = run.record()["attempts"][0]
    assert first["exit"] in FATAL_SIGNALS, run.text()
    [line] = run.history()
    assert (line["action"], line["result"]) == ("restart", "restarted"), line
    assert line["error"].startswith("Fatal Python error: "), line  # faulthandler's, in the log
    assert re.fullmatch(r"\w\w/\w+\.py, line \d+ in \w+", line["compiled_entry"] or ""), line
    assert (warm_copy / line["compiled_entry"].split(",")[0]).is_file()
    assert line["cache_damaged"] and set(line["cache_damaged"]) <= set(broken), line
    aside = Path(line["cache_moved_aside"])
    assert all((aside / path).is_file() for path in line["cache_damaged"])
    assert (
        "differ from the hashes recorded"
        in json.loads((aside / "FAILED.json").read_text())["reason"]
    )
    assert f"moved aside to {aside}" in run.text()
    # The restarted trainer ran warm on the rest, compiled the kernels anew, and agreed with
    # the eager step; the folder is whole again.
    cache = back["compile_cache"]
    assert cache["started_warm"] is True and cache["hits"] > 0, cache
    assert cache["canary"]["ok"] is True, cache
    assert all((warm_copy / path).is_file() for path in line["cache_damaged"])
    assert check(warm_copy)["damaged"] == []


def test_the_canary_judges_only_the_first_steps_of_a_warm_compiled_start(tmp_path):
    canary = Canary(armed=True)
    assert canary.check(1, 2.0, 0.5) is None and canary.verdict is None
    assert canary.check(2, 2.0, math.inf) == "gradient norm is inf at step 2"
    assert canary.verdict == {"ok": False, "step": 2, "reason": "gradient norm is inf at step 2"}

    passed = Canary(armed=True)
    for step in range(1, CANARY_STEPS + 2):
        assert passed.check(step, 2.0, 0.5 if step <= CANARY_STEPS else math.nan) is None
    assert passed.verdict == {"ok": True, "step": CANARY_STEPS}

    # Another drafter rank's first step disagreed with its eager one: this rank fails too.
    elsewhere = Canary(armed=True)
    elsewhere.failed_elsewhere()
    assert elsewhere.check(1, 2.0, 0.5) == (
        "another drafter rank's compiled step disagrees with its eager one, step 1"
    )

    cold = CacheWatch(tmp_path / "cache", started_warm=False)
    cold.arm(compiled=True)
    cold.step_done(1, math.nan, math.nan)  # a cold start's NaN is FloatingPointError's, later
    assert cold.report()["canary"] is None and cold.first_step_s is not None
    warm = CacheWatch(tmp_path / "cache", started_warm=True)
    warm.arm(compiled=True)
    with pytest.raises(CacheSuspect, match=f"compile cache {tmp_path / 'cache'} is suspect"):
        warm.step_done(1, math.nan, 1.0)


def test_a_cache_is_moved_aside_with_its_reason_and_a_missing_one_says_so(tmp_path):
    folder = tmp_path / "cache" / "fp"
    (folder / "fxgraph").mkdir(parents=True)
    aside = move_aside(folder, "why", "run-9")
    assert not folder.exists() and (aside / "fxgraph").is_dir()
    assert json.loads((aside / "FAILED.json").read_text())["run_id"] == "run-9"
    with pytest.raises(FileNotFoundError):
        move_aside(folder, "why", "run-9")
