"""The compile cache's hashes (dflash/cache_files.py) on real files, and the compiled entry a
crash names (dflash/supervision/restart_facts.py compiled_entry) on faulthandler's real output
format.
Standard library only: no compile here (tests/trainer/test_compile_canary.py compiles)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dflash.cache_files import HASHES, check, entry_files, record, repair
from dflash.supervision.restart_facts import compiled_entry
from tests.helpers import REPO


def cache_folder(tmp_path: Path) -> Path:
    """A folder laid out as Inductor and Triton fill one: kernels, wrapper modules, entries,
    their locks and a temp file of a write not yet renamed."""
    folder = tmp_path / "cache" / "0123456789abcdef"
    files = {
        "ab/cabkey.so": b"\x7fELF kernel",
        "ab/cabkey.cpp": b"// source",
        "e4/ce4key.py": b"def call(args): ...\n",
        "fxgraph/3h/key/entry": b"pickled graph",
        "triton/GRP/kernel.cubin": b"cubin",
        "locks/ab.lock": b"",
        "e4/.ce4key.py.123.tmp": b"half",
        "built-by.json": b"{}",
    }
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return folder


def test_record_takes_the_entries_not_the_locks_temp_files_or_marker(tmp_path):
    folder = cache_folder(tmp_path)
    assert record(folder) == 5
    recorded = json.loads((folder / HASHES).read_text())
    assert recorded["format"] == 1
    assert sorted(recorded["files"]) == [
        "ab/cabkey.cpp", "ab/cabkey.so", "e4/ce4key.py", "fxgraph/3h/key/entry",
        "triton/GRP/kernel.cubin",
    ]  # fmt: skip
    assert recorded["files"]["ab/cabkey.so"]["size"] == len(b"\x7fELF kernel")
    assert record(folder) == 0  # nothing new: hashes.json is not rewritten
    assert check(folder) == {"checked": 5, "damaged": [], "unrecorded": [], "gone": []}


def test_a_damaged_file_is_found_and_moved_aside_with_why(tmp_path):
    folder = cache_folder(tmp_path)
    record(folder)
    kernel = folder / "ab" / "cabkey.so"
    kernel.write_bytes(b"\x7fELF kernEL")  # same size, other bytes: found by the hash
    (folder / "e4" / "ce4key.py").write_bytes(b"longer than it was\n")  # found by the size
    (folder / "ab" / "cnew.so").write_bytes(b"compiled by a process that died")
    (folder / "triton" / "GRP" / "kernel.cubin").unlink()  # a miss, not damage
    found = check(folder)
    assert found == {
        "checked": 4, "damaged": ["ab/cabkey.so", "e4/ce4key.py"], "unrecorded": ["ab/cnew.so"],
        "gone": ["triton/GRP/kernel.cubin"],
    }  # fmt: skip

    repaired = repair(folder, "a test")
    aside = Path(repaired["moved_aside"])
    assert aside.parent == folder.parent and aside.name.startswith(f"{folder.name}.failed-")
    assert (aside / "ab" / "cabkey.so").read_bytes() == b"\x7fELF kernEL"
    assert not kernel.exists() and not (folder / "e4" / "ce4key.py").exists()
    why = json.loads((aside / "FAILED.json").read_text())
    assert why["by"] == "a test" and "ab/cabkey.so, e4/ce4key.py" in why["reason"]
    # The rest is whole again: the unrecorded file adopted, the gone one forgotten.
    assert check(folder) == {"checked": 3, "damaged": [], "unrecorded": [], "gone": []}
    assert "ab/cnew.so" in entry_files(folder)


def test_a_folder_without_hashes_counts_its_files_as_unrecorded_not_damaged(tmp_path):
    folder = cache_folder(tmp_path)  # a cache from before hashes
    assert check(folder)["unrecorded"] and check(folder)["damaged"] == []
    assert repair(folder, "upgrade")["moved_aside"] is None
    assert check(folder)["checked"] == 5


def test_the_command_says_damage_in_json_and_its_exit_code(tmp_path):
    folder = cache_folder(tmp_path)
    record(folder)
    (folder / "ab" / "cabkey.so").write_bytes(b"\x00" * 11)

    def run(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "dflash.cache_files", action, str(folder)],
            cwd=REPO, capture_output=True, text=True, check=False,
        )  # fmt: skip

    checked = run("check")
    assert checked.returncode == 1 and json.loads(checked.stdout)["damaged"] == ["ab/cabkey.so"]
    repaired = run("repair")
    assert repaired.returncode == 0 and json.loads(repaired.stdout)["moved_aside"]
    assert run("check").returncode == 0


# faulthandler's dump as Python 3.11-3.13 writes it (all_threads=True): the crashing thread is
# the one headed "Current thread", wherever it comes.
DUMP = """\
step 2 loss 10.4
Fatal Python error: Illegal instruction

Thread 0x00007fb68e8ff6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "{cache}/zz/czzother.py", line 3 in call

Current thread 0x00007fb6c1df2b80 (most recent call first):
  File "{cache}/r2/cr2key.py", line 808 in call
  File "/venv/torch/_inductor/output_code.py", line 763 in __call__
  File "/repo/dflash/step.py", line 90 in loss

Extension modules: numpy, cr2key.kernel (total: 2)
"""


def test_a_crash_names_the_compiled_entry_of_the_crashing_thread(tmp_path):
    cache = tmp_path / "cache" / "fp"
    log = tmp_path / "train.log"
    log.write_text(DUMP.format(cache=cache))
    assert compiled_entry(log, 0, cache) == "r2/cr2key.py, line 808 in call"
    assert compiled_entry(log, 0, tmp_path / "another") is None  # crashed outside the cache
    assert compiled_entry(log, log.stat().st_size, cache) is None  # not this attempt's output
    assert compiled_entry(log, 0, None) is None
    log.write_text("Traceback (most recent call last):\nValueError: x\n")
    assert compiled_entry(log, 0, cache) is None
