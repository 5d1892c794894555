"""``SFTDataset``: records tokenized once, served as dicts with a ``sample_index``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dlmkit.data.collate import Collator
from dlmkit.data.records import (
    DataError,
    Record,
    as_record,
    load_records,
    records_from_dicts,
    tokenize_record,
    warn_unanswered,
)
from dlmkit.data.tasks import get_task
from dlmkit.data.tokenizer import Tokenizer

__all__ = ["SFTDataset"]


class SFTDataset(torch.utils.data.Dataset):
    """A map-style dataset of tokenized SFT examples.

    All records are tokenized (and validated) in the constructor, so a bad record fails before
    training with its file and line. Tokens live in one flat tensor, so memory is about
    9 bytes per token rather than a Python list per example.

    Args:
        records: :class:`Record` objects, or ``{"prompt", "response"}`` / ``{"messages"}``
            dicts (validated; errors name them ``source[index]``).
        tokenizer: any :class:`~dlmkit.data.tokenizer.Tokenizer`.
        source: name used in errors for plain dicts.

    Item ``i`` is ``{"input_ids": LongTensor [L_i], "loss_mask": LongTensor [L_i],
    "sample_index": i}``; ``i`` is the global sample index that per-sample seeds derive from.
    """

    def __init__(
        self,
        records: Sequence[Record | Mapping[str, Any]],
        tokenizer: Tokenizer,
        *,
        source: str = "records",
    ) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                f"tokenizer must be a dlmkit Tokenizer (see load_tokenizer), got "
                f"{type(tokenizer).__name__}"
            )
        if len(records) == 0:
            raise DataError(source, "the dataset is empty (no records)")
        converted = {i: as_record(r, f"{source}[{i}]") for i, r in enumerate(records)
                     if not isinstance(r, Record)}
        records = [converted.get(i, r) for i, r in enumerate(records)]
        if converted:  # Record objects (from files, tasks) were checked when they were read
            warn_unanswered(list(converted.values()), source, stacklevel=2)
        self.tokenizer = tokenizer
        self.sources = [r.source for r in records]
        ids: list[int] = []
        mask: list[int] = []
        offsets = [0]
        for record in records:
            tok = tokenize_record(record, tokenizer)
            ids.extend(tok.input_ids)
            mask.extend(tok.loss_mask)
            offsets.append(len(ids))
        self._ids = torch.tensor(ids, dtype=torch.int32)
        self._mask = torch.tensor(mask, dtype=torch.int8)
        self._offsets = torch.tensor(offsets, dtype=torch.long)

    @classmethod
    def from_files(
        cls, paths: str | os.PathLike | Sequence[str | os.PathLike], tokenizer: Tokenizer,
        fields: Mapping[str, str] | None = None,
    ) -> SFTDataset:
        """Load data files or saved datasets (see :func:`load_records`; ``fields`` maps
        format fields to the data's own names)."""
        return cls(load_records(paths, fields), tokenizer)

    @classmethod
    def from_task(
        cls,
        name: str,
        split: str,
        tokenizer: Tokenizer,
        *,
        n: int | None = None,
        seed: int = 0,
        **params: Any,
    ) -> SFTDataset:
        """A bundled synthetic task's split (see :mod:`dlmkit.data.tasks`)."""
        task = get_task(name, **params)
        source = f"task:{name}/{split}"
        return cls(records_from_dicts(task.records(split, n=n, seed=seed), source), tokenizer)

    def __len__(self) -> int:
        return self._offsets.numel() - 1

    @property
    def lengths(self) -> torch.Tensor:
        """Token count of every example, ``LongTensor [N]``."""
        return self._offsets[1:] - self._offsets[:-1]

    @property
    def num_supervised_tokens(self) -> int:
        return int(self._mask.sum())

    @property
    def supervised_lengths(self) -> torch.Tensor:
        """Supervised (response) token count of every example, ``LongTensor [N]``."""
        totals = torch.cat([self._mask.new_zeros(1, dtype=torch.long),
                            self._mask.long().cumsum(0)])
        return totals[self._offsets[1:]] - totals[self._offsets[:-1]]

    @property
    def longest_responses(self) -> torch.Tensor:
        """Length of every example's longest supervised run (its longest assistant turn),
        ``LongTensor [N]`` (0 for an example with nothing supervised)."""
        on = self._mask.long()
        n = on.numel()
        starts_example = torch.zeros(n, dtype=torch.bool)
        starts_example[self._offsets[:-1][self._offsets[:-1] < n]] = True
        previous = torch.cat([on.new_zeros(1), on[:-1]])
        run_start = (on == 1) & ((previous == 0) | starts_example)
        run_of = run_start.long().cumsum(0) - 1  # run number of every supervised token
        run_len = torch.bincount(run_of[on == 1], minlength=int(run_start.sum()))
        example_of_run = torch.bucketize(torch.nonzero(run_start).flatten(),
                                         self._offsets[1:], right=True)
        longest = torch.zeros(len(self), dtype=torch.long)
        return longest.scatter_reduce_(0, example_of_run, run_len, "amax")

    def kept_by(self, collator: Collator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What ``collator`` keeps of every example under its length cap: ``(kept, aligned,
        supervised)``, each ``LongTensor [N]`` (see :meth:`Collator.keeps`)."""
        return collator.keeps(self._mask, self._offsets)

    def needed_by(self, collator: Collator) -> torch.Tensor:
        """The least ``max_seq_len`` with which ``collator`` keeps each example whole,
        ``LongTensor [N]`` (see :meth:`Collator.needs`)."""
        return collator.needs(self._mask, self._offsets)

    def subset(self, indices: Sequence[int]) -> SFTDataset:
        """A dataset of the examples at ``indices`` (in that order), renumbered from 0."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        if index.numel() == 0:
            raise DataError(self.sources[0] if self.sources else "records",
                            "the dataset is empty (no records left)")
        out = SFTDataset.__new__(SFTDataset)
        out.tokenizer = self.tokenizer
        out.sources = [self.sources[i] for i in index.tolist()]
        starts, lengths = self._offsets[index], self.lengths[index]
        # Flat positions of the kept examples: for each, its start plus 0 .. length - 1.
        owner = torch.repeat_interleave(torch.arange(index.numel()), lengths)
        within = torch.arange(int(lengths.sum())) - (lengths.cumsum(0) - lengths)[owner]
        flat = starts[owner] + within
        out._ids = self._ids[flat]
        out._mask = self._mask[flat]
        out._offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self)
        if isinstance(index, torch.Tensor):
            index = index.item()
        if isinstance(index, bool) or not isinstance(index, int) or not -n <= index < n:
            raise IndexError(f"index must be an int in [0, {n}), got {index!r}")
        index %= n
        lo, hi = int(self._offsets[index]), int(self._offsets[index + 1])
        return {
            "input_ids": self._ids[lo:hi].long(),
            "loss_mask": self._mask[lo:hi].long(),
            "sample_index": index,
        }
