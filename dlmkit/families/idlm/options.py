"""The idlm sampler's options (docs/families/idlm.md: how it decodes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import SamplerConfig, needs_block_size, option


@dataclass(frozen=True)
class IDLMSampling(SamplerConfig):
    """Introspective strided decoding (I-DLM)."""

    block_size: int | None = option(
        None, "the stride: tokens proposed per forward (default: the trained block size)")

    sampler: ClassVar[str] = "idlm"

    def check(self) -> IDLMSampling:
        needs_block_size(self)
        return self
