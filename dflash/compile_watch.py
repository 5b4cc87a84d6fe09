"""The compile cache as the trainer sees it: status.json's `compile_cache`, and its canary.

run.sh points TORCHINDUCTOR_CACHE_DIR at the release's cache folder, cache/<fingerprint> (and
TRITON_CACHE_DIR inside it). A process that starts on a folder that already holds compiled
entries (`started_warm`) runs code that earlier processes compiled, and a damaged entry shows in
its first steps. The canary checks them: the first step's batch runs through the compiled layers
and through the same layers uncompiled, and the two must agree (dflash.eager_reference: the
loss, and the gradients of the compiled graphs' parameters); then no loss or gradient norm of
the first CANARY_STEPS optimizer steps may be non-finite. A warm start with compiled code that
fails either is blamed on the cache (CacheSuspect, exit code CACHE_SUSPECT_EXIT), and the
supervisor moves the folder aside and restarts the trainer cold (dflash.supervise). A cold start
that diverges is no cache's fault.

What this process compiled gets its hashes recorded (dflash.cache_files: after its first
CANARY_STEPS steps, at each checkpoint and at its end), so the supervisor's check before the
next start finds a file damaged since.

Hits and misses are torch's own counters of compile cache lookups in this process
(torch._dynamo.utils.counters): the FX graph cache's (`inductor` fxgraph_cache_hit /
fxgraph_cache_miss) plus the AOTAutograd cache's (`aot_autograd` autograd_cache_hit /
autograd_cache_miss); a graph found in the AOTAutograd cache counts there and again for each
FX graph it loads.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash.cache_files import record

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


def figure(value: float | str) -> str:
    """A relative error as the reason says it (NaN comes as the text "nan")."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


@dataclass
class Canary:
    """The verdict on the first CANARY_STEPS steps: None until given (or when not armed),
    {ok: true, step, eager} once they passed, {ok: false, step, reason} at the first failure.

    `reference` is the first step against the eager one (dflash.eager_reference's dict; on
    several drafter ranks each compares its own batch, and they agree on the outcome before the
    first step is judged, `Cluster.agree_to_stop`). After it, every drafter rank checks the same
    values: the loss is all-reduced over the drafter ranks, and the gradient norm is that of the
    gradients DDP averaged over them (a NaN on one rank is a NaN on all), so all ranks decide
    alike at the same step."""

    armed: bool
    checked: int = 0
    verdict: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None

    def wants_reference(self) -> bool:
        return self.armed and self.reference is None and self.verdict is None

    def reference_failed(self) -> bool:
        return self.reference is not None and not self.reference["ok"]

    def failed_elsewhere(self) -> None:
        """Another drafter rank's first step disagreed with its eager one."""
        if not self.reference_failed():
            self.reference = {"ok": False, "elsewhere": True}

    def disagreement(self, step: int) -> str:
        ref = self.reference or {}
        if ref.get("elsewhere"):
            return f"another drafter rank's compiled step disagrees with its eager one, step {step}"
        tolerance = ref["tolerance"]
        return (
            f"the compiled step disagrees with the eager one at step {step}: relative loss error "
            f"{figure(ref['loss_rel_err'])} (tolerance {tolerance['loss_rel_err']:g}), gradient "
            f"error {figure(ref['grad_rel_err'])} (tolerance {tolerance['grad_rel_err']:g})"
        )

    def check(self, step: int, loss: float, grad_norm: float) -> str | None:
        """What went wrong at this step, if the canary blames the cache for it."""
        if not self.armed or self.verdict is not None:
            return None
        reason = self.disagreement(step) if self.reference_failed() else None
        for name, value in (("loss", loss), ("gradient norm", grad_norm)):
            if reason is None and not math.isfinite(value):
                reason = f"{name} is {value} at step {step}"
        if reason:
            self.verdict = {"ok": False, "step": step, "reason": reason}
            return reason
        self.checked += 1
        if self.checked == CANARY_STEPS:
            self.verdict = {"ok": True, "step": step}
            if self.reference:
                self.verdict["eager"] = {
                    k: self.reference[k] for k in ("loss_rel_err", "grad_rel_err")
                }
        return None


@dataclass
class CacheWatch:
    folder: Path | None
    started_warm: bool
    first_step_s: float | None = None  # from the process's start to its first optimizer step
    canary: Canary = field(default_factory=lambda: Canary(armed=False))
    steps: int = 0  # optimizer steps of this process

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
        self.steps += 1
        reason = self.canary.check(step, loss, grad_norm)
        if self.steps == CANARY_STEPS and not reason:  # compiled by now, and checked
            self.record_files()
        if reason:
            raise CacheSuspect(
                f"the compile cache {self.folder} is suspect: {reason}, within the first "
                f"{CANARY_STEPS} steps of a process that started on it warm (entries compiled "
                "by earlier processes); the supervisor moves it aside and restarts cold"
            )

    def record_files(self) -> None:
        """Record the hashes of what this process compiled. A full disk or a folder gone costs
        the record (the next supervisor's check adopts the files), never the run."""
        if self.folder is not None:
            with contextlib.suppress(OSError):
                record(self.folder)

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
