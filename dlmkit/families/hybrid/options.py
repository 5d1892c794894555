"""The hybrid sampler's options (docs/families/hybrid.md: how it decodes)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import (
    Cached,
    CommitRules,
    SamplerConfig,
    check_int,
    needs_block_size,
    option,
    option_names,
)

MODES = ("diffusion", "ar")
# What the autoregressive mode would ignore (it has its own exact causal cache).
DIFFUSION_ONLY = ("steps", "remasking", "threshold", "factor", "cache")


@dataclass(frozen=True)
class HybridSampling(Cached, CommitRules):
    """Block diffusion (``mode: diffusion``) or the clean causal stream (``mode: ar``)."""

    block_size: int | None = option(
        None, "diffusion mode: the trained block size (default: block_size of dlmkit.json); ar "
              "mode takes none")
    mode: str = option("diffusion", "diffusion (block diffusion) or ar (the clean causal "
                                    "stream, one token a forward)", choices=MODES)

    sampler: ClassVar[str] = "hybrid"
    caches: ClassVar[tuple[str, ...]] = ("none", "prefix")

    def resolved(self) -> SamplerConfig:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "diffusion":
            return super().resolved()
        fields = {f.name: f for f in dataclasses.fields(self)}
        unused = sorted(k for k in DIFFUSION_ONLY if getattr(self, k) != fields[k].default)
        if unused:
            accepts = sorted(option_names(type(self)) - set(DIFFUSION_ONLY))
            raise ValueError(f"hybrid mode='ar' does not use option(s) {unused}; it accepts "
                             f"{accepts}")
        if self.block_size is not None:
            check_int("block_size", self.block_size, 1)
        self.check_common()
        return self

    def check(self) -> HybridSampling:
        needs_block_size(self)
        return self

    def unused_block_size(self, mode: str = "mode='ar'") -> str | None:
        if self.mode == "ar":
            return (f"the hybrid sampler in {mode} (it decodes token by token on the clean "
                    "causal stream)")
        return None

    def decodes_trained_blocks(self) -> bool:
        return self.mode == "diffusion"

    @classmethod
    def trained_defaults(cls, meta: dict, options: dict) -> dict:
        # ar mode decodes the clean causal stream: no block.
        return {} if options.get("mode") == "ar" else super().trained_defaults(meta, options)
