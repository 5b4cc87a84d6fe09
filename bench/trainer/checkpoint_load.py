"""How long a restart takes to load its checkpoint, read against mapped (dflash/resume.py).

Default shape: the Qwen3-8B-shaped drafter of drafter_step.py (its shape flags) with its fused
AdamW state, one checkpoint saved by dflash.checkpoint (what a restart finds: ~12 GB, in the
page cache the save left). Each round loads it both ways, in turns, and puts it on the device
as a resume does (load_latest, then the drafter's and the optimizer's load_state_dict):

    python bench/trainer/checkpoint_load.py [--rounds 3] [--cpu --hidden 256 ...]

`read` is torch.load reading the whole file into memory first (before), `mmap` maps it and the
copies onto the device read it (now). Prints each round and the medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from drafter_step import add_shape_args, shaped_drafter  # beside this file

from dflash import checkpoint


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--folder", help="where the checkpoint goes (default: a temp folder)")
    p.add_argument("--cpu", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse()
    device = torch.device("cpu" if args.cpu else "cuda:0")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    _, drafter = shaped_drafter(args, device, dtype)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4, fused=not args.cpu)
    for param in drafter.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()  # the moments exist, as in any checkpoint after step 1
    with tempfile.TemporaryDirectory(prefix="ckload-", dir=args.folder) as folder:
        started = time.perf_counter()
        payload = {"drafter": drafter.state_dict(), "optimizer": optimizer.state_dict()}
        path = checkpoint.save(Path(folder), 1, payload)
        saved_s = time.perf_counter() - started
        del payload
        rounds = []
        for number in range(args.rounds):
            for mode in ("read", "mmap"):
                timed = load(folder, mode, drafter, optimizer, device)
                rounds.append({"round": number, "mode": mode, **timed})
                print(json.dumps(rounds[-1]), flush=True)
        size_gb = path.stat().st_size / 1e9
    medians = {
        mode: {
            key: round(statistics.median(r[key] for r in rounds if r["mode"] == mode), 2)
            for key in ("load_s", "apply_s", "total_s")
        }
        for mode in ("read", "mmap")
    }
    print(json.dumps({
        "device": torch.cuda.get_device_name() if not args.cpu else "cpu",
        "torch": torch.__version__, "checkpoint_gb": round(size_gb, 2),
        "saved_s": round(saved_s, 2), "rounds": args.rounds, "medians": medians,
        "mmap_over_read": round(medians["mmap"]["total_s"] / medians["read"]["total_s"], 3),
    }, indent=1))  # fmt: skip


def load(
    folder: str, mode: str, drafter: torch.nn.Module, optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> dict[str, float]:  # fmt: skip
    """One resume's load: the newest checkpoint, then onto the device."""
    started = time.perf_counter()
    found = checkpoint.load_latest(Path(folder), warn=print, mmap=mode == "mmap")
    assert found is not None
    loaded = time.perf_counter()
    _, payload = found
    drafter.load_state_dict(payload["drafter"])
    optimizer.load_state_dict(payload["optimizer"])
    if device.type == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    del payload, found
    return {"load_s": round(loaded - started, 3), "apply_s": round(done - loaded, 3),
            "total_s": round(done - started, 3)}  # fmt: skip


if __name__ == "__main__":
    main()
