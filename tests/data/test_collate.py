"""Collator tests: NeMo's collator test map (spec §6.3) plus what we do differently
(aligned cap, truncation reported, attended fill, packing), against a brute-force reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.data import ByteTokenizer, Collator, SFTDataset

PAD, EOS = 0, 2
KEYS = {
    "input_ids",
    "loss_mask",
    "attention_valid",
    "position_ids",
    "doc_ids",
    "lengths",
    "sample_index",
    "doc_sample_index",
    "truncated",
}


def sample(n, *, prompt=None, index=0, start=10):
    """``n`` tokens ``start..``; the first ``prompt`` (default n // 2) unsupervised."""
    prompt = n // 2 if prompt is None else prompt
    return {
        "input_ids": list(range(start, start + n)),
        "loss_mask": [0] * prompt + [1] * (n - prompt),
        "sample_index": index,
    }


def batch(*lengths):
    return [sample(n, index=i, start=10 + 100 * i) for i, n in enumerate(lengths)]


def reference(samples, *, pad, eos, block_size, psd, max_seq_len, supervise_padding):
    """Token-by-token statement of the (unpacked) layout, independent of the implementation."""
    bs = block_size or 1
    unit = math.lcm(bs, psd or 1)
    cap = None if max_seq_len is None else max_seq_len // unit * unit
    rows = []
    for s in samples:
        ids = s["input_ids"][:cap] if cap is not None else s["input_ids"]
        mask = s["loss_mask"][: len(ids)]
        rows.append((ids, mask, math.ceil(len(ids) / bs) * bs, len(ids) < len(s["input_ids"])))
    length = max(max(r[2] for r in rows), 1)
    length = math.ceil(length / unit) * unit
    if cap is not None:
        length = min(length, cap)
    out = {k: [] for k in KEYS}
    fill = pad if eos is None else eos
    sp = int(supervise_padding)
    for s, (ids, mask, f, cut) in zip(samples, rows):
        c = len(ids)
        row = {k: [] for k in ("input_ids", "loss_mask", "attention_valid", "doc_ids")}
        for t in range(length):
            if t < c:
                vals = (ids[t], mask[t], 1, 0)
            elif t < f:
                vals = (fill, 1, 1, 0)
            else:
                vals = (pad, sp, sp, 0 if sp else -1)
            for k, v in zip(row, vals):
                row[k].append(v)
        for k, v in row.items():
            out[k].append(v)
        out["position_ids"].append(list(range(length)))
        out["lengths"].append(c)
        out["sample_index"].append(s["sample_index"])
        out["doc_sample_index"].append([s["sample_index"]])
        out["truncated"].append(cut)
    return out


def check_against_reference(samples, **kw):
    got = Collator(pad_token_id=PAD, eos_token_id=kw.get("eos", EOS), **_collator_kw(kw))(samples)
    want = reference(
        samples,
        pad=PAD,
        eos=kw.get("eos", EOS),
        block_size=kw.get("block_size"),
        psd=kw.get("pad_seq_len_divisible"),
        max_seq_len=kw.get("max_seq_len"),
        supervise_padding=kw.get("supervise_padding", False),
    )
    assert set(got) == KEYS
    for k in KEYS:
        assert got[k].tolist() == want[k], k
    return got


def _collator_kw(kw):
    return {k: v for k, v in kw.items() if k != "eos"}


# --------------------------------------------------------------------------------- basics


def test_output_keys_shapes_and_dtypes():
    out = Collator(pad_token_id=PAD)(batch(3, 5, 4))
    assert set(out) == KEYS
    for k in ("input_ids", "loss_mask", "attention_valid", "position_ids", "doc_ids"):
        assert out[k].shape == (3, 5) and out[k].dtype == torch.long, k
    for k in ("lengths", "sample_index"):
        assert out[k].shape == (3,) and out[k].dtype == torch.long
    assert out["doc_sample_index"].shape == (3, 1)
    assert out["truncated"].dtype == torch.bool


def test_content_preserved_lengths_and_pads_to_longest():
    samples = batch(3, 7, 5)
    out = check_against_reference(samples)
    assert out["input_ids"].shape[1] == 7
    assert out["lengths"].tolist() == [3, 7, 5]
    for row, s in zip(out["input_ids"], samples):
        assert row[: len(s["input_ids"])].tolist() == s["input_ids"]
    assert out["sample_index"].tolist() == [0, 1, 2]


def test_tensors_as_input_and_missing_loss_mask_means_all_supervised():
    s = {"input_ids": torch.tensor([5, 6, 7]), "sample_index": torch.tensor(4)}
    out = Collator(pad_token_id=PAD)([s])
    assert out["loss_mask"].tolist() == [[1, 1, 1]]
    assert out["sample_index"].tolist() == [4]


# ------------------------------------------------------------------------ block alignment


def test_block_alignment_fill_is_eos_supervised_and_attended():
    out = check_against_reference(batch(5, 9), block_size=4)
    L = out["input_ids"].shape[1]
    assert L % 4 == 0 and L == 12
    row0 = out["input_ids"][0].tolist()
    assert row0[5:8] == [EOS] * 3 and row0[8:] == [PAD] * 4
    assert out["loss_mask"][0, 5:8].tolist() == [1, 1, 1]
    assert out["loss_mask"][0, 8:].tolist() == [0] * 4  # global padding unsupervised
    assert out["attention_valid"][0].tolist() == [1] * 8 + [0] * 4
    assert out["doc_ids"][0].tolist() == [0] * 8 + [-1] * 4


def test_block_fill_uses_pad_without_eos():
    out = Collator(pad_token_id=PAD, block_size=4)(batch(5))
    assert out["input_ids"][0, 5:].tolist() == [PAD] * 3
    assert out["loss_mask"][0, 5:].tolist() == [1] * 3


def test_sample_already_aligned_gets_no_fill():
    out = check_against_reference(batch(8, 3), block_size=4)
    assert out["input_ids"].shape[1] == 8
    assert EOS not in out["input_ids"][0].tolist()


# --------------------------------------------------------------------- pad_seq_len_divisible


def test_pad_seq_len_divisible():
    out = check_against_reference(batch(5, 30), pad_seq_len_divisible=1024)
    assert out["input_ids"].shape[1] == 1024


def test_lcm_alignment():
    out = check_against_reference(batch(5, 30), block_size=32, pad_seq_len_divisible=48)
    assert out["input_ids"].shape[1] % math.lcm(32, 48) == 0


# ------------------------------------------------------------------------------ length cap


def test_cap_and_truncation_are_reported():
    samples = batch(12, 5)
    out = check_against_reference(samples, max_seq_len=8)
    assert out["input_ids"].shape[1] == 8
    assert out["input_ids"][0].tolist() == samples[0]["input_ids"][:8]
    assert out["lengths"].tolist() == [8, 5]  # tokens kept, not the raw length
    assert out["truncated"].tolist() == [True, False]


def test_cap_never_breaks_block_alignment():
    # NeMo: block_size 16, max_seq_len 40 gave L = 40, not a multiple of 16.
    c = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=16, max_seq_len=40)
    assert c.max_seq_len == 32
    out = check_against_reference(batch(39, 3), block_size=16, max_seq_len=40)
    assert out["input_ids"].shape[1] == 32
    assert out["lengths"].tolist() == [32, 3]
    c = Collator(pad_token_id=PAD, block_size=32, pad_seq_len_divisible=48, max_seq_len=200)
    assert c.max_seq_len == 192  # lcm(32, 48) = 96


