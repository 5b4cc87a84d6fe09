"""Several processes compiling into one compile cache at once (the ranks of a job, a warmup and
a restarted trainer): Inductor writes every entry to a temporary name and renames it into place,
so no process reads another's half-written entry, one killed mid-write leaves nothing a later
process reads, and what they leave is a complete cache that the next process finds whole."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, cli_env

# Not in `make test-quick`: several processes compiling at once.
pytestmark = pytest.mark.slow

# The warmup's drafter step, small: the compile still makes every kind of cache entry.
STEP = ["--compile-drafter", "--drafter-layers", "1", "--max-seq-len", "64",
        "--token-budget", "128", "--num-anchors", "8"]  # fmt: skip
# One warmup, then Inductor's own counters of this process's cache lookups as a JSON line.
PROBE = (
    "import json, sys\n"
    "from torch._dynamo.utils import counters\n"
    "from dflash.warmup import main\n"
    "code = main(sys.argv[1:])\n"
    "seen = {k: dict(counters[k]) for k in ('inductor', 'aot_autograd')}\n"
    "print(json.dumps({'counters': seen}))\n"
    "sys.exit(code)\n"
)


def start_probe(cache: Path) -> subprocess.Popen[str]:
    env = {**cli_env(), "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "TRITON_CACHE_DIR": str(cache / "triton")}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-c", PROBE, *STEP], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def counters(output: str) -> dict[str, dict[str, int]]:
    [line] = [line for line in output.splitlines() if line.startswith('{"counters"')]
    return json.loads(line)["counters"]


def entries(cache: Path) -> list[Path]:
    return [p for p in (cache / "fxgraph").rglob("*") if p.is_file()]


def test_concurrent_writers_and_a_killed_one_leave_a_whole_cache(tmp_path: Path):
    cache = tmp_path / "cache"
    victim = start_probe(cache)
    writers = [start_probe(cache) for _ in range(2)]
    # Kill one writer as soon as the cache holds anything: it may be mid-write.
    deadline = time.monotonic() + 600
    while victim.poll() is None and not any(cache.rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for writer in writers:
        output, _ = writer.communicate(timeout=600)
        assert writer.returncode == 0, output
    assert entries(cache), "the writers left no FX graph entry"
    # What a killed writer leaves: a temporary file under Inductor's naming, half written.
    first_entry = entries(cache)[0]
    (first_entry.parent / ".999999.1.tmp").write_bytes(b"\x80\x04half-written")

    reader = start_probe(cache)
    output, _ = reader.communicate(timeout=600)
    assert reader.returncode == 0, output
    seen = counters(output)
    assert seen["inductor"].get("fxgraph_cache_hit", 0) >= 1, seen
    assert seen["inductor"].get("fxgraph_cache_miss", 0) == 0, seen
    assert seen["aot_autograd"].get("autograd_cache_hit", 0) >= 1, seen
