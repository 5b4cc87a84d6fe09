"""How long this process's threads waited for a CPU, so that a step slowed by a busy host is
told from a slower trainer.

The kernel counts, per thread, the time it ran and the time it was runnable but waited on a
run queue (/proc/<pid>/task/<tid>/schedstat: run ns, wait ns, timeslices). A stopped or
sleeping thread waits on no run queue: a trainer held by SIGSTOP or slowed by its own code
shows no such wait, a starved one does.

A step's time without the wait is its wall time less the longest wait of one thread: the
step's threads work side by side (torch's intra-op pool), and a pool waits for its slowest
member while the others spin, so the longest wait is what the step lost. Measured on a
2-core machine with a 2-thread torch matmul loop: quiet 73 steps/s; beside 2 and 4 CPU
burners 28 and 16 as measured, 65 and 55 with that wait left out (the sum of the threads'
waits over-corrects, their work-weighted share under-corrects)."""

from __future__ import annotations

import os
from pathlib import Path

Sample = dict[str, tuple[float, float]]  # thread id -> (ran s, waited s), since it started


class ThreadClock:
    """The CPU time the process's threads ran and waited between two calls of `step`."""

    def __init__(self, tasks: Path | None = None) -> None:
        self.tasks = tasks or Path(f"/proc/{os.getpid()}/task")
        self.last = self.read()

    def read(self) -> Sample | None:
        """Every thread's totals, or None where the kernel does not count them."""
        try:
            names = os.listdir(self.tasks)
        except OSError:
            return None
        sample: Sample = {}
        for name in names:
            try:
                ran, waited, _ = (self.tasks / name / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue  # a thread that ended since the listing
            sample[name] = (int(ran) / 1e9, int(waited) / 1e9)
        return sample or None

    def step(self) -> tuple[float, float] | None:
        """(the longest one thread ran, the longest one thread waited) since the last call;
        None where schedstat is not readable."""
        now, before = self.read(), self.last
        self.last = now
        if now is None or before is None:
            return None
        ran = waited = 0.0
        for name, (run_total, wait_total) in now.items():
            run_then, wait_then = before.get(name, (0.0, 0.0))
            ran = max(ran, run_total - run_then)
            waited = max(waited, wait_total - wait_then)
        return ran, waited


def unstarved_seconds(wall: float, cpu: tuple[float, float] | None) -> float:
    """A step's seconds with its wait for a CPU left out: never less than its busiest thread
    ran (that work took at least that long), nor more than the wall time."""
    if cpu is None:
        return wall
    ran, waited = cpu
    return min(wall, max(wall - waited, ran, 1e-9))
