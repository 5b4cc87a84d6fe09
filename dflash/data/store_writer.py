"""Writing a token store (dflash/data/store.py): arrays appended chunk by chunk into a temp folder
beside the final one, hashed as they are written, renamed into place with the manifest at the
end. A writer killed at any moment leaves no store under the final name; the next writer of
that name on the same host removes what a dead one left."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import socket
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from dflash.data.store import ARRAYS, MANIFEST, manifest, write_manifest
from dflash.errors import ConfigError

TEMP_MARK = ".prepare-"
Say = Callable[[str], None]


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def chunk_first_anchors(mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per sample of a chunk (flat mask, lengths), its first anchor position; -1 for none."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    pos = np.flatnonzero(mask[:-1] & mask[1:])
    sample = np.searchsorted(ends, pos, side="right")
    keep = pos + 1 < ends[sample]  # the pair lies within one sample
    pos, sample = pos[keep], sample[keep]
    first = np.full(len(lengths), -1, dtype=np.int32)
    found, where = np.unique(sample, return_index=True)
    first[found] = pos[where] - starts[found]
    return first


class StoreWriter:
    """A store written chunk by chunk into a temp folder beside `out`, hashed as it goes, and
    renamed into place by `finish()`; left without `finish()` (an error, a kill), it leaves no
    store under the final name.

        with StoreWriter(out) as writer:
            writer.add(tokens, mask, lengths)
            writer.finish(sources=[...], settings={...})
    """

    def __init__(self, out: Path, force: bool = False, say: Say = stderr) -> None:
        if not out.parent.is_dir():
            raise ConfigError(
                f"--out '{out}': its folder {out.parent} does not exist; create it first"
            )
        if out.exists() and not force:
            raise ConfigError(
                f"--out '{out}' exists; pass --force to replace it (a trainer that reads it "
                "keeps reading the old files until it restarts)"
            )
        for stale in remove_stale_temps(out):
            say(f"prepare: removed {stale}, left by a prepare that did not finish")
        self.out = out
        self.temp = out.parent / f".{out.name}{TEMP_MARK}{socket.gethostname()}-{os.getpid()}"
        self.temp.mkdir()
        self.files = {name: (self.temp / file).open("wb") for name, (file, _) in ARRAYS.items()}
        self.hashes = {name: hashlib.sha256() for name in ARRAYS}
        self.counts = dict.fromkeys(ARRAYS, 0)
        self.lengths: list[np.ndarray] = []
        self.supervised = 0
        self.max_token_id = -1
        self.offset = 0
        self.done = False
        self._write("offsets", np.zeros(1, np.int64))

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()
        if not self.done:
            shutil.rmtree(self.temp, ignore_errors=True)

    @property
    def samples(self) -> int:
        return self.counts["first_anchor"]

    def _write(self, name: str, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=ARRAYS[name][1]).tobytes()
        self.files[name].write(data)
        self.hashes[name].update(data)
        self.counts[name] += len(array)

    def add(self, tokens: np.ndarray, mask: np.ndarray, lengths: np.ndarray,
            anchors: np.ndarray | None = None) -> None:  # fmt: skip
        """Samples one after the other: flat ids and mask, and each sample's length."""
        if not len(lengths):
            return
        self._write("tokens", tokens)
        self._write("loss_mask", mask)
        self._write("offsets", self.offset + np.cumsum(lengths))
        self._write("first_anchor", chunk_first_anchors(mask, lengths) if anchors is None
                    else anchors)  # fmt: skip
        self.offset += int(lengths.sum())
        self.lengths.append(lengths)
        self.supervised += int(mask.sum(dtype=np.int64))
        self.max_token_id = max(self.max_token_id, int(tokens.max()))

    def _close(self) -> None:
        for handle in self.files.values():
            if not handle.closed:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()

    def finish(self, **fields: Any) -> dict[str, Any]:
        """Write the manifest (with `fields`: sources, tokenizer, settings, ...) and rename the
        store into place; returns the manifest."""
        self._close()
        sums = {name: digest.hexdigest() for name, digest in self.hashes.items()}
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        data = manifest(
            sums, self.counts, lengths, supervised=self.supervised,
            max_token_id=self.max_token_id,
            created=datetime.now(UTC).isoformat(timespec="seconds"), **fields,
        )  # fmt: skip
        write_manifest(self.temp, data)
        _fsync_dir(self.temp)
        _put_in_place(self.temp, self.out)
        self.done = True
        return data


def remove_stale_temps(out: Path) -> list[Path]:
    """Temp folders of earlier prepares of `out` on this host whose process is gone (killed
    mid-way). The host is in the name: on a shared file system another host's pid means
    nothing here, and its prepare may still run."""
    removed = []
    for path in out.parent.glob(f".{out.name}{TEMP_MARK}{socket.gethostname()}-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _put_in_place(temp: Path, out: Path) -> None:
    """Rename the finished store to its name; a store already there is moved aside first (a
    trainer mapping it keeps its files until it exits) and then removed."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.replaced-{os.getpid()}"
        os.rename(out, old)
    try:
        os.rename(temp, out)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _copy_manifest_last(temp, out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _copy_manifest_last(temp: Path, out: Path) -> None:
    """Where a directory cannot be renamed (overlayfs, a container's root file system, answers
    EXDEV): copy the store, its manifest last, so a copy cut short is no store (no manifest)."""
    out.mkdir()
    for item in sorted(temp.iterdir(), key=lambda path: path.name == MANIFEST):
        shutil.copy2(item, out / item.name)
    for name in os.listdir(out):
        fd = os.open(out / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    shutil.rmtree(temp)
