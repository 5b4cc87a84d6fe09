"""JSONL files into a token store (dflash/store.py), streamed: memory does not grow with the data.

The store is written into a temp folder beside the final one and renamed into place at the
end, so a prepare killed at any moment leaves no store under the final name (the next prepare
of that name removes what a dead one left). Records are parsed by a pool of worker processes,
chunk by chunk, and written in input order; progress goes to stderr every few seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import multiprocessing
import os
import shutil
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dflash.errors import ConfigError
from dflash.records import Parsed, RecordParser, Settings, tokenizer_identity
from dflash.store import ARRAYS, MANIFEST, TokenStore, file_sha256, manifest, write_manifest

CHUNK_BYTES = 4 << 20  # lines handed to a worker at a time
IN_PROCESS_BELOW = 32 << 20  # smaller inputs are parsed without a pool
TEMP_MARK = ".prepare-"
Say = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Progress:
    """A line every `interval` seconds: how far, how fast, how long still."""

    def __init__(self, total_bytes: int, say: Say, interval: float = 2.0) -> None:
        self.total = max(1, total_bytes)
        self.say = say
        self.interval = interval
        self.start = self.last = time.monotonic()
        self.done = self.samples = self.tokens = 0

    def add(self, nbytes: int, samples: int, tokens: int) -> None:
        self.done += nbytes
        self.samples += samples
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.say(self.line(now))

    def line(self, now: float, final: bool = False) -> str:
        elapsed = max(1e-9, now - self.start)
        share = self.done / self.total
        eta = "" if final or not share else f", ETA {_duration(elapsed / share - elapsed)}"
        return (
            f"prepare: {share:.0%} of {self.total / 1e6:.1f} MB, {self.samples:,} samples, "
            f"{self.tokens / 1e6:.1f} M tokens in {_duration(elapsed)} "
            f"({self.samples / elapsed:,.0f} samples/s, {self.tokens / elapsed / 1e6:.2f} M "
            f"tokens/s){eta}"
        )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _chunks(handle: BinaryIO) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, lines) of about CHUNK_BYTES each."""
    number = 1
    while lines := handle.readlines(CHUNK_BYTES):
        yield number, lines
        number += len(lines)


_PARSER: RecordParser | None = None


def _init_worker(settings: Settings) -> None:
    global _PARSER
    _PARSER = RecordParser(settings)


def _parse(job: tuple[str, int, list[bytes]]) -> tuple[Any, ...]:
    assert _PARSER is not None
    source, first, lines = job
    return _pack(_PARSER.lines(lines, source, first))


def _pack(parsed: Parsed) -> tuple[Any, ...]:
    """Flat arrays (cheap to send between processes) and the counts."""
    empty_i32, empty_u8 = np.zeros(0, np.int32), np.zeros(0, np.uint8)
    return (
        np.concatenate(parsed.tokens) if parsed.tokens else empty_i32,
        np.concatenate(parsed.masks) if parsed.masks else empty_u8,
        np.array(parsed.lengths, dtype=np.int64),
        np.array(parsed.anchors, dtype=np.int32),
        parsed.records,
        parsed.dropped,
        parsed.cut,
    )


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

    def __init__(self, out: Path, force: bool = False, say: Say = _stderr) -> None:
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


def _check_inputs(inputs: list[Path]) -> None:
    if not inputs:
        raise ConfigError("prepare: name at least one JSONL input file")
    for path in inputs:
        if not path.is_file():
            raise ConfigError(f"input '{path}': no such file")


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


def _sources(inputs: list[Path], settings: Settings, workers: int, writer: StoreWriter,
             progress: Progress) -> tuple[list[dict[str, Any]], dict[str, int]]:  # fmt: skip
    """Parse every input into `writer`; the sources' table and the record counts."""
    counts = {"records": 0, "dropped": 0, "cut": 0}
    sources = []
    pool = None
    if workers > 1 and sum(p.stat().st_size for p in inputs) >= IN_PROCESS_BELOW:
        pool = multiprocessing.get_context("spawn").Pool(
            workers, initializer=_init_worker, initargs=(settings,)
        )
    local = RecordParser(settings)
    try:
        for path in inputs:
            digest, before = hashlib.sha256(), dict(counts)
            samples_before = writer.samples
            pending: deque[tuple[int, Any]] = deque()
            with path.open("rb") as handle:
                for first, lines in _chunks(handle):
                    block = b"".join(lines)
                    digest.update(block)
                    size = len(block)
                    if pool is None:
                        packed = _pack(local.lines(lines, str(path), first))
                        _take(packed, size, writer, counts, progress)
                        continue
                    pending.append((size, pool.apply_async(_parse, ((str(path), first, lines),))))
                    while len(pending) > 2 * workers:  # bounded: memory stays flat
                        _drain_one(pending, writer, counts, progress)
                while pending:
                    _drain_one(pending, writer, counts, progress)
            stat = path.stat()
            sources.append({
                "name": path.name, "path": str(path.resolve()), "size": stat.st_size,
                "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(timespec="seconds"),
                "sha256": digest.hexdigest(),
                "records": counts["records"] - before["records"],
                "samples": writer.samples - samples_before,
            })  # fmt: skip
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return sources, counts


