"""Hybrid AR + diffusion: block diffusion over a token-causal clean stream that is also a
causal LM."""

from dlmkit.families.family import Family

from .decode import decode
from .options import HybridSampling, HybridTraining
from .strategy import HybridStrategy

FAMILY = Family(
    name="hybrid", paper="hybrid autoregressive + diffusion (block diffusion with an AR term)",
    trains="block diffusion plus next-token loss on a token-causal clean stream",
    strategy=HybridStrategy, sampling=HybridSampling, training=HybridTraining,
    decode=decode, likelihood="causal",
    also_decoded_by=("ar",))
