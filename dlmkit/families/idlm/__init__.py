"""I-DLM: introspective diffusion over a causal clean stream."""

from dlmkit.families.family import Family

from .decode import decode
from .options import IDLMSampling, IDLMTraining
from .strategy import IDLMStrategy

FAMILY = Family(
    name="idlm", paper="I-DLM (introspective diffusion language models)",
    trains="all-masked noisy block after a causal clean stream; clean next-token loss",
    strategy=IDLMStrategy, sampling=IDLMSampling, training=IDLMTraining,
    decode=decode, likelihood="causal",
    also_decoded_by=("ar",))