def _drain_one(
    pending: deque, writer: StoreWriter, counts: dict[str, int], progress: Progress
) -> None:
    size, result = pending.popleft()
    _take(result.get(), size, writer, counts, progress)


def _take(packed: tuple[Any, ...], size: int, writer: StoreWriter, counts: dict[str, int],
          progress: Progress) -> None:  # fmt: skip
    tokens, mask, lengths, anchors, records, dropped, cut = packed
    writer.add(tokens, mask, lengths, anchors)
    counts["records"] += records
    counts["dropped"] += dropped
    counts["cut"] += cut
    progress.add(size, len(lengths), len(tokens))


def prepare(
    inputs: list[Path],
    out: Path,
    settings: Settings,
    *,
    workers: int = 1,
    force: bool = False,
    say: Say = _stderr,
) -> dict[str, Any]:
    """Write the store of `inputs` at `out`; returns its manifest."""
    _check_inputs(inputs)
    progress = Progress(sum(p.stat().st_size for p in inputs), say)
    with StoreWriter(out, force=force, say=say) as writer:
        sources, counts = _sources(inputs, settings, workers, writer, progress)
        if not writer.samples:
            names = ", ".join(f"'{p}'" for p in inputs)
            raise ConfigError(
                f"{names}: no sample to train on ({counts['records']} records, "
                f"{counts['dropped']} without two consecutive loss-mask tokens); the drafter "
                "learns where loss_mask has 1 at two positions in a row (a response)"
            )
        data = writer.finish(
            sources=sources,
            tokenizer=tokenizer_identity(settings.tokenizer) if settings.tokenizer else None,
            settings={"max_seq_len": settings.max_seq_len, "vocab_size": settings.vocab_size},
            prepare={**counts, "workers": workers,
                     "seconds": round(time.monotonic() - progress.start, 1)},
        )  # fmt: skip
    say(progress.line(time.monotonic(), final=True) + f" -> {out}")
    return data


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
    os.rename(temp, out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def default_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0))))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_store(
    path: Path, cache_dir: Path, settings: Settings, say: Say, verify: bool = False
) -> TokenStore:
    """A JSONL file's store, prepared once into `cache_dir` under a key of the file's content
    and the settings; every process of a host (and every later start) maps that one copy."""
    if not path.is_file():
        raise ConfigError(
            f"--data '{path}': no such file or folder; pass a JSONL file or a store folder "
            "(python -m dflash.data prepare)"
        )
    started = time.monotonic()
    tokenizer = tokenizer_identity(settings.tokenizer)["sha256"] if settings.tokenizer else ""
    content = file_sha256(path)
    key_text = f"{content} {settings.max_seq_len} {settings.vocab_size} {tokenizer}"
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--data-cache '{cache_dir}': cannot create it ({exc}); point --data-cache (or "
            "DFLASH_DATA_CACHE) at a writable folder, or prepare a store yourself"
        ) from None
    folder = cache_dir / f"{path.stem}-{key}"
    with _locked(cache_dir / f".{folder.name}.lock"):  # one process prepares, the others wait
        if (folder / MANIFEST).is_file():
            say(
                f"data: {path} (sha256 {content[:12]}): its prepared copy {folder} is read "
                f"(hashed in {time.monotonic() - started:.1f} s)"
            )
        else:
            try:
                prepare([path], folder, settings, workers=default_workers(), force=True, say=say)
            except ConfigError as exc:
                raise ConfigError(f"--data {exc}") from None
            say(
                f"data: {path} (sha256 {content[:12]}) prepared once into {folder} in "
                f"{time.monotonic() - started:.1f} s; later starts read it"
            )
    return TokenStore.open(folder, verify=verify)


def load_in_memory(path: Path, settings: Settings) -> TokenStore:
    """A small JSONL file (held-out data, tests) as an in-memory store, nothing written."""
    if not path.is_file():
        raise ConfigError(f"--data '{path}': no such file")
    with path.open("rb") as handle:
        parsed = RecordParser(settings).lines(handle.readlines(), str(path), 1)
    if not parsed.lengths:
        raise ConfigError(
            f"--data '{path}': no sample with two consecutive loss-mask tokens "
            f"({parsed.records} records)"
        )
    return TokenStore.from_arrays(
        parsed.tokens, parsed.masks, sources=[{"name": path.name, "path": str(path)}]
    )
