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

from pathlib import Path

REGIMES = ("auto", "scratch", "finetune")

# The files a Hugging Face model directory keeps its weights in (one of them).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors")


def has_weights(directory: Path) -> bool:
    return any((Path(directory) / name).is_file() for name in WEIGHT_FILES)


def detect_regime(name: str) -> str:
    """``scratch`` for a preset, ``finetune`` for a model directory with weights.

    Raises:
        ValueError: a directory without weights (the files it has are listed).
    """
    path = Path(str(name))
    if not path.is_dir():
        return "scratch"
    if has_weights(path):
        return "finetune"
    have = sorted(p.name for p in path.iterdir())[:8]
    raise ValueError(f"model.name={name!r} is a directory without weights (none of "
                     f"{', '.join(WEIGHT_FILES)}; it has {have or 'nothing'}): point it at a "
                     "model directory with its weights, such as a run's final/, or use a preset")


def resolve_regime(config: dict, strategy) -> str:
    """Fill the unset ``train`` keys the regime decides, in place: ``train.regime``, ``lr``,
    ``weight_decay`` and, for fine-tuning, ``ema_decay`` and the budget (``epochs``; the
    warmup fraction is :func:`warmup_fraction`'s). Returns the line to print. Runs before the
    budget is resolved (:mod:`.budget` turns epochs into steps, and fills an unset
    ``ema_decay`` with the family's from-scratch default)."""
    t = config["train"]
    detected = detect_regime(config["model"]["name"])
    regime = detected if t["regime"] == "auto" else t["regime"]
    t["regime"] = regime
    if regime == "scratch":
        defaults = {"lr": strategy.default_lr, "weight_decay": strategy.default_weight_decay}
    else:
        f = strategy.finetune_defaults
        defaults = {"lr": f["lr"], "weight_decay": f["weight_decay"], "ema_decay": f["ema_decay"]}
        if t["steps"] is None and t["epochs"] is None:
            defaults["epochs"] = f["epochs"]
    filled = [f"{key}={value:g}" for key, value in defaults.items() if t[key] is None]
    for key, value in defaults.items():
        if t[key] is None:
            t[key] = value
    what = ("a preset: trained from scratch" if detected == "scratch"
            else "a model directory with weights: a pretrained checkpoint, fine-tuned")
    forced = "" if regime == detected else f"; train.regime={regime} overrides it"
    line = f"train.regime={regime}: model.name {config['model']['name']!r} is {what}{forced}"
    if filled:
        line += (f"; {strategy.name}'s {regime} defaults: {', '.join(filled)} (set train.<key> "
                 "to change one)")
    return line

