"""Stratified noise levels across the global batch (low-discrepancy time sampling).

The masked families weight each corrupted token by ``1/t``. With ``t`` drawn independently
per sample, a batch may hold several very small ``t`` (huge weights on few tokens) or none, and
the loss swings from step to step; MDLM (Sahoo et al., 2024) and BD3-LM (Arriola et al., 2025)
sample ``t`` *low-discrepancy* over the batch instead. Here the global batch of ``G`` samples is
cut into ``G`` strata of ``[0, 1)``: the sample in slot ``k`` of the step's global batch gets

    level = frac(k / G + u / G + j * PHI)

where ``u`` is the sample's own uniform (drawn from its per-sample generator, exactly as in
i.i.d. sampling) and ``j`` the block's index within its document (0 for a per-row level).
For each ``j`` the ``G`` levels of a step therefore fall one in each stratum (rotated by
``j * PHI``, which keeps one per stratum), so the batch mean of any function of the level has
far less variance than with i.i.d. levels, and each level is still uniform on ``[0, 1)``
marginally (unbiased). Successive blocks of one document are spread by the golden-ratio
rotation (a Weyl sequence), so one answer's blocks get spread-out levels too.

The slot ``k`` is the sample's position in the step's global batch, which the data order fixes
(:class:`~dlmkit.data.GlobalBatchSampler`), not the micro-batch or rank split; with ``u`` a
function of ``(seed, step, sample index)``, every level is independent of the split.
"""

from __future__ import annotations

import math

import torch

# Golden-ratio conjugate: the rotation whose multiples are the most evenly spread mod 1.
PHI = (math.sqrt(5.0) - 1.0) / 2.0
TIME_SAMPLING = ("stratified", "iid")


def check_time_sampling(value: object) -> str:
    if value not in TIME_SAMPLING:
        raise ValueError(f"strategy.time_sampling must be one of {TIME_SAMPLING}, got {value!r}")
    return value


def strata(slot: torch.Tensor, num_slots: int,
           block_index: torch.Tensor | None = None) -> torch.Tensor:
    """Per-position stratum offsets ``frac(slot / num_slots + block_index * PHI)``, float64.

    ``slot [B, L]``: the slot of each position's sample in the global batch, in
    ``[0, num_slots)`` (negative on padding, which is never corrupted: read as 0);
    ``block_index [B, L]``: the position's block within its document (None = 0).
    Pass the result as a corruption's ``stratum`` with ``num_strata=num_slots``.
    """
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
        raise ValueError(f"num_slots must be an int >= 1, got {num_slots!r}")
    if slot.dtype.is_floating_point or slot.dim() != 2:
        raise ValueError(f"slot must be an integer [B, L] tensor, got {slot.dtype} "
                         f"{tuple(slot.shape)}")
    if bool((slot >= num_slots).any()):
        raise ValueError(f"slot values must be < num_slots = {num_slots}, got "
                         f"{int(slot.max())}")
    out = slot.clamp_min(0).to(torch.float64) / num_slots
    if block_index is not None:
        if block_index.shape != slot.shape:
            raise ValueError(f"block_index must have slot's shape {tuple(slot.shape)}, got "
                             f"{tuple(block_index.shape)}")
        out = out + block_index.to(torch.float64) * PHI
    return torch.frac(out)


def stratified(u: torch.Tensor, stratum: torch.Tensor | None, num_strata: int) -> torch.Tensor:
    """The level in ``[0, 1)`` from a uniform ``u``: ``u`` itself without strata (i.i.d.),
    else ``frac(stratum + u / num_strata)``."""
    if stratum is None:
        return u
    if stratum.shape != u.shape:
        raise ValueError(f"stratum must have shape {tuple(u.shape)} (the batch), got "
                         f"{tuple(stratum.shape)}")
    return torch.frac(stratum.to(u.device, torch.float64) + u / num_strata)
