"""Masked-diffusion sampler (MDLM / LLaDA; trained under ``bidirectional(L, valid)``, unshifted
logits): semi-autoregressive block decoding of a canvas, and infilling of ``[MASK]`` spans.

The canvas is ``[left-padded prompts | max_new_tokens MASK]`` (see :mod:`.runner`). Blocks of
``block_size`` tile the generated region left to right; each block gets its share of
``steps``. Every step predicts all masked positions of the block (MASK logit excluded),
scores the proposals (``remasking``) and commits the scheduled count of the most confident ones
(with ``threshold``: every proposal above it, and never fewer than the schedule, so a block
always finishes within its steps and no mask is ever stranded). A row stops when a stop token
is committed with nothing masked before it; the whole batch stops when every row has.

Prefix KV cache (``use_cache``), an **approximation**: bidirectional attention lets the prompt
and earlier blocks attend the tokens still being decoded, so their keys/values change as the
block fills. As in Fast-dLLM, the first step of each block runs the whole canvas and keeps the
keys/values of everything before the block; the block's other steps run only
``canvas[block start:]`` against that cache. Exact only in the limit where the prefix's
representations do not depend on the suffix; the output can differ from the uncached one.
(The block-diffusion samplers' cache *is* exact: their training mask never lets a clean block
see later ones.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.diffusion import rng
from dlmkit.diffusion.rng import Generators
from dlmkit.masks.bidirectional import bidirectional

from .config import SamplerConfig
from .primitives import confidence, sample_tokens, scheduled_count, select_transfers
from .runner import Runner, first_stop, left_pad, positions, rule_mask


def split_steps(steps: int, parts: int) -> list[int]:
    """``steps`` over ``parts`` blocks, as even as possible, earlier blocks first."""
    return [steps // parts + (i < steps % parts) for i in range(parts)]


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
    picked = select_transfers(scores, wanted, count, cfg.threshold)
    chosen[rows] = picked
    x[rows] = torch.where(picked, tokens, x[rows])
    return chosen


class _Canvas:
    """Canvas, validity, positions and the (static) bidirectional mask of a masked sampler."""

    def __init__(self, x: torch.Tensor, valid: torch.Tensor) -> None:
        self.x, self.valid = x, valid
        self.pos = positions(valid)
        self.mask = bidirectional(x.shape[1], valid, device=x.device)

    def suffix_mask(self, start: int):
        """Rows ``[start, L)`` of the canvas mask, over all ``L`` keys (the cached step)."""
        valid, length = self.valid, self.x.shape[1]

        def rule(b, q, kv):
            return (valid[b, kv] > 0) | (q + start == kv)

        return rule_mask(rule, length - start, length, valid.shape[0], f"suffix_{start}",
                         self.x.device)


def _denoise_block(runner: Runner, canvas: _Canvas, lo: int, hi: int, steps: int,
                   cfg: SamplerConfig, mask_id: int, generator: Generators,
                   active: torch.Tensor, after_step=None) -> None:
    """Decode the masks of columns ``[lo, hi)`` in rows ``active`` within ``steps`` steps."""
    x = canvas.x
    cache = None
    for step in range(steps):
        candidates = (x[:, lo:hi] == mask_id) & active.unsqueeze(1)
        if not bool(candidates.any()):
            return
        rows = int(candidates.any(1).sum())
        if cfg.use_cache and cache is not None:
            logits = runner(x[:, lo:], canvas.suffix_mask(lo), canvas.pos[:, lo:], cache, rows)
            cache.crop(-(x.shape[1] - lo))
            logits = logits[:, : hi - lo]
        elif cfg.use_cache:
            cache = runner.new_cache()
            logits = runner(x, canvas.mask, canvas.pos, cache, rows)[:, lo:hi]
            cache.crop(-(x.shape[1] - lo))
        else:
            logits = runner(x, canvas.mask, canvas.pos, rows=rows)[:, lo:hi]
        window = x[:, lo:hi].clone()
        commit_step(window, logits, candidates, steps - step, cfg, mask_id, generator)
        x[:, lo:hi] = window
        if after_step is not None:
            after_step()
    if bool(((x[:, lo:hi] == mask_id) & active.unsqueeze(1)).any()):
        raise RuntimeError("internal error: masks left after a block's last step")


def sample_masked(runner: Runner, prompts: Sequence[Sequence[int]], cfg: SamplerConfig, *,
                  mask_id: int, pad_id: int, stop_ids: Sequence[int],
                  generator: Generators) -> torch.Tensor:
    """Generated tokens ``[B, max_new_tokens]`` (stop and fill still in place)."""
    device = runner.device
    ids, valid = left_pad(prompts, pad_id, device)
    batch, width = ids.shape
    gen = cfg.max_new_tokens
    x = torch.cat([ids, torch.full((batch, gen), mask_id, device=device)], 1)
    canvas = _Canvas(x, torch.cat([valid, torch.ones_like(x[:, width:])], 1))
    active = torch.ones(batch, dtype=torch.bool, device=device)

    def update_active():
        out = canvas.x[:, width:]
        stop = first_stop(out, stop_ids)
        index = torch.arange(gen, device=device)
        pending = ((out == mask_id) & (index < stop.unsqueeze(1))).any(1)
        finished = (stop < gen) & ~pending
        # Everything after a finished row's stop is discarded: fill it so no MASK remains.
        fill = finished.unsqueeze(1) & (out == mask_id)
        canvas.x[:, width:] = torch.where(fill, torch.full_like(out, pad_id), out)
        active.copy_(active & ~finished)

    num_blocks = gen // cfg.block_size
    for block, steps in enumerate(split_steps(cfg.steps, num_blocks)):
        lo = width + block * cfg.block_size
        _denoise_block(runner, canvas, lo, lo + cfg.block_size, steps, cfg, mask_id,
                       generator, active, update_active)
        if not bool(active.any()):
            break
    return canvas.x[:, width:]


def infill_masked(runner: Runner, sequences: Sequence[Sequence[int]], cfg: SamplerConfig, *,
                  mask_id: int, pad_id: int, generator: Generators) -> list[list[int]]:
    """Fill every ``mask_id`` in ``sequences`` (ragged) within ``cfg.steps`` steps, all spans
    jointly (one block over the whole canvas); every other token is kept."""
    device = runner.device
    ids, valid = left_pad(sequences, pad_id, device)
    canvas = _Canvas(ids, valid)
    width = ids.shape[1]
    active = torch.ones(ids.shape[0], dtype=torch.bool, device=device)
    if bool((ids == mask_id).any()):
        _denoise_block(runner, canvas, 0, width, cfg.steps, cfg, mask_id, generator, active)
    return [canvas.x[row, width - len(s):].tolist() for row, s in enumerate(sequences)]
