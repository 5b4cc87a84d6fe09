"""What a rank runs, from its TrainConfig: a target server, or a trainer and its feature source.

One process: the target runs beside the drafter (CPU, or one GPU). Colocated ranks do the same
on their GPU, each on its own data shard, the drafter data-parallel. Split mode: target ranks
build a `FeatureServer`; drafter ranks receive the frozen embedding / lm_head and the feature
stream from their target rank and never load the target's weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from torch.nn.parallel import DistributedDataParallel

from dflash.cluster import Cluster
from dflash.config import TrainConfig
from dflash.data import SELF_GENERATED, open_data, sample_store, self_generated
from dflash.data.order import BatchOrder, ShardedOrder
from dflash.data.store import TokenStore
from dflash.errors import ConfigError
from dflash.options import build_drafter, drafter_config, fixed_rows, gamma, token_budget
from dflash.pipeline import FeatureSource, LocalFeatureSource, RemoteFeatureSource
from dflash.server import FeatureServer
from dflash.step import DrafterStep, static_shapes
from dflash.target import TINY, Target, load_target, load_target_config
from dflash.trainer import Trainer
from dflash.transport import FeatureReceiver, WireShape, recv_frozen, send_frozen

Log = Callable[[str], None]


@dataclass(frozen=True)
class StepShape:
    static: bool  # fixed rows, length and anchor count (compiled code, or several processes)
    rows: int | None  # rows per batch when static
    budget: int  # padded tokens per batch


def step_shape(config: TrainConfig, cluster: Cluster) -> StepShape:
    """Static on a GPU, with --compile-drafter, and whenever features travel between ranks."""
    on_gpu = cluster.me.device.type == "cuda"
    static = static_shapes(cluster.me.device, config.compile_drafter) or config.cpu_ranks
    rows = fixed_rows(config, on_gpu) if static else None
    return StepShape(static, rows, token_budget(config, on_gpu))


def training_data(config: TrainConfig, target: Target, log: Log) -> TokenStore:
    """--data (a store folder or a JSONL file), else the target's own continuations."""
    if config.data:
        tokenizer = config.tokenizer or (
            None if config.target_model == TINY else config.target_model
        )
        store = open_data(
            config.data, tokenizer, target.config.vocab_size, config.max_seq_len, log,
            cache_dir=config.data_cache,
            verify=config.verify_data,
        )  # fmt: skip
        if store.manifest["max_token_id"] == target.mask_token_id:
            # Only the largest id is known without reading every token: the case of the tiny
            # target, whose mask id is its last (127 of 128).
            log(
                f"warning: data: token id {target.mask_token_id} is the target's mask id; in the "
                "data it reads as a real token, and the drafter learns to predict the mask"
            )
        return store
    samples = self_generated(
        target,
        config.gen_samples,
        config.gen_prompt_len,
        config.gen_new_tokens,
        config.seed,
        "train",
        max_len=config.max_seq_len,
    )
    generated = {
        "target_model": config.target_model,
        "samples": config.gen_samples,
        "prompt_len": config.gen_prompt_len,
        "new_tokens": config.gen_new_tokens,
        "seed": config.seed,
    }
    data = sample_store(
        samples,
        generated=generated,
        settings={"max_seq_len": config.max_seq_len, "vocab_size": target.config.vocab_size},
    )
    data.kind = SELF_GENERATED
    return data


def target_and_data(
    config: TrainConfig, cluster: Cluster, shape: StepShape, log: Log
) -> tuple[Target, ShardedOrder]:
    """The frozen target on this rank's device and the global data order (same on all ranks:
    every target rank reads or generates the same samples from --seed)."""
    if config.compile_target and not shape.static:
        raise ConfigError(
            "--compile-target: on the CPU the target's batches change shape from step to step; "
            "add --compile-drafter (static shapes) or drop --compile-target"
        )
    target = load_target(
        config.target_model,
        cluster.me.device,
        config.num_target_layers,
        config.mask_token_id,
        random_init=config.target_random_init,
    )
    log(
        f"target {config.target_model}: {target.config.num_hidden_layers} layers, hidden "
        f"{target.config.hidden_size}, features from layers {target.layer_ids}, "
        f"mask id {target.mask_token_id}"
    )
    data = training_data(config, target, log)
    if config.compile_target:  # after the data: generating it runs the uncompiled layers
        target.compile_layers()
    order = BatchOrder(
        data,
        shape.budget,
        pad_to=config.max_seq_len if shape.rows else 8,
        fixed_rows=shape.rows,
        seed=config.seed,
        max_len=config.max_seq_len,
    )
    lengths = data.manifest["lengths"]
    log(
        f"data: {order.num_samples} samples ({data.manifest['tokens']:,} tokens, lengths p50 "
        f"{lengths['p50']} p99 {lengths['p99']} max {lengths['max']}) from "
        f"{config.data or 'the target (self-generated)'}, sha256 {order.data_sha256[:12]}"
    )
    return target, ShardedOrder(order, cluster.num_drafters)


