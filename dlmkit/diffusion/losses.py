"""Losses of the dLLM families. Pure torch; no model code.

Calling convention (keyword arguments; tensors on one device):

* ``logits [B, L, V]`` — model output, any float dtype (upcast to fp32 chunk by chunk);
* ``target_ids [B, L]`` — the clean tokens;
* ``noise_mask [B, L]`` bool — corrupted positions (from a corruption in
  :mod:`dlmkit.diffusion.corruption`);
* ``p_mask [B, L]`` float — the corruption's ``p_mask`` (``t`` for SCDD);
* ``loss_mask [B, L]`` — 1 = supervised (any dtype);
* ``num_tokens`` — the **global** denominator (summed over ranks and micro-batches of the
  step; int, float or 1-element tensor). ``None`` = the local count of exactly the positions
  the loss scores (after any shift). Each loss documents what it scores.

Every loss returns :class:`LossOutput` ``(total, dllm, extras)``: ``total`` to backpropagate,
``dllm`` its detached diffusion part for logging, ``extras`` a dict of detached tensors.
A zero denominator means nothing was scored: the loss is then exactly 0 and still attached to
the graph (its gradient is zero), never NaN.

Memory: ``chunk_size`` (rows of the flattened ``[B*L]`` batch per chunk; ``None`` = off)
computes the vocabulary-sized work, gradient included, chunk by chunk (see
:mod:`dlmkit.diffusion.chunked`), so no ``[B*L, V]`` activation is kept; results equal the
unchunked ones. A loss output supports one backward.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from dlmkit.diffusion._checks import (
    check_denominator,
    check_ids,
    check_local,
    check_logits,
    check_positive_int,
    check_same_shape,
    check_vocab,
)
from dlmkit.diffusion.chunked import cross_entropy_fn, weighted_token_loss
from dlmkit.diffusion.schedules import check_scdd_grid, check_scdd_params, scdd_schedule

DEFAULT_CHUNK = 1024


class LossOutput(NamedTuple):
    """``total``: scalar to backpropagate; ``dllm``: detached diffusion part, for logging;
    ``extras``: named detached tensors (loss parts, counts, accuracies)."""

    total: torch.Tensor
    dllm: torch.Tensor
    extras: dict[str, torch.Tensor]


def _check_chunk(chunk_size: object) -> int | None:
    return None if chunk_size is None else check_positive_int("chunk_size", chunk_size)


def _mask(name: str, mask: object, target_ids: torch.Tensor) -> torch.Tensor:
    return check_same_shape(name, mask, target_ids, "target_ids").to(target_ids.device) != 0


def _denominator(num_tokens, local: torch.Tensor) -> torch.Tensor:
    """``num_tokens`` if given, else ``local``; 0 becomes 1 (then nothing is scored, so the
    numerator is 0 and the loss is exactly 0)."""
    den = local if num_tokens is None else torch.as_tensor(num_tokens, device=local.device)
    den = den.to(torch.float32).reshape(())
    return torch.where(den > 0, den, torch.ones_like(den))


def _weighted_ce(logits: torch.Tensor, targets: torch.Tensor, coef: torch.Tensor,
                 chunk_size: int | None, group=None, num_groups: int = 1) -> torch.Tensor:
    """``sum coef * CE(logits, targets)`` per group (``[num_groups]``); ``logits [B, L, V]``."""
    flat = targets.reshape(-1)
    out, _ = weighted_token_loss(cross_entropy_fn(flat), logits.reshape(flat.numel(), -1), coef,
                                 group=group, num_groups=num_groups, chunk_size=chunk_size)
    return out


def next_token_scored(scored_next: torch.Tensor, doc_ids=None) -> torch.Tensor:
    """bool ``[B, L]`` by predicting position: ``i`` is scored when token ``i + 1`` is to be
    predicted (``scored_next [B, L]``) and, in packed rows (``doc_ids [B, L]``), belongs to
    the same document as ``i`` — a document's first token is never predicted from the one
    before it, so packed rows score exactly the pairs of their documents unpacked. The last
    position predicts nothing. Its sum is a shifted loss's local denominator."""
    scored_next = scored_next != 0
    scored = torch.zeros_like(scored_next)
    scored[:, :-1] = scored_next[:, 1:]
    if doc_ids is not None:
        doc = check_same_shape("doc_ids", doc_ids, scored_next, "the masks").to(scored.device)
        scored[:, :-1] &= doc[:, 1:] == doc[:, :-1]
    return scored


