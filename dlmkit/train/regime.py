"""Two regimes, two sets of defaults: a preset trained from scratch, a checkpoint fine-tuned.

``train.regime: auto`` (the default) reads it from ``model.name``: a preset name trains from
scratch; a model directory with weights is a pretrained checkpoint, fine-tuned; a directory
without weights is an error. ``scratch`` / ``finetune`` force one. Every ``train`` key left unset
(null) takes the regime's default, and config.yaml records the value used:

* from scratch: each family's measured defaults (``Strategy.default_*``; the suite in
  docs/suite.md), weight decay 0.5;
* fine-tuning: ``Strategy.finetune_defaults`` — the field's usual values for adapting a
  pretrained model (docs/finetuning.md says where each comes from): a small learning rate, no
  weight decay, a 3% warmup, no weight average, and a budget in passes over the data that early
  stopping (:mod:`.early_stopping`) usually ends sooner.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

from dlmkit.models.directory import check_model_directory

from .config import Regime, RunConfig

REGIMES = typing.get_args(Regime)


def detect_regime(name: str) -> str:
    """``scratch`` for a preset, ``finetune`` for a model directory with weights.

    Raises:
        ValueError: a directory that is not a loadable model (no weights, a run directory,
            a training checkpoint: :func:`~dlmkit.models.directory.check_model_directory`).
    """
    if not Path(str(name)).is_dir():
        return "scratch"
    check_model_directory(name, "model.name")
    return "finetune"


def resolve_regime(config: RunConfig, strategy) -> str:
    """Fill the unset ``train`` keys the regime decides, in place: ``train.regime``, ``lr``,
    ``weight_decay`` and, for fine-tuning, ``ema_decay`` and the budget (``epochs``; the
    warmup fraction is :func:`warmup_fraction`'s). Returns the line to print. Runs before the
    budget is resolved (:mod:`.budget` turns epochs into steps, and fills an unset
    ``ema_decay`` with the family's from-scratch default)."""
    t = config.train
    detected = detect_regime(config.model.name)
    regime = detected if t.regime == "auto" else t.regime
    t.regime = regime
    if regime == "scratch":
        defaults = {"lr": strategy.default_lr, "weight_decay": strategy.default_weight_decay}
    else:
        f = strategy.finetune_defaults
        defaults = {"lr": f["lr"], "weight_decay": f["weight_decay"], "ema_decay": f["ema_decay"]}
        if t.steps is None and t.epochs is None:
            defaults["epochs"] = f["epochs"]
    unset = {key: value for key, value in defaults.items() if getattr(t, key) is None}
    filled = [f"{key}={value:g}" for key, value in unset.items()]
    for key, value in unset.items():
        setattr(t, key, value)
    shift = resolve_logit_shift(config, strategy)
    if shift:
        filled.append(shift)
    what = ("a preset: trained from scratch" if detected == "scratch"
            else "a model directory with weights: a pretrained checkpoint, fine-tuned")
    forced = "" if regime == detected else f"; train.regime={regime} overrides it"
    line = f"train.regime={regime}: model.name {config.model.name!r} is {what}{forced}"
    if filled:
        line += (f"; {strategy.name}'s {regime} defaults: {', '.join(filled)} (set "
                 "train.<key> / strategy.<key> to change one)")
    return line



def lora_warning(config: RunConfig) -> str | None:
    """A warning when LoRA adapts a preset: its base weights are random and frozen, so only
    the low-rank adapters learn, from nothing."""
    m = config.model
    if m.lora and config.train.regime == "scratch":
        return (f"warning: model.lora adapts {m.name!r}, a preset whose weights are randomly "
                "initialised and frozen: only the adapters learn. LoRA is for pretrained "
                "checkpoints (model.name a model directory); drop model.lora to train the "
                "whole model")
    return None



def resolve_logit_shift(config: RunConfig, strategy) -> str | None:
    """``strategy.logit_shift: null`` (the masked families that offer it): true when
    fine-tuning a causal checkpoint — its head predicts the next token, and reading it that way
    keeps what it learned (the measurement: docs/logit_shift.md) — the export's own value for a
    checkpoint of a family that records it, false from scratch. Written into the strategy and
    ``config`` in place; returns the ``key=value`` to announce when fine-tuning, else None."""
    if strategy.config.get("logit_shift", False) is not None:
        return None
    value = False
    if config.train.regime == "finetune":
        meta_file = Path(str(config.model.name)) / "dlmkit.json"
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        # A checkpoint of a family that records strategy.logit_shift keeps its own.
        if "logit_shift" in getattr(_family_strategy(meta.get("strategy")), "options", {}):
            value = bool((meta.get("options") or {}).get("logit_shift", False))
        else:
            value = True
    strategy.config["logit_shift"] = config.strategy["logit_shift"] = value
    if config.train.regime != "finetune":
        return None  # from scratch there is no head to keep: nothing worth a word
    return f"strategy.logit_shift={str(value).lower()}"


# The fine-tuning lr (1e-5) is the field's rate for checkpoints of 0.6 B-8 B parameters; below
# this size it barely moves the weights (docs/finetuning.md: a 0.7 M checkpoint adapted at 1e-5
# lost to training from scratch, at 1e-3 it won).
SMALL_CHECKPOINT = 50_000_000


def small_checkpoint_warning(config: RunConfig, model, lr_unset: bool) -> str | None:
    """A warning when the fine-tuning default lr meets a small checkpoint."""
    if config.train.regime != "finetune" or not lr_unset:
        return None
    count = sum(p.numel() for p in model.parameters())
    if count >= SMALL_CHECKPOINT:
        return None
    return (f"warning: train.lr={config.train.lr:g} is the fine-tuning default for "
            f"checkpoints of 0.5 B+ parameters; this one has {count / 1e6:.1f} M. Adapting a "
            "0.7 M checkpoint into mdlm or bd3lm, 1e-5 ended worse than training from scratch "
            "and 1e-4 to 1e-3 better (docs/finetuning.md): set train.lr, e.g. in that range")


def _family_strategy(name):
    """The strategy class of family ``name`` (None: not a dlmkit family)."""
    from dlmkit import strategies

    return strategies.get(name) if name in strategies.names() else None
