"""JSONL training records into token arrays, each bad record named by file and line.

A record is one JSON object a line, in one of three forms:
  {"input_ids": [...], "loss_mask": [...]}   loss_mask optional (all ones)
  {"text": "..."}                            tokenized, all ones
  {"prompt": "...", "response": "..."}       tokenized, ones on the response only
Samples are cut to the longest length; a sample without two consecutive loss-mask tokens
(no anchor, nothing to learn) is dropped and counted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dflash.data.store import first_anchors
from dflash.errors import ConfigError

# Files of a tokenizer folder that decide how text becomes ids (not the model's weights).
TOKENIZER_FILES = ("tokenizer", "vocab", "merges", "special_tokens_map", "added_tokens")


class RecordError(ConfigError):
    """A bad record; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Settings:
    """How records become samples; recorded in the store's manifest."""

    max_seq_len: int
    vocab_size: int | None  # None: ids are not checked here (the trainer checks max_token_id)
    tokenizer: str | None  # a tokenizer folder, for text records


@dataclass
class Parsed:
    """The samples of a run of consecutive lines, as flat arrays."""

    tokens: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    anchors: list[int] = field(default_factory=list)
    records: int = 0
    dropped: int = 0  # no anchor: nothing to learn
    cut: int = 0  # longer than max_seq_len


def tokenizer_identity(folder: str) -> dict[str, Any]:
    """The tokenizer's name and a hash of the files that decide its ids."""
    path = Path(folder)
    files = sorted(
        p for p in path.iterdir() if p.is_file() and p.name.startswith(TOKENIZER_FILES)
    ) if path.is_dir() else []  # fmt: skip
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\n".encode())
    return {"name": path.name, "sha256": digest.hexdigest(), "files": [f.name for f in files]}


class RecordParser:
    """One parser per process: the tokenizer is loaded at the first text record."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tokenizer: Any = None

    def tokenize(self, text: str, where: str) -> list[int]:
        if self._tokenizer is None:
            if self.settings.tokenizer is None:
                raise RecordError(f"{where}: text needs a tokenizer; pass --tokenizer FOLDER")
            from dflash.target import load_tokenizer

            self._tokenizer = load_tokenizer(self.settings.tokenizer)
        return self._tokenizer(text, add_special_tokens=False)["input_ids"]

    def record(self, line: bytes | str, where: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32, mask uint8) of one line, before the cut."""
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise RecordError(
                f"{where}: not JSON ({exc}); each line must be one JSON object"
            ) from None
        if not isinstance(record, dict):
            raise RecordError(f"{where}: expected a JSON object, found {type(record).__name__}")
        if "input_ids" in record:
            ids = _int_array(record["input_ids"], "input_ids", where)
            mask = (
                _int_array(record["loss_mask"], "loss_mask", where) != 0
                if "loss_mask" in record
                else np.ones(len(ids), dtype=bool)
            )
            if len(mask) != len(ids):
                raise RecordError(
                    f"{where}: input_ids has {len(ids)} ids but loss_mask {len(mask)} values; "
                    "they must be integer lists of one length"
                )
        elif isinstance(record.get("text"), str):
            ids = np.array(self.tokenize(record["text"], where), dtype=np.int64)
            mask = np.ones(len(ids), dtype=bool)
        elif isinstance(record.get("prompt"), str) and isinstance(record.get("response"), str):
            prompt = self.tokenize(record["prompt"], where)
            response = self.tokenize(record["response"], where)
            ids = np.array(prompt + response, dtype=np.int64)
            mask = np.arange(len(ids)) >= len(prompt)
        else:
            raise RecordError(
                f"{where}: needs input_ids, text, or prompt and response "
                f"(found keys {sorted(record)[:6]})"
            )
        self._check_ids(ids, where)
        return ids.astype(np.int32), mask.astype(np.uint8)

    def _check_ids(self, ids: np.ndarray, where: str) -> None:
        if not len(ids):
            return
        vocab = self.settings.vocab_size
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or (vocab is not None and high >= vocab) or high >= 2**31:
            bad = low if low < 0 else high
            position = int(np.flatnonzero(ids == bad)[0])
            limit = f"0..{vocab - 1}" if vocab is not None else "0..2147483647"
            raise RecordError(
                f"{where}: token id {bad} at position {position} is outside the vocabulary "
                f"{limit}; tokenize the data for this target (or name the right one with "
                "--target-model / --vocab-size)"
            )

    def lines(self, lines: list[bytes], source: str, first_line: int) -> Parsed:
        """Parse a run of lines of `source` starting at line `first_line` (blank lines skipped)."""
        out = Parsed()
        max_len = self.settings.max_seq_len
        for number, line in enumerate(lines, first_line):
            if not line.strip():
                continue
            ids, mask = self.record(line, f"'{source}' line {number}")
            out.records += 1
            if len(ids) > max_len:
                ids, mask, out.cut = ids[:max_len], mask[:max_len], out.cut + 1
            anchor = first_anchors(mask)
            if anchor < 0:
                out.dropped += 1
                continue
            out.tokens.append(ids)
            out.masks.append(mask)
            out.lengths.append(len(ids))
            out.anchors.append(anchor)
        return out


def _int_array(value: Any, name: str, where: str) -> np.ndarray:
    """A 1-D integer array from a JSON list, without a Python loop over its items."""
    if isinstance(value, list):
        if not value:
            return np.zeros(0, dtype=np.int64)
        try:
            array = np.array(value)
        except (ValueError, OverflowError):
            array = None
        if array is not None and array.ndim == 1 and array.dtype.kind in "iub":
            return array.astype(np.int64, copy=False)
    raise RecordError(
        f"{where}: {name} must be a list of integers (found {str(value)[:60]}); "
        "input_ids and loss_mask must be integer lists of one length"
    )
