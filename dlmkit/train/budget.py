"""The training budget: ``train.steps`` or ``train.epochs``, exactly one of which decides.

``train.epochs`` (a positive number, fractions allowed), when set, decides: the run takes
``ceil(epochs * N / G)`` optimizer steps for ``N`` training records (after the length cap)
and a global batch of ``G``, and the resolved count replaces ``train.steps`` in the run's
``config.yaml`` (with ``train.epochs`` cleared), so a resumed run continues the same schedule.
Otherwise ``train.steps`` decides; with neither set, the strategy's ``default_steps`` (recorded
the same way). In the config file and ``--set`` the later of the two wins
(``--set train.epochs=3`` over a file with ``steps: 400``); both in one place is an error.
"""

from __future__ import annotations

import math


def resolve_budget(config: dict, num_train: int, strategy) -> str | None:
    """Write the step count into ``config`` (in place; the learning-rate schedule reads
    ``train.steps``) when ``train.epochs`` asks for it or neither is set (``strategy``'s
    ``default_steps``). Returns a line saying so, or None when ``train.steps`` decides."""
    t = config["train"]
    epochs = t.get("epochs")
    if epochs is not None:
        steps = max(1, math.ceil(epochs * num_train / t["global_batch_size"]))
        t["steps"], t["epochs"] = steps, None
        return (f"train.epochs={epochs:g}: {steps} steps of {t['global_batch_size']} samples "
                f"over {num_train} training records")
    if t["steps"] is None:
        t["steps"] = strategy.default_steps
        return (f"train.steps={t['steps']}: the {strategy.name} default (set train.steps or "
                "train.epochs to change it)")
    return None
