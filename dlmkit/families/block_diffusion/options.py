"""The block_diffusion sampler's options: DiffusionGemma canvases (docs/families/
block_diffusion.md: how it decodes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import CommitRules, check_int, number, option


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
