"""The ar sampler: token-by-token decoding of a causal LM over its KV cache (the causal stream
runtime of :mod:`dlmkit.decoding.stream`, shared with hybrid's ar mode and idlm)."""

from __future__ import annotations

from dlmkit.decoding.runner import Runner
from dlmkit.decoding.stream import sample_ar

from .options import ARSampling


def decode(runner: Runner, encoded, cfg: ARSampling, **ids) -> list[list[int]]:
    """(:class:`~dlmkit.families.family.Family` ``decode``)."""
    return sample_ar(runner, encoded, max_new_tokens=cfg.max_new_tokens,
                     temperature=cfg.temperature, **ids)
