"""Random splitting of training tokens into smaller vocabulary pieces that spell them
(``data.split_tokens``; the idea of StochasTok, Sims et al. 2025).

A BPE model sees ``wl`` as one id and never learns that it is ``w`` then ``l`` unless some
training text shows it: a task that reverses or spells words then fails on exactly the words
whose answer must break a multi-letter piece (what the suite's ``transform`` misses are; see
docs/suite.md). Splitting a random share of the training tokens into two pieces that
concatenate to them shows the model each piece's spelling in context, while the text (and so
every target) stays the same.

The rule, per training sample and step: every prompt token is split with probability ``p``
into one of its splits (two pieces whose strings concatenate to its string, chosen uniformly),
and each new piece is again split with probability ``p``, until nothing is left to split.
Special tokens are never split. The supervised (response) tokens keep the tokenizer's own
segmentation unless ``data.split_responses`` is set (each piece then keeps its token's
``loss_mask``): a diffusion model predicts many positions at once, and an answer that may be
spelled in several ways gives each position several right tokens, which parallel decoding
mixes: scdd with responses split at 0.1 got 39 of 58 ``double`` problems of the suite's BPE
``transform`` right, where every run scored without splitting got 52-56 (docs/suite.md). The
draws come from :func:`~dlmkit.data.seeds.split_generators`, a function of ``(seed, step,
sample, repeat)``, so a run is reproducible and resumes exactly. A sample may grow to ``limit``
tokens (the collator's row length or length cap) and no further: splits beyond it are dropped
at random, so splitting never truncates what was kept before. Validation and sampling use the
tokenizer's own segmentation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import torch

from dlmkit.data.tokenizer import Tokenizer

__all__ = ["PieceSplits", "piece_splits", "split_sample"]


class PieceSplits:
    """For every vocabulary piece that is two other pieces written one after the other, those
    pairs of ids (``pairs[id] = [(left, right), ...]``, by split point)."""

    def __init__(self, pieces: Mapping[int, str]) -> None:
        by_string: dict[str, int] = {}
        for i in sorted(pieces):  # two ids with one string: the lower id stands for it
            by_string.setdefault(pieces[i], i)
        self.pairs: dict[int, list[tuple[int, int]]] = {}
        for i, s in pieces.items():
            pairs = [(by_string[s[:k]], by_string[s[k:]]) for k in range(1, len(s))
                     if s[:k] in by_string and s[k:] in by_string]
            if pairs:
                self.pairs[i] = pairs

    def __len__(self) -> int:
        """How many pieces can be split."""
        return len(self.pairs)


@functools.cache
def piece_splits(tokenizer: Tokenizer) -> PieceSplits:
    """The tokenizer's :class:`PieceSplits` (built once per tokenizer object)."""
    return PieceSplits(tokenizer.pieces())


def split_sample(sample: Mapping[str, Any], splits: PieceSplits, probability: float,
                 generator: torch.Generator, limit: int | None = None,
                 supervised: bool = True) -> dict[str, Any]:
    """``sample`` (``input_ids`` and ``loss_mask``, 1-D) with its tokens split by the rule
    of this module; other keys are kept. ``limit``: most tokens the result may have (None: no
    limit); a sample already at or over it is returned as it is. ``supervised``: split the
    supervised tokens too (False: only those with ``loss_mask`` 0, the prompt's)."""
    ids = [int(t) for t in sample["input_ids"].tolist()]
    mask = [int(m) for m in sample["loss_mask"].tolist()]
    budget = math.inf if limit is None else limit - len(ids)  # each split adds one token
    fresh = list(range(len(ids)))  # positions that may split this round
    while fresh and budget > 0:
        draws = torch.rand(len(fresh), generator=generator).tolist()
        chosen = [p for p, u in zip(fresh, draws) if u < probability and ids[p] in splits.pairs
                  and (supervised or not mask[p])]
        if not chosen:
            break
        if len(chosen) > budget:  # keep a random `budget` of them, in order
            keep = torch.randperm(len(chosen), generator=generator)[:budget].sort().values
            chosen = [chosen[k] for k in keep.tolist()]
        which = dict(zip(chosen, torch.rand(len(chosen), generator=generator).tolist()))
        new_ids: list[int] = []
        new_mask: list[int] = []
        fresh = []
        for p, (token, m) in enumerate(zip(ids, mask)):
            if p in which:
                options = splits.pairs[token]
                fresh += [len(new_ids), len(new_ids) + 1]
                new_ids += options[int(which[p] * len(options))]
                new_mask += [m, m]
            else:
                new_ids.append(token)
                new_mask.append(m)
        budget -= len(chosen)
        ids, mask = new_ids, new_mask
    out = dict(sample)
    out["input_ids"] = torch.tensor(ids, dtype=torch.long)
    out["loss_mask"] = torch.tensor(mask, dtype=torch.long)
    return out
