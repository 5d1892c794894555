"""Two regimes (dlmkit.train.regime): a preset trains from scratch with its family's measured
defaults; a model directory with weights is fine-tuned with the fine-tuning defaults; a
directory without weights is an error. The defaults are printed and recorded."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmkit import strategies
from dlmkit.train import ConfigError, load_config
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components
from dlmkit.train.regime import detect_regime

from .helpers import overrides, tiny_target

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def config(*extra: str, strategy: str = "bd3lm") -> dict:
    items = [o for o in overrides(*extra, strategy=strategy)
             if not (o.startswith("model.config=") and any("model.name=" in e for e in extra))]
    return load_config(None, items)


def test_the_regime_is_read_from_model_name(tmp_path):
    assert detect_regime("tiny-llama") == "scratch"
    assert detect_regime(str(tiny_target())) == "finetune"
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="model.name .* has config.json but no model weights "
                                         ".* it holds: config.json"):
        detect_regime(str(tmp_path))


def test_a_preset_gets_its_family_s_from_scratch_defaults():
    cfg = config()
    c = build_components(cfg, CPU)
    bd3lm = strategies.get("bd3lm")
    t = cfg["train"]
    assert (t["regime"], t["lr"], t["weight_decay"], t["ema_decay"]) == (
        "scratch", bd3lm.default_lr, 0.5, bd3lm.default_ema_decay)
    assert c.optimizer.param_groups[0]["weight_decay"] == 0.5
    assert c.budget_report[0].startswith("train.regime=scratch: model.name 'tiny-llama' is a "
                                         "preset")
    assert "lr=0.001, weight_decay=0.5" in c.budget_report[0]


def test_a_checkpoint_gets_the_fine_tuning_defaults():
    cfg = config(f"model.name={tiny_target()}", "train.warmup_steps=null")
    c = build_components(cfg, CPU)
    f = strategies.get("bd3lm").finetune_defaults
    t = cfg["train"]
    steps = math.ceil(f["epochs"] * len(c.train_set) / t["global_batch_size"])
    assert (t["regime"], t["lr"], t["weight_decay"], t["ema_decay"], t["steps"]) == (
        "finetune", f["lr"], f["weight_decay"], f["ema_decay"], steps)
    assert t["warmup_steps"] == round(f["warmup_fraction"] * steps)
    assert c.optimizer.param_groups[0]["lr"] == pytest.approx(f["lr"] / t["warmup_steps"])
    assert "a pretrained checkpoint, fine-tuned" in c.budget_report[0]
    assert "epochs=3" in c.budget_report[0]
    assert any(line.startswith("warning: train.lr=1e-05 is the fine-tuning default for "
                               "checkpoints of 0.5 B+ parameters; this one has 0.") for line in
               c.budget_report)  # the tiny target: well under 50 M parameters


def test_what_the_user_sets_wins_and_the_regime_can_be_forced():
    cfg = config(f"model.name={tiny_target()}", "train.lr=3e-4", "train.steps=7")
    c = build_components(cfg, CPU)
    assert not any("warning: train.lr" in line for line in c.budget_report)  # the user's lr
    assert (cfg["train"]["lr"], cfg["train"]["steps"], cfg["train"]["weight_decay"]) == (
        3e-4, 7, 0.0)
    forced = config(f"model.name={tiny_target()}", "train.regime=scratch")
    c = build_components(forced, CPU)
    assert forced["train"]["weight_decay"] == 0.5
    assert "train.regime=scratch overrides it" in c.budget_report[0]
    with pytest.raises(ConfigError, match="train.regime must be one of auto, scratch, "
                                          "finetune, got 'pretrained'"):
        config("train.regime=pretrained")


def test_a_directory_without_weights_is_named_before_anything_is_built(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="has config.json but no model weights"):
        build_components(config(f"model.name={tmp_path}"), CPU)


def test_lora_on_a_preset_warns_and_on_a_checkpoint_does_not():
    lora = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"
    c = build_components(config(lora), CPU)
    assert any(line.startswith("warning: model.lora adapts 'tiny-llama', a preset whose "
                               "weights are randomly initialised") for line in c.budget_report)
    c = build_components(config(lora, f"model.name={tiny_target()}"), CPU)
    assert not any("warning: model.lora" in line for line in c.budget_report)


def test_logit_shift_is_on_when_fine_tuning_a_causal_checkpoint(tmp_path):
    """strategy.logit_shift null: false from scratch, true for a causal checkpoint (its head
    predicts the next token), the export's own value for a bd3lm/mdlm/scdd checkpoint; what
    the user sets wins. Recorded in config (config.yaml, dlmkit.json)."""
    import shutil

    scratch = config()
    build_components(scratch, CPU)
    assert scratch["strategy"]["logit_shift"] is False
    causal = config(f"model.name={tiny_target()}")
    c = build_components(causal, CPU)
    assert causal["strategy"]["logit_shift"] is True and c.strategy.config["logit_shift"] is True
    assert "strategy.logit_shift=true" in c.budget_report[0]
    assert config(f"model.name={tiny_target()}", "strategy.logit_shift=false",
                  )["strategy"]["logit_shift"] is False
    kept = config(f"model.name={tiny_target()}", "strategy.logit_shift=false")
    build_components(kept, CPU)
    assert kept["strategy"]["logit_shift"] is False
    for recorded in (False, True):
        export = tmp_path / f"bd3lm-{recorded}"
        shutil.copytree(tiny_target(), export)
        (export / "dlmkit.json").write_text(json.dumps(
            {"strategy": "bd3lm", "options": {"logit_shift": recorded}}))
        cfg = config(f"model.name={export}")
        build_components(cfg, CPU)
        assert cfg["strategy"]["logit_shift"] is recorded


def test_idlm_s_clean_loss_weight_is_heavier_when_adapting_a_causal_checkpoint(tmp_path):
    """strategy.clean_loss_weight null: 1.0 from scratch, 4.0 adapting a causal checkpoint (the
    measurement: docs/finetuning.md), an idlm export's own value; what the user sets wins. The
    loss is built with the resolved value, and config.yaml records it."""
    import shutil

    scratch = config(strategy="idlm")
    c = build_components(scratch, CPU)
    assert scratch["strategy"]["clean_loss_weight"] == 1.0
    assert c.strategy.loss_fn.clean_loss_weight == 1.0
    causal = config(f"model.name={tiny_target()}", strategy="idlm")
    c = build_components(causal, CPU)
    assert causal["strategy"]["clean_loss_weight"] == 4.0
    assert c.strategy.loss_fn.clean_loss_weight == 4.0
    assert "strategy.clean_loss_weight=4" in c.budget_report[0]
    mine = config(f"model.name={tiny_target()}", "strategy.clean_loss_weight=0.2",
                  strategy="idlm")
    c = build_components(mine, CPU)
    assert mine["strategy"]["clean_loss_weight"] == 0.2
    assert c.strategy.loss_fn.clean_loss_weight == 0.2
    assert "clean_loss_weight" not in c.budget_report[0]  # the user's value: nothing to say
    for recorded, expected in ((2.5, 2.5), (None, 1.0)):  # None: an export from before the key
        export = tmp_path / f"idlm-{recorded}"
        shutil.copytree(tiny_target(), export)
        options = {"block_size": 4} if recorded is None else {"clean_loss_weight": recorded}
        (export / "dlmkit.json").write_text(json.dumps({"strategy": "idlm",
                                                        "options": options}))
        cfg = config(f"model.name={export}", strategy="idlm")
        c = build_components(cfg, CPU)
        assert cfg["strategy"]["clean_loss_weight"] == expected
        assert c.strategy.loss_fn.clean_loss_weight == expected
    # a bd3lm export is not an idlm checkpoint: it is adapted, as a causal LM is
    export = tmp_path / "bd3lm"
    shutil.copytree(tiny_target(), export)
    (export / "dlmkit.json").write_text(json.dumps({"strategy": "bd3lm",
                                                    "options": {"logit_shift": True}}))
    cfg = config(f"model.name={export}", strategy="idlm")
    build_components(cfg, CPU)
    assert cfg["strategy"]["clean_loss_weight"] == 4.0


def test_a_strategy_built_outside_the_recipe_trains_as_from_scratch():
    assert strategies.get("idlm")({}, mask_token_id=0, vocab_size=8).loss_fn \
        .clean_loss_weight == 1.0
    assert strategies.get("bd3lm")({}, mask_token_id=0, vocab_size=8).config["logit_shift"] \
        is False
