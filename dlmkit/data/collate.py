"""The collator: a list of tokenized samples -> one padded (optionally packed) batch of tensors.

Layout of a row (not packed), with ``c`` = content length after the length cap and
``f`` = ``c`` rounded up to a multiple of ``block_size``:

=============  ================================  =========  ======================  =======
span           ``input_ids``                     loss_mask  attention_valid         doc_ids
=============  ================================  =========  ======================  =======
``[0, c)``     the sample's tokens               sample's   1                       0
``[c, f)``     EOS (PAD if no EOS): block fill   1          1                       0
``[f, L)``     PAD                               s          s                       0 / -1
=============  ================================  =========  ======================  =======

with ``s = supervise_padding``. Every supervised position is also attended, so a model that
honours ``attention_valid`` never has to predict a token it cannot see as part of the sequence
(NeMo's collator supervised the EOS fill but masked it out of attention). ``doc_ids`` is -1
exactly where ``attention_valid`` is 0.

``L`` is the longest row's ``f``, rounded up to a multiple of
``lcm(block_size, pad_seq_len_divisible)``, then capped by ``max_seq_len``. The cap is rounded
*down* to a multiple of that same unit at construction, so it can never break block alignment
(NeMo's cap, applied last, could); content beyond it is dropped and flagged in ``truncated``,
and ``lengths`` counts only the tokens kept.

With ``fill_from_response=True`` the fill is measured from where each sample's last
supervised run starts instead of from position 0: ``f = a + ceil((c - a) / block_size) *
block_size`` with ``a`` that start, so the final response is a whole number of blocks (block
diffusion's canvas blocks start at the response, not at multiples of the block size).

With ``pad_to=T`` (needs ``supervise_padding``) a row's supervised padding ends at ``T`` (or at
``f``, if that is later) instead of at ``L``; the rest of the row is unsupervised, unattended
padding. Every row then has the same length, whatever the batch's longest row: a bidirectional
model with relative positions uses the ends of the sequence as landmarks, so the decoder pads
each prompt's canvas to the same ``T`` (the samplers' ``pad_to``).

With ``pack=True`` several samples share a row (first fit, in order, each sample block-aligned
with its own EOS fill so no block straddles two documents); ``doc_ids`` numbers them
``0, 1, ...`` within the row and ``position_ids`` restart at 0 for each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import torch

__all__ = ["Batch", "Collator"]


class Batch(TypedDict):
    """What the collator returns. ``B`` rows of ``L`` positions; ``D``: the most documents in
    a row (1 unless packed)."""

    input_ids: torch.Tensor  # [B, L] token ids
    loss_mask: torch.Tensor  # [B, L] 1 = supervised
    attention_valid: torch.Tensor  # [B, L] 1 = attended (every supervised position is)
    position_ids: torch.Tensor  # [B, L] from 0 in each document
    doc_ids: torch.Tensor  # [B, L] the document's number in its row, -1 = unattended padding
    lengths: torch.Tensor  # [B] content tokens kept in the row
    sample_index: torch.Tensor  # [B] the row's first document's global sample index
    doc_sample_index: torch.Tensor  # [B, D] each document's global sample index, -1 = none
    truncated: torch.Tensor  # [B] bool: the length cap cut a document of the row


def _opt_int(name: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be None or an int >= {minimum}, got {value!r}")
    return value


def _ceil_to(n, multiple: int):
    """``n`` (an int or an integer tensor) rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def _flat(masks: Any, offsets: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``masks`` and ``offsets`` as tensors, checked: ``offsets`` rise from 0 to
    ``len(masks)``."""
    masks = torch.as_tensor(masks)
    offsets = torch.as_tensor(offsets, dtype=torch.long)
    if masks.dim() != 1 or offsets.dim() != 1 or offsets.numel() == 0 or \
            int(offsets[0]) != 0 or int(offsets[-1]) != masks.numel() or \
            bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"offsets must rise from 0 to len(masks) = {masks.numel()} "
                         f"(sample i at [offsets[i], offsets[i + 1])), got "
                         f"{offsets.tolist()!r:.80}")
    return masks, offsets


def _last_run_starts(masks: torch.Tensor, offsets: torch.Tensor,
                     ends: torch.Tensor) -> torch.Tensor:
    """Where the last run of supervised positions before ``ends[i]`` starts in sample ``i``,
    counted from the sample's start (``ends[i] - offsets[i]`` when it has none there).
    ``masks``: the samples' loss masks laid end to end, sample ``i`` at
    ``[offsets[i], offsets[i + 1])``; ``ends``: flat positions within each sample's span."""
    on = masks != 0
    starts = offsets[:-1]
    begins_sample = torch.zeros_like(on)
    begins_sample[starts[starts < on.numel()]] = True
    previous = torch.cat([on.new_zeros(1), on[:-1]])
    run_start = on & (~previous | begins_sample)
    # A -1 in front so every search finds an entry; it lies before every sample's start.
    positions = torch.cat([torch.full((1,), -1, dtype=torch.long),
                           torch.nonzero(run_start).flatten()])
    last = positions[torch.searchsorted(positions, ends) - 1]
    return torch.where(last >= starts, last - starts, ends - starts)


class Collator:
    """Pads, block-aligns, caps and optionally packs SFT samples.

    Args:
        pad_token_id: id written on padding.
        eos_token_id: id of the block fill (None: the fill uses ``pad_token_id``).
        block_size: round each sample up to a multiple of this with a supervised EOS fill
            (None or 1: no fill).
        pad_seq_len_divisible: round the batch length up to a multiple of
            ``lcm(block_size, pad_seq_len_divisible)``.
        max_seq_len: cap on the batch length, rounded down to a multiple of that lcm (the
            effective value is ``self.max_seq_len``); must be at least the lcm. Required with
            ``pack``.
        supervise_padding: put loss (and attention) on the padding after the fill too.
        pack: put several samples in one row (up to ``max_seq_len``).
        fill_from_response: block-align each sample's last supervised run (its final
            response) rather than the whole sample.
        pad_to: end each row's supervised padding at this length (requires
            ``supervise_padding``; not with ``pack``).

    Each sample is a mapping with ``input_ids`` (list or 1-D tensor of ints, length ``n``),
    optional ``loss_mask`` (``n`` values in {0, 1}; default all 1) and ``sample_index`` (int,
    its global index in the dataset, from which per-sample noise seeds are derived).

    Returns (``B`` rows, ``B`` = number of samples, or fewer when packing; ``D`` = most
    documents in one row, 1 when not packing), all ``torch.long`` except ``truncated``:

    * ``input_ids [B, L]``
    * ``loss_mask [B, L]``: 1 = supervised (scored) position.
    * ``attention_valid [B, L]``: 1 = real token (content, block fill, supervised padding).
    * ``position_ids [B, L]``: 0, 1, ... per row (per document when packed); padding
      continues the count of the token before it.
    * ``doc_ids [B, L]``: document number within the row (always 0 when not packed), -1 where
      ``attention_valid`` is 0. With ``supervise_padding`` the padding belongs to the row's
      last document.
    * ``lengths [B]``: content tokens kept in the row (before fill/padding; all documents).
    * ``sample_index [B]``: the sample's global index; for a packed row, its first document's.
    * ``doc_sample_index [B, D]``: global index of document ``d`` of each row (-1 where the row
      has fewer documents); ``doc_sample_index.gather(1, doc_ids.clamp(min=0))`` is the per-
      token sample index.
    * ``truncated [B]`` (bool): some content of the row was cut by ``max_seq_len``.
    """

    def __init__(
        self,
        *,
        pad_token_id: int,
        eos_token_id: int | None = None,
        block_size: int | None = None,
        pad_seq_len_divisible: int | None = None,
        max_seq_len: int | None = None,
        supervise_padding: bool = False,
        pack: bool = False,
        fill_from_response: bool = False,
        pad_to: int | None = None,
    ) -> None:
        self.pad_token_id = _opt_int("pad_token_id", pad_token_id, 0)
        if self.pad_token_id is None:
            raise ValueError("pad_token_id must be an int >= 0, got None")
        self.eos_token_id = _opt_int("eos_token_id", eos_token_id, 0)
        self.block_size = _opt_int("block_size", block_size, 1) or 1
        self.pad_seq_len_divisible = _opt_int("pad_seq_len_divisible", pad_seq_len_divisible, 1)
        self.unit = math.lcm(self.block_size, self.pad_seq_len_divisible or 1)
        requested = _opt_int("max_seq_len", max_seq_len, 1)
        if requested is not None and requested < self.unit:
            raise ValueError(
                f"max_seq_len must be at least lcm(block_size, pad_seq_len_divisible) = "
                f"{self.unit} so the batch stays aligned, got {requested}"
            )
        self.max_seq_len = None if requested is None else requested // self.unit * self.unit
        if not isinstance(supervise_padding, bool):
            raise TypeError(f"supervise_padding must be a bool, got {supervise_padding!r}")
        if not isinstance(pack, bool):
            raise TypeError(f"pack must be a bool, got {pack!r}")
        if pack and self.max_seq_len is None:
            raise ValueError("pack=True needs max_seq_len (the row length to pack up to)")
        if not isinstance(fill_from_response, bool):
            raise TypeError(f"fill_from_response must be a bool, got {fill_from_response!r}")
        self.pad_to = _opt_int("pad_to", pad_to, 1)
        if self.pad_to is not None and not supervise_padding:
            raise ValueError("pad_to needs supervise_padding=True (it is the length the "
                             "supervised padding fills rows to)")
        if self.pad_to is not None and pack:
            raise ValueError("pad_to cannot be combined with pack=True (one sample per row)")
        self.supervise_padding = supervise_padding
        self.pack = pack
        self.fill_from_response = fill_from_response
        self.fill_token_id = self.pad_token_id if self.eos_token_id is None else self.eos_token_id

    def __repr__(self) -> str:
        return (
            f"Collator(pad_token_id={self.pad_token_id}, eos_token_id={self.eos_token_id}, "
            f"block_size={self.block_size}, pad_seq_len_divisible={self.pad_seq_len_divisible}, "
            f"max_seq_len={self.max_seq_len}, supervise_padding={self.supervise_padding}, "
            f"pack={self.pack}, pad_to={self.pad_to})"
        )

    def keeps(self, masks: torch.Tensor, offsets: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What this collator keeps of each of ``N`` samples: ``(kept, aligned, supervised)``,
        each ``LongTensor [N]``: content tokens kept (``c``, after the length cap), that
        span with its block fill (``f``), and supervised tokens among the kept ones.

        ``masks``: the samples' loss masks laid end to end, sample ``i`` at
        ``[offsets[i], offsets[i + 1])`` (``offsets``: ``LongTensor [N + 1]``, from 0).

        The one count of what the cap keeps: the collator lays out its rows with it and the
        length-cap report and ``data.truncation`` (:mod:`dlmkit.train.truncation`) count with
        it, so they cannot disagree. With ``fill_from_response`` a response keeps only the whole
        blocks (counted from its start) that fit under the cap: a sample shorter than the cap
        can be cut, and one whose response starts less than a block before the cap keeps none
        of it."""
        masks, offsets = _flat(masks, offsets)
        kept, aligned = self._spans(masks, offsets, self.max_seq_len)
        totals = torch.cat([kept.new_zeros(1), (masks != 0).long().cumsum(0)])
        starts = offsets[:-1]
        return kept, aligned, totals[starts + kept] - totals[starts]

    def needs(self, masks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The least ``max_seq_len`` that keeps each sample whole, ``LongTensor [N]`` (arguments
        as :meth:`keeps`): its block-filled span rounded up to the alignment unit."""
        return _ceil_to(self._spans(*_flat(masks, offsets), None)[1], self.unit)

    def _spans(self, masks: torch.Tensor | None, offsets: torch.Tensor, cap: int | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(kept, aligned)`` of :meth:`keeps` (``masks`` is only read, and only needed, with
        ``fill_from_response``)."""
        starts, sizes = offsets[:-1], offsets[1:] - offsets[:-1]
        kept = sizes if cap is None else sizes.clamp(max=cap)
        if self.fill_from_response:
            response = _last_run_starts(masks, offsets, starts + kept)
            aligned = response + _ceil_to(kept - response, self.block_size)
            if cap is not None:
                # The response's blocks start at the response, so its last block can overrun
                # the cap: keep the whole blocks that fit (the cut is counted as truncation).
                # A response starting less than a block before the cap keeps nothing.
                aligned = torch.where(aligned <= cap, aligned, response + (cap - response)
                                      // self.block_size * self.block_size)
                kept = torch.minimum(kept, aligned)
        else:
            aligned = _ceil_to(kept, self.block_size)
        return kept, aligned

    def _sample(self, i: int, sample: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Shape and type checks for one sample; value checks run once on the whole batch."""
        if not isinstance(sample, Mapping):
            raise TypeError(f"samples[{i}] must be a dict, got {type(sample).__name__}")
        if "input_ids" not in sample:
            raise ValueError(f"samples[{i}] has no 'input_ids' (keys: {sorted(sample)})")
        if "sample_index" not in sample:
            raise ValueError(
                f"samples[{i}] has no 'sample_index' (the global index per-sample noise seeds "
                "come from); SFTDataset provides it"
            )
        ids = torch.as_tensor(sample["input_ids"], dtype=torch.long)
        if ids.dim() != 1:
            raise ValueError(f"samples[{i}]['input_ids'] must be 1-D, got shape {tuple(ids.shape)}")
        if sample.get("loss_mask") is None:
            mask = torch.ones_like(ids)
        else:
            mask = torch.as_tensor(sample["loss_mask"], dtype=torch.long)
            if mask.shape != ids.shape:
                raise ValueError(
                    f"samples[{i}]: loss_mask has shape {tuple(mask.shape)} but input_ids has "
                    f"{tuple(ids.shape)}"
                )
        index = sample["sample_index"]
        if isinstance(index, torch.Tensor):
            index = index.item()
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"samples[{i}]['sample_index'] must be an int >= 0, got {index!r}")
        return ids, mask, index

    def _check_values(self, parsed, ids: torch.Tensor, masks: torch.Tensor) -> None:
        bad_ids = bool(ids.numel()) and int(ids.min()) < 0
        bad_mask = bool(masks.numel()) and not bool(((masks == 0) | (masks == 1)).all())
        if not (bad_ids or bad_mask):
            return
        for i, (sample_ids, mask, _) in enumerate(parsed):  # slow path: name the sample
            low = int(sample_ids.min()) if sample_ids.numel() else 0
            if low < 0:
                raise ValueError(f"samples[{i}]['input_ids'] has negative ids ({low})")
            if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
                raise ValueError(f"samples[{i}]['loss_mask'] must hold only 0 and 1")

    def _place(self, aligned: list[int]) -> tuple[list[int], list[int], list[int]]:
        """Row, offset and document number of each sample (first fit when packing)."""
        if not self.pack:
            return list(range(len(aligned))), [0] * len(aligned), [0] * len(aligned)
        rows, offsets, numbers, used, count = [], [], [], [], []
        for a in aligned:
            r = next((r for r, u in enumerate(used) if u + a <= self.max_seq_len), len(used))
            if r == len(used):
                used.append(0)
                count.append(0)
            rows.append(r)
            offsets.append(used[r])
            numbers.append(count[r])
            used[r] += a
            count[r] += 1
        return rows, offsets, numbers

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> Batch:
        if not isinstance(samples, Sequence) or len(samples) == 0:
            raise ValueError(f"samples must be a non-empty list of dicts, got {samples!r:.80}")
        parsed = [self._sample(i, s) for i, s in enumerate(samples)]
        cap = self.max_seq_len
        sizes = torch.tensor([p[0].numel() for p in parsed])
        kept, aligned = self._spans(
            torch.cat([p[1] for p in parsed]) if self.fill_from_response else None,
            torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]), cap)
        kept_list = kept.tolist()
        flat_ids = torch.cat([p[0][:k] for p, k in zip(parsed, kept_list)])
        flat_mask = torch.cat([p[1][:k] for p, k in zip(parsed, kept_list)])
        self._check_values(parsed, flat_ids, flat_mask)
        rows_l, offsets_l, numbers_l = self._place(aligned.tolist())

        # Where each row's padding ends with pad_to (not packed: one sample per row).
        extent = None if self.pad_to is None else aligned.clamp_min(self.pad_to)
        row = torch.tensor(rows_l)
        number = torch.tensor(numbers_l)
        B, D = int(row.max()) + 1, int(number.max()) + 1
        used = torch.zeros(B, dtype=torch.long).index_add_(0, row, aligned)
        widest = used if extent is None else extent
        length = _ceil_to(max(int(widest.max()), 1), self.unit)
        if cap is not None:
            length = min(length, cap)
        base = row * length + torch.tensor(offsets_l)

        def spans(n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """Flat positions of ``[base, base + n)`` for every sample, which sample, offset."""
            # Sample k covers flat slots [starts[k], starts[k] + n[k]); marking every start and
            # taking a running count numbers the slots by sample (empty samples are skipped).
            starts = n.cumsum(0) - n
            total = int(n.sum())
            marks = torch.zeros(total + 1, dtype=torch.long).index_add_(
                0, starts, torch.ones_like(n)
            )
            which = marks[:total].cumsum(0) - 1
            local = torch.arange(total) - starts[which]
            return base[which] + local, which, local

        pad_on = int(self.supervise_padding)
        input_ids = torch.full((B * length,), self.pad_token_id, dtype=torch.long)
        loss_mask = torch.full((B * length,), pad_on, dtype=torch.long)
        attention_valid = torch.full((B * length,), pad_on, dtype=torch.long)
        doc_ids = torch.full((B * length,), -1, dtype=torch.long)
        position_ids = torch.zeros(B * length, dtype=torch.long)
        # Each sample's aligned span: block fill, supervised and attended ...
        pos, which, local = spans(aligned)
        input_ids[pos] = self.fill_token_id
        loss_mask[pos] = 1
        attention_valid[pos] = 1
        doc_ids[pos] = number[which]
        position_ids[pos] = local
        # ... then its content over the front of that span.
        pos, _, _ = spans(kept)
        input_ids[pos] = flat_ids
        loss_mask[pos] = flat_mask
        input_ids, loss_mask, attention_valid, doc_ids, position_ids = (
            t.view(B, length)
            for t in (input_ids, loss_mask, attention_valid, doc_ids, position_ids)
        )
        # Padding continues the position count of the token before it.
        cols = torch.arange(length)
        tail = cols[None, :] >= used[:, None]
        before = position_ids.gather(1, (used - 1).clamp(min=0)[:, None]).squeeze(1)
        next_pos = torch.where(used > 0, before + 1, torch.zeros_like(used))
        position_ids = torch.where(
            tail, next_pos[:, None] + cols[None, :] - used[:, None], position_ids
        )
        docs_per_row = torch.zeros(B, dtype=torch.long).index_add_(0, row, torch.ones_like(row))
        if self.supervise_padding:
            doc_ids = torch.where(tail, (docs_per_row - 1)[:, None], doc_ids)
        if extent is not None:  # past pad_to: padding nobody sees
            beyond = cols[None, :] >= extent[:, None]
            loss_mask, attention_valid = (t.masked_fill(beyond, 0)
                                          for t in (loss_mask, attention_valid))
            doc_ids = doc_ids.masked_fill(beyond, -1)
        doc_sample_index = torch.full((B, D), -1, dtype=torch.long)
        doc_sample_index[row, number] = torch.tensor([p[2] for p in parsed])
        cut = torch.tensor([p[0].numel() > k for p, k in zip(parsed, kept_list)], dtype=torch.long)
        return {
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "attention_valid": attention_valid,
            "position_ids": position_ids,
            "doc_ids": doc_ids,
            "lengths": torch.zeros(B, dtype=torch.long).index_add_(0, row, kept),
            "sample_index": doc_sample_index[:, 0].clone(),
            "doc_sample_index": doc_sample_index,
            "truncated": torch.zeros(B, dtype=torch.long).index_add_(0, row, cut) > 0,
        }
