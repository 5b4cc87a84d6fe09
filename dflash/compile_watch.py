"""The compile cache as the trainer sees it: status.json's `compile_cache`, and its canary.

run.sh points TORCHINDUCTOR_CACHE_DIR at the release's cache folder, cache/<fingerprint> (and
TRITON_CACHE_DIR inside it). A process that starts on a folder that already holds compiled
entries (`started_warm`) runs code that earlier processes compiled, and a damaged entry shows in
its first steps. The canary checks them: a non-finite loss or gradient norm in one of the first
CANARY_STEPS optimizer steps of a warm start with compiled code is blamed on the cache
(CacheSuspect, exit code CACHE_SUSPECT_EXIT), and the supervisor moves the folder aside and
restarts the trainer cold (dflash.supervise). A cold start that diverges is no cache's fault.

Hits and misses are torch's own counters of compile cache lookups in this process
(torch._dynamo.utils.counters): the FX graph cache's (`inductor` fxgraph_cache_hit /
fxgraph_cache_miss) plus the AOTAutograd cache's (`aot_autograd` autograd_cache_hit /
autograd_cache_miss); a graph found in the AOTAutograd cache counts there and again for each
FX graph it loads.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANARY_STEPS = 3  # the first optimizer steps of a warm start that the canary checks
# Subfolders of TORCHINDUCTOR_CACHE_DIR that only compiled entries fill (run.sh puts Triton's
# there); its locks/ and kernel folders say nothing of a finished compilation.
ENTRY_DIRS = ("fxgraph", "aotautograd", "triton")
# (counter group, hit, miss) for each cache whose lookups torch counts.
LOOKUP_COUNTERS = (
    ("inductor", "fxgraph_cache_hit", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit", "autograd_cache_miss"),
)


class CacheSuspect(Exception):
    """A warm start's first steps went wrong: the compiled code its cache held is suspect."""


def cache_dir() -> Path | None:
    """The folder run.sh named; None without one (no cache of the deployment's to judge)."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(value) if value else None


def holds_entries(folder: Path | None) -> bool:
    """Whether the folder holds compiled entries (any file under ENTRY_DIRS)."""
    if folder is None:
        return False
    return any(path.is_file() for name in ENTRY_DIRS for path in (folder / name).rglob("*"))


def process_age_s() -> float:
    """Seconds since this process started, the interpreter's start and torch's import included,
    which a timer started in Python would miss (Linux /proc; starttime is stat's field 22)."""
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    started = int(stat[19]) / os.sysconf("SC_CLK_TCK")  # seconds after boot
    return float(Path("/proc/uptime").read_text().split()[0]) - started


def lookups() -> tuple[int, int]:
    """(hits, misses) of this process's compile cache lookups. Only what compiles imports
    torch._dynamo: not loaded, nothing was looked up (importing it here would cost a second)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0, 0
    counters = utils.counters
    hits = sum(counters[group][hit] for group, hit, _ in LOOKUP_COUNTERS)
    misses = sum(counters[group][miss] for group, _, miss in LOOKUP_COUNTERS)
    return hits, misses


@dataclass
class Canary:
    """The verdict on the first CANARY_STEPS steps: None until given (or when not armed),
    {ok: true, step} once they passed, {ok: false, step, reason} at the first bad value.

    Every drafter rank checks the same values: the loss is all-reduced over the drafter ranks,
    and the gradient norm is that of the gradients DDP averaged over them (a NaN on one rank is
    a NaN on all), so all ranks decide alike at the same step."""

    armed: bool
    checked: int = 0
    verdict: dict[str, Any] | None = None

    def check(self, step: int, loss: float, grad_norm: float) -> str | None:
        """What went wrong at this step, if the canary blames the cache for it."""
        if not self.armed or self.verdict is not None:
            return None
        for name, value in (("loss", loss), ("gradient norm", grad_norm)):
            if not math.isfinite(value):
                reason = f"{name} is {value} at step {step}"
                self.verdict = {"ok": False, "step": step, "reason": reason}
                return reason
        self.checked += 1
        if self.checked == CANARY_STEPS:
            self.verdict = {"ok": True, "step": step}
        return None


@dataclass
class CacheWatch:
    folder: Path | None
    started_warm: bool
    first_step_s: float | None = None  # from the process's start to its first optimizer step
    canary: Canary = field(default_factory=lambda: Canary(armed=False))

    @classmethod
    def at_start(cls) -> CacheWatch:
        """Called before anything compiles: what the folder holds then, earlier processes left."""
        folder = cache_dir()
        return cls(folder, holds_entries(folder))

    def arm(self, compiled: bool) -> None:
        """Check the first steps when they run cached compiled code (--compile-drafter, or a
        GPU, where flex_attention is always compiled)."""
        self.canary = Canary(armed=compiled and self.started_warm)

    def step_done(self, step: int, loss: float, grad_norm: float) -> None:
        """After each optimizer step; raises CacheSuspect when the canary blames the cache."""
        if self.first_step_s is None:
            self.first_step_s = round(process_age_s(), 3)
        reason = self.canary.check(step, loss, grad_norm)
        if reason:
            raise CacheSuspect(
                f"the compile cache {self.folder} is suspect: {reason}, within the first "
                f"{CANARY_STEPS} steps of a process that started on it warm (entries compiled "
                "by earlier processes); the supervisor moves it aside and restarts cold"
            )

    def report(self) -> dict[str, Any]:
        """status.json's `compile_cache`."""
        hits, misses = lookups()
        return {
            "dir": str(self.folder) if self.folder else None,
            "fingerprint": self.folder.name if self.folder else None,
            "started_warm": self.started_warm,
            "first_step_s": self.first_step_s,
            "hits": hits,
            "misses": misses,
            "canary": self.canary.verdict,
        }
