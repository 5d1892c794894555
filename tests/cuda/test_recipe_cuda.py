"""The recipe on CUDA: ``attention: auto`` resolves to FlexAttention with our BlockMasks and
trains under bf16 autocast (``train.autocast: auto``)."""

import json
import math
from pathlib import Path

import pytest
import torch

from dlmkit import strategies
from dlmkit.models import resolve_attention
from dlmkit.train import load_config
from dlmkit.train.distributed import World
from dlmkit.train.recipe import autocast_context, build_components, run

TINY = ["data.num_train=64", "data.num_validation=8", "train.global_batch_size=8",
        "train.steps=4", "train.log_every=2", "train.val_every=4", "train.save_every=100",
        "train.progress=false", "train.device=cuda", "model.attention=auto"]


def test_auto_is_flex_and_autocast_is_bf16():
    device = torch.device("cuda")
    assert resolve_attention("auto", device) == "flex_attention"
    config = load_config(None, TINY)
    with autocast_context(config, device):
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16
        assert torch.is_autocast_enabled("cuda")
    c = build_components(config, World(0, 1, 0, device))
    assert getattr(c.model, "module", c.model).config._attn_implementation == "flex_attention"


@pytest.mark.parametrize("name", ["mdlm", "bd3lm", "idlm", "block_diffusion"])
def test_recipe_trains_on_cuda_with_flex(tmp_path, name):
    assert name in strategies.names()
    config = load_config(None, [*TINY, f"strategy.name={name}", f"output_dir={tmp_path / name}"])
    run_dir = Path(run(config))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert len(train) == 2 and all(math.isfinite(r["loss"]) for r in train)
    assert all(math.isfinite(r["loss"]) for r in records if r["split"] == "validation")
