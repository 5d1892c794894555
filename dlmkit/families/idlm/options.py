"""The idlm sampler's options (docs/families/idlm.md: how it decodes); then its training options
(``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import SamplerConfig, needs_block_size, option
from dlmkit.families.options import TrainingOptions, block_size_option
from dlmkit.families.options import option as train_option


@dataclass(frozen=True)
class IDLMSampling(SamplerConfig):
    """Introspective strided decoding (I-DLM)."""

    block_size: int | None = option(
        None, "the stride: tokens proposed per forward (default: the trained block size)")

    sampler: ClassVar[str] = "idlm"

    def check(self) -> IDLMSampling:
        needs_block_size(self)
        return self


@dataclass(frozen=True)
class IDLMTraining(TrainingOptions):
    """idlm's training options (``strategy.<option>``; why the defaults:
    docs/families/idlm.md#why-these-defaults)."""

    block_size: int = block_size_option(
        4, "the noisy block: the stride the sampler proposes; recorded in dlmkit.json")
    clean_loss_weight: float | None = train_option(
        None, "weight of the clean stream's next-token loss (the stream that decodes; the "
              "paper's early value: 0.2); adapting a causal LM, a heavier clean loss keeps "
              "what it knew", low=0, regime=(1.0, 4.0))
    auto_balance: bool = train_option(
        False, "weight the clean loss by CE_noisy / CE_clean instead of clean_loss_weight")
