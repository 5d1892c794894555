"""Corruption processes of the dLLM families.

Every function takes ``input_ids [B, L]`` (integer) and ``loss_mask [B, L]`` (1 = supervised,
any dtype) and returns ``(noisy_ids, noise_mask, p_mask)``:

* ``noisy_ids [B, L]`` (dtype of ``input_ids``): the corrupted sequence;
* ``noise_mask [B, L]`` bool: positions whose token was corrupted; always a subset of the
  supervised positions, and unsupervised positions are returned unchanged;
* ``p_mask [B, L]`` float32: the probability, given the per-row/per-block level drawn, that the
  position is in ``noise_mask``. It is the importance weight the MDLM-style losses divide by
  (the exceptions, :func:`corrupt_scdd` and :func:`corrupt_all_masked`, are documented there).

Randomness: every random number comes from ``generator`` — one ``torch.Generator`` or a list
of one per row (see :mod:`dlmkit.diffusion.rng`); the global RNG is never touched.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dlmkit.diffusion import rng, timesteps
from dlmkit.diffusion._checks import (
    check_ids,
    check_mask_token,
    check_open_unit,
    check_optional_block_size,
    check_positive_int,
    check_same_shape,
    check_unit_from_zero,
    check_vocab,
)
from dlmkit.diffusion.schedules import check_scdd_grid, check_scdd_params, scdd_schedule

Corruption = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _supervised(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    check_ids("input_ids", input_ids)
    check_same_shape("loss_mask", loss_mask, input_ids, "input_ids")
    return loss_mask.to(input_ids.device) != 0


def _per_row_or_block(
    row_u: torch.Tensor, pos_u: torch.Tensor, block_size: int | None
) -> torch.Tensor:
    """``[B, L]`` level: the row's uniform, or each block's (read at its first position)."""
    if block_size is None:
        return row_u[:, :1].expand_as(pos_u)
    return rng.block_values(pos_u, block_size)


def corrupt_uniform(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, mask_token_id: int, *,
    eps: float = 1e-3, t_max: float = 1.0, block_size: int | None = None,
    stratum: torch.Tensor | None = None, num_strata: int = 1, generator: rng.Generators,
) -> Corruption:
    """MDLM / LLaDA absorbing corruption (BD3-LM with ``block_size``).

    Per row (``block_size=None``) or per block of ``block_size`` positions (BD3-LM: every block
    its own noise level; blocks start at multiples of ``block_size``) a level ``t`` in
    ``[0, 1)`` and ``p = eps + (t_max - eps) t``; each supervised token becomes
    ``mask_token_id`` independently with probability ``p``. ``p_mask = p`` at every position
    of the row/block. ``t_max < 1`` clips the noise range to ``[eps, t_max)`` (BD3-LM's clipped
    schedules: bounded ``1/p`` weights, lower-variance training).
    ``t`` is the row's/block's uniform ``u`` (i.i.d.), or with ``stratum [B, L]`` (offsets from
    :func:`~dlmkit.diffusion.timesteps.strata`) ``frac(stratum + u / num_strata)``: stratified
    over the global batch (see :mod:`dlmkit.diffusion.timesteps`); the draws are the same.
    A row can end up with no corrupted token (likely when ``p`` is small and the row short).
    Draws per row: ``u``, then one uniform per position (two in per-block mode, the block's
    ``u`` read at its first position).
    """
    sup = _supervised(input_ids, loss_mask)
    check_mask_token(mask_token_id)
    eps = check_open_unit("eps", eps)
    if isinstance(t_max, bool) or not isinstance(t_max, (int, float)) or \
            not eps < t_max <= 1.0:
        raise ValueError(f"t_max must be a number in (eps, 1] = ({eps}, 1], got {t_max!r}")
    num_strata = check_positive_int("num_strata", num_strata)
    block_size = check_optional_block_size(block_size)
    batch, length = input_ids.shape
    cols = 1 if block_size is None else 2
    row_u, pos_u = rng.draw(generator, batch, length, 1, cols, input_ids.device)
    u = _per_row_or_block(row_u, pos_u[..., -1], block_size)
    p = eps + (float(t_max) - eps) * timesteps.stratified(u, stratum, num_strata)
    noise = (pos_u[..., 0] < p) & sup
    noisy = torch.where(noise, torch.full_like(input_ids, mask_token_id), input_ids)
    return noisy, noise, p.to(torch.float32).contiguous()


def corrupt_all_masked(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, mask_token_id: int, *,
    generator: rng.Generators | None = None,
) -> Corruption:
    """I-DLM: every supervised token becomes ``mask_token_id``; ``p_mask`` is all ones.

    Deterministic. ``generator`` is accepted (and ignored) only so that every corruption can be
    called the same way.
    """
    sup = _supervised(input_ids, loss_mask)
    check_mask_token(mask_token_id)
    noisy = torch.where(sup, torch.full_like(input_ids, mask_token_id), input_ids)
    return noisy, sup, torch.ones(input_ids.shape, dtype=torch.float32, device=input_ids.device)


def corrupt_uniform_random(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int, *,
    block_size: int | None = None, eps: float = 1e-3, generator: rng.Generators,
) -> Corruption:
    """DiffusionGemma (D3PM-uniform): supervised tokens are resampled uniformly from the vocab.

    Level ``t = eps + (1 - eps) U`` per row (``block_size=None``) or per block of ``block_size``
    positions (blocks start at multiples of ``block_size``). Each supervised position is
    selected with probability ``t`` and replaced by a token drawn uniformly from
    ``[0, vocab_size)``; the draw may equal the clean token (self-transition, as in D3PM), in
    which case the position is still in ``noise_mask``. There is no mask token.
    ``p_mask = t`` (the selection probability; the flat block-diffusion loss does not use it).
    Draws per row: ``t`` (per-row mode), then ``[L, 2]`` (selection, replacement), or
    ``[L, 3]`` in per-block mode (the block's ``t`` is read at its first position).
    """
    sup = _supervised(input_ids, loss_mask)
    check_vocab(vocab_size, minimum=2)
    block_size = check_optional_block_size(block_size)
    eps = check_open_unit("eps", eps)
    batch, length = input_ids.shape
    cols = 2 if block_size is None else 3
    row_u, pos_u = rng.draw(generator, batch, length, 1, cols, input_ids.device)
    level_u = _per_row_or_block(row_u, pos_u[..., -1], block_size)
    t = eps + (1.0 - eps) * level_u
    noise = (pos_u[..., 0] < t) & sup
    replacement = (pos_u[..., 1] * vocab_size).floor().clamp(max=vocab_size - 1)
    noisy = torch.where(noise, replacement.to(input_ids.dtype), input_ids)
    return noisy, noise, t.to(torch.float32)


def _row_probability(name: str, value: torch.Tensor | float, batch: int) -> torch.Tensor:
    """A float or a ``[B]`` / ``[B, 1]`` tensor -> float64 ``[B, 1]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"{name} must be a float or a [B] / [B, 1] tensor, got {value!r}")
    v = torch.as_tensor(value, dtype=torch.float64)
    if v.dim() == 0:
        v = v.expand(batch)
    if v.shape not in ((batch,), (batch, 1)):
        raise ValueError(f"{name} must be a float or of shape [B] or [B, 1] with B = {batch}, "
                         f"got shape {tuple(v.shape)}")
    v = v.reshape(batch, 1)
    if not bool(((v >= 0) & (v <= 1)).all()):
        raise ValueError(f"{name} must lie in [0, 1], got {v.flatten().tolist()}")
    return v


