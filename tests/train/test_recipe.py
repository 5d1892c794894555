"""The SFT recipe end to end on a tiny CPU model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from dlmkit import strategies
from dlmkit.cli import main
from dlmkit.train.distributed import World
from dlmkit.train.recipe import accumulate_gradients, build_components

from .helpers import cli_args, config, losses, records

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.mark.parametrize("name", strategies.names())
def test_each_strategy_trains_with_finite_loss(tmp_path, name):
    run_dir = tmp_path / name
    main(cli_args(run_dir, "train.steps=3", "train.val_every=3", strategy=name))
    train = records(run_dir)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in train)
    assert all(r["grad_norm"] > 0 for r in train)
    (val,) = losses(run_dir, "validation")
    assert math.isfinite(val)
    assert (run_dir / "loss.png").is_file() and (run_dir / "config.yaml").is_file()
    # train.lr unset: the family's default learning rate, recorded in the run's config
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored["train"]["lr"] == strategies.get(name).default_lr


def test_the_learning_rate_is_the_familys_unless_set():
    assert strategies.get("block_diffusion").default_lr == 1.5e-3  # measured: see the README
    assert strategies.get("hybrid").default_lr == 1e-3
    assert strategies.get("mdlm").default_lr == 1e-3
    assert strategies.get("scdd").default_lr == 1e-3
    assert strategies.get("bd3lm").default_lr == 1e-3
    assert strategies.get("idlm").default_lr == 3e-3
    for extra, expected in (((), 1.5e-3), (("train.lr=5e-4",), 5e-4)):
        c = build_components(config(*extra, strategy="block_diffusion"), CPU)
        assert [g["initial_lr"] for g in c.optimizer.param_groups] == [expected, expected]


def test_weight_decay_applies_to_matrices_only():
    """AdamW decays weight matrices at train.weight_decay (0.5 unless set: see the README) and
    never norm gains or biases."""
    for extra, expected in (((), 0.5), (("train.weight_decay=0.01",), 0.01)):
        c = build_components(config(*extra), CPU)
        matrices, vectors = c.optimizer.param_groups
        assert matrices["weight_decay"] == expected and vectors["weight_decay"] == 0.0
        assert matrices["params"] and all(p.dim() >= 2 for p in matrices["params"])
        assert vectors["params"] and all(p.dim() < 2 for p in vectors["params"])
        names = {id(p): n for n, p in c.model.named_parameters()}
        assert all("norm" in names[id(p)] for p in vectors["params"])


def test_loss_falls_over_50_steps(tmp_path):
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=50", "train.val_every=50", "train.lr=3e-3",
                  "data.num_train=256"))
    train = losses(run_dir)
    first, last = sum(train[:5]) / 5, sum(train[-5:]) / 5
    assert last < 0.7 * first, (first, last)


def gradients(cfg: dict) -> tuple[float, dict[str, torch.Tensor]]:
    c = build_components(cfg, CPU)
    loss, _ = accumulate_gradients(0, c.step_context(cfg, CPU))
    return loss, {n: p.grad.clone() for n, p in c.model.named_parameters()}


@pytest.mark.parametrize("name", ["mdlm", "hybrid", "idlm", "ar", "dflash"])
def test_gradient_accumulation_invariance(name):
    """2 micro-batches of 4 == 1 micro-batch of 8: same loss and gradients (global
    denominators, per-sample noise)."""
    whole_loss, whole = gradients(config("train.micro_batch_size=8", strategy=name))
    split_loss, split = gradients(config("train.micro_batch_size=4", strategy=name))
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    for key in whole:
        torch.testing.assert_close(split[key], whole[key], rtol=1e-4, atol=1e-7,
                                   msg=lambda m, k=key: f"{k}: {m}")


def test_seed_changes_the_noise():
    a, _ = gradients(config("seed=0"))
    b, _ = gradients(config("data.task_options={}", "seed=1"))
    assert a != b


def test_export_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from dlmkit.data import load_tokenizer

    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2", strategy="bd3lm"))
    final = run_dir / "final"
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    meta = json.loads((final / "dlmkit.json").read_text())
    assert meta["strategy"] == "bd3lm" and meta["block_size"] == 4
    # the longest trained response (reverse: 5 characters + end marker) rounded up to a block
    assert meta["max_new_tokens"] == 8
    tok = load_tokenizer(str(final))
    assert tok.vocab_size == model.get_input_embeddings().num_embeddings
    assert meta["mask_token_id"] == tok.mask_token_id
    # the exported weights are the trained ones, not a fresh init
    c = build_components(config(strategy="bd3lm"), CPU)
    fresh = c.model.state_dict()
    trained = model.state_dict()
    assert any(not torch.equal(fresh[k], trained[k]) for k in fresh if k in trained)
    ids = torch.tensor([tok.encode("hello")])
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_fixed_length_families_train_and_decode_rows_of_one_length(tmp_path):
    """mdlm pads every training row (supervised) to the longest training example, whatever
    the batch; the export records it as ``pad_to`` and the sampler uses it unless the user
    sets the canvas. A block family records none."""
    from dlmkit.generate import generate, load

    from ..generate.helpers import prompt_ids

    c = build_components(config(strategy="mdlm"), CPU)
    longest = int(c.train_set.lengths.max())
    for indices in ([0, 1], [2], list(range(8))):
        batch = c.collator([c.train_set[i] for i in indices])
        assert batch["attention_valid"].sum(1).tolist() == [longest] * len(indices)
        assert batch["loss_mask"][:, longest:].sum() == 0
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2", strategy="mdlm"))
    loaded = load(run_dir / "final")
    assert loaded.meta["pad_to"] == longest
    assert loaded.config().pad_to == longest
    assert loaded.config(max_new_tokens=6).pad_to is None  # the user's canvas wins
    assert loaded.config(pad_to=40).pad_to == 40
    result = generate(loaded.model, loaded.tokenizer, ["rev abc"], loaded.config())
    assert len(result.tokens[0]) <= longest - len(prompt_ids("rev abc")[0])
    # a length cap shorter than the longest example: rows (and the export's pad_to) end there
    cap = longest - 2
    capped = build_components(config(f"data.max_seq_len={cap}", "data.truncation=truncate",
                                     strategy="mdlm"), CPU)
    assert capped.collator.pad_to == cap
    batch = capped.collator([capped.train_set[i] for i in range(8)])
    assert batch["attention_valid"].sum(1).tolist() == [cap] * 8
    main(cli_args(tmp_path / "bd3lm", "train.steps=2", strategy="bd3lm"))
    assert load(tmp_path / "bd3lm" / "final").meta["pad_to"] is None


def test_bf16_autocast_trains_and_stays_close_to_fp32():
    """``train.autocast=bf16`` (the CUDA default) runs on CPU too: finite loss, and the first
    step's loss within bf16 rounding of the fp32 one."""
    fp32, _ = gradients(config("train.autocast=none", strategy="bd3lm"))
    bf16, _ = gradients(config("train.autocast=bf16", strategy="bd3lm"))
    assert math.isfinite(bf16)
    assert bf16 == pytest.approx(fp32, rel=0.05)
    assert bf16 != fp32  # autocast really ran the matmuls in bf16
