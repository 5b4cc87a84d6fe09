"""filter_plugins/dflash_limits.py: a Proxmox container's memory and core limits against the
trainer processes of a layout, with the numbers and the fix."""

from __future__ import annotations

from filter_plugins.dflash_limits import limits_problems, limits_warnings, trainer_processes

CONTAINER = {"vmid": 200, "config": {"memory": 2048, "cores": 2}}


def spec(target: list[int], drafter: list[int], flags: list[list[str]] | None = None) -> dict:
    return {"layout": {"target": target, "drafter": drafter}, "flags": flags or []}


def test_processes_are_the_layout_gpus_or_the_cpu_ranks_or_one() -> None:
    assert trainer_processes(spec([0, 1], [2, 3])) == 4
    assert trainer_processes(spec([0, 1], [0, 1])) == 2  # colocated: one process per GPU
    assert trainer_processes(spec([], [], [["--cpu-ranks", "3"], ["--compile"]])) == 3
    assert trainer_processes(spec([], [])) == 1


def test_a_layout_over_memory_names_both_figures_and_the_fix() -> None:
    [problem] = limits_problems(CONTAINER, spec([0], [1]), 1500)
    assert problem.startswith(
        "container 200 may use 2048 MB of memory (memory in its Proxmox config), and this layout "
        "runs 2 trainer process(es) of 1500 MB each (dflash_trainer_memory_mb): 3000 MB"
    )
    assert problem.endswith("(pct set 200 -memory 3000), or run fewer processes")


def test_a_layout_over_cores_is_a_warning_and_memory_unchecked_at_zero() -> None:
    assert limits_problems(CONTAINER, spec([0, 1], [2, 3]), 0) == []
    [warning] = limits_warnings(CONTAINER, spec([0, 1], [2, 3]))
    assert warning.startswith("container 200 may use 2 core(s) (cores in its Proxmox config)")
    assert "(pct set 200 -cores 4 gives each its own)" in warning
    assert limits_warnings(CONTAINER, spec([0], [1])) == []


def test_what_fits_or_is_unknown_says_nothing() -> None:
    assert limits_problems(CONTAINER, spec([0], [1]), 1024) == []
    assert limits_problems(None, spec([0, 1], [2, 3]), 99999) == []  # not a Proxmox container
    assert limits_problems({"vmid": 1, "config": {}}, spec([0], [1]), 99999) == []
