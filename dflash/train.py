"""python -m dflash.train: train a DFlash drafter with status.json, checkpoints and safe stop.

SIGTERM or SIGINT: the current step finishes, a checkpoint is saved, status.json says
"stopped", exit 0. On start, training resumes from the newest complete checkpoint.

Exit codes: 0 stopped or done, 2 a bad flag, CACHE_SUSPECT_EXIT (3) when the process started on
a warm compile cache and its first steps gave a non-finite loss or gradient norm (the canary,
dflash.compile_watch; the supervisor then moves the cache aside), 1 any other failure.

One process (CPU, one GPU) or one torchrun rank per GPU (`dflash.topology`): the drafter
ranks agree after every step whether to go on, so all stop after the same step; only the lead
drafter rank writes status.json, checkpoints and the step lines of the log.
"""

from __future__ import annotations

import faulthandler
import math
import os
import signal
import statistics
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from dflash.assemble import build_server, build_trainer
from dflash.cluster import Cluster, job_fields, torchrun_rank
from dflash.compile_watch import CacheSuspect, CacheWatch
from dflash.config import TrainConfig
from dflash.cpu_wait import ThreadClock, unstarved_seconds
from dflash.eager_reference import compare_first_step
from dflash.errors import ConfigError
from dflash.flags import train_parser
from dflash.pipeline import FeatureBatch
from dflash.provenance import code_tree_sha256, header_lines
from dflash.resume import resume, resume_order, save_checkpoint
from dflash.stages import StageWindow, stage_text
from dflash.stopflag import StopFlag
from dflash.supervision.record import CACHE_SUSPECT_EXIT
from dflash.supervision.status import StatusFile, print_line, utc_now
from dflash.topology import Layout, plan_layout, resolve_roles
from dflash.trainer import Trainer

# status.json is written at each of a process's first steps (later, the heartbeat's every few
# seconds): a deploy's health check waits on them (dflash_health_steps, 5 by default) and
# should end with the step it waits for, not up to a heartbeat later.
EAGER_STATUS_STEPS = 20


def log(message: str) -> None:
    print_line(f"{utc_now()} {message}")  # a full disk under the log loses lines, not the run


def rank_log(cluster: Cluster) -> Callable[[str], None]:
    """The lead logs plainly; the first target rank of split mode with its rank in front (its
    target and data lines); the other ranks keep quiet."""
    if cluster.rank == cluster.layout.lead:
        return log
    if cluster.me.target and cluster.rank == 0:
        return lambda message: log(f"[rank {cluster.rank}] {message}")
    return lambda message: None


def describe(layout: Layout) -> str:
    """`2 (0: target cuda:0, 1: drafter cuda:1)` for the log header."""
    roles = []
    for r in layout.ranks:
        role = "target+drafter" if r.target and r.drafter else "target" if r.target else "drafter"
        roles.append(f"{r.rank}: {role} {r.device}")
    return f"{layout.world_size} ({', '.join(roles)})"


class StopRequest:
    """SIGTERM/SIGINT set a flag that the loop reads between steps: a step is never cut."""

    def __init__(self) -> None:
        self.event = StopFlag()  # set by the signal handler: no lock (dflash/stopflag.py)
        self.reason = ""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.reason = self.reason or f"{signal.Signals(signum).name} received"
        self.event.set()


