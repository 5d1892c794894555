"""The sampling entry points, above the families: :mod:`.api` (load an export, generate,
infill), :mod:`.evaluation` (exact match), :mod:`.harness` (lm-eval). The decoding runtime they
and every family's decoder share is :mod:`dlmkit.decoding`; each family's decoder and its
sampler's options live in its folder (:mod:`dlmkit.families`).
"""

from dlmkit.decoding.options import SamplerConfig
from dlmkit.decoding.primitives import REMASKING

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
from .evaluation import evaluate


def __getattr__(name: str):
    # The samplers and the options each takes come from the family registry.
    if name == "SAMPLERS":
        from dlmkit import families

        return tuple(families.names())
    if name == "OPTIONS":
        from dlmkit import families
        from dlmkit.decoding.options import option_names

        return {n: frozenset(option_names(families.get(n).sampling)) for n in families.names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OPTIONS", "REMASKING", "SAMPLERS", "GenerationResult", "LoadedModel",
           "SamplerConfig", "encode_infill", "encode_prompt", "evaluate", "generate", "infill",
           "load", "sampler_config"]