def test_cap_below_the_alignment_unit_is_an_error():
    with pytest.raises(ValueError, match=r"max_seq_len must be at least .* = 16.*got 10"):
        Collator(pad_token_id=PAD, block_size=16, max_seq_len=10)


# ----------------------------------------------------------------------- supervise_padding


@pytest.mark.parametrize("supervise", [False, True])
def test_supervise_padding(supervise):
    samples = batch(3, 9)
    out = check_against_reference(samples, block_size=4, supervise_padding=supervise)
    row = out["loss_mask"][0].tolist()
    assert row[:3] == samples[0]["loss_mask"]  # content unaffected
    assert row[3:4] == [1]  # block fill always supervised
    assert row[4:] == [int(supervise)] * 8
    assert out["attention_valid"][0, 4:].tolist() == [int(supervise)] * 8
    assert out["doc_ids"][0, 4:].tolist() == [0 if supervise else -1] * 8


def test_equal_lengths_no_padding_difference():
    samples = [sample(6, prompt=0, index=i) for i in range(3)]
    a = Collator(pad_token_id=PAD)(samples)
    b = Collator(pad_token_id=PAD, supervise_padding=True)(samples)
    assert all(torch.equal(a[k], b[k]) for k in KEYS)
    assert a["loss_mask"].eq(1).all()