def _shifted(target_ids: torch.Tensor, scored_next: torch.Tensor, doc_ids=None):
    """Next-token targets: position ``i`` predicts ``target_ids[:, i + 1]``.

    ``scored_next [B, L]`` says whether *token* ``i`` is to be predicted. Returns
    ``(targets [B, L], scored [B, L])`` indexed by the predicting position
    (:func:`next_token_scored`); the last position predicts nothing (its target is a
    placeholder 0, never scored).
    """
    targets = torch.zeros_like(target_ids)
    targets[:, :-1] = target_ids[:, 1:]
    return targets, next_token_scored(scored_next, doc_ids)


def predictor_rows(loss_mask: torch.Tensor, **per_token: torch.Tensor
                   ) -> dict[str, torch.Tensor]:
    """Per-token tensors ``[B, L]`` re-indexed for a model trained with a logit shift (an AR
    checkpoint's head kept: the output at position ``i`` predicts the token at ``i + 1``), so
    that an unshifted loss applied to the model's own logits scores each token at the row that
    predicts it: ``out[name][:, i] = per_token[name][:, i + 1]`` and ``out["loss_mask"]``
    likewise. The last row predicts nothing: its ``loss_mask`` is 0 (the other tensors repeat
    their last column there, so a per-row value read from any column, such as SCDD's ``t``,
    stays the row's). Shifting the ``[B, L]`` tensors, not the ``[B, L, V]`` logits, copies no
    logits.

    A sequence's first token has no predecessor, so it cannot be scored: ``loss_mask[:, 0]``
    must be 0 (the strategies take each document's first token out of the loss mask before
    corrupting, :meth:`dlmkit.families.strategy.Strategy.shift_batch`), else a ValueError — the
    numerator would silently drop a token the denominator counts."""
    if bool((loss_mask[:, 0] != 0).any()):
        raise ValueError("with a logit shift the first position has no predecessor and cannot "
                         "be scored, but loss_mask[:, 0] is set; take it out of the loss mask "
                         "(and the denominator) first")
    out = {name: torch.cat([x[:, 1:], x[:, -1:]], 1) for name, x in per_token.items()}
    mask = torch.zeros_like(loss_mask)
    mask[:, :-1] = loss_mask[:, 1:]
    out["loss_mask"] = mask
    return out


def _inverse_p(scored: torch.Tensor, p_mask: torch.Tensor) -> torch.Tensor:
    """``1/p`` on scored positions, 0 elsewhere (``p`` floored at 1e-8)."""
    p = p_mask.to(scored.device, torch.float32).clamp_min(1e-8)
    return torch.where(scored, 1.0 / p, 0.0)


