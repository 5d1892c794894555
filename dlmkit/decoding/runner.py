"""Calling the model during decoding: masks for any backend, an optional KV cache, a count of
forwards; and the batch layout shared by the samplers.

Ragged prompts are **left-padded**: row ``b`` of a ``[B, P]`` prompt batch holds its
``P_b`` tokens in columns ``[P - P_b, P)``, so every row's generation starts in the same column.
Padding is harmless because every decode mask blocks padded keys, and each token gets its own
row's position id (``column - pad_b``): a padded row computes exactly what it would alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from dlmkit.masks import Mask


class Runner:
    """``runner(ids, mask, positions, cache=None) -> float logits [B, Q, V]``.

    Counts ``forwards`` (calls, each over the whole batch) and ``row_forwards`` (per call, the
    rows that still needed it, as the sampler says: a finished row riding along in the batch
    does not count), so tokens per forward is a per-sequence figure whatever the batch size.

    ``model`` is a Hugging Face causal LM (its ``config._attn_implementation`` decides how a
    ``Mask`` is rendered: bool for sdpa, ``BlockMask`` for flex, additive for eager) or any
    module called as ``model(input_ids=, attention_mask=, position_ids=, **kw)`` returning
    logits or an object with ``.logits`` (then the mask is given as a dense bool tensor).

    ``vocab_size``: the tokenizer's vocabulary ``V``; logits are cut to their first ``V``
    columns. A checkpoint's embedding table is often padded past the tokenizer (Qwen3: 151936
    rows for 151669 tokens): those ids are never data, so no sampler may propose one, and
    SCDD's uniform channel runs over the tokenizer's ``K = V - 1`` tokens, as in training.
    ``None`` keeps every column.
    """

    def __init__(self, model, vocab_size: int | None = None) -> None:
        if vocab_size is not None and (isinstance(vocab_size, bool)
                                       or not isinstance(vocab_size, int) or vocab_size < 2):
            raise ValueError(f"vocab_size must be None or an int >= 2, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.model = model
        self.forwards = 0
        # on_commit(row, tokens): told each time a row's committed response grows (a server
        # streams it); the block-wise samplers call committed(), whole-canvas ones never do.
        self.on_commit = None
        self.row_forwards = 0
        config = getattr(model, "config", None)
        self.implementation = getattr(config, "_attn_implementation", None) or "sdpa"
        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed past_key_values -> cache (the old name warns).
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        try:
            self.dtype = next(model.parameters()).dtype
        except StopIteration:
            self.dtype = torch.float32

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def committed(self, row: int, tokens: Sequence[int]) -> None:
        """Row ``row``'s response so far is ``tokens`` (final: the sampler keeps them)."""
        if self.on_commit is not None:
            self.on_commit(row, list(tokens))

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, mask: Mask, position_ids: torch.Tensor,
                 cache=None, rows: int | None = None) -> torch.Tensor:
        from dlmkit.models import mask_argument

        attention = mask_argument(mask, self.implementation, self.dtype)
        if isinstance(attention, torch.Tensor) and attention.shape[0] != input_ids.shape[0]:
            attention = attention.expand(input_ids.shape[0], *attention.shape[1:])
        kwargs = {}
        if cache is not None:
            kwargs = {self._cache_kw: cache, "use_cache": True}
        elif hasattr(self.model, "config"):
            kwargs = {"use_cache": False}
        out = self.model(input_ids=input_ids, attention_mask=attention,
                         position_ids=position_ids, **kwargs)
        self.forwards += 1
        self.row_forwards += input_ids.shape[0] if rows is None else int(rows)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        if self.vocab_size is not None:
            if logits.shape[-1] < self.vocab_size:
                raise ValueError(f"the model gives {logits.shape[-1]} logits per token, fewer "
                                 f"than the tokenizer's vocab_size {self.vocab_size}")
            logits = logits[..., :self.vocab_size]
        return logits.float()


def drop_cached(cache, lo: int, hi: int) -> None:
    """Remove the cached keys/values of columns ``[lo, hi)`` from every layer of a
    ``DynamicCache`` (the masked sampler's dual cache keeps ``[prefix | suffix]``)."""
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise ValueError("the dual cache needs full-attention cache layers; this model's "
                             "cache has sliding-window layers (use cache='prefix' or 'none')")
        layer.keys = torch.cat([layer.keys[..., :lo, :], layer.keys[..., hi:, :]], -2)
        layer.values = torch.cat([layer.values[..., :lo, :], layer.values[..., hi:, :]], -2)


def rule_mask(rule, q_len: int, kv_len: int, batch: int, name: str, device) -> Mask:
    """A per-row ``Mask`` from a rule over absolute key columns."""
    return Mask.from_rule(rule, q_len, kv_len, batch, name=name, device=device)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device,
             multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, valid)`` ``[B, P]`` long: prompts right-aligned, ``P`` the longest prompt."""
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        valid[row, width - len(p):] = 1
    return ids.to(device), valid.to(device)


def positions(valid: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded layout: real tokens count from 0; padding gets 0."""
    return (valid.long().cumsum(1) - 1).clamp(min=0)


def first_stop(tokens: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """``[B]`` index of each row's first stop token in ``tokens [B, G]`` (``G`` if none)."""
    stops = torch.isin(tokens, torch.as_tensor(list(stop_ids), device=tokens.device))
    index = torch.arange(tokens.shape[1], device=tokens.device)
    return torch.where(stops, index, tokens.shape[1]).amin(1)
