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


def resolve_regime(config: RunConfig, strategy, adapted: list[str] | None = None) -> str:
    """Fill the unset ``train`` keys the regime decides, in place: ``train.regime``, ``lr``,
    ``weight_decay`` and, for fine-tuning, ``ema_decay`` and the budget (``epochs``; the
    warmup fraction is :func:`warmup_fraction`'s). Returns the line to print, which also names
    ``adapted`` (:func:`resolve_regime_options`' settings, filled earlier). Runs before the
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
    filled += adapted or []
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



def resolve_regime_options(config: RunConfig, strategy_cls, options: dict) -> list[str]:
    """Fill, in ``options`` (the ``strategy`` section without its name), the family's options
    whose default depends on the regime and that are left null (``option(..., regime=(from
    scratch, adapting))``: ``logit_shift`` of mdlm, bd3lm and scdd, ``clean_loss_weight`` of
    idlm; why each value: docs/finetuning.md). From scratch: the first value. Fine-tuning a
    checkpoint that records the option (an export of a family that has it): that checkpoint's
    value. Any other checkpoint (a causal LM, another family's export): the second value. What
    the user set is kept. Runs before the strategy is built, so its loss is built with the
    values; returns the ``strategy.<key>=<value>`` settings to announce when fine-tuning."""
    from dlmkit.families.options import regime_options

    todo = {key: values for key, values in regime_options(strategy_cls.options).items()
            if options.get(key) is None}
    if not todo:
        return []
    name = config.model.name or strategy_cls.default_model
    regime = detect_regime(name) if config.train.regime == "auto" else config.train.regime
    recorded: dict = {}
    if regime == "finetune":
        meta_file = Path(str(name)) / "dlmkit.json"
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        family = _family_strategy(meta.get("strategy"))
        if family is not None:
            # The options the checkpoint's family has: an export records each value it trained
            # with (one that does not was trained with the family's from-scratch value).
            mine = meta.get("options") or {}
            recorded = {key: mine.get(key) for key in family.defaults()}
    filled = []
    for key, (scratch, adapt) in todo.items():
        if regime != "finetune":
            options[key] = scratch
            continue  # from scratch there is nothing to keep: nothing worth a word
        value = recorded[key] if key in recorded else adapt
        value = options[key] = scratch if value is None else value
        shown = str(value).lower() if isinstance(value, bool) else f"{value:g}"
        filled.append(f"strategy.{key}={shown}")
    return filled


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
