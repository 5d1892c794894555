"""The bd3lm sampler's options (docs/families/bd3lm.md: how it decodes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import Cached, CommitRules, LogitShift, needs_block_size, option


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
