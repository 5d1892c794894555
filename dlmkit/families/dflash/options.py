"""The dflash sampler's options (docs/families/dflash.md: speculative decoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import SamplerConfig, needs_block_size, option


@dataclass(frozen=True)
class DFlashSampling(SamplerConfig):
    """Speculative decoding: a DFlash drafter proposes a block, the target verifies it."""

    block_size: int | None = option(
        None, "caps the drafted block (default: the drafter's trained block size)")

    sampler: ClassVar[str] = "dflash"

    def check(self) -> DFlashSampling:
        needs_block_size(self)
        return self