# ------------------------------------------------------------------------------ edge cases


def test_empty_samples_and_single_token():
    out = check_against_reference(batch(0, 0))
    assert out["input_ids"].shape == (2, 1)
    assert out["attention_valid"].sum() == 0
    out = check_against_reference(batch(0, 1), block_size=4)
    assert out["input_ids"].shape == (2, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pad_token_id": None}, "pad_token_id"),
        ({"pad_token_id": -1}, "pad_token_id must be"),
        ({"pad_token_id": 0, "block_size": 0}, "block_size must be None or an int >= 1, got 0"),
        ({"pad_token_id": 0, "block_size": "4"}, "block_size.*'4'"),
        ({"pad_token_id": 0, "pad_seq_len_divisible": 2.5}, "pad_seq_len_divisible"),
        ({"pad_token_id": 0, "eos_token_id": True}, "eos_token_id"),
        ({"pad_token_id": 0, "max_seq_len": 0}, "max_seq_len"),
        ({"pad_token_id": 0, "pack": True}, "pack=True needs max_seq_len"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Collator(**kwargs)
    with pytest.raises(TypeError, match="supervise_padding"):
        Collator(pad_token_id=0, supervise_padding=1)


@pytest.mark.parametrize(
    ("samples", "match"),
    [
        ([], "non-empty"),
        ([{"input_ids": [1, 2], "loss_mask": [1], "sample_index": 0}], r"loss_mask has shape"),
        ([{"input_ids": [1, 2], "loss_mask": [1, 2], "sample_index": 0}], "only 0 and 1"),
        ([{"input_ids": [1, 2]}], r"samples\[0\] has no 'sample_index'"),
        ([{"loss_mask": [1], "sample_index": 0}], "no 'input_ids'"),
        ([{"input_ids": [[1]], "sample_index": 0}], "must be 1-D"),
        ([{"input_ids": [-3], "sample_index": 0}], "negative"),
        ([{"input_ids": [1], "sample_index": -1}], "sample_index"),
    ],
)
def test_bad_samples_are_errors(samples, match):
    with pytest.raises(ValueError, match=match):
        Collator(pad_token_id=PAD)(samples)


# ---------------------------------------------------------------------- property: reference

options = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([None, 1, 2, 3, 4, 8]),
        "pad_seq_len_divisible": st.sampled_from([None, 1, 4, 6, 16]),
        "max_seq_len": st.sampled_from([None, 48, 50, 100]),
        "supervise_padding": st.booleans(),
        "eos": st.sampled_from([None, EOS]),
    }
)
lengths_st = st.lists(st.integers(0, 60), min_size=1, max_size=5)


@given(lengths_st, options)
@settings(max_examples=100, deadline=None)
def test_matches_reference_and_stays_aligned(lengths, kw):
    out = check_against_reference(batch(*lengths), **kw)
    L = out["input_ids"].shape[1]
    unit = math.lcm(kw["block_size"] or 1, kw["pad_seq_len_divisible"] or 1)
    assert L % unit == 0
    if kw["max_seq_len"] is not None:
        assert L <= kw["max_seq_len"]
    # Supervised positions are always attended; doc -1 exactly where not attended.
    assert not (out["loss_mask"].bool() & ~out["attention_valid"].bool()).any()
    assert torch.equal(out["doc_ids"].eq(-1), out["attention_valid"].eq(0))


# ------------------------------------------------------------------------------- packing


