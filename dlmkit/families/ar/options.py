"""The ar sampler's options: autoregressive decoding takes only the common ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import SamplerConfig


@dataclass(frozen=True)
class ARSampling(SamplerConfig):
    """Token-by-token decoding over a KV cache (any causal LM)."""

    sampler: ClassVar[str] = "ar"
