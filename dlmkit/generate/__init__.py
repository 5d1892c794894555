"""Samplers for the diffusion LM families dlmkit trains (see :mod:`dlmkit.generate.api`).

Modules: :mod:`.primitives` (Gumbel sampling, confidence, schedule, threshold selection),
:mod:`.runner` (model calls, left-padded ragged batches), :mod:`.masked` (MDLM / LLaDA,
infilling), :mod:`.scdd` (ancestral, optionally self-correcting), :mod:`.block` (BD3-LM,
hybrid diffusion mode), :mod:`.stream` (KV-cached causal stream, AR decoding), :mod:`.idlm`
(introspective strided decoding), :mod:`.config` (options), :mod:`.api` (entry points).
"""

from .api import (
    GenerationResult,
    LoadedModel,
    encode_infill,
    encode_prompt,
    evaluate,
    generate,
    infill,
    load,
)
from .config import OPTIONS, SAMPLERS, SamplerConfig
from .primitives import REMASKING

__all__ = ["OPTIONS", "REMASKING", "SAMPLERS", "GenerationResult", "LoadedModel",
           "SamplerConfig", "encode_infill", "encode_prompt", "evaluate", "generate", "infill",
           "load"]
