"""The ar sampler's options: autoregressive decoding takes only the common ones; then its
training options (``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import SamplerConfig
from dlmkit.families.options import TrainingOptions


@dataclass(frozen=True)
class ARSampling(SamplerConfig):
    """Token-by-token decoding over a KV cache (any causal LM)."""

    sampler: ClassVar[str] = "ar"


@dataclass(frozen=True)
class ARTraining(TrainingOptions):
    """ar has no training options: next-token cross-entropy on the supervised tokens."""
