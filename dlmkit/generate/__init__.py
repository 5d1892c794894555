"""The shared decoding runtime and the sampling entry points (:mod:`.api`).

Modules: :mod:`.primitives` (Gumbel sampling, confidence, schedule, threshold selection),
:mod:`.commit` (the commit rules of a denoising step, the masked canvas), :mod:`.runner`
(model calls, left-padded ragged batches), :mod:`.stream` (the KV-cached causal stream, AR
decoding), :mod:`.config` (the options every sampler takes), :mod:`.likelihood` (scorers),
:mod:`.evaluation` (exact match), :mod:`.api` (load, generate, infill). Each family's decoder
and its sampler's options live in its folder (:mod:`dlmkit.families`).
"""

from .api import (
    GenerationResult,
    LoadedModel,
    encode_infill,
    encode_prompt,
    generate,
    infill,
    load,
    sampler_config,
)
from .config import SamplerConfig
from .evaluation import evaluate
from .primitives import REMASKING


def __getattr__(name: str):
    # The samplers and the options each takes come from the family registry.
    if name == "SAMPLERS":
        from dlmkit import families

        return tuple(families.names())
    if name == "OPTIONS":
        from dlmkit import families
        from dlmkit.generate.config import option_names

        return {n: frozenset(option_names(families.get(n).sampling)) for n in families.names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OPTIONS", "REMASKING", "SAMPLERS", "GenerationResult", "LoadedModel",
           "SamplerConfig", "encode_infill", "encode_prompt", "evaluate", "generate", "infill",
           "load", "sampler_config"]