def corrupt_mix(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, mask_token_id: int, vocab_size: int, *,
    mask_prob: torch.Tensor | float, uniform_prob: torch.Tensor | float,
    generator: rng.Generators,
) -> Corruption:
    """SCDD's two mutually exclusive channels, one uniform ``u`` per position deciding.

    * absorbed (``u < mask_prob``): the token becomes ``mask_token_id``;
    * transitioned (``mask_prob <= u < mask_prob + uniform_prob``): the token becomes a
      *different* non-mask token, uniform over the ``V - 2`` tokens that are neither MASK nor
      the clean token (so ``uniform_prob`` is the probability that the token *changes*).

    ``mask_prob`` / ``uniform_prob``: a float or ``[B]`` / ``[B, 1]`` per row, each in
    ``[0, 1]`` with ``mask_prob + uniform_prob <= 1`` (checked; costs one host sync).
    A clean token equal to MASK is never transitioned and, if absorbed, stays unchanged and
    out of ``noise_mask``. ``noise_mask`` marks exactly the positions whose token changed.
    ``p_mask = mask_prob + uniform_prob`` (the corruption probability of a non-MASK token).
    Draws per row: ``[L, 2]`` (channel, replacement).
    """
    sup = _supervised(input_ids, loss_mask)
    check_vocab(vocab_size, mask_token_id, minimum=3)
    batch, length = input_ids.shape
    mp = _row_probability("mask_prob", mask_prob, batch).to(input_ids.device)
    up = _row_probability("uniform_prob", uniform_prob, batch).to(input_ids.device)
    total = mp + up
    if bool((total > 1.0 + 1e-6).any()):
        raise ValueError(
            "mask_prob + uniform_prob must be <= 1 for every row (they are the probabilities of "
            f"two exclusive channels), got sums {total.flatten().tolist()}"
        )
    _, pos_u = rng.draw(generator, batch, length, 0, 2, input_ids.device)
    u = pos_u[..., 0]
    not_mask = input_ids != mask_token_id
    absorbed = (u < mp) & sup
    transitioned = (u >= mp) & (u < total) & sup & not_mask
    # The d-th token of the vocabulary with MASK and the clean token removed, without a table.
    d = (pos_u[..., 1] * (vocab_size - 2)).floor().to(input_ids.dtype).clamp(max=vocab_size - 3)
    lo = torch.minimum(input_ids, torch.full_like(input_ids, mask_token_id))
    hi = torch.maximum(input_ids, torch.full_like(input_ids, mask_token_id))
    d = d + (d >= lo).to(d.dtype)
    d = d + (d >= hi).to(d.dtype)
    d = d.clamp(max=vocab_size - 1)  # only reachable when clean == MASK, which is excluded
    noisy = torch.where(absorbed, torch.full_like(input_ids, mask_token_id), input_ids)
    noisy = torch.where(transitioned, d, noisy)
    noise = noisy != input_ids
    return noisy, noise, total.to(torch.float32).expand(batch, length).contiguous()


