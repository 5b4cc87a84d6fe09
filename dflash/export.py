"""python -m dflash.export: a training checkpoint as a public DFlash drafter folder.

    python -m dflash.export --checkpoint FILE_OR_DIR --out DIR [--target-model M]
    python -m dflash.export --checkpoint DIR --step N --out-root exports/

The folder (`dflash.public_format`) holds config.json, model.safetensors, dflash_export.json
(where the weights came from) and SHA256SUMS; serving engines load it as it is. Everything is
checked before anything is written, and the folder is written under a temp name and renamed,
so an export either is complete or does not exist. The checkpoint is memory-mapped: only the
drafter's weights are read, never the optimizer state, so exporting beside a running trainer
takes little memory. Prints one JSON line: out, name, step, release (the checkpoint's),
trained_by {run_id, code_tree_sha256}, changed, files {name: sha256} (null in a dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from dflash import checkpoint
from dflash.codehash import sha256_file
from dflash.errors import ConfigError
from dflash.flags import positive_int
from dflash.provenance import code_tree_sha256, release_name
from dflash.public_format import (
    CHECKSUMS,
    CONFIG,
    DTYPES,
    PROVENANCE,
    WEIGHTS,
    config_json,
    drafter_config_of,
    expressible_problems,
    tensor_problems,
)
from dflash.supervision.status import utc_now
from dflash.target import load_target_config

FORMAT = 1
_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dflash.export",
        description="Write a checkpoint as a public DFlash drafter folder (config.json, "
        "model.safetensors).",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint file, or a folder (its newest complete checkpoint, or --step)",
    )
    parser.add_argument("--step", type=positive_int, default=None, help="the checkpoint's step")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="the folder to write; must not exist or be empty")
    out.add_argument(
        "--out-root",
        help="write <root>/<release>-step<N>; a complete export of the same checkpoint there is "
        "left as it is",
    )
    parser.add_argument(
        "--target-model",
        default=None,
        help="the target's config (layer count, width); default: the checkpoint's target",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="weights dtype (default bfloat16, as published; float32 keeps the trained "
        "master weights exactly)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check everything and say what would be written"
    )
    return parser


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def load_checkpoint(where: Path, step: int | None) -> tuple[Path, dict[str, Any]]:
    """The checkpoint file, or a folder's newest complete one (or that of --step)."""
    if where.is_dir() and step is not None:
        if not checkpoint.checkpoint_path(where, step).is_file():
            raise ConfigError(f"--checkpoint '{where}' has no checkpoint of --step {step}")
        where = checkpoint.checkpoint_path(where, step)
    if where.is_file():
        try:
            payload = torch.load(where, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # a truncated zip fails in several ways
            raise ConfigError(f"--checkpoint '{where}': cannot be read ({exc})") from exc
        if step is not None and payload.get("step") != step:
            found = payload.get("step")
            raise ConfigError(f"--checkpoint '{where}' is of step {found}, not --step {step}")
        return where, payload
    if not where.is_dir():
        raise ConfigError(f"--checkpoint '{where}': no such checkpoint file or folder")
    found = checkpoint.load_latest(where, warn=warn, mmap=True)
    if found is None:
        raise ConfigError(
            f"--checkpoint '{where}': no complete checkpoint there (step-NNNNNNNN.pt); "
            "train first, or name a checkpoint file"
        )
    return found


def provenance(path: Path, payload: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Where the weights came from: the run that trained them and the code that exported them."""
    return {
        "format": FORMAT,
        "step": payload["step"],
        "checkpoint": str(path),
        "dtype": dtype,
        "trained_by": {
            "release": payload.get("release"),
            "code_tree_sha256": payload.get("code_tree_sha256"),
            "run_id": payload.get("run_id"),
            "target_model": payload.get("target_model"),
            "data": payload.get("training_data"),  # absent from checkpoints before exports
        },
        "exported_by": {
            "release": release_name(),
            "code_tree_sha256": code_tree_sha256(),
            "time": utc_now(),
        },
        "drafter_config": payload["drafter_config"],
    }


def read_checksums(folder: Path) -> dict[str, str] | None:
    """sha256 of every file of an export folder (SHA256SUMS included), None unless the files
    SHA256SUMS lists are exactly the export's and all still match."""
    try:
        lines = (folder / CHECKSUMS).read_text().splitlines()
    except OSError:
        return None
    listed = dict(reversed(line.split("  ", 1)) for line in lines if "  " in line)
    if sorted(listed) != sorted([CONFIG, WEIGHTS, PROVENANCE]):
        return None
    for name, sha in listed.items():
        if not (folder / name).is_file() or sha256_file(folder / name) != sha:
            return None
    return {**listed, CHECKSUMS: sha256_file(folder / CHECKSUMS)}


def write_folder(
    out: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], origin: dict[str, Any]
) -> dict[str, str]:
    """Write the folder under a temp name beside `out`, then rename it to `out`."""
    from safetensors.torch import save_file

    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # what a killed export left
        shutil.rmtree(stale, ignore_errors=True)
    temp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    temp.mkdir()
    try:
        (temp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(temp / WEIGHTS), metadata={"format": "pt"})
        (temp / PROVENANCE).write_text(json.dumps(origin, indent=2) + "\n")
        sums = {name: sha256_file(temp / name) for name in (CONFIG, WEIGHTS, PROVENANCE)}
        # sha256sum's format: `sha256sum -c SHA256SUMS` checks the folder.
        (temp / CHECKSUMS).write_text("".join(f"{sha}  {name}\n" for name, sha in sums.items()))
        for name in (CONFIG, WEIGHTS, PROVENANCE, CHECKSUMS):
            (temp / name).chmod(0o644)  # safetensors writes its file owner-only
            with (temp / name).open("rb") as handle:
                os.fsync(handle.fileno())
        os.replace(temp, out)  # `out` is absent or an empty folder: both are replaced
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {**sums, CHECKSUMS: sha256_file(out / CHECKSUMS)}


def existing_export(
    out: Path, payload: dict[str, Any], dtype: str, out_root: str | None
) -> dict[str, str]:
    """The files of a complete export of this very checkpoint already at `out` (--out-root
    leaves it as it is); anything else in the way is refused."""
    if not out_root:
        raise ConfigError(f"--out '{out}' exists and is not empty; remove it or pick another")
    files = read_checksums(out)
    origin = json.loads((out / PROVENANCE).read_text()) if files else {}
    found = (origin.get("step"), origin.get("dtype"), origin.get("trained_by", {}).get("run_id"))
    if files is None or found != (payload["step"], dtype, payload.get("run_id")):
        raise ConfigError(
            f"--out-root: '{out}' holds something else than a complete {dtype} export "
            "of this checkpoint; remove it, or export to another --out"
        )
    return files


def destination(out: str | None, out_root: str | None, release: str, step: int) -> tuple[Path, str]:
    if out:
        return Path(out), Path(out).name
    if not _RELEASE.match(release):
        raise ConfigError(f"the checkpoint's release {release!r} cannot name a folder; use --out")
    name = f"{release}-step{step}"
    assert out_root is not None  # argparse requires --out or --out-root
    return Path(out_root) / name, name


def export(
    source: Path,
    *,
    step: int | None,
    out: str | None,
    out_root: str | None,
    target_model: str | None,
    dtype: str,
    dry_run: bool,
) -> dict[str, Any]:
    """Export `source` (a checkpoint file, or a folder's newest or `step`) to `out`, or under
    `out_root`; `dry_run` checks everything and writes nothing. The rest as the flags say."""
    path, payload = load_checkpoint(source, step)
    where = f"--checkpoint '{path}'"
    cfg = drafter_config_of(payload.get("drafter_config") or {}, where)
    target_name = target_model or payload.get("target_model")
    if not target_name:
        raise ConfigError(f"{where} does not name its target; pass --target-model")
    target_config = load_target_config(target_name)
    problems = expressible_problems(cfg, target_config)
    if problems:
        raise ConfigError(
            f"{where} with --target-model '{target_name}' cannot be written in the public "
            f"DFlash format: {'; '.join(problems)}"
        )
    state = payload["drafter"]
    problems = tensor_problems(state, cfg)
    if problems:
        raise ConfigError(f"{where}: its weights do not fit its config: {'; '.join(problems)}")
    saved_step = int(payload["step"])
    folder, name = destination(out, out_root, str(payload.get("release")), saved_step)
    summary: dict[str, Any] = {"out": str(folder), "name": name, "step": saved_step}
    summary["release"] = payload.get("release")
    summary["trained_by"] = {key: payload.get(key) for key in ("run_id", "code_tree_sha256")}
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        files = existing_export(folder, payload, dtype, out_root)
        return {**summary, "changed": False, "files": files}
    # --out-root is made when missing, inside a folder that exists.
    must_exist = folder.parent.parent if out_root else folder.parent
    if not must_exist.is_dir():
        raise ConfigError(f"'{must_exist}' is not a folder; create it first")
    if dry_run:
        return {**summary, "changed": True, "files": None}
    folder.parent.mkdir(exist_ok=True)
    tensors = {key: value.to(DTYPES[dtype]).contiguous() for key, value in state.items()}
    config = config_json(cfg, target_config, dtype)
    files = write_folder(folder, config, tensors, provenance(path, payload, dtype))
    return {**summary, "changed": True, "files": files}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = export(
            Path(args.checkpoint),
            step=args.step,
            out=args.out,
            out_root=args.out_root,
            target_model=args.target_model,
            dtype=args.dtype,
            dry_run=args.dry_run,
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
