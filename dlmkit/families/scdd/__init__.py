"""SCDD: self-correcting discrete diffusion, absorbing and uniform channels."""

from dlmkit.families.family import Family

from .decode import decode, infill
from .options import SCDDSampling, SCDDTraining
from .strategy import SCDDStrategy

FAMILY = Family(
    name="scdd", paper="SCDD (self-correcting discrete diffusion)",
    trains="absorbing + uniform noise on the SCDD schedule, discrete-time NELBO",
    strategy=SCDDStrategy, sampling=SCDDSampling, training=SCDDTraining,
    decode=decode,
    likelihood="masked_elbo_nonmask", related=("mdlm",), infill=infill)
