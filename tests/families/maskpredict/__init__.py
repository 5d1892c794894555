"""Mask-Predict (Ghazvininejad et al. 2019): the example family of docs/adding_a_family.md.

It trains with mdlm's masked-diffusion objective and decodes with its own sampler: every step
predicts every masked position, then *re-masks* the least confident of all the canvas's
predictions (committed or not) for the next step, so an early guess can still change, where
mdlm commits a token once and for all. Registered by ``families.register(FAMILY)`` (a test
fixture); in dlmkit's own tree it would be one line in ``dlmkit/families/__init__.py``.
"""

from dlmkit.families import Family

from .decode import decode
from .options import MaskPredictSampling
from .strategy import MaskPredictStrategy

FAMILY = Family(
    name="maskpredict", paper="Mask-Predict (Ghazvininejad et al. 2019)",
    trains="mdlm's masked diffusion: one bidirectional stream, loss on the masked tokens",
    strategy=MaskPredictStrategy, sampling=MaskPredictSampling, decode=decode,
    likelihood="masked_elbo")
