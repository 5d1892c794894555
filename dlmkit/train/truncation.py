"""What ``data.max_seq_len`` does to the data, counted and reported before training.

The collator keeps the first ``cap`` tokens of a record (``cap`` = ``data.max_seq_len`` rounded
down to the strategy's block); a strategy whose blocks start at the response
(``fill_from_response``, block_diffusion) keeps only the response's whole blocks that fit, so
it can cut a record shorter than the cap and empty one whose response starts less than a block
before it. Every count here comes from :meth:`~dlmkit.data.Collator.keeps`, the function the
collator lays out its rows with, so the report says what training sees. Cutting a prompt is
harmless to the loss, cutting a response loses supervised tokens, and a record whose whole
response is cut trains on nothing: with every record like that a run would "succeed" at
loss 0. ``data.truncation`` decides what happens to cut records:

* ``error`` (default): cut records are kept, truncated; one left without any supervised token
  is an error naming it;
* ``drop``: every record the cap cuts is left out;
* ``truncate``: every record is kept, cut, even those left without supervised tokens.

Whatever the policy, the counts are reported, and data with no supervised token left is an
error: such a run never starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlmkit.data import Collator, SFTDataset

from .config import ConfigError, TruncationPolicy


@dataclass
class CapReport:
    """What the length cap does to one split."""

    split: str
    cap: int | None
    records: int
    cut: int              # records the cap cuts (some content not trained)
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
                    f"records it cuts (data.truncation=drop), {self.lost} of "
                    f"{self.supervised} supervised tokens with them ({share:.1f}%)")
        text = (f"data: {cap} cuts {self.cut} of {self.records} {self.split} records; "
                f"{self.lost} of {self.supervised} supervised tokens lost ({share:.1f}%)")
        if self.emptied:
            text += f"; {self.emptied} records keep no supervised token"
        return text


def apply_length_cap(dataset: SFTDataset, collator: Collator, policy: TruncationPolicy,
                     split: str, requested: int | None) -> tuple[SFTDataset, CapReport]:
    """``dataset`` as ``collator`` will train it under ``policy`` (see the module doc) and
    its counts; ``requested`` is ``data.max_seq_len`` as written (for the messages).

    Raises ConfigError when ``policy`` is ``error`` and a record is left without supervised
    tokens, or when no supervised token is left at all."""
    lengths = dataset.lengths
    supervised = dataset.supervised_lengths
    n = len(dataset)
    kept, _, kept_supervised = dataset.kept_by(collator)
    cut = kept < lengths
    emptied = cut & (kept_supervised == 0) & (supervised > 0)
    report = CapReport(split, collator.max_seq_len, n, int(cut.sum()), int(emptied.sum()),
                       int(supervised.sum()), int((supervised - kept_supervised).sum()))
    if report.emptied and policy == "error":
        where = [dataset.sources[i] for i in emptied.nonzero().flatten()[:3].tolist()]
        raise ConfigError(
            f"data.max_seq_len={requested} cuts the whole response of {report.emptied} of {n} "
            f"{split} records (e.g. {', '.join(where)}){_blocks_note(collator)}: they would "
            f"train on nothing. Raise data.max_seq_len ({_whole(dataset, collator)}), or set "
            f"data.truncation=drop (leave out the records it cuts) or "
            f"data.truncation=truncate (keep them cut)")
    if policy == "drop" and report.cut:
        keep = (~cut).nonzero().flatten().tolist()
        if not keep:
            raise ConfigError(
                f"data.max_seq_len={requested} with data.truncation=drop leaves no {split} "
                f"record: it cuts every one{_blocks_note(collator)} (the least that keeps one "
                f"whole is data.max_seq_len={int(dataset.needed_by(collator).min())})")
        dataset = dataset.subset(keep)
        report.dropped = report.cut
        report.lost = int(supervised[cut].sum())
    if int(dataset.kept_by(collator)[2].sum()) == 0:
        raise ConfigError(f"no supervised token is left in the {split} data under "
                          f"data.max_seq_len={requested}: the run would train on nothing")
    return dataset, report


def _blocks_note(collator: Collator) -> str:
    if not collator.fill_from_response or collator.block_size == 1:
        return ""
    return (f"; a response keeps only its whole blocks of {collator.block_size} tokens that "
            f"fit under the cap of {collator.max_seq_len}")


def _whole(dataset: SFTDataset, collator: Collator) -> str:
    """The longest record and, where block rounding or fill needs more, the cap that keeps
    every record whole."""
    longest, need = int(dataset.lengths.max()), int(dataset.needed_by(collator).max())
    text = f"the longest record has {longest} tokens"
    return text if need == longest else \
        f"{text}; data.max_seq_len={need} keeps every record whole"
