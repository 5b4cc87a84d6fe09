"""The prepared token store: flat arrays on disk that every process of a host reads in place.

A store is a folder (written by `python -m dflash.data prepare`, dflash/data/prepare.py):

    tokens.i32        int32  every sample's token ids, one after the other
    loss_mask.u8      uint8  1 where the drafter learns, per token
    offsets.i64       int64  samples + 1 offsets into the two arrays above
    first_anchor.i32  int32  per sample, the first position a with mask[a] and mask[a + 1]
    manifest.json     what the store holds and where it came from (`manifest()` below)

The layout nanoGPT-style trainers use (flat binary arrays, little-endian, no header), with an
offsets index because samples have their own lengths. A process reads the per-sample index
(12 bytes a sample) and then each sample's ids and mask where they lie (`FileArray`, one pread
each): the pages live once in the page cache however many processes read them, and a process's
own memory does not grow with the data set. (A memory map would give the same sharing, but on
kernels with large page-cache folios each fault maps up to 2 MB around the sample, so every
process's resident size would climb toward the store's size over an epoch.) `content_sha256`
names the data: the hash of the three arrays that define it (first_anchor is derived).
Just over 300 lines: the format, its reading and its manifest belong together; writing a store
is dflash/data/store_writer.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dflash.data.store_format import (
    ARRAY_FILES,
    CONTENT,
    FORMAT,
    MANIFEST,
    SUMMARY_KEYS,
    VERSION,
)
from dflash.errors import ConfigError

# name -> (file, dtype); the order is the order of content_sha256.
ARRAYS = {name: (file, np.dtype(dtype)) for name, (file, dtype) in ARRAY_FILES.items()}
HASH_BLOCK = 1 << 24
# Read a sample at a time, in shuffled order; the per-sample index is read whole.
PER_TOKEN = ("tokens", "loss_mask")


def content_sha256(array_sha256: dict[str, str]) -> str:
    """The data's name, from the sha256 of each array that defines it."""
    lines = "".join(f"{name} {array_sha256[name]}\n" for name in CONTENT)
    return hashlib.sha256(lines.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def length_stats(lengths: np.ndarray) -> dict[str, int]:
    """Sample length percentiles (nearest rank: p90 is the length 90% of samples are within),
    the figures that move tokens/s."""
    if len(lengths) == 0:
        return {"p50": 0, "p90": 0, "p99": 0, "max": 0}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99], method="inverted_cdf")
    return {"p50": int(p50), "p90": int(p90), "p99": int(p99), "max": int(lengths.max())}


def first_anchors(mask: np.ndarray) -> int:
    """The first position a with mask[a] and mask[a + 1]; -1 when there is none."""
    pairs = np.flatnonzero(mask[:-1] & mask[1:])
    return int(pairs[0]) if len(pairs) else -1


