"""The block_diffusion sampler's options: DiffusionGemma canvases (docs/families/
block_diffusion.md: how it decodes); then its training options
(``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import CommitRules, check_int, number, option
from dlmkit.families.options import TrainingOptions, block_size_option
from dlmkit.families.options import option as train_option


@dataclass(frozen=True)
class CanvasSampling(CommitRules):
    """Canvas-by-canvas denoising over the encoder's cache, with DiffusionGemma's commit rules,
    temperature schedule and adaptive stopping."""

    block_size: int | None = option(
        None, "the trained canvas block (default: block_size of dlmkit.json)")
    entropy_bound: float | None = option(
        None, "commit the lowest-entropy positions whose entropies, less their maximum, sum to "
              "at most this (transformers' entropy-bound sampler); None = the remasking / "
              "threshold rule")
    t_min: float | None = option(None, "linear temperature schedule: the temperature at a "
                                       "canvas's last step (with t_max; replaces temperature)")
    t_max: float | None = option(None, "linear temperature schedule: the temperature at a "
                                       "canvas's first step (with t_min)")
    stability_threshold: int | None = option(
        None, "adaptive stopping: a row stops denoising a canvas once its argmax is unchanged "
              "for this many steps (with confidence_threshold)")
    confidence_threshold: float | None = option(
        None, "adaptive stopping: ... and its mean entropy is below this (with "
              "stability_threshold)")

    sampler: ClassVar[str] = "block_diffusion"

    def check(self) -> CanvasSampling:
        if self.block_size is None:
            raise ValueError("sampler 'block_diffusion' needs block_size (the trained canvas "
                             "block; read from the model's dlmkit.json)")
        check_int("block_size", self.block_size, 1)
        if self.entropy_bound is not None:
            number("entropy_bound", self.entropy_bound, positive=True)
            for rule in ("threshold", "factor"):
                if getattr(self, rule) is not None:
                    raise ValueError(f"entropy_bound and {rule} are two commit rules; set one")
        if (self.t_min is None) != (self.t_max is None):
            raise ValueError(f"t_min and t_max go together (a linear temperature schedule), "
                             f"got t_min={self.t_min!r}, t_max={self.t_max!r}")
        if self.t_min is not None:
            if not number("t_min", self.t_min) < number("t_max", self.t_max):
                raise ValueError(f"t_min must be < t_max, got {self.t_min!r} and {self.t_max!r}")
            if self.temperature != 0:
                raise ValueError("t_min/t_max replace temperature; do not set both")
        if (self.stability_threshold is None) != (self.confidence_threshold is None):
            raise ValueError("stability_threshold and confidence_threshold go together "
                             f"(adaptive stopping), got {self.stability_threshold!r} and "
                             f"{self.confidence_threshold!r}")
        if self.stability_threshold is not None:
            check_int("stability_threshold", self.stability_threshold, 0)
            number("confidence_threshold", self.confidence_threshold, positive=True)
        return self


DECODE = ("selected", "all")
ENCODER_LOSS_TARGETS = ("all", "response")


@dataclass(frozen=True)
class BlockDiffusionTraining(TrainingOptions):
    """block_diffusion's training options (``strategy.<option>``; why the defaults:
    docs/families/block_diffusion.md#why-these-defaults)."""

    block_size: int = block_size_option(
        4, "the canvas block the decoder denoises; recorded in dlmkit.json")
    eps: float = train_option(1e-3, "lower end of the canvas block's noise level",
                              low=0.0, high=1.0, ends="()")
    self_conditioning_p: float = train_option(
        0.5, "probability that a step's second decoder pass is conditioned on the first "
             "pass's logits (0 = no self-conditioning, one pass)", low=0.0, high=1.0, ends="[]")
    encoder_loss_weight: float = train_option(
        1.0, "weight of the encoder's next-token loss (0 = none)", low=0)
    encoder_loss_targets: str = train_option(
        "response", "pairs that loss scores: 'response' = pairs whose target is a supervised "
                    "token (as ar's SFT loss), 'all' = every valid pair (NeMo's recipe)",
        choices=ENCODER_LOSS_TARGETS)
    max_blocks: int | None = train_option(
        None, "canvas budget: a response that needs more blocks is an error before training",
        positive=True, null="no limit")
    decode: str = train_option(
        "selected", "'selected' = decode only the drawn block; 'all' = NeMo's whole-response "
                    "canvas, the same loss for about num_blocks times the decoder work "
                    "(single-turn records; for tests and benchmarks)", choices=DECODE)
