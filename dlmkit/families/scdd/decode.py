"""SCDD sampler: masks denoise on the trained schedule; optionally visible tokens are revised.

The model (bidirectional, unshifted, MASK logit excluded) gives ``p(x | z_t)`` at every
response position. With the forward marginal of :mod:`dlmkit.diffusion.schedules`
(``q(z_t | x) = gamma_t (rho_t x + (1 - rho_t) u) + (1 - gamma_t) MASK``, ``u`` uniform over the
``K = V - 1`` non-mask tokens), one step ``t -> s < t`` of the reverse process samples the
posterior ``q(z_s | z_t, x)`` with ``x`` replaced by the model's ``p`` — the posterior the SCDD
loss matches (``revise=True``):

* ``z_t = MASK``: stays MASK with probability ``(1 - gamma_s) / (1 - gamma_t)``; otherwise
  ``z_s = v`` with probability proportional to ``(1 - rho_s) / K + rho_s p(v)``;
* ``z_t = z`` visible: ``z_s = v`` with weight ``((1 - rho_s) / K + rho_s p(v)) *
  (alpha [v = z] + (1 - alpha) / K)``, ``alpha = rho_t / rho_s`` (``z`` came from ``v`` by the
  keep-or-resample transition); a visible token never becomes MASK again.

A final pass then takes the model's argmax at **every** response position, which removes
uniform-channel noise that the last steps left (``steps + 1`` forwards).

**The default, ``revise=False``, keeps only the first rule without its uniform channel**: a mask
is released with the same probability, into a draw from ``p``, and a committed token stays —
MDLM's ancestral sampler on SCDD's release schedule (at most ``steps`` forwards: it stops
once no mask is left). Why: the models the
suite trains predict *visible* tokens badly, and revising by them undoes right answers (a
likely reason: at a visible position the loss is the KL of two posteriors that both sit almost
entirely on the visible token — ``alpha`` is close to 1 for a step of ``1/T`` — so ``p`` there
gets little training signal). Measured on the suite's exports, revise on and off:
docs/families/scdd.md#why-these-defaults.

With ``logit_shift`` (a model trained with ``strategy.logit_shift``) the token at column ``c``
is read from the model's output at ``c - 1``.

Times run ``1 = t_0 > ... > t_steps = 0`` on a uniform grid (the last step reaches ``t = 0``:
every mask is released). Temperature divides the logits before ``p`` is formed; ``0`` makes
``p`` one-hot (argmax).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.decoding.commit import masked_canvas, own_canvases
from dlmkit.decoding.options import SamplerConfig
from dlmkit.decoding.primitives import gumbel
from dlmkit.decoding.runner import Runner, left_pad, positions
from dlmkit.diffusion.schedules import check_scdd_params, scdd_schedule
from dlmkit.families.mdlm.decode import infill_masked
from dlmkit.families.mdlm.options import MDLMSampling
from dlmkit.masks.bidirectional import bidirectional

from .options import SCDDSampling


def _model_probs(logits: torch.Tensor, mask_id: int, temperature: float) -> torch.Tensor:
    """float64 ``p [B, G, V]`` over non-mask tokens (``p[..., mask_id] == 0``)."""
    logits = logits.double().clone()
    logits[..., mask_id] = float("-inf")
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    return torch.softmax(logits / temperature, -1)


def _from_mask(prior: torch.Tensor, at_t, at_s, mask_id: int) -> torch.Tensor:
    """Weights of ``z_s`` for ``z_t = MASK`` (a new tensor): released with probability
    ``(gamma_s - gamma_t) / (1 - gamma_t)`` into ``prior`` (its MASK column ignored), else it
    stays MASK."""
    absorbed_t = (1.0 - at_t.gamma).clamp_min(1e-30)
    release = ((at_s.gamma - at_t.gamma) / absorbed_t).clamp(0.0, 1.0)
    weights = release * prior
    weights[..., mask_id] = ((1.0 - at_s.gamma) / absorbed_t).clamp(0.0, 1.0)
    return weights


def _one_hot(z: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(z.clamp(max=vocab - 1), vocab).double()


def step_weights(z: torch.Tensor, p: torch.Tensor, t: float, s: float, mask_id: int,
                 schedule: dict) -> torch.Tensor:
    """Unnormalised ``q(z_s = v | z_t = z, x ~ p)`` ``[B, G, V]`` (float64); see the module."""
    vocab = p.shape[-1]
    k = vocab - 1
    at_t = scdd_schedule(t, **schedule)
    at_s = scdd_schedule(s, **schedule)
    rho_s = at_s.rho.clamp_min(1e-30)
    prior = (1.0 - at_s.rho) / k + at_s.rho * p  # q(z_s = v | not absorbed), x ~ p
    prior[..., mask_id] = 0.0
    from_mask = _from_mask(prior, at_t, at_s, mask_id)
    # Visible z: it came from v by "keep" (alpha) or "resample uniformly" (1 - alpha).
    alpha = (at_t.rho / rho_s).clamp(0.0, 1.0)
    from_visible = prior * (alpha * _one_hot(z, vocab) + (1.0 - alpha) / k)
    from_visible[..., mask_id] = 0.0
    weights = torch.where((z == mask_id).unsqueeze(-1), from_mask, from_visible)
    return weights.clamp_min(0.0)


def release_weights(z: torch.Tensor, p: torch.Tensor, t: float, s: float, mask_id: int,
                    schedule: dict) -> torch.Tensor:
    """``revise=False``: a MASK is released with the posterior's probability into a draw from
    ``p`` (no uniform channel); a visible token keeps all the weight. ``[B, G, V]`` float64."""
    from_mask = _from_mask(p, scdd_schedule(t, **schedule), scdd_schedule(s, **schedule),
                           mask_id)
    return torch.where((z == mask_id).unsqueeze(-1), from_mask, _one_hot(z, p.shape[-1]))


def sample_scdd(runner: Runner, prompts: Sequence[Sequence[int]], cfg: SamplerConfig, *,
                mask_id: int, pad_id: int, generator: torch.Generator) -> torch.Tensor:
    """Generated tokens ``[B, W]`` (as :func:`~dlmkit.families.mdlm.decode.sample_masked`'s)."""
    schedule = {"max_ratio": cfg.max_ratio, "gamma_shape": cfg.gamma_shape,
                "t_peak": cfg.t_peak}
    check_scdd_params(**schedule)
    device = runner.device
    ids, valid = left_pad(prompts, pad_id, device)
    width = ids.shape[1]
    x, inside, cfg = masked_canvas(ids, prompts, cfg, mask_id, pad_id)
    valid = torch.cat([valid, inside], 1)
    inside = inside.bool()
    pos = positions(valid)
    mask = bidirectional(x.shape[1], valid, device=device)
    grid = torch.linspace(1.0, 0.0, cfg.steps + 1, dtype=torch.float64).tolist()
    rule = step_weights if cfg.revise else release_weights
    shift = int(cfg.logit_shift)  # width >= 1: every canvas column has a predecessor

    def canvas_logits() -> torch.Tensor:
        return runner(x, mask, pos)[:, width - shift:x.shape[1] - shift]

    def masks_left() -> bool:
        return bool((x[:, width:][inside] == mask_id).any())

    for t, s in zip(grid[:-1], grid[1:]):
        if not cfg.revise and not masks_left():
            break  # every mask released: nothing left to change
        p = _model_probs(canvas_logits(), mask_id, cfg.temperature)
        weights = rule(x[:, width:], p, t, s, mask_id, schedule)
        total = weights.sum(-1, keepdim=True)
        logw = torch.where(weights > 0, weights.log(), float("-inf"))
        drawn = (logw + gumbel(logw.shape, generator, device)).argmax(-1)
        # A position whose weights are all zero (numerically impossible move) keeps its token.
        x[:, width:] = torch.where((total.squeeze(-1) > 0) & inside, drawn, x[:, width:])
    if not cfg.revise:
        if masks_left():
            raise RuntimeError("internal error: masks left after the step to t = 0")
        return torch.where(inside, x[:, width:], pad_id)
    logits = canvas_logits().clone()
    logits[..., mask_id] = float("-inf")
    return torch.where(inside, logits.argmax(-1), pad_id)


def decode(runner: Runner, encoded, cfg: SCDDSampling, *, stop_ids, **ids) -> list[list[int]]:
    """The scdd sampler (:class:`~dlmkit.families.family.Family` ``decode``)."""
    return own_canvases(sample_scdd(runner, encoded, cfg, **ids), encoded, cfg)


def infill(runner: Runner, sequences, cfg: SCDDSampling, **ids) -> list[list[int]]:
    """Infilling of an scdd export: its layout is mdlm's (one bidirectional canvas), so the
    masked-diffusion sampler fills the spans, with its commit rules at their defaults."""
    masked = MDLMSampling(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                          seed=cfg.seed, steps=cfg.steps, logit_shift=cfg.logit_shift)
    return infill_masked(runner, sequences, masked.resolved(), **ids)
