# Which deployments of a target ran the same workload, so that their tokens/s compare: the
# shape of a deployment from its recorded run.sh values and the data it trained on, its
# comparable healthy deployments,
# the references verify's throughput finding judges a running trainer against, and the
# baseline of the deploy's throughput gate. Pure functions, for modules and filters alike.
from __future__ import annotations

import statistics

# For history lines written before deployments recorded their shape: the trainer's defaults of
# the flags that fixed what one step computes (a deploy now records the shape it computed from
# the release's own description of its flags, `python -m dflash.flags describe`, so a new flag
# needs no edit here); tests/unit/test_history_shape.py holds them against the trainer.
SHAPE_DEFAULTS: dict[str, object] = {
    "target_model": "tiny",
    "max_seq_len": 3072,
    "num_anchors": 512,
    "block_size": 16,
    "drafter_layers": 5,
}
# --token-budget's default on the CPU; on a GPU it is --max-seq-len.
CPU_TOKEN_BUDGET = 512
# How many of the newest comparable healthy deployments the deploy's gate takes the median of.
GATE_PEERS = 5


def _flag_value(value: object) -> object:
    """An inventory value as the trainer parses it: '4096' and 4096 are the same flag."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value).strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.rstrip("/") or text  # a model folder named with or without its last slash


def _nnodes(torchrun_args: list) -> str:
    """torchrun's --nnodes (1, 2, or an elastic 1:4) from run.sh's torchrun arguments."""
    args = [str(a) for a in torchrun_args]
    for position, arg in enumerate(args):
        if arg.startswith("--nnodes="):
            return arg.split("=", 1)[1]
        if arg == "--nnodes" and position + 1 < len(args):
            return args[position + 1]
    return "1"


def workload_defaults(schema: dict | None) -> tuple[dict[str, object], int]:
    """The defaults of the flags that fix what one step computes, and --token-budget's on the
    CPU, from a release's description of its flags (dflash/flags.py describe); the table
    above for a release that cannot describe them."""
    if not schema:
        return SHAPE_DEFAULTS, CPU_TOKEN_BUDGET
    flags = schema.get("flags") or {}
    defaults = {name: flag.get("default") for name, flag in flags.items()
                if flag.get("workload") and name != "token_budget"}  # fmt: skip
    return defaults, int((schema.get("token_budget") or {}).get("cpu") or CPU_TOKEN_BUDGET)


def shape_of(entry: dict, schema: dict | None = None) -> dict | None:
    """What one training step of a deployment computes, and where: GPU mode and lists, nodes,
    and the workload flags (target model, tokens per step, sequence length, block size,
    anchors, drafter depth) with the trainer's defaults for those left out. A line that
    recorded its shape (`shape`) is taken at its word; else it is computed from the run.sh
    values and `schema`'s defaults (dflash/flags.py describe). Two deployments of the same
    shape should train at the same tokens/s; anything else that differs (code, env, other
    flags) is what diff.yml shows. None without run.sh values."""
    if entry.get("shape"):
        return entry["shape"]
    run_sh = entry.get("run_sh") or {}
    layout = run_sh.get("layout")
    if not layout:
        return None
    args = {str(key): _flag_value(value) for key, value in
            (run_sh.get("trainer_args") or {}).items() if value not in (None, False)}  # fmt: skip
    defaults, cpu_budget = workload_defaults(schema)
    shape = {key: args.get(key, default) for key, default in defaults.items()}
    on_gpu = layout.get("mode") != "cpu"
    shape["token_budget"] = args.get("token_budget") or (
        shape.get("max_seq_len") if on_gpu else cpu_budget
    )
    shape.update(
        mode=layout.get("mode"),
        target_gpus=sorted(layout.get("target") or []),
        drafter_gpus=sorted(layout.get("drafter") or []),
        nnodes=_nnodes(run_sh.get("torchrun_args") or []),
    )
    return shape


def rated(entry: dict) -> bool:
    """A healthy deployment with the tokens/s its health check measured."""
    speed = entry.get("tokens_per_s")
    return (
        entry.get("result") == "healthy"
        and isinstance(speed, (int, float))
        and not isinstance(speed, bool)
        and speed > 0
    )


# A wait for a CPU under 5% of the time is the run queue's everyday noise: no message names it.
WAIT_NOISE = 0.95


def reference_speed(entry: dict) -> float | None:
    """A deployment's tokens/s, the one figure of its health check that the gate, verify,
    history, diff and the report all use: with the trainer's wait for a CPU left out where its
    health check recorded that (a busy host is not the release's doing), else as measured."""
    return entry.get("unstarved_tokens_per_s") or entry.get("tokens_per_s")


def measured_apart(entry: dict) -> float | None:
    """The health check's tokens/s as measured, where it differs from reference_speed (the
    trainer waited for a CPU): shown beside it, never instead of it."""
    measured = entry.get("tokens_per_s")
    return measured if measured != reference_speed(entry) else None


def data_key(entry: dict) -> tuple | None:
    """Which data a deployment trained on, as its tokens/s depends on them (another store or
    file is another workload: other lengths, other padding), in what both a history line and
    the deployment being made know: a store's content hash, a JSONL file's path, or the kind
    (self-generated samples follow the shape's target model); None where the line recorded no
    data (written before deployments did)."""
    data = entry.get("data")
    if not isinstance(data, dict):
        return None
    kind = data.get("kind")
    if kind == "store":
        return kind, data.get("content_sha256")
    if kind == "jsonl":
        return kind, data.get("path")
    return (kind,)


def comparable_indexes(history: list[dict], entry: dict, since: int = 1) -> list[int]:
    """Indexes (oldest first) of the healthy deployments with a tokens/s figure that ran the
    same workload as `entry`: its shape and its data (data_key); `entry` itself among them
    when it is such a line of `history`. `since`: the first deployment, by its history.yml
    number, that may be compared with (dflash_throughput_baseline_from: a baseline accepted
    anew leaves the faster deployments before it out)."""
    shape = shape_of(entry)
    if shape is None:
        return []
    data = data_key(entry)
    return [
        i for i, other in enumerate(history)
        if i + 1 >= since and rated(other) and shape_of(other) == shape
        and data_key(other) == data
    ]  # fmt: skip


def comparable(history: list[dict], entry: dict, since: int = 1) -> list[dict]:
    """The healthy deployments whose tokens/s compare with `entry`'s (comparable_indexes)."""
    return [history[i] for i in comparable_indexes(history, entry, since)]


def fastest_of(history: list[dict], indexes: list[int]) -> int | None:
    # By the figure the gate and verify judge; on a tie the newest: the one whose code and
    # setup are still most likely on the target.
    return max(indexes, key=lambda i: (reference_speed(history[i]), i)) if indexes else None


def fastest_comparable(history: list[dict], entry: dict, since: int = 1) -> int | None:
    """Index of the fastest healthy deployment of `entry`'s shape, or None."""
    return fastest_of(history, comparable_indexes(history, entry, since))


def reference(history: list[dict], index: int) -> dict:
    """One deployment as a throughput reference: its number (as history.yml lists it),
    release, time, the tokens/s and per-stage seconds its health check measured."""
    entry = history[index]
    return {
        "number": index + 1,
        "release": entry.get("release"),
        "action": entry.get("action"),
        "time": entry.get("time"),
        "tokens_per_s": entry.get("tokens_per_s"),
        # The same with the trainer's wait for a CPU left out (a busy host at the health check).
        "unstarved_tokens_per_s": entry.get("unstarved_tokens_per_s"),
        # Its steps' own noise at the health check (MAD over median): verify's band.
        "step_spread": entry.get("step_spread"),
        "stages": entry.get("stages"),
        # What it trained on, so that a slower run on longer samples is named as such.
        "data": {key: entry["data"].get(key) for key in ("content_sha256", "lengths")}
        if entry.get("data")
        else None,
    }


def throughput_references(history: list[dict], index: int | None, since: int = 1) -> dict:
    """What a running trainer of deployment `index` is compared with: that deployment's own
    health check and the fastest comparable healthy deployment (`current` says whether that
    is the same one). Either is None when history has no such figure."""
    if index is None:
        return {"health_check": None, "fastest": None}
    fastest = fastest_comparable(history, history[index], since)
    return {
        "health_check": reference(history, index) if rated(history[index]) else None,
        "fastest": None
        if fastest is None
        else dict(reference(history, fastest), current=fastest == index),
    }


def gate_baseline(history: list[dict], candidate: dict, since: int = 1) -> dict:
    """What the deploy's throughput gate compares a new trainer with: the median tokens/s of
    the newest GATE_PEERS healthy deployments of the candidate's layout, shape and data (one figure
    of one earlier run is noise on a shared host, and another shape is another workload).
    `candidate` is a history line or the run.sh values of the deployment being made; {} when
    there is nothing to compare with."""
    peers = comparable(history, candidate, int(since or 1))[-GATE_PEERS:]
    if not peers:
        return {}
    # Each with its wait for a CPU left out where its health check recorded that: a peer
    # measured on a busy host does not lower the bar, nor a busy host now fail a release.
    median = statistics.median(float(reference_speed(e)) for e in peers)
    releases = ", ".join(str(e.get("release")) for e in peers)
    return {
        "tokens_per_s": round(median, 1),
        "count": len(peers),
        "name": f"the median of the {len(peers)} newest healthy deployments of this layout and "
        f"shape ({releases})",
    }


# However noisy the reference's steps were, a window at half of it or less is always a drop.
BAND_FLOOR = 0.5
# A window's median of n steps errs by about 1.25 x 1.48 x MAD / sqrt(n); three such errors,
# with n = 20, is 1.25 x the reference's step spread (MAD over median).
SPREAD_TO_BAND = 1.25


def band(min_ratio: float, reference: dict | None) -> float:
    """The share of a reference's tokens/s a window must reach: `min_ratio`, lowered where the
    reference deployment's own steps were noisy (its recorded step spread), never under
    BAND_FLOOR."""
    spread = (reference or {}).get("step_spread")
    if not isinstance(spread, (int, float)):
        return min_ratio
    return round(max(BAND_FLOOR, min(min_ratio, 1 - SPREAD_TO_BAND * spread)), 3)
