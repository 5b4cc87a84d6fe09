# The `contention` rule of verify (docs/verify.md): a trainer that loses more than a set share
# of its step time waiting for a CPU (other processes hold them), in each of its last windows,
# once it has run long enough that its own start (compiles, the deploy that runs beside it) is
# not what is measured. Distinct from `throughput`, which leaves that wait out to judge the
# trainer's own speed. Pure functions: the facts module asks `contended` whether to sample
# who takes the CPU, the filter builds the finding.
from __future__ import annotations

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_findings import finding
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_judged import judged_trainer
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_states import state_is

# The windows judged, as for a throughput drop: one busy window is not contention.
WINDOWS = 3
MAX_WAIT = 0.25  # dflash_verify_max_cpu_wait's default
AFTER_S = 300  # dflash_verify_contention_after's default


def wait_shares(status: dict) -> list[float]:
    """The share of the time the trainer waited for a CPU in each of its last WINDOWS
    completed windows: 1 - its tokens/s as measured over the same with the wait left out."""
    measured = status.get("throughput_windows") or []
    unstarved = status.get("throughput_windows_unstarved") or []
    if len(measured) != len(unstarved):  # an older trainer, or none measured yet
        return []
    pairs = list(zip(measured, unstarved, strict=True))[-WINDOWS:]
    return [round(max(0.0, 1 - m / u), 3) if u else 0.0 for m, u in pairs]


def judge(status: dict, age_s: float | None, max_wait: float, after_s: float) -> dict:
    """`contended` when every one of the last WINDOWS windows waited more than `max_wait`;
    `judged` False with the `note` why not (switched off, not stepping, too young, too early)."""
    shares = wait_shares(status)
    view = {"shares": shares, "max_wait": max_wait, "judged": False, "contended": False}
    if max_wait >= 1:
        return dict(view, note="not judged: dflash_verify_max_cpu_wait is 1")
    if not state_is(status, "stepping"):
        return dict(view, note=f"the trainer is {status.get('state') or 'without status.json'}")
    if age_s is None or age_s < after_s:
        return dict(
            view,
            note=f"not judged before the trainer has run {after_s:g} s (up {age_s} s): its "
            "start and the deploy beside it are not contention",
        )
    measured = status.get("throughput_windows")
    if measured is None or len(measured) != len(status.get("throughput_windows_unstarved") or []):
        return dict(view, note="not judged: this trainer does not measure its wait for a CPU")
    if len(shares) < WINDOWS:
        return dict(view, note=f"too early to judge: {len(shares)} of {WINDOWS} windows measured")
    return dict(
        view,
        judged=True,
        contended=min(shares) > max_wait,
        note=f"judged over the last {WINDOWS} windows: waited {share_range(shares)} of the time",
    )


def share_range(shares: list[float]) -> str:
    low, high = min(shares), max(shares)
    return f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low:.0%}-{high:.0%}"


def consumers_text(sample: dict | None) -> str:
    """`pid 812 yes (1.00 CPU), pid 90 gzip (0.42 CPU)`, or what the sample could not see."""
    top = (sample or {}).get("top") or []
    if not sample:
        return "who takes the CPU was not sampled"
    if not top:
        return (
            f"no process visible here took over 5% of a CPU in a {sample['seconds']:g} s sample "
            "(in a container, those of the node and other containers are not visible)"
        )
    named = ", ".join(f"pid {row['pid']} {row['name']} ({row['cpu']:.2f} CPU)" for row in top)
    return (
        f"in a {sample['seconds']:g} s sample, of {sample['cpus']} CPUs, other processes took "
        f"{sample['others_cpu']:.2f} CPU: {named}"
    )


def contention_view(facts: dict, max_wait: float = MAX_WAIT, after_s: float = AFTER_S) -> dict:
    """The judged trainer's wait for a CPU, judged, with the sample of who took the CPU."""
    found = judged_trainer(facts)
    if found is None:
        view = {"shares": [], "max_wait": max_wait, "judged": False, "contended": False}
        return dict(view, note="no trainer runs", consumers=None)
    leader, status = found
    view = judge(status, leader.get("age_s"), max_wait, after_s)
    return dict(view, consumers=facts.get("cpu_consumers"))


def contention_findings(
    facts: dict, max_wait: float = MAX_WAIT, after_s: float = AFTER_S
) -> list[dict]:
    """`contention`: the judged trainer waited for a CPU more than `max_wait` of the time in
    each of its last windows, with who took the CPU."""
    view = contention_view(facts, max_wait, after_s)
    if not view["contended"]:
        return []
    leader, status = judged_trainer(facts) or ({}, {})
    measured = (status.get("throughput_windows") or [0])[-1]
    unstarved = (status.get("throughput_windows_unstarved") or [0])[-1]
    return [
        finding(
            "contention",
            f"the trainer waits for a CPU at most {max_wait:.0%} of its time "
            "(dflash_verify_max_cpu_wait)",
            f"it waited {share_range(view['shares'])} of the time in each of its last "
            f"{WINDOWS} windows at step {status.get('step')} ({measured:.0f} tokens/s as "
            f"measured, {unstarved:.0f} with the wait left out); "
            + consumers_text(view["consumers"]),
            "stop or move the processes named, or give the trainer CPUs of its own (a cpuset, "
            "the container's cores); in a container, look at the node for the others (top on "
            "the node); where such a wait is this host's normal, raise "
            "dflash_verify_max_cpu_wait",
            pid=leader.get("pid"),
            shares=view["shares"],
            consumers=(view["consumers"] or {}).get("top"),
        )
    ]
