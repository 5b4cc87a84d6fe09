"""The frozen target: a local Hugging Face causal LM folder or the `tiny` preset. No downloads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash.errors import ConfigError

TINY = "tiny"
TINY_VOCAB = 128
TINY_MASK_TOKEN_ID = TINY_VOCAB - 1  # reserved: never in prompts
# A random init gives tiny logits (~1) and a residual stream where the layers drown the token.
# Scaled embeddings make greedy continuations follow the current token mostly, with context
# effects on top: a pattern a drafter learns in a few hundred CPU steps and that carries over
# to held-out prompts. Scaling the lm_head gives trained-LM-like logits; argmax is unchanged.
TINY_EMBED_SCALE = 5.0
TINY_LOGIT_SCALE = 16.0


def tiny_config() -> Any:
    """A small Qwen3: 8 layers of width 64, untied embeddings."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def tiny_model(config: Any) -> Any:
    from transformers import Qwen3ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the preset is one fixed model, the same in every process
        model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(TINY_EMBED_SCALE)
        model.get_output_embeddings().weight.mul_(TINY_LOGIT_SCALE)
    return model


def random_model(config: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """A causal LM of this config with random weights, made on the device (the same in every
    process)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)


def feature_layer_ids(num_layers: int, num_features: int) -> list[int]:
    """Target layers whose outputs form the context: [L // 2], or spread from 1 to L - 3."""
    if num_features == 1:
        return [num_layers // 2]
    return [round(1 + i * (num_layers - 4) / (num_features - 1)) for i in range(num_features)]


def load_target_config(name: str) -> Any:
    if name == TINY:
        return tiny_config()
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(_model_dir(name), local_files_only=True)


def _model_dir(name: str) -> Path:
    path = Path(name)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"--target-model '{name}': not '{TINY}' and not a local folder holding a Hugging Face "
            "config.json (weights cannot be downloaded here)"
        )
    return path


class _FeaturesTaken(Exception):
    """Raised by the last feature layer's hook: the rest of the target's forward is not run."""


@dataclass
class Target:
    name: str
    model: Any  # a transformers causal LM, eval mode, frozen
    layer_ids: list[int]
    mask_token_id: int
    compiled_forwards: list[Any] = field(default_factory=list)  # see compile_layers

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    def embed_weight(self) -> Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def forward(self, input_ids: Tensor, logits: bool = False) -> tuple[Tensor, Tensor | None]:
        """Context features [b, S, n*H] (and logits when asked) for right-padded input ids.

        Right padding needs no attention mask: a causal model's real positions never see pads.
        """
        if not logits:
            return self.features(input_ids), None
        out = self.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        # hidden_states[0] is the embedding output, so layer i's output is at i + 1.
        features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return features, out.logits

    def compile_layers(self) -> None:
        """Run `features` through compiled decoder layers from now on (static shapes: a GPU
        trainer's batches). The layers share one code object, so all of them use one graph; the
        hooks that take their outputs stay outside it. `forward(logits=True)` and `greedy`
        (any length, a KV cache) keep the uncompiled layers."""
        self.compiled_forwards = [
            torch.compile(layer.forward, dynamic=False) for layer in self.model.base_model.layers
        ]

    def features(self, input_ids: Tensor) -> Tensor:
        """The features alone: the layers past the last feature layer are never run (at the
        Qwen3-8B shape 2 of 36 layers and the final norm), the outputs are taken by hooks."""
        with self._layers_compiled():
            return self._features(input_ids)

    @contextlib.contextmanager
    def _layers_compiled(self) -> Iterator[None]:
        layers = self.model.base_model.layers
        for layer, compiled in zip(layers, self.compiled_forwards, strict=False):
            layer.forward = compiled  # an instance attribute: Module.__call__ finds it first
        try:
            yield
        finally:
            for layer in layers:
                layer.__dict__.pop("forward", None)

    def _features(self, input_ids: Tensor) -> Tensor:
        outputs: dict[int, Tensor] = {}
        last = self.layer_ids[-1]

        def keep(index: int) -> Any:
            def hook(_module: Any, _args: Any, output: Any) -> None:
                outputs[index] = output[0] if isinstance(output, tuple) else output
                if index == last:
                    raise _FeaturesTaken

            return hook

        layers = self.model.base_model.layers
        handles = [layers[i].register_forward_hook(keep(i)) for i in self.layer_ids]
        try:
            self.model.base_model(input_ids=input_ids, use_cache=False)
        except _FeaturesTaken:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return torch.cat([outputs[i] for i in self.layer_ids], dim=-1)

    @torch.no_grad()
    def greedy(self, prompts: Tensor, new_tokens: int) -> Tensor:
        """Greedy continuations [b, new_tokens] of equal-length prompts."""
        out = self.model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=self.config.eos_token_id or 0,
        )
        return out[:, prompts.shape[1] :]


def load_target(
    name: str,
    device: torch.device,
    num_features: int,
    mask_token_id: int | None,
    random_init: bool = False,
) -> Target:
    """Load the target frozen: bf16 on a GPU, fp32 on the CPU. `random_init` builds a folder's
    model from its config.json with random weights (benchmarks: no weights are read)."""
    config = load_target_config(name)
    layers = config.num_hidden_layers
    if not 1 <= num_features <= max(1, layers - 2):
        raise ConfigError(
            f"--num-target-layers {num_features}: the target has {layers} layers; "
            f"use 1..{max(1, layers - 2)}"
        )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if name == TINY:
        model = tiny_model(config).to(device=device, dtype=dtype)
    elif random_init:
        model = random_model(config, device, dtype)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            _model_dir(name), dtype=dtype, local_files_only=True
        ).to(device)
    model.eval().requires_grad_(False)
    lm_head = model.get_output_embeddings()
    if getattr(lm_head, "bias", None) is not None:
        raise ConfigError(f"--target-model '{name}': an lm_head with a bias is not supported")
    return Target(
        name=name,
        model=model,
        layer_ids=feature_layer_ids(layers, num_features),
        mask_token_id=resolve_mask_token_id(name, config, mask_token_id),
    )


def resolve_mask_token_id(name: str, config: Any, requested: int | None) -> int:
    """The MASK token: explicit, the preset's, the tokenizer's, or the first unused row."""
    vocab = config.vocab_size
    if requested is not None:
        if not 0 <= requested < vocab:
            raise ConfigError(f"--mask-token-id {requested}: must be in 0..{vocab - 1}")
        return requested
    if name == TINY:
        return TINY_MASK_TOKEN_ID
    tokenizer = load_tokenizer(name)
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < vocab:
        return len(tokenizer)  # embedding rows past the tokenizer are free to use
    raise ConfigError(
        f"--target-model '{name}': the tokenizer has no mask token and no free embedding row; "
        "pass --mask-token-id"
    )


def load_tokenizer(folder: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tokenizer folder '{folder}': cannot load a tokenizer ({exc})") from exc