def check_packed(samples, out, *, block_size, max_seq_len):
    bs = block_size or 1
    L = out["input_ids"].shape[1]
    assert L <= max_seq_len and L % bs == 0
    seen = []
    for b in range(out["input_ids"].shape[0]):
        docs = out["doc_sample_index"][b].tolist()
        n_docs = sum(i >= 0 for i in docs)
        assert docs[:n_docs] == [i for i in docs if i >= 0]
        assert out["sample_index"][b] == docs[0]
        start, kept_total = 0, 0
        for d in range(n_docs):
            s = samples[docs[d]]
            where = out["doc_ids"][b].eq(d).nonzero().flatten().tolist()
            kept = min(len(s["input_ids"]), max_seq_len // bs * bs)
            aligned = math.ceil(kept / bs) * bs
            assert where == list(range(start, start + aligned))  # contiguous, block aligned
            assert start % bs == 0
            assert out["input_ids"][b, start : start + kept].tolist() == s["input_ids"][:kept]
            assert out["loss_mask"][b, start : start + kept].tolist() == s["loss_mask"][:kept]
            assert out["input_ids"][b, start + kept : start + aligned].eq(EOS).all()
            assert out["loss_mask"][b, start + kept : start + aligned].eq(1).all()
            assert out["position_ids"][b, start : start + aligned].tolist() == list(range(aligned))
            start += aligned
            kept_total += kept
            seen.append(docs[d])
        assert out["lengths"][b] == kept_total
        assert out["attention_valid"][b, :start].eq(1).all()
        assert out["attention_valid"][b, start:].eq(0).all()
        assert out["doc_ids"][b, start:].eq(-1).all()
        assert out["input_ids"][b, start:].eq(PAD).all()
    assert sorted(seen) == sorted(s["sample_index"] for s in samples)


def test_packing_puts_several_samples_in_a_row():
    samples = batch(8, 8, 8, 8)
    c = Collator(pad_token_id=PAD, eos_token_id=EOS, max_seq_len=32, pack=True)
    out = c(samples)
    assert out["input_ids"].shape == (1, 32)
    assert out["doc_ids"][0].tolist() == [d for d in range(4) for _ in range(8)]
    assert out["position_ids"][0].tolist() == list(range(8)) * 4
    assert out["doc_sample_index"].tolist() == [[0, 1, 2, 3]]
    per_token = out["doc_sample_index"].gather(1, out["doc_ids"].clamp(min=0))
    assert per_token[0].tolist() == [d for d in range(4) for _ in range(8)]
    check_packed(samples, out, block_size=None, max_seq_len=32)


def test_packing_first_fit_and_block_fill_per_document():
    samples = batch(5, 14, 3, 9)
    c = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=4, max_seq_len=16, pack=True)
    out = c(samples)
    # aligned lengths 8, 16, 4, 12: row0 = [8, 4], row1 = [16], row2 = [12]
    assert out["doc_sample_index"].tolist() == [[0, 2], [1, -1], [3, -1]]
    assert out["sample_index"].tolist() == [0, 1, 3]
    check_packed(samples, out, block_size=4, max_seq_len=16)


def test_packing_supervised_padding_belongs_to_last_document():
    c = Collator(
        pad_token_id=PAD,
        eos_token_id=EOS,
        max_seq_len=16,
        pad_seq_len_divisible=16,
        pack=True,
        supervise_padding=True,
    )
    out = c(batch(4, 4, 12))  # rows [4, 4] and [12], both padded to 16
    assert out["doc_ids"].tolist() == [[0] * 4 + [1] * 12, [0] * 12 + [0] * 4]
    assert out["loss_mask"][0, 8:].eq(1).all() and out["attention_valid"].eq(1).all()
    assert out["position_ids"][0].tolist() == list(range(4)) + list(range(12))


@given(
    lengths_st,
    st.sampled_from([None, 2, 4]),
    st.sampled_from([16, 24, 33]),
)
@settings(max_examples=100, deadline=None)
def test_packing_invariants(lengths, block_size, max_seq_len):
    samples = batch(*lengths)
    c = Collator(
        pad_token_id=PAD,
        eos_token_id=EOS,
        block_size=block_size,
        max_seq_len=max_seq_len,
        pack=True,
    )
    out = c(samples)
    check_packed(samples, out, block_size=block_size, max_seq_len=c.max_seq_len)
    assert out["input_ids"].shape[0] <= len(samples)
    assert out["truncated"].any() == any(n > c.max_seq_len for n in lengths)


