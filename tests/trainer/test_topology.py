"""Rank roles: which torchrun rank runs the target, trains the drafter, and feeds whom."""

from __future__ import annotations

import pytest
import torch

from dflash.errors import ConfigError
from dflash.topology import Roles, plan_layout, resolve_roles


def roles(target: str, drafter: str) -> Roles:
    return resolve_roles(target, drafter, check_gpus=False)


def test_split_layout_on_one_node():
    layout = plan_layout(roles("0,1", "2-4"), world_size=5)
    assert layout.mode == "split"
    assert [(r.rank, r.gpu, r.target, r.drafter) for r in layout.ranks] == [
        (0, 0, True, False),
        (1, 1, True, False),
        (2, 2, False, True),
        (3, 3, False, True),
        (4, 4, False, True),
    ]
    assert layout.drafter_ranks == [2, 3, 4]
    assert layout.lead == 2
    assert layout.source == {2: 0, 3: 1, 4: 0}  # round robin over the node's target ranks
    assert layout.served_by(0) == [2, 4] and layout.served_by(1) == [3]
    assert [layout.shard(r) for r in layout.drafter_ranks] == [0, 1, 2]
    assert layout.ranks[3].device == torch.device("cuda:3")


def test_split_layout_over_two_nodes_feeds_within_each_node():
    layout = plan_layout(roles("0", "1,2"), world_size=6)
    assert layout.source == {1: 0, 2: 0, 4: 3, 5: 3}
    assert [r.gpu for r in layout.ranks] == [0, 1, 2, 0, 1, 2]
    assert [layout.shard(r) for r in layout.drafter_ranks] == [0, 1, 2, 3]
    assert layout.lead == 1


def test_colocated_layout():
    layout = plan_layout(roles("4-5", "4,5"), world_size=2)
    assert layout.mode == "colocated"
    assert all(r.target and r.drafter for r in layout.ranks)
    assert [r.gpu for r in layout.ranks] == [4, 5]
    assert layout.source == {0: 0, 1: 1}
    assert layout.served_by(0) == [] and layout.lead == 0


def test_cpu_and_cpu_ranks():
    single = plan_layout(roles("", ""), world_size=1)
    assert single.mode == "cpu" and single.ranks[0].device == torch.device("cpu")
    on_cpu = plan_layout(roles("0", "1"), world_size=2, on_cpu=True)
    assert on_cpu.mode == "split" and all(r.gpu is None for r in on_cpu.ranks)
    assert on_cpu.source == {1: 0}


def test_process_counts_that_do_not_fit_are_refused():
    with pytest.raises(ConfigError, match="need 3 processes per node; this job has 2") as err:
        plan_layout(roles("0", "1,2"), world_size=2)
    assert "--nproc-per-node 3" in str(err.value)
    with pytest.raises(ConfigError, match="need 2 processes per node; this job has 1"):
        plan_layout(roles("0", "1"), world_size=1)  # started without torchrun
    with pytest.raises(ConfigError, match=r"CPU mode .* runs one process"):
        plan_layout(roles("", ""), world_size=2)


def test_more_target_than_drafter_gpus_is_refused():
    with pytest.raises(ConfigError, match="more target than drafter GPUs"):
        roles("0,1", "2")