def build_server(config: TrainConfig, cluster: Cluster, log: Log) -> FeatureServer:
    """A target rank of split mode: load, hand the frozen weights to the drafters it serves."""
    shape = step_shape(config, cluster)
    target, order = target_and_data(config, cluster, shape, log)
    drafters = cluster.layout.served_by(cluster.rank)
    frozen = {"embed": target.embed_weight(), "lm_head": target.lm_head_weight()}
    for rank in drafters:
        send_frozen(frozen, target.mask_token_id, order.data, rank, cluster.control)
    shards = [cluster.layout.shard(rank) for rank in drafters]
    return FeatureServer(target, order, drafters, shards, config.prefetch, cluster.control)


def build_trainer(config: TrainConfig, cluster: Cluster, log: Log) -> Trainer:
    """A drafter rank: its feature source, the drafter (data-parallel over drafter ranks) and
    the optimizer."""
    device = cluster.me.device
    shape = step_shape(config, cluster)
    source: FeatureSource
    if cluster.me.target:
        target, order = target_and_data(config, cluster, shape, log)
        target_config, mask_token_id = target.config, target.mask_token_id
        embed, lm_head = target.embed_weight(), target.lm_head_weight()
        source = LocalFeatureSource(target, order, cluster.layout.shard(cluster.rank), device)
    else:
        target_config = load_target_config(config.target_model)
        src = cluster.layout.source[cluster.rank]
        frozen, mask_token_id, data = recv_frozen(src, device, cluster.control)
        embed, lm_head = frozen["embed"], frozen["lm_head"]
        assert shape.rows is not None  # split mode is static
        wire = WireShape(
            shape.rows,
            config.max_seq_len,
            config.num_target_layers * target_config.hidden_size,
            embed.dtype,
        )
        source = RemoteFeatureSource(
            lambda: FeatureReceiver(src, wire, device, config.prefetch, cluster.control),
            device,
            data,
        )
    cfg = drafter_config(config, target_config, mask_token_id)
    drafter = build_drafter(cfg, embed, lm_head, device, config.seed)
    module = None
    if cluster.num_drafters > 1:
        with warnings.catch_warnings():
            # torch 2.13 deprecates broadcast_buffers for forward_sync_buffers, which older
            # torch lacks; both mean: never re-broadcast the frozen weights every step.
            warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated")
            module = DistributedDataParallel(
                drafter,
                device_ids=[device] if device.type == "cuda" else None,
                process_group=cluster.drafters,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )
    trainable = sum(p.numel() for p in drafter.parameters())
    log(
        f"drafter: {cfg.num_layers} layers, {trainable / 1e6:.2f}M trainable parameters, "
        f"block {cfg.block_size}, {config.num_anchors} anchors, token budget {shape.budget}, "
        f"compile {config.compile_drafter}, {cluster.num_drafters} drafter rank(s)"
    )
    step_fn = DrafterStep(
        drafter,
        gamma(config),
        config.num_anchors,
        compile=config.compile_drafter,
        static=shape.static,
        module=module,
        ranks=cluster.num_drafters,
        weight_sum=cluster.weight_sum if cluster.num_drafters > 1 else None,
    )
    trainer = Trainer(
        drafter,
        source,
        step_fn,
        lr=config.lr,
        max_steps=config.max_steps,
        warmup_ratio=config.warmup_ratio,
        grad_clip=config.grad_clip,
        seed=config.seed,
    )
    return trainer