class MDLMLoss(torch.nn.Module):
    """MDLM / LLaDA: ``sum_{noise & supervised} CE / p  /  den``.

    This is the NELBO estimate with the linear schedule (weight ``1/t``; ``1/p`` in general,
    the Horvitz-Thompson weight). It covers every supervised position — an unmasked one adds
    exactly 0 (its token is copied through) — so the local denominator is ``sum(loss_mask)``.
    """

    def __init__(self, chunk_size: int | None = DEFAULT_CHUNK):
        super().__init__()
        self.chunk_size = _check_chunk(chunk_size)

    def forward(self, *, logits, target_ids, noise_mask, p_mask, loss_mask,
                num_tokens=None) -> LossOutput:
        """``logits [B, L, V]``, ``target_ids``/``noise_mask``/``p_mask``/``loss_mask [B, L]``."""
        check_ids("target_ids", target_ids)
        check_logits("logits", logits, target_ids)
        check_same_shape("p_mask", p_mask, target_ids, "target_ids")
        check_denominator("num_tokens", num_tokens)
        sup = _mask("loss_mask", loss_mask, target_ids)
        scored = _mask("noise_mask", noise_mask, target_ids) & sup
        den = _denominator(num_tokens, sup.sum())
        loss = _weighted_ce(logits, target_ids, _inverse_p(scored, p_mask) / den,
                            self.chunk_size)[0]
        return LossOutput(loss, loss.detach(), {"num_scored": scored.sum().detach()})


class HybridLoss(torch.nn.Module):
    """Nemotron-Labs-Diffusion: ``alpha * D + A``.

    * ``D = sum_{noise & supervised} CE(logits) / p  /  num_tokens`` — local default: the
      number of corrupted supervised positions (Nemotron normalises by corrupted tokens);
    * ``A = sum_i CE(causal_logits[:, i], target[:, i + 1]) * loss_mask[:, i + 1]  /
      num_ar_tokens`` — local default: ``sum(loss_mask[:, 1:])``, the pairs it scores; with
      ``doc_ids`` (packed rows) only pairs inside one document (:func:`next_token_scored`).

    ``alpha`` weights the diffusion branch. ``dllm = alpha * D``; ``extras`` holds ``D``
    (``"diffusion"``) and ``A`` (``"ar"``, 0 without ``causal_logits``).
    """

    def __init__(self, alpha: float = 1.0, chunk_size: int | None = DEFAULT_CHUNK):
        super().__init__()
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or \
                not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        self.chunk_size = _check_chunk(chunk_size)

    def forward(self, *, logits, target_ids, noise_mask, p_mask, loss_mask, causal_logits=None,
                num_tokens=None, num_ar_tokens=None, doc_ids=None) -> LossOutput:
        """``logits``/``causal_logits [B, L, V]``; the masks and ``doc_ids`` ``[B, L]``."""
        check_ids("target_ids", target_ids)
        check_logits("logits", logits, target_ids)
        check_same_shape("p_mask", p_mask, target_ids, "target_ids")
        check_denominator("num_tokens", num_tokens)
        check_denominator("num_ar_tokens", num_ar_tokens)
        sup = _mask("loss_mask", loss_mask, target_ids)
        scored = _mask("noise_mask", noise_mask, target_ids) & sup
        den = _denominator(num_tokens, scored.sum())
        diffusion = _weighted_ce(logits, target_ids, _inverse_p(scored, p_mask) / den,
                                 self.chunk_size)[0]
        if causal_logits is None:
            ar = diffusion.new_zeros(())
        else:
            ar = next_token_loss(causal_logits, target_ids, sup, num_tokens=num_ar_tokens,
                                 chunk_size=self.chunk_size, doc_ids=doc_ids)
        weighted = self.alpha * diffusion
        return LossOutput(weighted + ar, weighted.detach(),
                          {"diffusion": diffusion.detach(), "ar": ar.detach()})


def next_token_loss(logits, target_ids, loss_mask, *, num_tokens=None,
                    chunk_size: int | None = DEFAULT_CHUNK, doc_ids=None) -> torch.Tensor:
    """Autoregressive SFT CE (scalar): ``logits [B, L, V]`` at ``i`` predict
    ``target_ids[:, i + 1]``, scored when that token is supervised (``loss_mask [B, L]``)
    and, with ``doc_ids [B, L]`` (packed rows), in the same document as ``i``;
    ``/ num_tokens`` (global pair count), local default the pairs it scores
    (``sum(loss_mask[:, 1:])`` unpacked)."""
    check_ids("target_ids", target_ids)
    check_logits("logits", logits, target_ids)
    check_denominator("num_tokens", num_tokens)
    targets, scored = _shifted(target_ids, _mask("loss_mask", loss_mask, target_ids), doc_ids)
    return _weighted_ce(logits, targets, scored / _denominator(num_tokens, scored.sum()),
                        _check_chunk(chunk_size))[0]


