"""The hybrid sampler: block diffusion over its token-causal clean stream (BD3-LM's block
sampler, :mod:`dlmkit.families.bd3lm.decode`), or with ``mode: ar`` autoregressive decoding
of that clean stream (:func:`dlmkit.decoding.stream.sample_ar`)."""

from __future__ import annotations

from dlmkit.decoding.runner import Runner
from dlmkit.decoding.stream import sample_ar
from dlmkit.families.bd3lm.decode import sample_blocks

from .options import HybridSampling


def decode(runner: Runner, encoded, cfg: HybridSampling, **ids) -> list[list[int]]:
    """(:class:`~dlmkit.families.family.Family` ``decode``)."""
    if cfg.mode == "ar":
        return sample_ar(runner, encoded, max_new_tokens=cfg.max_new_tokens,
                         temperature=cfg.temperature, **ids)
    return sample_blocks(runner, encoded, cfg, clean_causal=True, **ids).tolist()
