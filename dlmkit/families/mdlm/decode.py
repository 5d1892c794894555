"""Masked-diffusion sampler (MDLM / LLaDA; trained under ``bidirectional(L, valid)``; logits
unshifted, or with ``logit_shift`` the token at column ``c`` read from the output at ``c - 1``,
:func:`shifted_rows`): semi-autoregressive block decoding of a canvas, and infilling of
``[MASK]`` spans.

The canvas is ``[left-padded prompts | max_new_tokens MASK]`` (see :mod:`.runner`). Blocks of
``block_size`` tile the generated region left to right; each block gets its share of
``steps``. Every step predicts all masked positions of the block (MASK logit excluded),
scores the proposals (``remasking``) and commits the scheduled count of the most confident ones
(with ``threshold`` or ``factor``: every proposal the rule accepts, never fewer than the
schedule and never none, so a block always finishes within its steps and no mask is ever
stranded). A row stops when a stop token is committed with nothing masked before it; the whole
batch stops when every row has.

KV caches (``cache``), both **approximations** (Fast-dLLM's): bidirectional attention lets
every token attend the tokens still being decoded, so the keys/values of the rest of the canvas
change as a block fills. Both refresh once per block: the block's first step runs the whole
canvas and keeps keys/values, its other steps reuse them.

* ``prefix``: keeps everything before the block; the other steps run ``canvas[block start:]``
  (the block and the still-masked suffix) against it.
* ``dual`` (DualCache): also keeps the suffix after the block; the other steps run only the
  block's ``block_size`` tokens, against ``[prefix | suffix]`` keys (a key's position is in its
  rotary embedding, so the cache order does not matter, only the mask's key-to-column map).

With ``logit_shift`` every forward starts one column earlier (the prefix cache keeps ``[0,
lo - 1)``, the dual cache recomputes ``[lo - 1, hi)``), so the block's first token is read from
its predecessor's output computed with the current block.

Exact only in the limit where the cached representations do not depend on the tokens committed
since the refresh; the output can differ from the uncached decode (``bench/sampling.py``
measures by how much). The block-diffusion samplers' cache *is* exact: their training mask
never lets a clean block see later ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.decoding.commit import (
    commit_step,
    masked_canvas,
    own_canvases,
    shifted_rows,
    split_steps,
)
from dlmkit.decoding.options import SamplerConfig
from dlmkit.decoding.runner import Runner, drop_cached, first_stop, left_pad, positions, rule_mask
from dlmkit.diffusion.rng import Generators
from dlmkit.masks.bidirectional import bidirectional


class _Canvas:
    """Canvas, validity, positions and the (static) bidirectional mask of a masked sampler."""

    def __init__(self, x: torch.Tensor, valid: torch.Tensor) -> None:
        self.x, self.valid = x, valid
        self.pos = positions(valid)
        self.mask = bidirectional(x.shape[1], valid, device=x.device)

    def suffix_mask(self, start: int):
        """Rows ``[start, L)`` of the canvas mask, over all ``L`` keys (the prefix-cached
        step)."""
        valid, length = self.valid, self.x.shape[1]

        def rule(b, q, kv):
            return (valid[b, kv] > 0) | (q + start == kv)

        return rule_mask(rule, length - start, length, valid.shape[0], f"suffix_{start}",
                         self.x.device)

    def block_mask(self, lo: int, hi: int):
        """Rows ``[lo, hi)`` of the canvas mask over the dual cache's key order: columns
        ``[0, lo)``, then ``[hi, L)`` (cached), then ``[lo, hi)`` (the block, appended)."""
        valid, length = self.valid, self.x.shape[1]
        column = torch.cat([torch.arange(lo), torch.arange(hi, length),
                            torch.arange(lo, hi)]).to(self.x.device)

        def rule(b, q, kv):
            col = column[kv]
            return (valid[b, col] > 0) | (q + lo == col)

        return rule_mask(rule, hi - lo, length, valid.shape[0], f"dual_{lo}_{hi}",
                         self.x.device)


def _denoise_block(runner: Runner, canvas: _Canvas, lo: int, hi: int, steps: int,
                   cfg: SamplerConfig, mask_id: int, generator: Generators,
                   active: torch.Tensor, after_step=None) -> None:
    """Decode the masks of columns ``[lo, hi)`` in rows ``active`` within ``steps`` steps."""
    x, length = canvas.x, canvas.x.shape[1]
    shift = int(cfg.logit_shift)
    a = max(lo - shift, 0)  # a cached forward's first column: the block, or its predecessor
    cache = step_mask = None
    for step in range(steps):
        candidates = (x[:, lo:hi] == mask_id) & active.unsqueeze(1)
        if not bool(candidates.any()):
            return
        rows = int(candidates.any(1).sum())
        if cfg.cache == "none":
            out = runner(x, canvas.mask, canvas.pos, rows=rows)
            logits = shifted_rows(out, 0, lo, hi, shift)
        elif cache is None:  # the block's first step refreshes the cache
            cache = runner.new_cache()
            out = runner(x, canvas.mask, canvas.pos, cache, rows)
            logits = shifted_rows(out, 0, lo, hi, shift)
            if cfg.cache == "prefix":
                cache.crop(-(length - a))
                step_mask = canvas.suffix_mask(a)
            else:
                drop_cached(cache, a, hi)
                step_mask = canvas.block_mask(a, hi)
        elif cfg.cache == "prefix":
            out = runner(x[:, a:], step_mask, canvas.pos[:, a:], cache, rows)
            logits = shifted_rows(out, a, lo, hi, shift)
            cache.crop(-(length - a))
        else:  # dual: only the block (and, shifted, its predecessor) runs against the rest
            out = runner(x[:, a:hi], step_mask, canvas.pos[:, a:hi], cache, rows)
            logits = shifted_rows(out, a, lo, hi, shift)
            cache.crop(-(hi - a))
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
    """Generated tokens ``[B, W]`` (stop and fill still in place; ``W`` = ``max_new_tokens``,
    or with ``pad_to`` the widest canvas; a row's columns past its own canvas are padding)."""
    device = runner.device
    ids, valid = left_pad(prompts, pad_id, device)
    batch, width = ids.shape
    x, canvas_valid, cfg = masked_canvas(ids, prompts, cfg, mask_id, pad_id)
    gen = cfg.max_new_tokens
    canvas = _Canvas(x, torch.cat([valid, canvas_valid], 1))
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
    if cfg.logit_shift:
        for i, s in enumerate(sequences):
            if len(s) and s[0] == mask_id:
                raise ValueError(f"sequences[{i}] starts with a mask token, but the model was "
                                 "trained with logit_shift (each token is predicted from the "
                                 "one before it), so a first token cannot be filled; put at "
                                 "least one token before the span")
    ids, valid = left_pad(sequences, pad_id, device)
    canvas = _Canvas(ids, valid)
    width = ids.shape[1]
    active = torch.ones(ids.shape[0], dtype=torch.bool, device=device)
    if bool((ids == mask_id).any()):
        _denoise_block(runner, canvas, 0, width, cfg.steps, cfg, mask_id, generator, active)
    return [canvas.x[row, width - len(s):].tolist() for row, s in enumerate(sequences)]


def decode(runner: Runner, encoded, cfg: SamplerConfig, **ids) -> list[list[int]]:
    """The mdlm sampler (:class:`~dlmkit.families.family.Family` ``decode``)."""
    return own_canvases(sample_masked(runner, encoded, cfg, **ids), encoded, cfg)
