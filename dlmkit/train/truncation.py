"""What ``data.max_seq_len`` does to the data, counted and reported before training.

The collator keeps the first ``cap`` tokens of a record (``cap`` = ``data.max_seq_len`` rounded
down to the strategy's block; see :class:`~dlmkit.data.Collator`). Cutting a prompt is harmless
to the loss, cutting a response loses supervised tokens, and a record whose whole response lies
beyond the cap trains on nothing: with every record like that a run would "succeed" at loss 0.
``data.truncation`` decides what happens to cut records:

* ``error`` (default): cut records are kept, truncated; one left without any supervised token
  is an error naming it;
* ``drop``: every record longer than the cap is left out;
* ``truncate``: every record is kept, cut, even those left without supervised tokens.

Whatever the policy, the counts are reported, and data with no supervised token left is an
error: such a run never starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmkit.data import SFTDataset

from .config import ConfigError


@dataclass
class CapReport:
    """What the length cap does to one split."""

    split: str
    cap: int | None
    records: int
    cut: int              # records longer than the cap
    emptied: int          # cut records left without a supervised token
    supervised: int       # supervised tokens before the cap
    lost: int             # supervised tokens not trained: beyond the cap, or in dropped records
    dropped: int = 0      # records left out (policy drop)

    def line(self, requested: int) -> str:
        cap = f"data.max_seq_len={requested}" + (
            f" ({self.cap} after rounding down to the block)" if self.cap != requested else "")
        share = 100.0 * self.lost / max(self.supervised, 1)
        if self.dropped:
            return (f"data: {cap}: dropped the {self.dropped} of {self.records} {self.split} "
                    f"records longer than the cap (data.truncation=drop), {self.lost} of "
                    f"{self.supervised} supervised tokens with them ({share:.1f}%)")
        text = (f"data: {cap} cuts {self.cut} of {self.records} {self.split} records; "
                f"{self.lost} of {self.supervised} supervised tokens lost ({share:.1f}%)")
        if self.emptied:
            text += f"; {self.emptied} records keep no supervised token"
        return text


def apply_length_cap(dataset: SFTDataset, cap: int | None, policy: str, split: str,
                     requested: int) -> tuple[SFTDataset, CapReport]:
    """``dataset`` as it will be trained under ``policy`` (see the module doc) and its counts.

    Raises ConfigError when ``policy`` is ``error`` and a record is left without supervised
    tokens, or when no supervised token is left at all."""
    lengths = dataset.lengths
    supervised = dataset.supervised_lengths
    n = len(dataset)
    if cap is None:
        kept_supervised = supervised
        cut = torch.zeros(n, dtype=torch.bool)
    else:
        kept_supervised = dataset.supervised_within(cap)
        cut = lengths > cap
    emptied = cut & (kept_supervised == 0) & (supervised > 0)
    report = CapReport(split, cap, n, int(cut.sum()), int(emptied.sum()), int(supervised.sum()),
                       int((supervised - kept_supervised).sum()))
    if report.emptied and policy == "error":
        where = [dataset.sources[i] for i in emptied.nonzero().flatten()[:3].tolist()]
        longest = int(lengths.max())
        raise ConfigError(
            f"data.max_seq_len={requested} cuts the whole response of {report.emptied} of {n} "
            f"{split} records (e.g. {', '.join(where)}): they would train on nothing. Raise "
            f"data.max_seq_len (the longest record has {longest} tokens), or set "
            f"data.truncation=drop (leave out records longer than the cap) or "
            f"data.truncation=truncate (keep them cut)")
    if policy == "drop" and report.cut:
        keep = (~cut).nonzero().flatten().tolist()
        if not keep:
            raise ConfigError(f"data.max_seq_len={requested} with data.truncation=drop leaves no "
                              f"{split} record: every one is longer (the shortest has "
                              f"{int(lengths.min())} tokens)")
        dataset = dataset.subset(keep)
        report.dropped = report.cut
        report.lost = int(supervised[cut].sum())
    left = int(dataset.supervised_within(cap).sum()) if cap is not None \
        else report.supervised
    if left == 0:
        raise ConfigError(f"no supervised token is left in the {split} data under "
                          f"data.max_seq_len={requested}: the run would train on nothing")
    return dataset, report
