"""The token store's format as data: its name and version, the manifest's file name, its arrays
(file and dtype) and the keys a run reports of it. Stdlib only, so `python -m dflash.contracts`
publishes it without numpy or torch; dflash/data/store.py reads and writes by it."""

from __future__ import annotations

FORMAT = "dflash-token-store"
VERSION = 1
MANIFEST = "manifest.json"
# name -> (file, numpy dtype string); the order is the order of content_sha256.
ARRAY_FILES = {
    "tokens": ("tokens.i32", "<i4"),
    "loss_mask": ("loss_mask.u8", "|u1"),
    "offsets": ("offsets.i64", "<i8"),
    "first_anchor": ("first_anchor.i32", "<i4"),
}
CONTENT = ("tokens", "loss_mask", "offsets")
# What a run reports of its data (status.json, checkpoints, history): the manifest without
# the per-file table. The manifest lists them (`summary_keys`) for readers that are not this
# code.
SUMMARY_KEYS = (
    "content_sha256",
    "samples",
    "tokens",
    "supervised_tokens",
    "lengths",
    "max_token_id",
    "sources",
    "tokenizer",
    "settings",
    "created",
)
