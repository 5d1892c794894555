"""Early stopping: a budget that ends when the model has learned.

With validation data, every validation that does not lower the best validation loss so far by
at least ``train.early_stopping_min_delta`` (nats per scored token, absolute) counts against
``train.early_stopping_patience``; that many in a row end the run (0 = off). ``train.steps`` /
``train.epochs`` are then the maximum (the learning-rate schedule still spans them), and
``RUN/final`` is the best checkpoint as always (:mod:`dlmkit.train.best`).

The count is a pure function of the validation losses in ``metrics.jsonl``: a resumed run
replays the ones up to its checkpoint and stops at the same step as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


class EarlyStopping:
    def __init__(self, patience: int, min_delta: float) -> None:
        if not (isinstance(patience, int) and patience >= 0):
            raise ValueError(f"train.early_stopping_patience must be an int >= 0, got "
                             f"{patience!r}")
        if not (isinstance(min_delta, (int, float)) and min_delta >= 0):
            raise ValueError(f"train.early_stopping_min_delta must be a number >= 0, got "
                             f"{min_delta!r}")
        self.patience, self.min_delta = patience, float(min_delta)
        self.best = math.inf
        self.best_step: int | None = None
        self.stale = 0  # validations since the last one that counted as an improvement

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    def observe(self, step: int, loss: float) -> bool:
        """Record the validation loss of ``step``; True when the run should stop now."""
        if math.isfinite(loss) and loss < self.best - self.min_delta:
            self.best, self.best_step, self.stale = loss, step, 0
        else:
            self.stale += 1
        return self.exhausted

    @property
    def exhausted(self) -> bool:
        return self.enabled and self.stale >= self.patience

    def replay(self, metrics: Path, upto: int) -> EarlyStopping:
        """Observe the validation losses ``metrics.jsonl`` recorded up to step ``upto``."""
        if Path(metrics).is_file():
            for line in Path(metrics).read_text().splitlines():
                record = json.loads(line) if line else {}
                if record.get("split") == "validation" and record["step"] <= upto:
                    self.observe(record["step"], record["loss"])
        return self

    def reason(self) -> str:
        return (f"early stopping: the validation loss has not improved by "
                f"{self.min_delta:g} for {self.patience} validations (best {self.best:.4g} at "
                f"step {self.best_step}); set train.early_stopping_patience=0 to train the "
                "whole budget")