def corrupt_scdd(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, mask_token_id: int, vocab_size: int, *,
    num_timesteps: int = 1000, max_ratio: float = 0.1, gamma_shape: float = 1.0,
    t_peak: float = 0.5, t_min: float = 0.0, stratum: torch.Tensor | None = None,
    num_strata: int = 1, generator: rng.Generators,
) -> Corruption:
    """SCDD forward process at a random grid time, ready for :class:`~.losses.SCDDLoss`.

    Per row, ``t`` is uniform on the grid points ``i/T >= t_min`` of ``{1/T, 2/T, ..., 1}``
    (``T = num_timesteps``; ``t_min = 0``: all of them, each with mass exactly ``1/T``), then
    :func:`corrupt_mix` runs with ``mask_prob = absorbed(t)`` and
    ``uniform_prob = uniform(t) * (K - 1) / K``, ``K = V - 1`` (a uniform draw that lands on
    the clean token leaves it unchanged, so only that share changes it). **``p_mask`` carries
    the diffusion time ``t``**, which the SCDD loss needs. ``t_min > 0`` clips the range as
    :func:`corrupt_uniform`'s ``eps`` does: only the ``T - first + 1`` grid points from
    ``first = max(1, ceil(t_min T))`` on are drawn, each with mass ``1 / (T - first + 1)``.
    :class:`~.losses.SCDDLoss` is ``T`` times the drawn step's KL, so its expectation is then
    ``T / (T - first + 1)`` times the sum of the bound's steps from ``first`` on (about 1.25
    times that partial sum at ``t_min = 0.2``), not the partial sum itself: the near-clean
    steps, whose terms swing most, are left out, and the kept ones are scaled up as
    :func:`corrupt_uniform`'s clipped range scales its kept levels. ``t_min = 0``: the whole
    bound (the NELBO). The row's uniform is stratified over the global batch with
    ``stratum [B]`` (as in
    :func:`corrupt_uniform`; :mod:`dlmkit.diffusion.timesteps`); the draws are the same.
    Draws per row: ``t``, then :func:`corrupt_mix`'s.
    """
    _supervised(input_ids, loss_mask)
    check_vocab(vocab_size, mask_token_id, minimum=3)
    num_timesteps = check_positive_int("num_timesteps", num_timesteps, minimum=2)
    check_scdd_params(max_ratio, gamma_shape, t_peak)
    check_scdd_grid(max_ratio, gamma_shape, t_peak, num_timesteps)
    t_min = check_unit_from_zero("t_min", t_min)
    num_strata = check_positive_int("num_strata", num_strata)
    batch, length = input_ids.shape
    u = rng.draw_rows(generator, batch, 1, input_ids.device)[:, 0]
    u = timesteps.stratified(u, stratum, num_strata)
    # The first grid index at or above t_min (the 1e-9 keeps t_min = i/T itself on the grid).
    first = max(1, math.ceil(t_min * num_timesteps - 1e-9))
    points = num_timesteps - first + 1
    t = ((u * points).floor() + first).clamp(max=num_timesteps) / num_timesteps
    masses = scdd_schedule(t, max_ratio=max_ratio, gamma_shape=gamma_shape, t_peak=t_peak)
    k = vocab_size - 1
    noisy, noise, _ = corrupt_mix(
        input_ids, loss_mask, mask_token_id, vocab_size,
        mask_prob=masses.absorbed, uniform_prob=masses.uniform * (k - 1) / k,
        generator=generator,
    )
    return noisy, noise, t.to(torch.float32)[:, None].expand(batch, length).contiguous()