class Throughput:
    """Tokens per second over the last few steps, sleeps and data included (end to end).

    The first step (lazy init, compilation) counts only until the second one is done, so the
    health gate of a deploy compares steady-state speed, not compile time."""

    # Completed windows kept for verify.yml, which names a drop only when it holds over
    # several consecutive windows (one slow window on a busy host is not drift).
    KEPT_WINDOWS = 8

    def __init__(self, window: int = 20, clock: ThreadClock | None = None) -> None:
        # (wall s, tokens, wall s without the threads' wait for a CPU) of each step
        self.steps: deque[tuple[float, int, float]] = deque(maxlen=window)
        self.last = time.monotonic()
        self.clock = clock or ThreadClock()
        self.count = 0
        # tokens/s of each step of the window being filled: as measured, and unstarved
        self.filling: list[tuple[float, float]] = []
        self.windows: deque[float] = deque(maxlen=self.KEPT_WINDOWS)
        # The same windows with the time the trainer waited for a CPU left out: what verify
        # judges, so that a busy host is not read as a slower trainer.
        self.unstarved_windows: deque[float] = deque(maxlen=self.KEPT_WINDOWS)

    def add(self, num_tokens: int) -> float:
        now = time.monotonic()
        wall = now - self.last
        self.steps.append((wall, num_tokens, unstarved_seconds(wall, self.clock.step())))
        self.last = now
        self.count += 1
        if self.count == 2:
            self.steps.popleft()
        if self.count >= 2:  # the first step (compilation) is no window's
            _, _, unstarved = self.steps[-1]
            self.filling.append((num_tokens / max(1e-9, wall), num_tokens / max(1e-9, unstarved)))
            if len(self.filling) == self.steps.maxlen:
                # A window's median step: a single stall does not move it.
                measured, unstarved_rates = zip(*self.filling, strict=True)
                self.windows.append(round(statistics.median(measured), 1))
                self.unstarved_windows.append(round(statistics.median(unstarved_rates), 1))
                self.filling = []
        return sum(n for _, n, _ in self.steps) / max(1e-9, sum(dt for dt, _, _ in self.steps))

    @property
    def unstarved_tokens_per_s(self) -> float:
        """The rolling figure with the steps' wait for a CPU left out (dflash.cpu_wait)."""
        seconds = sum(unstarved for _, _, unstarved in self.steps)
        return round(sum(n for _, n, _ in self.steps) / max(1e-9, seconds), 1)

    @property
    def step_spread(self) -> float | None:
        """The steps' own noise: the median absolute deviation of the window's per-step tokens/s
        over their median. The health check records it; verify's band is drawn from it."""
        rates = [n / dt for dt, n, _ in self.steps if dt > 0]
        if len(rates) < 3:
            return None
        middle = statistics.median(rates)
        return round(statistics.median(abs(r - middle) for r in rates) / middle, 4)

    @property
    def last_step_s(self) -> float:
        return self.steps[-1][0]

    @property
    def median_step_s(self) -> float:
        """The median step of the window: the supervisor's hang limit scales with it."""
        return statistics.median(dt for dt, _, _ in self.steps)

    @property
    def window(self) -> dict[str, int | None]:
        """status.json's `throughput_window`: the steps the figure covers and the window size;
        fewer steps than the size is an early figure (verify.yml does not judge it)."""
        return {"steps": len(self.steps), "size": self.steps.maxlen}


def eager_check(cache: CacheWatch, trainer: Trainer) -> Callable[[FeatureBatch, int], None] | None:
    """The canary's comparison of a warm start's first step with the eager one, where the
    drafter's layers are compiled (without --compile-drafter both would run the same code)."""
    if not cache.canary.wants_reference() or trainer.step_fn.layers is None:
        return None

    def check(batch: FeatureBatch, seed: int) -> None:
        cache.canary.reference = compare_first_step(trainer.step_fn, batch, seed)

    return check


def train(
    config: TrainConfig, cluster: Cluster, status: StatusFile, stop: StopRequest, cache: CacheWatch
) -> int:
    """A drafter rank (the only rank of a one-process run): set-up, resume, loop, shutdown."""
    lead = cluster.rank == cluster.layout.lead
    cache.arm(compiled=config.compile_drafter or cluster.me.device.type == "cuda")
    # Set-up: loading, generating data, compiling; "warming" until the first optimizer step.
    status.write(state="warming")
    trainer = build_trainer(config, cluster, rank_log(cluster))
    status.update(data=trainer.source.data)

    # Resume: the newest complete checkpoint (of any node), else --init-from, else step 0.
    saved_step = resume(trainer, config, cluster, status, log)

    # Loop: the drafter ranks agree before every step whether to go on, so all stop together.
    throughput = Throughput(config.throughput_window)
    stages = StageWindow(config.throughput_window)
    while True:
        done = cluster.agree_to_stop(stop.event.is_set() or trainer.step >= config.max_steps)
        trainer.source.credit(not done)
        if done:
            break
        first = throughput.count == 0
        result = trainer.train_step(eager_check(cache, trainer) if first else None)
        # Every drafter rank, armed or not, learns whether any rank's first step disagreed.
        if first and cluster.agree_to_stop(cache.canary.reference_failed()):
            cache.canary.failed_elsewhere()
        loss, num_tokens = cluster.step_totals(result.loss, result.num_tokens)
        cache.step_done(result.step, loss, result.grad_norm)  # a warm start's canary may raise
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {result.step}")
        tokens_per_s = throughput.add(num_tokens)  # the whole job's tokens: the same on every rank
        stages.add({**result.stages, "step": throughput.last_step_s})
        means = stages.means()
        now = utc_now()
        status.update(
            first_step_at=status.snapshot()["first_step_at"] or now,
            last_step_at=now,
            step_s_median=round(throughput.median_step_s, 4),
            step=result.step,
            loss=loss,
            tokens_per_s=round(tokens_per_s, 1),
            throughput_window=throughput.window,
            throughput_windows=list(throughput.windows),
            throughput_windows_unstarved=list(throughput.unstarved_windows),
            unstarved_tokens_per_s=throughput.unstarved_tokens_per_s,
            step_spread=throughput.step_spread,
            stages=means,
            compile_cache=cache.report(),
        )
        if status.enabled and status.snapshot()["state"] != "running":
            status.write(state="running")  # only now: a real optimizer step is done
        elif throughput.count <= EAGER_STATUS_STEPS:
            status.write()  # a deploy's health check waits on these steps, not on a heartbeat
        if not lead:
            continue
        if result.step % config.log_every == 0 or throughput.count == 1:
            log(
                f"step {result.step} loss {loss:.4f} tokens/s {tokens_per_s:.0f} "
                f"lr {result.lr:.3e} step_s {throughput.last_step_s:.3f} | {stage_text(means)}"
            )
        if result.step % config.checkpoint_every == 0:
            saved = save_checkpoint(trainer, config, status, "running", log)
            saved_step = trainer.step if saved else saved_step  # unsaved: the shutdown tries
            cache.record_files()  # a graph compiled since (an eval's, a new shape) gets its hashes
        if config.sleep_per_step:
            stop.event.wait(config.sleep_per_step)

    # Shutdown: the lead saves the last step (unless that was just done) and says why it stopped.
    trainer.source.close()
    cache.record_files()
    if not lead:
        status.write(state="stopped")  # another node's status.json; the lead checkpoints
        return 0
    reason = stop.reason or (
        f"--max-steps {config.max_steps} reached"
        if trainer.step >= config.max_steps
        else "another rank was asked to stop"
    )
    if trainer.step != saved_step:
        save_checkpoint(trainer, config, status, "stopped", log)
    else:
        status.write(state="stopped")
    log(f"stopped at step {trainer.step}: {reason}")
    return 0