# --------------------------------------------------------------------------- integration


def test_collates_a_dataset_through_a_dataloader():
    tok = ByteTokenizer()
    ds = SFTDataset.from_task("sort", "validation", tok, n=8)
    c = Collator(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, block_size=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=c)
    out = next(iter(loader))
    assert out["sample_index"].tolist() == [0, 1, 2, 3]
    assert out["input_ids"].shape[1] % 4 == 0
    for b in range(4):
        item = ds[b]
        n = item["input_ids"].numel()
        assert torch.equal(out["input_ids"][b, :n], item["input_ids"])
        assert torch.equal(out["loss_mask"][b, :n], item["loss_mask"])


def test_fill_from_response_keeps_whole_response_blocks_under_the_cap():
    """The response's blocks start at the response, so with ``max_seq_len`` its last block can
    overrun the cap: the collator keeps the whole blocks that fit and marks the row cut
    (it used to index past the row)."""
    collate = Collator(pad_token_id=0, eos_token_id=1, block_size=8, max_seq_len=24,
                       fill_from_response=True)
    batch = collate([
        {"input_ids": list(range(2, 26)), "loss_mask": [0] * 5 + [1] * 19, "sample_index": 0},
        {"input_ids": list(range(2, 20)), "loss_mask": [0] * 5 + [1] * 13, "sample_index": 1},
    ])
    assert batch["input_ids"].shape == (2, 24)
    assert batch["lengths"].tolist() == [21, 18]  # 5 prompt + 2 blocks of 8; 18 + EOS fill
    assert batch["truncated"].tolist() == [True, False]
    assert batch["input_ids"][0, :21].tolist() == list(range(2, 23))
    assert batch["input_ids"][1, 18:21].tolist() == [1, 1, 1]
    assert batch["loss_mask"].sum(1).tolist() == [16, 16]


# --------------------------------------------------------------------------------- pad_to


