"""The maskpredict sampler's options: the common ones, a step budget and the canvas length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import PaddedCanvas, Steps, option


@dataclass(frozen=True)
class MaskPredictSampling(PaddedCanvas, Steps):
    """Mask-Predict decoding: ``steps`` rounds of predict-all, re-mask the least confident."""

    final_argmax: bool = option(
        True, "the last step takes every position's argmax (False: its sampled token)")

    sampler: ClassVar[str] = "maskpredict"

    def check(self) -> MaskPredictSampling:
        if not isinstance(self.final_argmax, bool):
            raise ValueError(f"final_argmax must be True or False, got {self.final_argmax!r}")
        return self
