"""A KV-cached causal stream whose rows advance by different amounts, and autoregressive
decoding on it (the hybrid model's AR mode; the reference I-DLM strided decoding must match).

Each forward appends a left-padded chunk of clean tokens per row (optionally followed by ``N``
MASK tokens for I-DLM's proposal block) to one shared ``DynamicCache``. Rows never realign:
tokens a row did not keep (padding, rejected proposals) stay in the cache as *holes* that its
``key_valid`` blocks, and every token carries its row's own position id, so a row computes
exactly what it would alone. The noisy block's entries are cropped after every forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.diffusion import rng
from dlmkit.diffusion.rng import Generators

from .runner import Runner, left_pad, rule_mask


class CausalStream:
    """Per-row causal decoding state over a shared KV cache."""

    def __init__(self, runner: Runner, batch: int) -> None:
        self.runner = runner
        self.device = runner.device
        self.cache = runner.new_cache()
        self.key_valid = torch.zeros((batch, 0), dtype=torch.bool, device=self.device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=self.device)
        self._fed: torch.Tensor | None = None

    def forward(self, clean: torch.Tensor, clean_valid: torch.Tensor, num_noisy: int = 0,
                mask_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``clean [B, C]`` (valid tokens right-aligned, ``clean_valid`` 1 on them) then
        ``num_noisy`` MASK tokens; returns ``(clean_logits [B, C, V], noisy_logits [B, N, V])``.

        Clean tokens see the row's valid cached keys and the valid new ones before them; the
        noisy block sees all of those and is causal inside (``idlm_decode``). Call
        :meth:`commit` next to say which clean tokens the row keeps.
        """
        batch, width = clean.shape
        cached = self.key_valid.shape[1]
        valid = clean_valid.bool()
        clean_pos = self.next_pos.unsqueeze(1) + (valid.long().cumsum(1) - 1).clamp(min=0)
        after = self.next_pos + valid.sum(1)
        noisy_pos = after.unsqueeze(1) + torch.arange(num_noisy, device=self.device)
        ids = torch.cat([clean, torch.full((batch, num_noisy), mask_id, device=self.device)], 1)
        new_valid = torch.cat([valid, torch.ones((batch, num_noisy), dtype=torch.bool,
                                                 device=self.device)], 1)
        keys_valid = torch.cat([self.key_valid, new_valid], 1)
        last = keys_valid.shape[1] - 1

        def rule(b, q, kv):
            qa = q + cached
            return ((kv <= qa) & keys_valid[b, kv.clamp(max=last)]) | (qa == kv)

        mask = rule_mask(rule, width + num_noisy, cached + width + num_noisy, batch,
                         f"stream_{cached}_{width}_{num_noisy}", self.device)
        logits = self.runner(ids, mask, torch.cat([clean_pos, noisy_pos], 1), self.cache,
                             rows=int(valid.any(1).sum()))
        if num_noisy:
            self.cache.crop(-num_noisy)
        self._fed = valid
        return logits[:, :width], logits[:, width:]

    def commit(self, keep: torch.Tensor) -> None:
        """``keep [B, C]`` bool: the clean tokens of the last forward each row keeps (a prefix
        of its valid ones); the rest become holes."""
        keep = keep.bool() & self._fed
        self.key_valid = torch.cat([self.key_valid, keep], 1)
        self.next_pos = self.next_pos + keep.sum(1)


def pad_chunks(chunks: Sequence[Sequence[int]], pad_id: int, device):
    """Left-pad per-row chunks (empty allowed) to ``([B, C], valid [B, C])``, ``C >= 1``."""
    width = max(1, max(len(c) for c in chunks))
    # Padded as lists, then one tensor each: a tensor op per row costs more than the lists
    # at every decoding step.
    ids = [[pad_id] * (width - len(c)) + [int(t) for t in c] for c in chunks]
    valid = [[0] * (width - len(c)) + [1] * len(c) for c in chunks]
    return (torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(valid, dtype=torch.long, device=device))


def exclude(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """``logits`` with the MASK logit at -inf (MASK is never an output token)."""
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    return logits


def sample_ar(runner: Runner, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
              temperature: float, mask_id: int, pad_id: int, stop_ids: Sequence[int],
              generator: Generators) -> list[list[int]]:
    """Autoregressive decoding of the clean causal stream (logits at ``i`` predict ``i + 1``):
    one token per row per forward after the prompt's. Returns each row's tokens, up to and
    including its first stop token."""
    from .primitives import sample_tokens

    ids, valid = left_pad(prompts, pad_id, runner.device)
    stream = CausalStream(runner, len(prompts))
    out: list[list[int]] = [[] for _ in prompts]
    active = [True] * len(prompts)
    stops = set(stop_ids)
    while True:
        logits, _ = stream.forward(ids, valid)
        stream.commit(valid)
        # Only the rows still decoding draw: a row's samples never depend on the others.
        rows = [row for row, a in enumerate(active) if a]
        tokens = sample_tokens(exclude(logits[rows, -1], mask_id), temperature,
                               rng.select(generator, rows)).tolist()
        for row, token in zip(rows, tokens):
            out[row].append(token)
            runner.committed(row, out[row])
            active[row] = token not in stops and len(out[row]) < max_new_tokens
        if not any(active):
            return out
        ids, valid = pad_chunks([[t[-1]] if a else [] for t, a in zip(out, active)], pad_id,
                                runner.device)