class BlockDiffusionLoss(torch.nn.Module):
    """DiffusionGemma: flat mean CE over **all** supervised canvas positions.

    Corrupted or not, no ``1/p`` weight: ``sum_{supervised} CE / num_tokens`` (local default
    ``sum(loss_mask)``). Pass the canvas-sliced tensors.
    """

    def __init__(self, chunk_size: int | None = DEFAULT_CHUNK):
        super().__init__()
        self.chunk_size = _check_chunk(chunk_size)

    def forward(self, *, logits, target_ids, loss_mask, num_tokens=None) -> LossOutput:
        """``logits [B, R, V]``, ``target_ids``/``loss_mask [B, R]``."""
        check_ids("target_ids", target_ids)
        check_logits("logits", logits, target_ids)
        check_denominator("num_tokens", num_tokens)
        sup = _mask("loss_mask", loss_mask, target_ids)
        den = _denominator(num_tokens, sup.sum())
        loss = _weighted_ce(logits, target_ids, sup / den, self.chunk_size)[0]
        return LossOutput(loss, loss.detach(), {})


def encoder_ar_loss(logits, input_ids, valid_mask=None, *, target_mask=None, num_tokens=None,
                    chunk_size: int | None = DEFAULT_CHUNK) -> torch.Tensor:
    """Next-token CE of an encoder pass (DiffusionGemma's co-trained AR term). Scalar.

    ``logits [B, S, V]`` at position ``i`` predict ``input_ids[:, i + 1]``; the pair is scored
    when ``valid_mask[i] & valid_mask[i + 1]`` (``valid_mask [B, S]``, ``None`` = all valid)
    and, with ``target_mask [B, S]``, also ``target_mask[i + 1]`` (e.g. only response tokens
    as targets). Divided by ``num_tokens`` (global pair count), else the local number of
    scored pairs.
    """
    check_ids("input_ids", input_ids)
    check_logits("logits", logits, input_ids)
    check_denominator("num_tokens", num_tokens)
    chunk_size = _check_chunk(chunk_size)
    valid = (torch.ones_like(input_ids, dtype=torch.bool) if valid_mask is None
             else _mask("valid_mask", valid_mask, input_ids))
    targets, scored = _shifted(input_ids, valid if target_mask is None
                               else valid & _mask("target_mask", target_mask, input_ids))
    scored = scored & valid
    return _weighted_ce(logits, targets, scored / _denominator(num_tokens, scored.sum()),
                        chunk_size)[0]


