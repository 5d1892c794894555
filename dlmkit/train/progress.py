"""What a training run prints: a bar on a terminal, plain lines in a log file.

``train.progress`` switches the per-step display only. On a terminal it is a tqdm bar; when
stderr is not a terminal (``dlmkit train > log 2>&1``, a batch job) a bar would be one line of
``\\r``-joined updates, so every log step prints one plain line instead. Messages (validation
losses, data and resume reports) are printed whatever ``train.progress`` says.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import RunConfig


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Progress of steps ``initial .. total`` on the main rank (silent elsewhere)."""

    def __init__(self, *, enabled: bool, show_steps: bool, total: int, initial: int,
                 desc: str, stream=None) -> None:
        self.enabled = enabled
        self.total, self.initial = total, initial
        self.desc = desc
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self.bar = None
        self.lines = False
        if enabled and show_steps:
            if self.stream.isatty():
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step",
                                dynamic_ncols=True, file=self.stream)
            else:
                self.lines = True

    def logged(self, done: int, record: dict) -> None:
        """A log step's train metrics (``loss``, ``lr``, ``tokens_per_s``)."""
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                                 tok_s=f"{record['tokens_per_s']:.0f}")
        elif self.lines:
            elapsed = time.perf_counter() - self.started
            rate = (done - self.initial) / max(elapsed, 1e-9)
            eta = (self.total - done) / rate if rate > 0 else 0.0
            print(f"{self.desc}: step {done}/{self.total}  loss {record['loss']:.4f}  "
                  f"lr {record['lr']:.2e}  tokens/s {record['tokens_per_s']:.0f}  "
                  f"elapsed {_clock(elapsed)}  eta {_clock(eta)}", file=self.stream, flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def message(self, text: str) -> None:
        """A line the user always sees, on stdout (not hidden by ``train.progress=false``)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def data_summary(train_set, val_set, config: RunConfig) -> list[str]:
    """What the run trains on, printed before the first step: records, supervised tokens,
    the longest record, and how many passes over the training records the budget makes
    (``train.steps`` resolved); a warning when one global batch holds more rows than the
    training set has records (each step then repeats records)."""
    t = config.train
    records, batch = len(train_set), t.global_batch_size
    passes = t.steps * batch / records
    validation = f"; {len(val_set)} validation records" if val_set is not None else \
        "; no validation data"
    lines = [f"data: {records} training records, {train_set.num_supervised_tokens} supervised "
             f"tokens, longest record {int(train_set.lengths.max())} tokens{validation}",
             f"budget: {t.steps} steps x {batch} samples = {passes:.3g} passes over the "
             "training records"]
    if batch > records:
        lines.append(f"warning: train.global_batch_size={batch} is larger than the training "
                     f"set ({records} records): every step holds some records more than once")
    return lines

