"""The scdd sampler's options (docs/families/scdd.md: how it decodes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmkit.generate.config import LogitShift, PaddedCanvas, Steps, option

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