def serve(config: TrainConfig, cluster: Cluster) -> int:
    """A target rank of split mode: features for its drafter ranks until they stop."""
    say = rank_log(cluster)
    server = build_server(config, cluster, say)
    resume_order(server.order, config.checkpoint_dir, cluster, say)
    steps = server.run()
    say(f"served {steps} steps to drafter ranks {server.drafters}")
    return 0


def main(argv: list[str] | None = None) -> int:
    # SIGUSR1 writes every thread's Python stack to the log: the supervisor's dump of a hang.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A crash in native code (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) writes the Python
    # stacks too before the process dies of it: the supervisor names the compiled cache entry
    # the crash ran in (dflash.supervision.restart_facts).
    faulthandler.enable(all_threads=True)
    code_tree_sha256()  # hash the code first: that is the code this process holds
    # Before anything compiles (no rank compiles before every rank has joined `Cluster`).
    cache = CacheWatch.at_start()
    config = TrainConfig.from_args(train_parser().parse_args(argv))
    rank, world_size = torchrun_rank()
    # Until the layout names the reporters, each node's first process reports (a bad flag
    # fails every rank alike).
    first_on_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
    status = StatusFile(
        config.status_file, config.run_id, config.status_interval, enabled=first_on_node
    )
    stop = StopRequest()
    try:
        roles = resolve_roles(
            config.target_gpus, config.drafter_gpus, check_gpus=not config.cpu_ranks
        )
        layout = plan_layout(roles, world_size, on_cpu=config.cpu_ranks)
        status.enabled = layout.reports(rank)
        status.write(
            state="starting",
            gpus=roles.as_dict(),
            job=job_fields(layout, rank),
            compile_cache=cache.report(),
        )
        status.start_heartbeat()
        if status.enabled:  # every node's train.log says what runs there
            extra = {"mode": roles.mode, "ranks": describe(layout)}
            for line in header_lines(config.run_id, roles.as_dict(), extra):
                log(line)
        cluster = Cluster(layout, rank, config.dist_timeout)
        if cluster.me.drafter:
            code = train(config, cluster, status, stop, cache)
        else:
            code = serve(config, cluster)
        cluster.close()
        return code
    except (ConfigError, CacheSuspect) as exc:  # said in one line, no traceback
        log(f"{'' if status.enabled else f'[rank {rank}] '}error: {exc}")
        status.write(state="failed", error=str(exc), compile_cache=cache.report())
        return 2 if isinstance(exc, ConfigError) else CACHE_SUSPECT_EXIT
    except Exception as exc:
        if not status.enabled:
            log(f"[rank {rank}] failed:")
        traceback.print_exc(file=sys.stdout)
        status.write(
            state="failed", error=f"{type(exc).__name__}: {exc}", compile_cache=cache.report()
        )
        return 1
    finally:
        status.stop_heartbeat()


if __name__ == "__main__":
    sys.exit(main())
