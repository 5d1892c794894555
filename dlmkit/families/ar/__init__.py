"""Plain autoregressive training: the baseline, and DFlash's target."""

from dlmkit.families.family import Family

from .decode import decode
from .options import ARSampling, ARTraining
from .strategy import ARStrategy

FAMILY = Family(
    name="ar", paper="autoregressive language modelling (the baseline)",
    trains="next-token cross-entropy under a causal mask",
    strategy=ARStrategy, sampling=ARSampling, training=ARTraining,
    decode=decode, likelihood="causal",
    plain_causal=True)
