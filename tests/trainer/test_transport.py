"""The split-mode feature stream over gloo: one target rank feeding two drafter ranks.

Three processes (torch.multiprocessing): rank 0 runs a FeatureServer with a stand-in target,
ranks 1 and 2 take batches through RemoteFeatureSource with credits, then stop. Checked: each
drafter gets its own data shard in order, the features that belong to its tokens, the data
order's state after each step, the target's timings from the second step on, and the server
stops after exactly (steps + depth) batches with nothing left in flight.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dflash.data import Sample, sample_store
from dflash.data.order import BatchOrder, ShardedOrder
from dflash.pipeline import RemoteFeatureSource
from dflash.server import FeatureServer
from dflash.transport import FeatureReceiver, WireShape

ROWS, SEQ, DIM, DEPTH, STEPS = 2, 8, 3, 2, 4


class StandInTarget:
    """Features a drafter can check: token id times (1, 2, 3)."""

    device = torch.device("cpu")

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        return input_ids[..., None].float() * torch.tensor([1.0, 2.0, 3.0]), None


def order() -> ShardedOrder:
    samples = [Sample([i + 1] * (3 + i % 5), [1] * (3 + i % 5)) for i in range(40)]
    batches = BatchOrder(sample_store(samples), ROWS * SEQ, pad_to=SEQ, fixed_rows=ROWS, seed=5)
    return ShardedOrder(batches, num_shards=2)


def worker(rank: int, rendezvous: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=rendezvous, rank=rank, world_size=3, timeout=timedelta(seconds=60)
    )
    control = dist.new_group(backend="gloo")
    if rank == 0:
        server = FeatureServer(StandInTarget(), order(), [1, 2], [0, 1], DEPTH, control)  # type: ignore[arg-type]
        result = {"served": server.run()}
    else:
        cpu = torch.device("cpu")
        wire = WireShape(ROWS, SEQ, DIM, torch.float32)
        source = RemoteFeatureSource(
            lambda: FeatureReceiver(0, wire, cpu, DEPTH, control), cpu, order().data
        )
        taken = []
        for _ in range(STEPS):
            source.credit(True)
            batch = source.next()
            taken.append(
                {
                    "input_ids": batch.input_ids.clone(),
                    "loss_mask": batch.loss_mask.clone(),
                    "features": batch.features.clone(),
                    "num_tokens": batch.num_tokens,
                    "state": source.state_dict(),
                    "timed": sorted(batch.timings.values),
                }
            )
        source.credit(False)
        source.close()
        result = {"taken": taken}
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_one_target_rank_feeds_two_drafter_ranks(tmp_path):
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(worker, args=(rendezvous, str(tmp_path)), nprocs=3, join=True)

    assert torch.load(tmp_path / "rank0.pt")["served"] == STEPS + DEPTH
    replay = order().order  # the global order, batch by batch: shard k of step j is 2j + k
    expected, states = [], []
    for _ in range(STEPS):
        expected += [replay.next(), replay.next()]
        states.append(replay.state_dict())
    for rank, shard in ((1, 0), (2, 1)):
        taken = torch.load(tmp_path / f"rank{rank}.pt")["taken"]
        for step, got in enumerate(taken):
            want = expected[2 * step + shard]
            assert torch.equal(got["input_ids"], want.input_ids), (rank, step)
            assert torch.equal(got["loss_mask"], want.loss_mask), (rank, step)
            assert got["num_tokens"] == want.num_tokens
            features, _ = StandInTarget().forward(want.input_ids)
            assert torch.equal(got["features"], features)
            assert got["state"] == states[step]
            timed = ["target_forward", "target_idle", "transfer"]
            assert got["timed"] == ([] if step == 0 else timed)
