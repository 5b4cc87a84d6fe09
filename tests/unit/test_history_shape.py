"""Which deployments ran the same workload (module_utils/dflash_throughput.py): the shape of a
deployment from its recorded run.sh values, the comparable healthy ones, the fastest of them,
and the median the deploy's throughput gate compares with."""

from __future__ import annotations

import subprocess
import sys

from ansible_collections.dflash.deploy.plugins.module_utils.dflash_history import select
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_run_spec import RESERVED_FLAGS
from ansible_collections.dflash.deploy.plugins.module_utils.dflash_throughput import (
    CPU_TOKEN_BUDGET,
    SHAPE_DEFAULTS,
    comparable,
    comparable_indexes,
    fastest_comparable,
    gate_baseline,
    shape_of,
    throughput_references,
)
from dflash import flags
from tests.helpers import REPO

CPU = {"mode": "cpu", "target": [], "drafter": []}
SPLIT = {"mode": "split", "target": [0, 1], "drafter": [2, 3]}


def line(release: str, speed: float | None, layout: dict = SPLIT, result: str = "healthy",
         torchrun: list | None = None, **args: object) -> dict:  # fmt: skip
    return {
        "release": release,
        "time": f"2026-11-{len(release):02d}T00:00:00+00:00",
        "action": "deploy",
        "result": result,
        "tokens_per_s": speed,
        "stages": {"drafter_forward": 0.1, "step": 0.4},
        "run_sh": {
            "layout": layout,
            "trainer_args": {"target_model": "/models/qwen3-8b", **args},
            "torchrun_args": torchrun or [],
        },
    }


def test_the_shape_fills_in_the_trainers_defaults():
    assert shape_of(line("v1", 1.0, token_budget=8192)) == {
        "target_model": "/models/qwen3-8b",
        "max_seq_len": 3072,
        "num_anchors": 512,
        "block_size": 16,
        "drafter_layers": 5,
        "token_budget": 8192,
        "mode": "split",
        "target_gpus": [0, 1],
        "drafter_gpus": [2, 3],
        "nnodes": "1",
    }
    # Left out, the budget is --max-seq-len on a GPU and the CPU budget on the CPU.
    assert shape_of(line("v1", 1.0, max_seq_len=4096))["token_budget"] == 4096
    assert shape_of(line("v1", 1.0, layout=CPU))["token_budget"] == CPU_TOKEN_BUDGET
    assert shape_of({"release": "v0"}) is None


def test_a_flag_given_as_its_default_or_as_text_is_the_same_shape():
    plain = line("v1", 1.0)
    spelled = line("v2", 1.0, num_anchors="512", block_size=16, compile_drafter=True)
    spelled["run_sh"]["trainer_args"]["target_model"] = "/models/qwen3-8b/"
    spelled["run_sh"]["layout"] = dict(SPLIT, target=[1, 0])
    assert shape_of(plain) == shape_of(spelled)


def test_shape_defaults_are_the_trainers():
    defaults = vars(flags.train_parser().parse_args([]))
    assert {key: defaults[key] for key in SHAPE_DEFAULTS} == SHAPE_DEFAULTS
    assert defaults["token_budget"] is None  # filled in by mode, as the trainer does
    assert flags.CPU_TOKEN_BUDGET == CPU_TOKEN_BUDGET


def test_the_release_describes_its_workload_and_a_recorded_shape_is_taken_as_it_is():
    """A deploy computes the shape with the defaults the release describes (dflash/flags.py
    describe); on the flags older lines knew, it agrees with the table they are read with (a
    release with a new workload flag adds it)."""
    schema = flags.describe(flags.train_parser())
    for entry in (line("v1", 1.0), line("v1", 1.0, layout=CPU), line("v1", 1.0, max_seq_len=9)):
        assert shape_of(entry, schema).items() >= shape_of(entry).items()
    # A release with a new workload flag: its default joins the shape, with no edit here.
    grown = {**schema, "flags": {**schema["flags"], "experts": {"default": 8, "workload": True}}}
    assert shape_of(line("v1", 1.0), grown)["experts"] == 8
    recorded = dict(line("v1", 1.0), shape={"experts": 8})
    assert shape_of(recorded) == {"experts": 8}
    assert comparable([dict(recorded, release="v0")], recorded) == [dict(recorded, release="v0")]