@dataclass
class TokenStore:
    """Samples as flat arrays (read from a store folder, or in memory) and their manifest."""

    tokens: np.ndarray | FileArray
    loss_mask: np.ndarray | FileArray
    offsets: np.ndarray
    first_anchor: np.ndarray
    manifest: dict[str, Any]
    path: Path | None = None  # the store folder read (None: in memory)
    kind: str = "store"  # how the run named its data: store | jsonl | self_generated | memory
    named: str | None = None  # what --data said (a store folder or a JSONL file)

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and loss mask of one sample."""
        begin, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.tokens[begin:end], self.loss_mask[begin:end]

    def summary(self) -> dict[str, Any]:
        """What a run reports of its data: how it was named, the manifest without its file
        table, and the store read (a JSONL file's prepared copy)."""
        found = {
            key: self.manifest[key]
            for key in SUMMARY_KEYS
            if self.manifest.get(key) not in (None, [], {})
        }
        if "generated" in self.manifest:
            found["generated"] = self.manifest["generated"]
        where = {"path": self.named, "store": str(self.path) if self.path else None}
        return {"kind": self.kind, **{k: v for k, v in where.items() if v}, **found}

    @classmethod
    def from_samples(
        cls, samples: Sequence[tuple[Sequence[int], Sequence[int]]], **manifest: Any
    ) -> TokenStore:
        """An in-memory store of (input_ids, loss_mask) pairs, e.g. self-generated data."""
        ids = [np.asarray(i, dtype=np.int32) for i, _ in samples]
        masks = [(np.asarray(m) != 0).astype(np.uint8) for _, m in samples]
        return cls.from_arrays(ids, masks, **manifest)

    @classmethod
    def from_arrays(
        cls, ids: list[np.ndarray], masks: list[np.ndarray], **manifest: Any
    ) -> TokenStore:
        """An in-memory store of per-sample id (int32) and mask (uint8) arrays."""
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        mask = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
        anchors = np.array([first_anchors(m) for m in masks], dtype=np.int32)
        arrays = {"tokens": tokens, "loss_mask": mask, "offsets": offsets}
        full = build_manifest(arrays, anchors, **manifest)
        return cls(tokens, mask, offsets, anchors, full, kind="memory")

    @classmethod
    def open(cls, folder: Path, verify: bool = False) -> TokenStore:
        """Open a store folder. Cheap checks always (the manifest, every array's size); with
        `verify` every array is hashed again and compared with the manifest."""
        manifest = read_manifest(folder)
        arrays = {}
        for name, (file, dtype) in ARRAYS.items():
            entry = manifest["arrays"][name]
            path = folder / file
            size = path.stat().st_size if path.is_file() else None
            if size != entry["count"] * dtype.itemsize:
                raise ConfigError(
                    f"--data '{folder}': {file} holds {size} bytes, its manifest says "
                    f"{entry['count'] * dtype.itemsize} (truncated or replaced); "
                    "prepare the store again over it (python -m dflash.data prepare --force "
                    "--out FOLDER FILE.jsonl)"
                )
            if verify and file_sha256(path) != entry["sha256"]:
                raise ConfigError(
                    f"--data '{folder}': {file} does not hash to its manifest's sha256 (its "
                    "content changed after prepare); prepare the store again over it "
                    "(prepare --force)"
                )
            arrays[name] = (
                FileArray(path, dtype, entry["count"])
                if name in PER_TOKEN
                else np.fromfile(path, dtype=dtype, count=entry["count"])
            )
        offsets = arrays["offsets"]
        if (
            int(offsets[-1]) != len(arrays["tokens"])
            or len(arrays["first_anchor"]) != len(offsets) - 1
        ):
            raise ConfigError(
                f"--data '{folder}': the offsets do not cover the token array; "
                "prepare the store again"
            )
        return cls(
            arrays["tokens"],
            arrays["loss_mask"],
            offsets,
            arrays["first_anchor"],
            manifest,
            folder,
            named=str(folder),
        )


def build_manifest(
    arrays: dict[str, np.ndarray], anchors: np.ndarray, **fields: Any
) -> dict[str, Any]:
    """The manifest of in-memory arrays (prepare streams its own, dflash/data/prepare.py)."""
    sums = {name: hashlib.sha256(array.tobytes()).hexdigest() for name, array in arrays.items()}
    sums["first_anchor"] = hashlib.sha256(anchors.tobytes()).hexdigest()
    lengths = np.diff(arrays["offsets"])
    counts = {**{name: len(a) for name, a in arrays.items()}, "first_anchor": len(anchors)}
    return manifest(
        sums,
        counts,
        lengths,
        supervised=int(arrays["loss_mask"].sum(dtype=np.int64)),
        max_token_id=int(arrays["tokens"].max()) if len(arrays["tokens"]) else -1,
        **fields,
    )


def manifest(
    sums: dict[str, str],
    counts: dict[str, int],
    lengths: np.ndarray,
    *,
    supervised: int,
    max_token_id: int,
    sources: list[dict[str, Any]] | None = None,
    tokenizer: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    created: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "content_sha256": content_sha256(sums),
        "samples": len(lengths),
        "tokens": int(lengths.sum()),
        "supervised_tokens": supervised,
        "lengths": length_stats(lengths),
        "max_token_id": max_token_id,
        "sources": sources or [],
        "tokenizer": tokenizer,
        "settings": settings or {},
        "created": created,
        # What a reader needs to judge the store without this code: which keys a run reports
        # (the summary) and each file's size in bytes.
        "summary_keys": list(SUMMARY_KEYS),
        "arrays": {
            name: {
                "file": file,
                "dtype": dtype.str,
                "count": counts[name],
                "bytes": counts[name] * dtype.itemsize,
                "sha256": sums[name],
            }
            for name, (file, dtype) in ARRAYS.items()
        },
        **extra,
    }


class FileArray:
    """A read-only 1-D array in a file, read a slice at a time (pread), never mapped."""

    def __init__(self, path: Path, dtype: np.dtype, count: int) -> None:
        self.path = path
        self.dtype = dtype
        self.count = count
        self.fd = os.open(path, os.O_RDONLY)
        # Samples are read in shuffled order: read-ahead would fill the cache with neighbours.
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, part: slice) -> np.ndarray:
        begin, end, step = part.indices(self.count)
        if step != 1:
            raise IndexError("FileArray reads contiguous slices only")
        out = np.empty(max(0, end - begin), dtype=self.dtype)
        if len(out):
            got = os.preadv(self.fd, [memoryview(out).cast("B")], begin * self.dtype.itemsize)
            if got != out.nbytes:
                raise OSError(f"{self.path}: short read at element {begin} (file truncated?)")
        return out

    def __del__(self) -> None:
        if hasattr(self, "fd"):
            os.close(self.fd)


def read_manifest(folder: Path) -> dict[str, Any]:
    """A store's manifest, checked for the format; a ConfigError names the folder and the fix."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ConfigError(
            f"--data '{folder}': no such folder; prepare one with python -m dflash.data prepare "
            "--out FOLDER INPUT.jsonl, or pass a JSONL file"
        )
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"--data '{folder}': no {MANIFEST}, so not a prepared store (a prepare killed "
            "before its end leaves none under the final name); prepare it again"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--data '{folder}': {MANIFEST} cannot be read ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"--data '{folder}': {MANIFEST} is not a {FORMAT} manifest")
    if data.get("version") != VERSION:
        raise ConfigError(
            f"--data '{folder}': store version {data.get('version')}, this trainer reads "
            f"version {VERSION}; prepare it again with this release"
        )
    return data


def write_manifest(folder: Path, data: dict[str, Any]) -> None:
    path = folder / MANIFEST
    with path.open("w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
