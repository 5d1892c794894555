"""The training budget: ``train.steps`` or ``train.epochs``, exactly one of which decides.

``train.epochs`` (a positive number, fractions allowed), when set, decides: the run takes
``ceil(epochs * N / G)`` optimizer steps for ``N`` training records (after the length cap)
and a global batch of ``G``, and the resolved count replaces ``train.steps`` in the run's
``config.yaml`` (with ``train.epochs`` cleared), so a resumed run continues the same schedule.
Otherwise ``train.steps`` decides; with neither set, the strategy's ``default_steps`` (recorded
the same way). In the config file and ``--set`` the later of the two wins
(``--set train.epochs=3`` over a file with ``steps: 400``); both in one place is an error.

The learning-rate warmup follows the budget: ``train.warmup_steps: null`` (the default) is
``WARMUP_FRACTION`` of the resolved steps (or the strategy's ``default_warmup_steps``;
``dlmkit train --print-config`` lists every family's), recorded the same way. A short warmup
at lr 3e-3 collapsed the attention of ar's answer queries on the suite's ``arith`` task (measured
on the suite: docs/families/ar.md#why-these-defaults).
"""

from __future__ import annotations

import math

from .config import RunConfig

WARMUP_FRACTION = 0.1


def resolve_budget(config: RunConfig, num_train: int, strategy) -> str | None:
    """Write the step count into ``config`` (in place; the learning-rate schedule reads
    ``train.steps``) when ``train.epochs`` asks for it or neither is set (``strategy``'s
    ``default_steps``). Returns a line saying so, or None when ``train.steps`` decides."""
    t = config.train
    epochs = t.epochs
    if epochs is not None:
        steps = max(1, math.ceil(epochs * num_train / t.global_batch_size))
        t.steps, t.epochs = steps, None
        return (f"train.epochs={epochs:g}: {steps} steps of {t.global_batch_size} samples "
                f"over {num_train} training records")
    if t.steps is None:
        t.steps = strategy.default_steps
        sooner = "; early stopping may end it sooner" if t.early_stopping_patience else ""
        return (f"train.steps={t.steps}: the {strategy.name} default, the most it trains "
                f"(set train.steps or train.epochs to change it{sooner})")
    return None


def resolve_warmup(config: RunConfig, strategy) -> str | None:
    """Write ``train.warmup_steps`` into ``config`` when unset: when fine-tuning, the
    ``warmup_fraction`` of ``strategy.finetune_defaults``; from scratch ``strategy``'s
    ``default_warmup_steps``, or when that is None ``WARMUP_FRACTION``; fractions are of the
    resolved ``train.steps``, rounded. Returns a line saying what was chosen, or a warning when the
    warmup is longer than the run (it is kept: a smoke test with ``train.steps=1`` over a
    config file's warmup is legitimate), else None."""
    t = config.train
    if t.warmup_steps is None:
        if t.regime == "finetune":
            fraction = strategy.finetune_defaults["warmup_fraction"]
            t.warmup_steps = round(fraction * t.steps)
            why = f"fine-tuning: {fraction:.0%} of the {t.steps} steps"
        elif strategy.default_warmup_steps is not None:
            t.warmup_steps = min(strategy.default_warmup_steps, t.steps)
            why = f"the {strategy.name} default"
        else:
            t.warmup_steps = round(WARMUP_FRACTION * t.steps)
            why = f"{WARMUP_FRACTION:.0%} of the {t.steps} steps"
        return (f"train.warmup_steps={t.warmup_steps}: {why} (set train.warmup_steps to "
                "change it)")
    if t.warmup_steps > t.steps:
        peak = t.steps / t.warmup_steps
        return (f"warning: train.warmup_steps={t.warmup_steps} is longer than the run "
                f"(train.steps={t.steps}): the learning rate reaches only {peak:.0%} of "
                f"train.lr={t.lr:g}")
    return None
