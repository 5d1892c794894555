"""Block diffusion as DiffusionGemma trains it: an encoder over the prompt, canvases decoded
over its cache."""

from dlmkit.families.family import Family

from .decode import decode
from .options import BlockDiffusionTraining, CanvasSampling
from .strategy import BlockDiffusionStrategy

FAMILY = Family(
    name="block_diffusion", paper="DiffusionGemma (encoder + block-diffusion decoder)",
    trains="uniform-noise canvases over an encoder's cache, self-conditioned",
    strategy=BlockDiffusionStrategy, sampling=CanvasSampling, training=BlockDiffusionTraining,
    decode=decode)
