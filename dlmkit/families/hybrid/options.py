"""The hybrid sampler's options (docs/families/hybrid.md: how it decodes); then its training options
(``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import (
    Cached,
    CommitRules,
    SamplerConfig,
    check_int,
    needs_block_size,
    option,
    option_names,
)
from dlmkit.families.options import (
    TrainingOptions,
    block_size_option,
    t_max_option,
    t_min_option,
    time_sampling_option,
)
from dlmkit.families.options import option as train_option

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


CORRUPTIONS = ("uniform", "blockwise")


@dataclass(frozen=True)
class HybridTraining(TrainingOptions):
    """hybrid's training options (``strategy.<option>``; why the defaults:
    docs/families/hybrid.md#why-these-defaults)."""

    block_size: int = block_size_option(4, "diffusion block; recorded in dlmkit.json")
    alpha: float = train_option(
        1.0, "weight of the diffusion term in alpha * L_diff + L_AR (NeMo's recipe: 0.3)", low=0)
    corruption: str = train_option(
        "uniform", "how positions are masked: 'uniform' = one level per document (as mdlm), "
                   "'blockwise' = one level per block, round(m * len) positions biased towards "
                   "later ones", choices=CORRUPTIONS)
    t_min: float = t_min_option()
    t_max: float = t_max_option()
    time_sampling: str = time_sampling_option(
        "how the mask levels are drawn: 'stratified' = one per stratum of [0, 1) over the "
        "global batch (blockwise: per block of each document), 'iid' = independently")
    half_life_ratio: float = train_option(
        0.25, "blockwise only (another value with 'uniform' is an error): the bias towards "
              "later positions, inclusion weights 2^((1 - m)(j - n + 1) / (half_life_ratio n)) "
              "(dlmkit.diffusion.corrupt_blockwise)",
        positive=True)