class IDLMLoss(torch.nn.Module):
    """I-DLM: shifted CE on the noisy half plus ``alpha`` times shifted CE on the clean half.

    ``logits [B, 2L, V]`` ordered ``[x_t half | x_0 half]``. In each half position ``i``
    predicts ``target_ids[:, i + 1]`` and is scored when ``loss_mask[i + 1] & valid[i + 1]``
    (so the first response token, predicted from the last prompt position, is scored); with
    ``doc_ids [B, L]`` (packed rows) also only when ``i`` and ``i + 1`` are in one document
    (:func:`next_token_scored`).
    ``CE_noisy``/``CE_clean`` are both divided by ``num_tokens``, else the local number of
    scored positions per half. ``alpha = clean_loss_weight``, or with ``auto_balance``
    ``alpha = stopgrad(CE_noisy / max(CE_clean, 1e-6))`` (I-DLM Eq. 2; this ratio is computed
    per call, so it is not invariant to how a step is split into micro-batches).
    ``total = CE_noisy + alpha * CE_clean``; ``dllm = CE_noisy``.
    """

    def __init__(self, clean_loss_weight: float = 0.2, auto_balance: bool = False,
                 chunk_size: int | None = DEFAULT_CHUNK):
        super().__init__()
        if isinstance(clean_loss_weight, bool) or not isinstance(clean_loss_weight, (int, float)) \
                or not math.isfinite(clean_loss_weight) or clean_loss_weight < 0:
            raise ValueError(f"clean_loss_weight must be a finite number >= 0, "
                             f"got {clean_loss_weight!r}")
        self.clean_loss_weight = float(clean_loss_weight)
        self.auto_balance = bool(auto_balance)
        self.chunk_size = _check_chunk(chunk_size)

    def forward(self, *, logits, target_ids, loss_mask, valid_mask=None,
                num_tokens=None, doc_ids=None) -> LossOutput:
        """``logits [B, 2L, V]``; ``target_ids``/``loss_mask``/``valid_mask``/``doc_ids``
        ``[B, L]``."""
        check_ids("target_ids", target_ids)
        check_local("logits", logits)
        batch, length = target_ids.shape
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or \
                tuple(logits.shape[:2]) != (batch, 2 * length):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
            raise ValueError(f"logits must have shape [B, 2L, V] = [{batch}, {2 * length}, V] "
                             f"([x_t | x_0] halves of target_ids [B, L]), got {got}")
        check_denominator("num_tokens", num_tokens)
        sup = _mask("loss_mask", loss_mask, target_ids)
        if valid_mask is not None:
            sup = sup & _mask("valid_mask", valid_mask, target_ids)
        targets, scored = _shifted(target_ids, sup, doc_ids)
        coef = scored / _denominator(num_tokens, scored.sum())
        half = torch.zeros_like(target_ids)  # group 0: the x_t half, group 1: the x_0 half
        noisy, clean = _weighted_ce(logits, targets.repeat(1, 2), coef.repeat(1, 2),
                                    self.chunk_size, group=torch.cat([half, half + 1], 1),
                                    num_groups=2)
        if self.auto_balance:
            alpha = (noisy / clean.clamp_min(1e-6)).detach()
        else:
            alpha = noisy.new_tensor(self.clean_loss_weight)
        return LossOutput(noisy + alpha * clean, noisy.detach(),
                          {"clean": clean.detach(), "alpha": alpha})