def test_pad_to_gives_every_row_the_same_length_whatever_the_batch():
    """Every row's supervised padding ends at ``pad_to`` however long the batch's longest row:
    what follows is padding nobody attends or scores (a longer row keeps its own length)."""
    collate = Collator(pad_token_id=PAD, eos_token_id=EOS, supervise_padding=True, pad_to=8)
    out = collate([
        {"input_ids": [10, 11, 12, 13, 14], "loss_mask": [0, 0, 0, 1, 1], "sample_index": 0},
        {"input_ids": list(range(10, 20)), "loss_mask": [0] * 6 + [1] * 4, "sample_index": 1},
        {"input_ids": [10, 11, 12], "loss_mask": [0, 1, 1], "sample_index": 2},
    ])
    assert out["input_ids"].shape == (3, 10)  # row 1 is longer than pad_to
    assert out["loss_mask"].tolist() == [
        [0, 0, 0, 1, 1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [0, 1, 1, 1, 1, 1, 1, 1, 0, 0],
    ]
    assert out["attention_valid"].tolist() == [[1] * 8 + [0] * 2, [1] * 10, [1] * 8 + [0] * 2]
    assert out["doc_ids"].tolist() == [[0] * 8 + [-1] * 2, [0] * 10, [0] * 8 + [-1] * 2]
    assert out["input_ids"][0].tolist() == [10, 11, 12, 13, 14] + [PAD] * 5
    assert out["position_ids"][0].tolist() == list(range(10))
    # the same rows in a batch of their own: identical up to pad_to
    alone = collate([{"input_ids": [10, 11, 12], "loss_mask": [0, 1, 1], "sample_index": 2}])
    assert alone["input_ids"].shape == (1, 8)
    assert alone["loss_mask"][0].tolist() == out["loss_mask"][2, :8].tolist()


def test_pad_to_needs_supervised_padding_and_no_packing():
    with pytest.raises(ValueError, match="pad_to needs supervise_padding"):
        Collator(pad_token_id=PAD, pad_to=4)
    with pytest.raises(ValueError, match="pad_to cannot be combined with pack"):
        Collator(pad_token_id=PAD, supervise_padding=True, pad_to=4, pack=True, max_seq_len=16)
    with pytest.raises(ValueError, match="pad_to must be None or an int >= 1"):
        Collator(pad_token_id=PAD, supervise_padding=True, pad_to=0)


def kept_reference(mask, *, cap, block_size, fill_from_response):
    """What the collator keeps of one sample, position by position: (content kept, span with
    its block fill, supervised tokens kept)."""
    kept = len(mask) if cap is None else min(len(mask), cap)
    if not fill_from_response:
        return kept, math.ceil(kept / block_size) * block_size, sum(mask[:kept])
    start = kept  # where the last supervised run within the kept tokens begins
    for i in range(kept - 1, -1, -1):
        if mask[i] and (i == 0 or not mask[i - 1]):
            start = i
            break
    aligned = start + math.ceil((kept - start) / block_size) * block_size
    if cap is not None and aligned > cap:  # only the response's whole blocks under the cap
        aligned = start + (cap - start) // block_size * block_size
        kept = min(kept, aligned)
    return kept, aligned, sum(mask[:kept])


@given(st.lists(st.lists(st.integers(0, 1), max_size=30), min_size=1, max_size=6),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from([None, 8, 12, 16, 24]), st.booleans())
@settings(max_examples=150, deadline=None)
def test_keeps_counts_what_the_rows_hold(masks, block_size, max_seq_len, fill_from_response):
    """``Collator.keeps`` is the count the length-cap report and ``data.truncation`` use: it
    must equal a position-by-position statement and what the collated rows hold."""
    collate = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=block_size,
                       max_seq_len=max_seq_len, fill_from_response=fill_from_response)
    samples = [{"input_ids": [5] * len(m), "loss_mask": m, "sample_index": i}
               for i, m in enumerate(masks)]
    sizes = torch.tensor([len(m) for m in masks])
    kept, aligned, supervised = collate.keeps(
        torch.tensor(sum(masks, []), dtype=torch.long),
        torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]))
    expected = [kept_reference(m, cap=collate.max_seq_len, block_size=block_size,
                               fill_from_response=fill_from_response) for m in masks]
    assert list(zip(kept.tolist(), aligned.tolist(), supervised.tolist())) == expected
    out = collate(samples)
    assert out["lengths"].tolist() == kept.tolist()
    content = torch.arange(out["loss_mask"].shape[1])[None, :] < out["lengths"][:, None]
    assert (out["loss_mask"] * content).sum(1).tolist() == supervised.tolist()
    assert out["truncated"].tolist() == (kept < sizes).tolist()


def test_keeps_a_response_starting_less_than_a_block_before_the_cap_keeps_nothing():
    """A 14-token sample under a cap of 16: its response starts at 11, its one block of 8 would
    end at 19, so no block of it fits: the whole response is cut although the sample is
    shorter than the cap; the least cap that keeps it whole is 24."""
    collate = Collator(pad_token_id=PAD, eos_token_id=EOS, block_size=8, max_seq_len=16,
                       fill_from_response=True)
    mask = torch.tensor([0] * 11 + [1] * 3)
    offsets = torch.tensor([0, 14])
    assert [t.tolist() for t in collate.keeps(mask, offsets)] == [[11], [11], [0]]
    assert collate.needs(mask, offsets).tolist() == [24]
    out = collate([{"input_ids": [5] * 14, "loss_mask": mask.tolist(), "sample_index": 0}])
    assert out["loss_mask"].sum() == 0 and out["truncated"].tolist() == [True]


@pytest.mark.parametrize("offsets", [[0, 3], [1, 4], [0, 3, 2, 4], [[0, 4]]])
def test_keeps_rejects_offsets_that_do_not_cover_the_masks(offsets):
    collate = Collator(pad_token_id=PAD, max_seq_len=8)
    with pytest.raises(ValueError, match=r"offsets must rise from 0 to len\(masks\) = 4"):
        collate.keeps(torch.ones(4, dtype=torch.long), torch.tensor(offsets))
