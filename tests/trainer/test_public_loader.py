"""An exported drafter in the public DFlash model class itself: it loads with no missing or
unexpected keys and drafts the same hidden states as ours.

The public code is not part of this repository. Point DFLASH_PUBLIC_MODEL at a copy of
z-lab/dflash's `dflash/model.py` (checked with 44947fbf71114e241c96de194f4b382b5dd330d0 and
transformers 5.24; see dflash/README.md "Export"), e.g. `git show HEAD:dflash/model.py >
/tmp/zlab_model.py` in a clone, and run this file; without it the test skips.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from dflash import export
from dflash.mask import attention_mask
from dflash.options import build_drafter
from dflash.public_format import read_folder

PUBLIC = os.environ.get("DFLASH_PUBLIC_MODEL")


@pytest.mark.skipif(
    not PUBLIC, reason="DFLASH_PUBLIC_MODEL (z-lab/dflash's dflash/model.py) is not given"
)
def test_the_public_model_class_loads_the_export_and_drafts_alike(tmp_path, trained, tiny_target):
    spec = importlib.util.spec_from_file_location("public_dflash_model", PUBLIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path / "export"
    assert (
        export.main(["--checkpoint", str(trained), "--out", str(folder), "--dtype", "float32"]) == 0
    )

    public, info = module.DFlashDraftModel.from_pretrained(
        str(folder), output_loading_info=True, dtype=torch.float32, attn_implementation="eager"
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and not info["error_msgs"]
    exported = read_folder(Path(folder))
    assert public.target_layer_ids == exported.target_layer_ids == tiny_target.layer_ids
    assert public.mask_token_id == exported.cfg.mask_token_id and public.block_size == 16

    ours = build_drafter(exported.cfg, tiny_target.embed_weight(), tiny_target.lm_head_weight(),
                         tiny_target.device, 0)  # fmt: skip
    ours.load_state_dict(exported.state)
    context, block_size = 20, exported.cfg.block_size
    ids = torch.randint(0, 120, (1, context + 1), generator=torch.Generator().manual_seed(0))
    features, _ = tiny_target.forward(ids[:, :context])
    block = torch.full((1, block_size), exported.cfg.mask_token_id)
    block[0, 0] = ids[0, context]
    positions = torch.arange(context + block_size)[None]
    anchors = torch.tensor([[context]])
    mask = attention_mask(anchors, torch.ones_like(anchors, dtype=torch.bool), context,
                          block_size, flex=False)  # fmt: skip
    with torch.no_grad():
        embedded = tiny_target.model.get_input_embeddings()(block)
        theirs = public(target_hidden=features, noise_embedding=embedded, position_ids=positions,
                        attention_mask=None, is_causal=False)  # fmt: skip
        mine = ours(features, block, positions[:, context:], mask)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
