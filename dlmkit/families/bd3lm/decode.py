"""Block-diffusion sampler: BD3-LM, and the hybrid model in diffusion mode (which reuses it).

Trained on ``[x_t | x_0]`` with blocks of ``S`` tokens starting at multiples of ``S`` from
position 0: a noisy block sees the clean tokens of strictly earlier blocks and itself
(bidirectionally), its logits (unshifted) predict its clean tokens. The clean stream is
block-causal for BD3-LM (a clean token sees clean tokens of its own and earlier blocks) and
token-causal for the hybrid model. Decoding walks the blocks: denoise the block containing the
next position over the clean prefix, commit it, move on. The prompt may end mid-block; that
block's prompt part stays clean inside the noisy block, as in training.

Layout: the buffer holds clean blocks, then the current noisy block. Rows are left-padded by a
whole number of blocks (row ``b`` by ``(K - k_b) * S`` columns, ``k_b = P_b // S`` its clean
prompt blocks), so every row's current block sits in the same columns and column-space block
ids differ from position-space ones by a per-row constant: one rule serves the whole batch.

KV cache (``cache="prefix"``), **exact**: a clean block's keys/values depend only on clean blocks
at or before it, so they are computed once. The first forward of block ``j`` also runs clean
block ``j - 1`` (queries ``[clean block | noisy block]`` over ``[cache | both]``), so committing
costs no extra forward; the noisy block's entries are cropped after every forward. Without the
cache the clean prefix is recomputed each forward under the same rule; both give the same
logits up to float rounding, hence the same tokens.

``logit_shift`` (a model trained with ``strategy.logit_shift``): the token at column ``c`` is
read from the output at ``c - 1``; a block's first token from the last column of the block
before, a *clean* query that sees exactly the clean tokens before it, as in training. That
output does not change while the block is denoised, so the cache keeps it from the block's
first forward (which runs that clean block) for the block's other steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.decoding.commit import commit_step, shifted_rows
from dlmkit.decoding.options import SamplerConfig
from dlmkit.decoding.runner import Runner, first_stop, rule_mask
from dlmkit.diffusion.rng import Generators


def sample_blocks(runner: Runner, prompts: Sequence[Sequence[int]], cfg: SamplerConfig, *,
                  mask_id: int, pad_id: int, stop_ids: Sequence[int],
                  generator: Generators, clean_causal: bool = False) -> torch.Tensor:
    """Generated tokens ``[B, max_new_tokens]``; ``clean_causal`` selects the hybrid model's
    token-causal clean stream (BD3-LM: block-causal)."""
    device = runner.device
    S, gen, batch = cfg.block_size, cfg.max_new_tokens, len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    if bool((lengths == 0).any()):
        raise ValueError("every prompt needs at least one token")
    k = lengths // S
    K = int(k.max())
    offset = (K - k) * S  # left padding of each row, whole blocks
    num_blocks = int((((lengths + gen + S - 1) // S) - k).max())
    total = (K + num_blocks) * S
    column = torch.arange(total, device=device)
    seq = torch.full((batch, total), mask_id, device=device)
    for row, p in enumerate(prompts):
        o = int(offset[row])
        seq[row, :o] = pad_id
        seq[row, o:o + len(p)] = torch.as_tensor(list(p), device=device)
    key_valid = column.unsqueeze(0) >= offset.unsqueeze(1)
    pos = (column.unsqueeze(0) - offset.unsqueeze(1)).clamp(min=0)
    gen_start = offset + lengths
    gen_cols = gen_start.unsqueeze(1) + torch.arange(gen, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)

    def mask_for(first: int, last: int, noisy_from: int):
        """Queries = columns ``[first, last)`` over keys ``[0, last)``; noisy from a column."""

        def rule(b, q, kv):
            qa = q + first
            if clean_causal:
                clean = kv <= qa
            else:
                clean = kv // S <= qa // S
            seen = torch.where(qa >= noisy_from, kv < last, (kv < noisy_from) & clean)
            return (seen & key_valid[b, kv.clamp(max=total - 1)]) | (qa == kv)

        return rule_mask(rule, last - first, last, batch, f"block_decode_{first}_{last}", device)

    def update_active():
        region = seq.gather(1, gen_cols)
        stop = first_stop(region, stop_ids)
        index = torch.arange(gen, device=device)
        pending = ((region == mask_id) & (index < stop.unsqueeze(1))).any(1)
        active.copy_(active & pending)

    cache = runner.new_cache() if cfg.cache == "prefix" else None
    cached = 0  # columns whose clean keys/values are in the cache
    steps = cfg.block_steps()
    shift = int(getattr(cfg, "logit_shift", False))  # hybrid reuses this sampler without one
    for block in range(num_blocks):
        lo, hi = (K + block) * S, (K + block + 1) * S
        limit = (gen_cols[:, -1:] >= column[lo:hi]).expand(batch, S)
        head = None  # shifted: the logits of column lo - 1 (clean), from the last forward with it
        for step in range(steps):
            candidates = (seq[:, lo:hi] == mask_id) & limit & active.unsqueeze(1)
            if not bool(candidates.any()):
                break
            first = cached if cache is not None else 0
            logits = runner(seq[:, first:hi], mask_for(first, hi, lo), pos[:, first:hi], cache,
                            rows=int(candidates.any(1).sum()))
            if cache is not None:
                cache.crop(-S)
                cached = lo
            if shift:
                if first < lo or lo == 0:  # this forward ran column lo - 1 (or lo is column 0)
                    head = shifted_rows(logits, first, lo, lo + 1, shift)
                logits = torch.cat([head, logits[:, lo - first:hi - 1 - first]], 1)
            window = seq[:, lo:hi].clone()
            commit_step(window, logits[:, -S:], candidates, steps - step, cfg, mask_id,
                        generator)
            seq[:, lo:hi] = window
            update_active()
        if runner.on_commit is not None:  # the block is final: tell a streaming listener
            for row, tokens in enumerate(seq.gather(1, gen_cols).tolist()):
                runner.committed(row, tokens[:tokens.index(mask_id)] if mask_id in tokens
                                 else tokens)
        if not bool(active.any()):
            break
    out = seq.gather(1, gen_cols)
    # Rows that stopped early keep MASK after their stop; it is discarded, fill it anyway.
    return torch.where(out == mask_id, torch.full_like(out, pad_id), out)


def decode(runner: Runner, encoded, cfg: SamplerConfig, **ids) -> list[list[int]]:
    """The bd3lm sampler (:class:`~dlmkit.families.family.Family` ``decode``)."""
    return sample_blocks(runner, encoded, cfg, clean_causal=False, **ids).tolist()
