"""The bd3lm sampler's options (docs/families/bd3lm.md: how it decodes); then its training options
(``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import Cached, CommitRules, LogitShift, needs_block_size, option
from dlmkit.families.options import (
    TrainingOptions,
    block_size_option,
    logit_shift_option,
    t_max_option,
    t_min_option,
    time_sampling_option,
)


@dataclass(frozen=True)
class BD3LMSampling(LogitShift, Cached, CommitRules):
    """Block-by-block diffusion over a clean KV cache (BD3-LM)."""

    block_size: int | None = option(
        None, "the trained block size (default: block_size of dlmkit.json; another size feeds "
              "the model a layout it never saw)")

    sampler: ClassVar[str] = "bd3lm"
    # The clean blocks' keys/values: exact (dlmkit.families.bd3lm.decode).
    caches: ClassVar[tuple[str, ...]] = ("none", "prefix")

    def check(self) -> BD3LMSampling:
        needs_block_size(self)
        return self

    def decodes_trained_blocks(self) -> bool:
        return True


@dataclass(frozen=True)
class BD3LMTraining(TrainingOptions):
    """bd3lm's training options (``strategy.<option>``; why the defaults:
    docs/families/bd3lm.md#why-these-defaults)."""

    block_size: int = block_size_option(
        4, "tokens per diffusion block; recorded in dlmkit.json, the sampler decodes with it")
    t_min: float = t_min_option(help=(
        "lower end of the per-block mask probability: clipped above 0 so the 1/p loss weights "
        "stay bounded; must be < t_max"))
    t_max: float = t_max_option(help="upper end of the per-block mask probability")
    time_sampling: str = time_sampling_option()
    logit_shift: bool | None = logit_shift_option(
        "read token i from the output at i - 1 (a block's first token from the clean stream's "
        "last position of the block before), keeping an autoregressive checkpoint's head "
        "(docs/logit_shift.md)")
