"""The dflash sampler's options (docs/families/dflash.md: speculative decoding); then its
training options (``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import SamplerConfig, needs_block_size, option
from dlmkit.families.options import TrainingOptions
from dlmkit.families.options import option as train_option


@dataclass(frozen=True)
class DFlashSampling(SamplerConfig):
    """Speculative decoding: a DFlash drafter proposes a block, the target verifies it."""

    block_size: int | None = option(
        None, "caps the drafted block (default: the drafter's trained block size)")

    sampler: ClassVar[str] = "dflash"

    def check(self) -> DFlashSampling:
        needs_block_size(self)
        return self


NORMALIZE = ("tokens", "mean")


@dataclass(frozen=True)
class DFlashTraining(TrainingOptions):
    """dflash's training options (``strategy.<option>``; docs/families/dflash.md)."""

    target: str | None = train_option(
        None, "the frozen target: a local Hugging Face causal LM directory (e.g. RUN/final of "
              "an ar run); required", null="not set: training stops and asks for one")
    target_layer_ids: list[int] | None = train_option(
        None, "target layers whose hidden states are the drafter's context (ids of existing "
              "layers)", null="num_target_layers layers evenly spaced from layer 1 to L - 3; "
                              "one: the middle layer")
    num_target_layers: int = train_option(
        3, "how many target layers, when target_layer_ids is null", positive=True)
    block_size: int = train_option(
        8, "the anchor plus the drafted tokens (at least one)", low=2)
    num_blocks_per_sample: int = train_option(
        4, "anchor blocks drawn per sample and step", positive=True)
    overlap: bool = train_option(True, "whether a sample's blocks may overlap")
    gamma: float | None = train_option(
        None, "decay of the loss weights over a block's offsets", positive=True,
        null="the DFlash paper's value for block_size 16 / 10 / 8 (7 / 5 / 4), else "
             "max(2, block_size / 2)")
    normalize: str = train_option(
        "tokens", "the loss denominator: 'tokens' = the scored tokens, 'mean' = their weights",
        choices=NORMALIZE)
    min_supervised: int | None = train_option(
        None, "a sample with fewer supervised tokens contributes nothing (counted as dropped)",
        positive=True, null="block_size")
