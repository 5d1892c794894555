"""Mask-Predict decoding over mdlm's canvas: ``[left-padded prompt | W x MASK]``.

Step ``t`` of ``T`` (``steps``): one forward over the canvas; every masked position takes the
model's token (argmax, or a draw at ``temperature > 0``) and its probability as confidence;
then the ``floor(W (T - 1 - t) / T)`` least confident positions of the row's canvas are masked
again for the next step (none after the last). A token committed early can thus be re-masked
and change. Every row draws from its own generator only (batch invariant).
"""

from __future__ import annotations

import torch

from dlmkit.decoding.commit import masked_canvas, own_canvases
from dlmkit.decoding.primitives import sample_tokens
from dlmkit.decoding.runner import Runner, left_pad, positions
from dlmkit.masks import bidirectional

from .options import MaskPredictSampling


def sample_maskpredict(runner: Runner, prompts, cfg: MaskPredictSampling, *, mask_id: int,
                       pad_id: int, generator) -> torch.Tensor:
    """Generated tokens ``[B, W]`` (the batch's canvas, padding after each row's own)."""
    device = runner.device
    ids, valid = left_pad(prompts, pad_id, device)
    start = ids.shape[1]
    x, inside, cfg = masked_canvas(ids, prompts, cfg, mask_id, pad_id)
    valid = torch.cat([valid, inside], 1)
    inside = inside.bool()
    pos, mask = positions(valid), bidirectional(x.shape[1], valid, device=device)
    widths = inside.sum(1)
    confidence = torch.zeros(inside.shape, device=device)
    for t in range(cfg.steps):
        logits = runner(x, mask, pos)[:, start:].clone()
        logits[..., mask_id] = float("-inf")
        last = t == cfg.steps - 1
        tokens = (logits.argmax(-1) if last and cfg.final_argmax
                  else sample_tokens(logits, cfg.temperature, generator))
        probs = logits.float().softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        masked = (x[:, start:] == mask_id) & inside
        x[:, start:] = torch.where(masked, tokens, x[:, start:])
        confidence = torch.where(masked, probs, confidence)
        if last:
            break
        again = (widths * (cfg.steps - 1 - t)) // cfg.steps  # per row
        order = confidence.masked_fill(~inside, float("inf")).argsort(1)
        rank = order.argsort(1)
        remask = (rank < again[:, None]) & inside
        x[:, start:] = torch.where(remask, mask_id, x[:, start:])
    return torch.where(inside, x[:, start:], pad_id)


def decode(runner: Runner, encoded, cfg: MaskPredictSampling, *, stop_ids, **ids):
    """The maskpredict sampler (:class:`~dlmkit.families.Family` ``decode``)."""
    return own_canvases(sample_maskpredict(runner, encoded, cfg, **ids), encoded, cfg)
