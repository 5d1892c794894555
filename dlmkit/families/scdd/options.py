"""The scdd sampler's options (docs/families/scdd.md: how it decodes); then its training options
(``strategy.<option>``, :mod:`dlmkit.families.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.decoding.options import LogitShift, PaddedCanvas, Steps, option
from dlmkit.families.options import TrainingOptions, logit_shift_option, time_sampling_option
from dlmkit.families.options import option as train_option

# The noise schedule of training, which the reverse process must run on.
SCHEDULE_OPTIONS = ("max_ratio", "gamma_shape", "t_peak")


@dataclass(frozen=True)
class SCDDSampling(PaddedCanvas, LogitShift, Steps):
    """SCDD's ancestral sampler on its trained schedule."""

    max_ratio: float = option(0.1, "SCDD schedule: peak share of the uniform channel (read "
                                   "from dlmkit.json; must match training)")
    gamma_shape: float = option(1.0, "SCDD schedule: shape of the uniform channel's bump "
                                     "(read from dlmkit.json; must match training)")
    t_peak: float = option(0.5, "SCDD schedule: time of the uniform channel's peak (read "
                                "from dlmkit.json; must match training)")
    revise: bool = option(
        False, "False: masks are released on the trained schedule into draws from the model "
               "and a committed token never changes. True: SCDD's full reverse process "
               "(visible tokens revised by the posterior, a final argmax pass)")

    sampler: ClassVar[str] = "scdd"

    def check(self) -> SCDDSampling:
        if not isinstance(self.revise, bool):
            raise ValueError(f"revise must be True or False, got {self.revise!r}")
        return self

    @classmethod
    def trained_defaults(cls, meta: dict, options: dict) -> dict:
        trained = meta.get("options") or {}
        return {**super().trained_defaults(meta, options),
                **{k: trained[k] for k in SCHEDULE_OPTIONS if k in trained}}


@dataclass(frozen=True)
class SCDDTraining(TrainingOptions):
    """scdd's training options (``strategy.<option>``; why the defaults:
    docs/families/scdd.md#why-these-defaults). ``max_ratio``, ``gamma_shape`` and ``t_peak``
    are recorded in dlmkit.json: the sampler runs the reverse process on the trained
    schedule."""

    num_timesteps: int = train_option(1000, "the time grid T of the discrete-time loss", low=2)
    max_ratio: float = train_option(
        0.1, "peak ratio of uniform noise to retained tokens (0 = MDLM's absorbing process)",
        low=0, high=1, ends="[)")
    gamma_shape: float = train_option(
        1.0, "shape of the uniform-noise bump over time (a bump so tall and sharp that the "
             "forward process is invalid on the grid is an error)", positive=True)
    t_peak: float = train_option(0.5, "the time where the uniform-noise bump peaks", low=0, high=1,
                           ends="()")
    t_min: float = train_option(
        0.2, "only grid times i/T >= t_min are drawn (the loss then estimates T / (T - first "
             "+ 1) times the kept steps' sum, first = ceil(t_min T)); 0 = every step",
        low=0, high=1, ends="[)")
    time_sampling: str = time_sampling_option(
        "how each row's time is drawn: 'stratified' = one per stratum of [0, 1) over the "
        "global batch (dlmkit.diffusion.timesteps), 'iid' = independently")
    logit_shift: bool | None = logit_shift_option()
