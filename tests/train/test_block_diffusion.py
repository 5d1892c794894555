"""block_diffusion through the recipe: micro-batch and rank invariance, exact resume, and an
export that transformers' DiffusionGemma class and ``dlmkit generate`` both load."""

from __future__ import annotations

import json

import pytest
import torch

from dlmkit.cli import main
from dlmkit.train.distributed import World, shard_units
from dlmkit.train.recipe import accumulate_gradients, build_components

from .helpers import cli_args, config, losses, run_cli

NAME = "block_diffusion"
CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def gradients(cfg: dict) -> tuple[float, dict[str, torch.Tensor]]:
    """Step 0's loss and gradients (the frozen vision tower has none)."""
    c = build_components(cfg, CPU)
    loss, _ = accumulate_gradients(0, c.step_context(cfg, CPU))
    return loss, {n: p.grad.clone() for n, p in c.model.named_parameters() if p.grad is not None}


def test_one_and_four_micro_batches_give_the_same_loss_and_gradients():
    """Block selection, coins and noise come from per-sample generators and the denominators
    are global, so splitting the batch changes nothing but float rounding."""
    whole_loss, whole = gradients(config("train.micro_batch_size=8", strategy=NAME))
    split_loss, split = gradients(config("train.micro_batch_size=2", strategy=NAME))
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    assert whole.keys() == split.keys() and len(whole) > 10
    for key in whole:
        # float rounding only: micro-batches pad to other lengths (other matmul shapes), and
        # the tied embedding sums encoder, decoder and LM-head contributions
        scale = float(whole[key].abs().max())
        torch.testing.assert_close(split[key], whole[key], rtol=1e-4, atol=1e-5 * scale + 1e-9,
                                   msg=lambda m, k=key: f"{k}: {m}")


def test_export_loads_with_transformers_and_dlmkit_generate(tmp_path, capsys):
    from transformers import DiffusionGemmaForBlockDiffusion

    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2", "train.val_every=2", strategy=NAME))
    final = run_dir / "final"
    meta = json.loads((final / "dlmkit.json").read_text())
    assert meta["strategy"] == NAME and meta["block_size"] == 4
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(final, local_files_only=True)
    assert model.config.canvas_length == 4
    capsys.readouterr()
    main(["generate", "--model", str(final), "--prompt", "rev abc", "--json"])
    captured = capsys.readouterr()
    row = json.loads(captured.out.strip().splitlines()[0])
    assert row["prompt"] == "rev abc" and isinstance(row["output"], str)
    assert "sampler: block_diffusion" in captured.err


def test_fsdp2_shards_each_encoder_layer_with_the_decoder_layer_that_reuses_its_weights():
    """DiffusionGemma has no ``model.layers``: the units come from ``_no_split_modules``, and
    a decoder layer shares its encoder layer's weights (FSDP2 needs them in one group)."""
    c = build_components(config(strategy=NAME), CPU)
    names = {id(m): n for n, m in c.model.named_modules()}
    groups = [[names[id(m)] for m in g] for g in shard_units(c.model)]
    layers = len(c.model.model.decoder.layers)
    assert layers >= 2 and [g for g in groups if "vision" not in g[0]] == [
        [f"model.encoder.language_model.layers.{i}", f"model.decoder.layers.{i}"]
        for i in range(layers)]
    shared = {id(p) for p in c.model.model.decoder.layers[0].parameters()} & {
        id(p) for p in c.model.model.encoder.language_model.layers[0].parameters()}
    assert shared


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_two_ranks_match_one_process(tmp_path, kind):
    settings = ["train.steps=3", "train.global_batch_size=16", "train.micro_batch_size=4",
                "train.val_every=3", "train.save_every=3"]
    single, ranks = tmp_path / "single", tmp_path / kind
    run_cli(cli_args(single, *settings, strategy=NAME))
    run_cli(cli_args(ranks, *settings, f"train.distributed={kind}", strategy=NAME), nproc=2)
    assert losses(ranks) == pytest.approx(losses(single), rel=1e-4)
    from transformers import DiffusionGemmaForBlockDiffusion

    DiffusionGemmaForBlockDiffusion.from_pretrained(ranks / "final", local_files_only=True)