def test_the_flags_description_is_the_parsers():
    described = flags.describe(flags.train_parser())["flags"]
    parsed = vars(flags.train_parser().parse_args([]))
    assert set(described) == set(parsed)
    assert {n for n, f in described.items() if f["workload"]} == set(flags.WORKLOAD)
    assert described["compile_drafter"]["type"] == "bool"
    assert described["max_seq_len"] == {
        "flag": "--max-seq-len", "type": "int", "default": 3072,
        "help": described["max_seq_len"]["help"], "workload": True, "compiled": True,
        "launcher": False,
    }  # fmt: skip
    assert described["run_id"]["default"] is None and described["run_id"]["launcher"]
    # run.sh sets the launcher's flags itself, so the inventory may not (module_utils/
    # dflash_run_spec.py refuses them in preflight, before the release's flags are read).
    assert {n for n, f in described.items() if f["launcher"]} == RESERVED_FLAGS
    # The warm-up compiles with the flags the train schema marks as compiled (and its GPUs).
    from dflash.warmup import build_parser

    warmup = {a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    assert warmup == {n for n, f in described.items() if f["compiled"]} | {"drafter_gpus"}


def test_comparable_deployments_ignore_another_layout_or_shape():
    history = [
        line("v1", 9000.0),
        line("v2", 50000.0, layout=dict(SPLIT, drafter=[2, 3, 4, 5])),  # more drafter GPUs
        line("v3", 40000.0, token_budget=16384),  # twice the tokens per step
        line("v4", 30000.0, layout={"mode": "colocated", "target": [0, 1], "drafter": [0, 1]}),
        line("v5", 20000.0, num_anchors=256),
        line("v6", 25000.0, block_size=8),
        line("v7", 26000.0, target_model="/models/qwen3-4b"),
        line("v8", 27000.0, torchrun=["--nnodes", "2"]),
        line("v9", 28000.0, drafter_layers=1),
        line("v10", 99000.0, result="rolled_back"),  # failed its health check
        line("v11", None),  # staged, never measured
        line("v12", 12000.0, lr=1e-4),  # another learning rate: the same work per step
        line("v13", 11000.0),
    ]
    current = history[-1]
    assert comparable_indexes(history, current) == [0, 11, 12]
    assert [e["release"] for e in comparable(history, current)] == ["v1", "v12", "v13"]
    assert fastest_comparable(history, current) == 11
    # The diff.yml selector agrees: the fastest of current's shape, not v2's 50000.
    assert select(history, "v13", "fastest") == 11


def test_fastest_on_a_tie_is_the_newest_and_none_without_a_figure():
    history = [line("v1", 100.0), line("v2", 100.0), line("v3", None, result="deployed")]
    assert fastest_comparable(history, history[2]) == 1
    assert fastest_comparable([line("v1", None)], line("v1", None)) is None
    assert comparable(history, {"release": "v0"}) == []


def test_references_name_the_health_check_and_the_fastest_comparable():
    history = [line("v1", 9000.0), line("v2", 20000.0, layout=CPU), line("v3", 4000.0)]
    refs = throughput_references(history, 2)
    assert refs["health_check"] == {
        "number": 3, "release": "v3", "action": "deploy", "time": history[2]["time"],
        "tokens_per_s": 4000.0, "stages": history[2]["stages"], "data": None,
        "step_spread": None,  # a line from before the health check recorded its steps' noise
        "unstarved_tokens_per_s": None,  # ... and its wait for a CPU
    }  # fmt: skip
    assert (refs["fastest"]["number"], refs["fastest"]["current"]) == (1, False)
    alone = throughput_references(history[:1], 0)
    assert alone["fastest"]["current"] is True
    assert throughput_references(history, None) == {"health_check": None, "fastest": None}
    staged = throughput_references([line("v1", None, result="deployed")], 0)
    assert staged == {"health_check": None, "fastest": None}


def test_the_shape_functions_import_as_a_controller_filter_imports_them():
    # Filters and modules import the collection's module_utils by one name, in a plain
    # interpreter too (no Ansible loader), e.g. a health gate that takes the median of the
    # comparable deployments.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from ansible_collections.dflash.deploy.plugins.module_utils import dflash_history; "
        "from ansible_collections.dflash.deploy.plugins.module_utils "
        "import dflash_throughput as h; "
        "e = {'result': 'healthy', 'tokens_per_s': 5.0, 'run_sh': {'layout': {'mode': 'cpu'}}}; "
        "print(h.comparable_indexes([e, e], e))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[0, 1]"


def test_the_gate_baseline_is_the_median_of_the_newest_comparable_deployments():
    history = [
        line("v1", 100.0),  # older than the newest five: left out
        line("v2", 900.0),
        line("v3", 1000.0),
        line("v4", 50000.0, token_budget=16384),  # another shape: never a baseline
        line("v5", 1100.0),
        line("v6", 400.0),  # one slow run on a busy host moves a median little
        line("v7", 1200.0),
        line("v8", 99000.0, result="rolled_back"),
    ]
    candidate = {"run_sh": history[1]["run_sh"]}
    baseline = gate_baseline(history, candidate)
    assert baseline["tokens_per_s"] == 1000.0 and baseline["count"] == 5
    assert "v2, v3, v5, v6, v7" in baseline["name"]
    # A first deployment of a new shape has nothing to compare with: the gate stays open.
    other = {"run_sh": {"layout": CPU, "trainer_args": {"target_model": "tiny"}}}
    assert gate_baseline(history, other) == {}
    # v6's health check on a busy host, with its wait for a CPU left out, was as fast as the
    # others: the median takes that figure.
    history[5]["unstarved_tokens_per_s"] = 1150.0
    assert gate_baseline(history, candidate)["tokens_per_s"] == 1100.0


def test_another_data_is_another_workload_for_verify_and_the_gate():
    """Issue 47: after a switch to a store of longer samples verify compared the new run with
    the fastest one on 64-token self-generated samples (x0.397), exit 2 at every audit. The
    data are part of the workload: a store by its content hash, a file by its path."""
    store = {"kind": "store", "path": "/data/s", "content_sha256": "aa" * 32}
    history = [
        dict(line("v1", 9000.0), data={"kind": "self_generated"}),
        dict(line("v2", 3500.0), data=store),
        dict(line("v3", 3600.0), data=dict(store, content_sha256="bb" * 32)),  # prepared again
        dict(line("v4", 3400.0), data={"kind": "jsonl", "path": "/data/a.jsonl"}),
        dict(line("v5", 3300.0), data=store),
    ]
    current = history[-1]
    assert comparable_indexes(history, current) == [1, 4]
    refs = throughput_references(history, 4)
    assert refs["fastest"]["release"] == "v2"  # not v1's 9000 on other samples
    assert select(history, "v5", "fastest") == 1
    # The deploy being made carries what it found at the path: the gate takes its peers only.
    candidate = {"run_sh": current["run_sh"], "data": {"kind": "store", "path": "/data/s",
                                                        "content_sha256": "aa" * 32}}  # fmt: skip
    assert gate_baseline(history, candidate)["tokens_per_s"] == 3400.0
    # A new store has no peers yet: the gate stays open, verify compares with its own check.
    new = dict(candidate, data=dict(store, content_sha256="cc" * 32))
    assert gate_baseline(history, new) == {}
    jsonl = dict(candidate, data={"kind": "jsonl", "path": "/data/a.jsonl", "size": 10})
    assert gate_baseline(history, jsonl)["count"] == 1


def test_a_baseline_accepted_anew_leaves_the_faster_deployments_before_it_out():
    """dflash_throughput_baseline_from: a release slower on purpose (same layout, shape and
    data) is judged against the fastest from the accepted deployment on, not forever against
    the older, faster ones."""
    history = [line("v1", 9000.0), line("v2", 9100.0), line("v3", 6000.0), line("v4", 6100.0)]
    assert throughput_references(history, 3)["fastest"]["release"] == "v2"
    assert throughput_references(history, 3, since=3)["fastest"]["release"] == "v4"
    candidate = {"run_sh": history[0]["run_sh"]}
    assert gate_baseline(history, candidate)["tokens_per_s"] == 7550.0
    assert gate_baseline(history, candidate, since=3)["tokens_per_s"] == 6050.0
    assert gate_baseline(history, candidate, since=9) == {}  # nothing yet: the gate stays open
