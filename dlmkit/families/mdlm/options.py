"""The mdlm sampler's options (docs/families/mdlm.md: how it decodes); then its training options
(``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import Cached, CommitRules, LogitShift, PaddedCanvas, check_int, option
from dlmkit.families.options import (
    TrainingOptions,
    logit_shift_option,
    t_max_option,
    t_min_option,
    time_sampling_option,
)


@dataclass(frozen=True)
class MDLMSampling(PaddedCanvas, LogitShift, Cached, CommitRules):
    """Semi-autoregressive block decoding of a masked canvas (MDLM / LLaDA)."""

    block_size: int | None = option(
        None, "semi-autoregressive block: blocks of this size fill left to right, each with "
              "its share of steps (default max_new_tokens; must divide it)")

    sampler: ClassVar[str] = "mdlm"
    # Fast-dLLM's prefix and dual caches, both approximations (dlmkit.families.mdlm.decode).
    caches: ClassVar[tuple[str, ...]] = ("none", "prefix", "dual")

    def check(self) -> MDLMSampling:
        if self.block_size is not None:
            check_int("block_size", self.block_size, 1)
        if self.pad_to is not None:  # the batch's canvas width decides (for_width)
            return self
        block = self.max_new_tokens if self.block_size is None else self.block_size
        if self.max_new_tokens % block:
            valid = [d for d in range(1, self.max_new_tokens + 1) if self.max_new_tokens % d == 0]
            raise ValueError(f"block_size={block} must divide max_new_tokens="
                             f"{self.max_new_tokens} for the mdlm sampler (valid: {valid})")
        blocks = self.max_new_tokens // block
        if self.steps < blocks:
            raise ValueError(f"steps={self.steps} must be >= the number of blocks ({blocks} = "
                             f"max_new_tokens / block_size) for the mdlm sampler")
        return dataclasses.replace(self, block_size=block)


@dataclass(frozen=True)
class MDLMTraining(TrainingOptions):
    """mdlm's training options (``strategy.<option>``; why the defaults:
    docs/families/mdlm.md#why-these-defaults)."""

    t_min: float = t_min_option()
    t_max: float = t_max_option()
    time_sampling: str = time_sampling_option()
    logit_shift: bool | None = logit_shift_option()
