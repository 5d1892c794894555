"""BD3-LM: block diffusion, noisy blocks over a block-causal clean stream."""

from dlmkit.families.family import Family

from .decode import decode
from .options import BD3LMSampling, BD3LMTraining
from .strategy import BD3LMStrategy

FAMILY = Family(
    name="bd3lm", paper="BD3-LM (Arriola et al. 2025)",
    trains="block diffusion: [noisy | clean] streams, masked loss per block",
    strategy=BD3LMStrategy, sampling=BD3LMSampling, training=BD3LMTraining,
    decode=decode, likelihood="block_elbo")
