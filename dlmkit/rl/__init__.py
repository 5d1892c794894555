"""Group-relative policy optimisation for diffusion LMs (``dlmkit rl``): rollouts with the
family's sampler (:mod:`.rollout`), rewards (:mod:`.rewards`), sequence log-probability
estimators (:mod:`.estimators`), the clipped objective (:mod:`.objective`), the loop
(:mod:`.loop`)."""

from .config import DEFAULTS, load_rl_config
from .estimators import Estimator, Noise
from .loop import run
from .objective import clipped_surrogate, group_advantages, k3
from .rewards import RewardError

__all__ = ["DEFAULTS", "Estimator", "Noise", "RewardError", "clipped_surrogate",
           "group_advantages", "k3", "load_rl_config", "run"]