def corrupt_blockwise(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, mask_token_id: int, *,
    block_size: int | None = None, eps: float = 1e-3, t_max: float = 1.0,
    half_life_ratio: float = 0.25, stratum: torch.Tensor | None = None, num_strata: int = 1,
    generator: rng.Generators,
) -> Corruption:
    """Nemotron-style exact-k masking with a late-position bias, with exact ``p_mask``.

    A *unit* is the supervised positions of a row (``block_size=None``) or of a block
    (``block_size=S``; blocks start at multiples of S). Per unit with ``n`` supervised
    positions: level ``m = eps + (t_max - eps) U`` (``t_max < 1`` clips the level range to
    ``[eps, t_max)``, as :func:`corrupt_uniform`'s); ``U`` is the unit's uniform (i.i.d.), or
    with ``stratum [B, L]`` (offsets from :func:`~dlmkit.diffusion.timesteps.strata`, read at
    the unit's first position) ``frac(stratum + U / num_strata)``: stratified over the global
    batch, the draws the same. Exactly ``k = clamp(round(m n), 1, n)`` of them
    are masked (``k`` counts supervised positions only; ``k >= 1`` in both modes, which the
    unbiasedness below needs). Position ``j`` (its rank among the unit's supervised positions)
    has weight ``w_j = 2^((1 - m) (j - n + 1) / (half_life_ratio n))``: later positions are
    preferred when few are masked; ``m -> 1`` is uniform.

    Difference from the reference design, and why: Gumbel top-k has no closed-form inclusion
    probability, and using ``m`` as ``p`` biases the ``1/p``-weighted loss. Here the inclusion
    probabilities are *chosen*: ``pi_j = min(1, c w_j)`` with ``c`` set so ``sum_j pi_j = k``;
    the ``k`` positions are then drawn by systematic sampling over a random order of the unit,
    which selects exactly ``k`` and includes position ``j`` with probability exactly ``pi_j``.
    ``p_mask = pi`` on supervised positions (so ``E[noise / p_mask] = 1`` there, making the
    importance-weighted loss unbiased) and ``m`` on unsupervised ones (never corrupted).
    Draws per row: ``(m, start)`` then ``[L, 1]`` order keys (per-row mode), or ``[L, 3]``
    (order key, and the block's ``m`` and start read at its first position).
    """
    sup = _supervised(input_ids, loss_mask)
    check_mask_token(mask_token_id)
    block_size = check_optional_block_size(block_size)
    eps = check_open_unit("eps", eps)
    if isinstance(t_max, bool) or not isinstance(t_max, (int, float)) or \
            not eps < t_max <= 1.0:
        raise ValueError(f"t_max must be a number in (eps, 1] = ({eps}, 1], got {t_max!r}")
    if isinstance(half_life_ratio, bool) or not isinstance(half_life_ratio, (int, float)) or \
            not half_life_ratio > 0:
        raise ValueError(f"half_life_ratio must be a number > 0, got {half_life_ratio!r}")
    num_strata = check_positive_int("num_strata", num_strata)
    if stratum is not None:
        stratum = check_same_shape("stratum", stratum, input_ids, "input_ids")
    batch, length = input_ids.shape
    device = input_ids.device
    if block_size is None:
        row_u, pos_u = rng.draw(generator, batch, length, 2, 1, device)
        unit_sup, keys = sup, pos_u[..., 0]
        level_u, start = row_u[:, 0], row_u[:, 1]
        unit_stratum = None if stratum is None or not length else stratum[:, 0]
    else:
        _, pos_u = rng.draw(generator, batch, length, 0, 3, device)
        nb = -(-length // block_size)
        pad = nb * block_size - length
        unit_sup = F.pad(sup, (0, pad)).reshape(batch * nb, block_size)
        keys = F.pad(pos_u[..., 0], (0, pad)).reshape(batch * nb, block_size)
        level_u = pos_u[:, ::block_size, 1].reshape(-1)
        start = pos_u[:, ::block_size, 2].reshape(-1)
        unit_stratum = None if stratum is None else stratum[:, ::block_size].reshape(-1)
    m = eps + (float(t_max) - eps) * timesteps.stratified(level_u, unit_stratum, num_strata)
    pi = _late_biased_inclusion(unit_sup, m, float(half_life_ratio))
    noise = _systematic_sample(pi, keys, start)
    unit_level = m[:, None].expand_as(pi)
    p = torch.where(unit_sup, pi, unit_level)
    if block_size is not None:
        noise = noise.reshape(batch, -1)[:, :length]
        p = p.reshape(batch, -1)[:, :length]
    noise = noise & sup
    noisy = torch.where(noise, torch.full_like(input_ids, mask_token_id), input_ids)
    return noisy, noise, p.to(torch.float32)


def _late_biased_inclusion(sup: torch.Tensor, m: torch.Tensor, half_life: float) -> torch.Tensor:
    """Inclusion probabilities ``[N, n]`` (float64) of the late-biased exact-k design.

    ``sup [N, n]`` marks each unit's positions, ``m [N]`` its level. Rows sum to ``k``.
    """
    n_sup = sup.sum(-1).to(torch.float64)
    k = torch.minimum((m * n_sup).round().clamp_min(1.0), n_sup)
    rank = sup.cumsum(-1).to(torch.float64) - 1.0
    rate = math.log(2.0) * (1.0 - m) / (half_life * n_sup.clamp_min(1.0))
    # Relative to the last supervised position so every weight lies in (0, 1].
    w = torch.where(sup, torch.exp(rate[:, None] * (rank - (n_sup[:, None] - 1.0))), 0.0)
    return _capped_proportional(w, k)


def _capped_proportional(w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``pi = min(1, c w)`` per row with ``c`` such that ``pi`` sums to ``k`` (water-filling).

    ``w [N, n] >= 0`` with at least ``k`` positive entries per row, ``k [N]``. Capping only ever
    adds entries (the mass freed by a cap raises ``c``), so the loop ends within ``n`` passes.
    """
    capped = torch.zeros_like(w, dtype=torch.bool)
    for _ in range(w.shape[-1] + 1):
        free_mass = torch.where(capped, 0.0, w).sum(-1)
        c = (k - capped.sum(-1)) / free_mass.clamp_min(1e-300)
        pi = torch.where(capped, 1.0, c[:, None] * w)
        newly = (pi > 1.0) & ~capped
        if not bool(newly.any()):
            break
        capped |= newly
    return pi.clamp(max=1.0)


def _systematic_sample(pi: torch.Tensor, keys: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Select exactly ``sum(pi)`` (an integer) positions per row, position ``j`` w.p. ``pi_j``.

    Positions are visited in the random order given by ``keys [N, n]``; position ``j`` is
    picked when an integer ``i`` satisfies ``C_{j-1} <= start + i < C_j`` for the cumulative
    sums ``C`` of ``pi`` in that order, ``start [N]`` uniform in ``[0, 1)``.
    """
    order = keys.argsort(-1)
    pi_ordered = pi.gather(-1, order)
    k = pi.sum(-1).round()
    cum = pi_ordered.cumsum(-1).clamp(max=k[:, None])
    cum[:, -1:] = k[:, None]  # exactly k in total despite rounding in the cumulative sum
    prev = F.pad(cum[:, :-1], (1, 0))
    hits = torch.ceil(cum - start[:, None]) - torch.ceil(prev - start[:, None]) > 0
    return torch.zeros_like(hits).scatter(-1, order, hits)
