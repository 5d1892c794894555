"""Commit rules shared by the samplers that denoise a masked window: propose tokens for the
masked positions, score them, and commit the scheduled count (or what ``threshold`` / ``factor``
accept); reading logits with ``logit_shift``; the masked canvas after left-padded prompts; how
``steps`` split over blocks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.diffusion import rng
from dlmkit.diffusion.rng import Generators

from .options import SamplerConfig
from .primitives import confidence, sample_tokens, scheduled_count, select_transfers


def split_steps(steps: int, parts: int) -> list[int]:
    """``steps`` over ``parts`` blocks, as even as possible, earlier blocks first."""
    return [steps // parts + (i < steps % parts) for i in range(parts)]


def shifted_rows(out: torch.Tensor, first: int, lo: int, hi: int, shift: int) -> torch.Tensor:
    """Logits ``[B, hi - lo, V]`` for columns ``[lo, hi)`` from a forward whose outputs ``out``
    start at column ``first``: column ``c`` is read at ``c - shift`` (``shift`` 1: a model
    trained with ``logit_shift``). Column 0 has no predecessor; it gets column 0's output as a
    placeholder, and the samplers never decode it (a prompt token, or refused in infilling)."""
    start, stop = lo - shift - first, hi - shift - first
    if start < 0:
        if lo - shift != -1 or first != 0:
            raise RuntimeError(f"internal error: columns [{lo}, {hi}) with shift {shift} from "
                               f"a forward starting at column {first}")
        return torch.cat([out[:, :1], out[:, :stop]], 1)
    return out[:, start:stop]


def propose(logits: torch.Tensor, cfg: SamplerConfig, mask_id: int,
            generator: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, scores)`` for ``logits [B, W, V]`` with the MASK logit excluded."""
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    tokens = sample_tokens(logits, cfg.temperature, generator)
    return tokens, confidence(logits, tokens, cfg.remasking, generator)


def commit_step(x: torch.Tensor, logits: torch.Tensor, candidates: torch.Tensor,
                steps_left: int, cfg: SamplerConfig, mask_id: int,
                generator: Generators) -> torch.Tensor:
    """One denoising step on a window ``x [B, W]`` (updated in place); returns what it committed.

    ``candidates`` marks the masked positions this step may commit; ``steps_left`` (including
    this one) sets the scheduled count. Only rows with candidates propose, so a row's random
    draws (from its own generator, with a per-row list) happen exactly at its own steps,
    whatever the other rows of the batch still need.
    """
    chosen = torch.zeros_like(candidates)
    rows = candidates.any(1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return chosen
    tokens, scores = propose(logits[rows], cfg, mask_id, rng.select(generator, rows))
    wanted = candidates[rows]
    count = scheduled_count(wanted.sum(1), steps_left)
    picked = select_transfers(scores, wanted, count, cfg.threshold, cfg.factor)
    chosen[rows] = picked
    x[rows] = torch.where(picked, tokens, x[rows])
    return chosen


def masked_canvas(ids: torch.Tensor, prompts: Sequence[Sequence[int]], cfg: SamplerConfig,
                  mask_id: int, pad_id: int
                  ) -> tuple[torch.Tensor, torch.Tensor, SamplerConfig]:
    """``([ids | canvas], canvas validity, the batch's config)`` for the left-padded prompts
    ``ids``: each row's first ``cfg.canvas_widths`` columns after the prompts are MASK (valid),
    the rest of the batch's canvas (:meth:`SamplerConfig.for_width`) padding, not attended."""
    widths = cfg.canvas_widths([len(p) for p in prompts])
    cfg = cfg.for_width(max(widths))
    columns = torch.arange(cfg.max_new_tokens, device=ids.device)
    inside = columns[None, :] < torch.as_tensor(widths, device=ids.device)[:, None]
    canvas = torch.where(inside, mask_id, pad_id).to(ids.dtype)
    return torch.cat([ids, canvas], 1), inside.long(), cfg


def own_canvases(out: torch.Tensor, prompts: Sequence[Sequence[int]],
                 cfg: SamplerConfig) -> list[list[int]]:
    """Each row's own canvas of a batch decoded by :func:`masked_canvas` (with ``pad_to`` the
    canvases differ in width)."""
    widths = cfg.canvas_widths([len(p) for p in prompts])
    return [row[:w] for row, w in zip(out.tolist(), widths)]
