"""MDLM / LLaDA: masked diffusion over a bidirectional canvas."""

from dlmkit.families.family import Family

from .decode import decode, infill_masked
from .options import MDLMSampling, MDLMTraining
from .strategy import MDLMStrategy

FAMILY = Family(
    name="mdlm", paper="MDLM (Sahoo et al. 2024) / LLaDA (Nie et al. 2025)",
    trains="masked diffusion: one bidirectional stream, loss on the masked tokens",
    strategy=MDLMStrategy, sampling=MDLMSampling, training=MDLMTraining,
    decode=decode, likelihood="masked_elbo",
    related=("scdd",), infill=infill_masked)
