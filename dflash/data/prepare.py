"""JSONL files into a token store (dflash/data/store.py), streamed: memory does not grow with
the data.

Records are parsed by a pool of worker processes, chunk by chunk, and written in input order by
a StoreWriter (dflash/data/store_writer.py: a temp folder renamed into place, so a prepare killed at
any moment leaves no store under the final name); progress goes to stderr every few seconds. A
JSONL file given to the trainer is prepared once into a cache keyed by its content.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dflash.data.records import Parsed, RecordParser, Settings, tokenizer_identity
from dflash.data.store import MANIFEST, TokenStore, file_sha256
from dflash.data.store_writer import Say, StoreWriter, stderr
from dflash.errors import ConfigError

CHUNK_BYTES = 4 << 20  # lines handed to a worker at a time
IN_PROCESS_BELOW = 32 << 20  # smaller inputs are parsed without a pool


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


def _check_inputs(inputs: list[Path]) -> None:
    if not inputs:
        raise ConfigError("prepare: name at least one JSONL input file")
    for path in inputs:
        if not path.is_file():
            raise ConfigError(f"input '{path}': no such file")


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
    say: Say = stderr,
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