class DFlashDecayLoss(torch.nn.Module):
    """DFlash drafter loss: CE weighted by ``w_k = exp(-(k - 1) / gamma)`` per block offset.

    Inputs cover ``N`` blocks of ``block_size - 1`` predicted positions each (offsets
    ``k = 1 .. block_size - 1``, the anchor at offset 0 is not predicted): ``T = N *
    (block_size - 1)``; the weights restart at every block (``gamma=None``: all 1).
    ``S = sum CE * w * block_mask``;
    ``normalize="tokens"``: ``S / num_tokens`` (local default ``sum(block_mask)``);
    ``normalize="mean"``: ``S / num_tokens`` (local default ``sum(w * block_mask)``).
    :meth:`local_denominator` gives the local value for the recipe to all-reduce.
    ``extras``: ``draft_correct``/``draft_count [block_size - 1]`` (argmax hits and scored
    positions per offset, local sums).
    Pass ``logits [B, T, V]``, or ``hidden [B, T, D]`` with ``lm_head_weight [V, D]`` (and
    ``lm_head_bias``) to fuse the LM head into the chunked CE so ``[B, T, V]`` never exists.
    """

    def __init__(self, block_size: int, gamma: float | None = 7.0, normalize: str = "tokens",
                 chunk_size: int | None = DEFAULT_CHUNK):
        super().__init__()
        self.block_size = check_positive_int("block_size", block_size, minimum=2)
        if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float))
                                  or not gamma > 0):
            raise ValueError(f"gamma must be None or a number > 0, got {gamma!r}")
        if normalize not in ("tokens", "mean"):
            raise ValueError(f"normalize must be 'tokens' or 'mean', got {normalize!r}")
        self.gamma, self.normalize = gamma, normalize
        self.chunk_size = _check_chunk(chunk_size)

    def weights(self, length: int, device=None) -> torch.Tensor:
        """Decay weights ``[T]`` (float32) for ``T`` predicted positions."""
        span = self.block_size - 1
        if length % span:
            raise ValueError(f"the predicted length T must be a multiple of block_size - 1 = "
                             f"{span}, got T = {length}")
        offset = torch.arange(length, device=device) % span  # k - 1
        if self.gamma is None:
            return torch.ones(length, device=device)
        return torch.exp(-offset.to(torch.float32) / self.gamma)

    def local_denominator(self, block_mask: torch.Tensor) -> torch.Tensor:
        """This rank's share of the denominator (sum it over ranks/micro-batches)."""
        m = (block_mask != 0).to(torch.float32)
        if self.normalize == "tokens":
            return m.sum()
        return (m * self.weights(m.shape[-1], m.device)).sum()

    def forward(self, *, target_ids, block_mask, logits=None, hidden=None, lm_head_weight=None,
                lm_head_bias=None, num_tokens=None) -> LossOutput:
        check_ids("target_ids", target_ids)
        check_denominator("num_tokens", num_tokens)
        batch, length = target_ids.shape
        w = self.weights(length, target_ids.device)
        if (logits is None) == (hidden is None):
            raise ValueError("pass exactly one of logits [B, T, V] or hidden [B, T, D] "
                             "(with lm_head_weight)")
        if logits is not None:
            check_logits("logits", logits, target_ids)
            x, head = logits.reshape(batch * length, -1), None
        else:
            if not isinstance(lm_head_weight, torch.Tensor) or lm_head_weight.dim() != 2:
                raise ValueError("hidden needs lm_head_weight, a [V, D] tensor, got "
                                 f"{lm_head_weight!r}")
            check_logits("hidden", hidden, target_ids)
            if hidden.shape[-1] != lm_head_weight.shape[1]:
                raise ValueError(f"hidden's last dim {hidden.shape[-1]} must equal "
                                 f"lm_head_weight's D = {lm_head_weight.shape[1]}")
            x, head = hidden.reshape(batch * length, -1), lm_head_weight
        scored = _mask("block_mask", block_mask, target_ids)
        den = _denominator(num_tokens, self.local_denominator(scored))
        out, pred = weighted_token_loss(
            cross_entropy_fn(target_ids.reshape(-1)), x, torch.where(scored, w, 0.0) / den,
            weight=head, bias=lm_head_bias, chunk_size=self.chunk_size, argmax=True)
        loss = out[0]
        span = self.block_size - 1
        hits = (pred.reshape(batch, length) == target_ids) & scored
        correct = hits.reshape(batch, -1, span).sum((0, 1)).to(torch.float32)
        count = scored.reshape(batch, -1, span).sum((0, 1)).to(torch.float32)
        return LossOutput(loss, loss.detach(), {"draft_correct": correct, "draft_count": count})


