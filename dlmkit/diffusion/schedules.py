"""Noise schedules.

SCDD (self-correcting discrete diffusion) mixes an absorbing channel (token -> [MASK]) with a
uniform channel (token -> a random non-mask token). Its forward marginal is

    q(z_t | x) = gamma_t (rho_t onehot(x) + (1 - rho_t) uniform) + (1 - gamma_t) onehot(MASK)

where ``uniform`` is over the ``K = V - 1`` non-mask tokens. The schedule is written with three
masses that sum to one: ``clean(t) = (1 - t) / (1 + c)``, ``uniform(t) = c / (1 + c)``,
``absorbed(t) = t / (1 + c)``, with a Beta-shaped bump ``c(t) = scale * t^a * (1 - t)^b``,
``a = gamma_shape * t_peak``, ``b = gamma_shape * (1 - t_peak)``. ``scale`` is chosen so that
``uniform(t_peak) == max_ratio`` exactly, which is also the maximum of ``uniform(t)``.
(The uniform-to-clean ratio is *not* bounded by ``max_ratio``; it grows as ``t -> 1``.)
With ``max_ratio = 0`` the schedule is MDLM's linear absorbing one: clean = 1 - t, absorbed = t.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch


class SCDDMasses(NamedTuple):
    """Masses of the SCDD forward marginal at time ``t`` (all the shape of ``t``, float64).

    ``clean + uniform + absorbed == 1``; ``gamma = clean + uniform`` (not absorbed);
    ``rho = clean / gamma`` (share of the non-absorbed mass that is the clean token's own
    "retained" part, before the uniform mass adds 1/K of itself to it too).
    """

    clean: torch.Tensor
    uniform: torch.Tensor
    absorbed: torch.Tensor
    gamma: torch.Tensor
    rho: torch.Tensor


def check_scdd_params(max_ratio: float, gamma_shape: float, t_peak: float) -> None:
    """Raise ``ValueError`` naming the first bad SCDD schedule parameter."""
    for name, value, ok, allowed in (
        ("max_ratio", max_ratio, lambda v: 0.0 <= v < 1.0, "[0, 1)"),
        ("gamma_shape", gamma_shape, lambda v: v > 0.0, "(0, inf)"),
        ("t_peak", t_peak, lambda v: 0.0 < v < 1.0, "(0, 1)"),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ValueError(f"{name} must be a number in {allowed}, got {value!r}")


def scdd_schedule(
    t: torch.Tensor | float, *, max_ratio: float = 0.1, gamma_shape: float = 1.0,
    t_peak: float = 0.5,
) -> SCDDMasses:
    """Evaluate the SCDD schedule at times ``t`` (any shape; clamped to ``[0, 1]``).

    Returns :class:`SCDDMasses` in float64. ``t = 0`` is all clean, ``t = 1`` all absorbed.
    """
    check_scdd_params(max_ratio, gamma_shape, t_peak)
    t = torch.as_tensor(t, dtype=torch.float64).clamp(0.0, 1.0)
    a = gamma_shape * t_peak
    b = gamma_shape * (1.0 - t_peak)
    peak = t_peak**a * (1.0 - t_peak) ** b
    scale = (max_ratio / (1.0 - max_ratio)) / peak
    c = scale * t.pow(a) * (1.0 - t).pow(b)
    clean = (1.0 - t) / (1.0 + c)
    uniform = c / (1.0 + c)
    absorbed = t / (1.0 + c)
    gamma = clean + uniform
    rho = clean / gamma.clamp_min(1e-30)
    return SCDDMasses(clean, uniform, absorbed, gamma, rho)


@lru_cache(maxsize=64)
def check_scdd_grid(max_ratio: float, gamma_shape: float, t_peak: float,
                    num_timesteps: int) -> None:
    """Require a valid forward process on the grid ``{0, 1/T, ..., 1}``.

    Each step ``s -> t`` keeps a token with probability ``gamma_t / gamma_s`` and its clean
    share with ``rho_t / rho_s``; both must be <= 1, i.e. ``gamma`` and ``rho`` non-increasing.
    A sharp, tall bump (large ``max_ratio`` and ``gamma_shape``) breaks this.
    """
    t = torch.linspace(0.0, 1.0, num_timesteps + 1, dtype=torch.float64)
    m = scdd_schedule(t, max_ratio=max_ratio, gamma_shape=gamma_shape, t_peak=t_peak)
    for name, v in (("gamma", m.gamma), ("rho", m.rho[:-1])):  # rho(1) = 0/0 is unused
        rise = (v[1:] - v[:-1]).max().item()
        if rise > 1e-12:
            raise ValueError(
                f"SCDD schedule (max_ratio={max_ratio}, gamma_shape={gamma_shape}, "
                f"t_peak={t_peak}) is not a valid forward process on a {num_timesteps}-step "
                f"grid: {name}(t) increases by {rise:.3g} somewhere; lower max_ratio or "
                "gamma_shape"
            )