class SCDDLoss(torch.nn.Module):
    """SCDD discrete-time NELBO, ``T`` times the KL of one random step ``s = t - 1/T -> t``.

    Needs ``noisy_ids`` (``z_t``) and ``p_mask`` holding ``t`` (as :func:`corrupt_scdd` gives;
    read from column 0 and snapped to the grid ``{1/T, ..., 1}``). The model's distribution
    ``p`` is the softmax over the ``K = V - 1`` non-mask tokens (the MASK logit is excluded).
    ``V`` is ``vocab_size`` — pass the tokenizer's, the one :func:`corrupt_scdd` drew over:
    logits beyond it (an embedding table padded past the tokenizer) are ignored, so the loss,
    the corruption and the sampler share one ``K``. ``None``: ``V = logits.shape[-1]``.
    Per supervised position, with the schedule's ``gamma``, ``rho`` at ``s`` and ``t``:

    * ``z_t = MASK``: ``KL(q(z_s | z_t, x) || p_theta(z_s | z_t))`` — the denoising term;
    * ``z_t`` visible (clean or replaced): the same KL, which there is a correction term: the
      posterior over which token ``z_s`` was, given the visible ``z_t``.

    Both posteriors follow from ``q(z_s | x)`` and the ``s -> t`` transition (keep with
    ``alpha = rho_t / rho_s``, resample uniformly with ``1 - alpha``, absorb with
    ``1 - gamma_t / gamma_s``). The value is a true KL (>= 0; the posterior's entropy is
    included, unlike a bare cross-entropy), times ``T``, summed over supervised positions and
    divided by ``num_tokens`` (local default ``sum(loss_mask)``). With ``max_ratio = 0`` it is
    exactly MDLM: ``-log p(x) / t`` at MASK positions, 0 elsewhere.
    """

    def __init__(self, mask_token_id: int, num_timesteps: int = 1000, max_ratio: float = 0.1,
                 gamma_shape: float = 1.0, t_peak: float = 0.5,
                 chunk_size: int | None = DEFAULT_CHUNK, vocab_size: int | None = None):
        super().__init__()
        if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or \
                mask_token_id < 0:
            raise ValueError(f"mask_token_id must be an int >= 0, got {mask_token_id!r}")
        self.vocab_size = None if vocab_size is None else \
            check_vocab(vocab_size, mask_token_id, minimum=3)
        self.mask_token_id = mask_token_id
        self.num_timesteps = check_positive_int("num_timesteps", num_timesteps, minimum=2)
        check_scdd_params(max_ratio, gamma_shape, t_peak)
        check_scdd_grid(max_ratio, gamma_shape, t_peak, num_timesteps)
        self.schedule = {"max_ratio": max_ratio, "gamma_shape": gamma_shape, "t_peak": t_peak}
        self.chunk_size = _check_chunk(chunk_size)

    def _coefficients(self, t: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        """Per-row float64 coefficients ``[B]`` of the step ``s = t - 1/T -> t``."""
        big_t = self.num_timesteps
        # Snap to the grid {1/T, ..., 1}: float32 storage of t = i/T is inexact, and near s = 0
        # the schedule is steep (t^a with a < 1), so an s of 1e-9 instead of 0 would matter.
        t = ((t.to(torch.float64) * big_t).round().clamp(1.0, big_t)) / big_t
        at_t = scdd_schedule(t, **self.schedule)
        at_s = scdd_schedule((t - 1.0 / big_t).clamp_min(0.0), **self.schedule)
        rho_s = at_s.rho.clamp_min(1e-30)
        alpha = at_t.rho / rho_s
        return {
            "rho_s": at_s.rho, "rho_t": at_t.rho,
            "base_s": (1.0 - at_s.rho) / k, "base_t": (1.0 - at_t.rho) / k,
            "alpha": alpha, "beta": 1.0 - alpha,
            "unmask": (at_s.gamma - at_t.gamma) / (1.0 - at_t.gamma).clamp_min(1e-30),
        }

    def forward(self, *, logits, target_ids, noisy_ids, p_mask, loss_mask,
                num_tokens=None) -> LossOutput:
        """``logits [B, L, V]``; ``target_ids``/``noisy_ids``/``p_mask``/``loss_mask [B, L]``."""
        check_ids("target_ids", target_ids)
        check_logits("logits", logits, target_ids)
        columns = logits.shape[-1]
        vocab = columns if self.vocab_size is None else self.vocab_size
        if columns < vocab:
            raise ValueError(f"logits have {columns} columns, fewer than vocab_size {vocab}")
        check_vocab(vocab, self.mask_token_id, minimum=3)
        check_ids("noisy_ids", noisy_ids)
        check_same_shape("noisy_ids", noisy_ids, target_ids, "target_ids")
        check_same_shape("p_mask", p_mask, target_ids, "target_ids")
        check_denominator("num_tokens", num_tokens)
        sup = _mask("loss_mask", loss_mask, target_ids)
        k = vocab - 1
        coef = self._coefficients(p_mask[:, 0], k)
        length = target_ids.shape[1]
        per_token = {n: c[:, None].expand(-1, length).reshape(-1) for n, c in coef.items()}
        fn = _scdd_token_kl(per_token, target_ids.reshape(-1), noisy_ids.reshape(-1),
                            self.mask_token_id, k)
        coef = sup * (self.num_timesteps / _denominator(num_tokens, sup.sum()))
        out, _ = weighted_token_loss(fn, logits.reshape(target_ids.numel(), columns), coef,
                                     chunk_size=self.chunk_size)
        loss = out[0]
        return LossOutput(loss, loss.detach(), {})


def _scdd_token_kl(coef, x, z, mask_id: int, k: int):
    """Token loss for :class:`SCDDLoss`: the step KL per row (see its docstring).

    Vocabulary-sized work is in fp32; the per-token combination in float64, because the KL is
    a small difference of log terms.
    """

    def fn(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        logits = logits[:, :k + 1]  # the columns past the tokenizer's vocabulary are no tokens
        c = {n: v[rows] for n, v in coef.items()}
        xr, zr = x[rows, None], z[rows, None]
        masked_logits = logits.index_fill(-1, torch.tensor([mask_id], device=logits.device),
                                          float("-inf"))
        logp = torch.log_softmax(masked_logits, -1)
        log_base_s = c["base_s"].clamp_min(1e-30).log().to(logp.dtype)[:, None]
        log_rho_s = c["rho_s"].clamp_min(1e-30).log().to(logp.dtype)[:, None]
        # log(base_s + rho_s p(v)): the model's q(z_s = v | x ~ p), up to the unmask factor.
        ell = torch.logaddexp(log_base_s, log_rho_s + logp)
        sum_ell = ell.sum(-1, dtype=torch.float64) - ell[:, mask_id].double()
        ell_x = ell.gather(-1, xr)[:, 0].double()
        ell_z = ell.gather(-1, zr)[:, 0].double()
        p_z = logp.gather(-1, zr)[:, 0].double().exp()
        base_s, rho_s, base_t, rho_t = c["base_s"], c["rho_s"], c["base_t"], c["rho_t"]
        alpha, beta = c["alpha"], c["beta"]

        clean_s = base_s + rho_s  # q(z_s = x | x, not absorbed)
        entropy_masked = (k - 1) * torch.xlogy(base_s, base_s) + torch.xlogy(clean_s, clean_s)
        kl_masked = c["unmask"] * (entropy_masked - base_s * sum_ell - rho_s * ell_x)

        same = (zr[:, 0] == xr[:, 0]).to(torch.float64)
        # q(z_t = z | x, not absorbed); floored so the unused branch at MASK rows stays finite.
        norm = (base_t + rho_t * same).clamp_min(1e-30)
        d_z = (base_t + rho_t * p_z).clamp_min(1e-30).log()
        cross = (base_s * beta / k * (sum_ell - k * d_z) + rho_s * beta / k * (ell_x - d_z)
                 + base_s * alpha * (ell_z - d_z) + rho_s * alpha * same * (ell_x - d_z))
        q_x = clean_s * (alpha * same + beta / k) / norm
        # sum_v q(v) log q(v) - sum_v q(v) log(transition to z): see the class docstring.
        rest = torch.where(base_s > 0, (1.0 - q_x) * base_s.clamp_min(1e-300).log(), 0.0)
        kl_visible = torch.xlogy(q_x, clean_s) + rest - norm.log() - cross / norm
        return torch.where(zr[:, 0] == mask_id, kl_masked, kl_visible).to(torch.float32)

    return fn
