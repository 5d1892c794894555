import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.catalogue.document import (
    batchify,
    document,
    packed_causal_document,
    shared_prefix,
)
from dlmkit.masks.catalogue.prefix import prefix_lm
from dlmkit.masks.causal import causal
from dlmkit.masks.core import Mask
from tests.masks.compare import (
    assert_dense_equals,
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    assert_matches_create_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_catalog import (
    batchify_ref,
    document_ids_ref,
    document_offsets_ref,
    packed_causal_document_ref,
    shared_prefix_ref,
)
from tests.masks.strategies import block_sizes


# ---------------------------------------------------------------- inner masks + references
def inner_mask(kind, q_len, kv_len):
    if kind == "causal":
        return causal(q_len, kv_len), lambda b, q, k: k <= q
    if kind == "full":
        return causal(q_len, kv_len, kv_len), lambda b, q, k: True
    # a rule without intervals (exercises the fallback); kv 0 keeps every row non-empty
    return (Mask.from_rule(lambda b, q, kv: ((q + kv) % 3 == 0) | (kv == 0), q_len, kv_len),
            lambda b, q, k: (q + k) % 3 == 0 or k == 0)


@st.composite
def offsets_rows(draw, total, n_docs, batch):
    rows = []
    for _ in range(batch):
        cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n_docs - 1,
                                    max_size=n_docs - 1)))
        rows.append([0, *cuts, total])
    return rows


def longest(rows):
    return max(max(r[i + 1] - r[i] for i in range(len(r) - 1)) for r in rows)


def check(mask, expected, data, empty_rows_allowed=False):
    bs = (data.draw(block_sizes), data.draw(block_sizes))
    if not empty_rows_allowed:
        full_check(mask, expected, block_sizes=bs)
        return
    assert_dense_equals(mask, expected)
    assert_matches_create_mask(mask)
    for b in bs:
        assert_matches_create_block_mask(mask, b)


# ---------------------------------------------------------------- document
@settings(max_examples=25, deadline=None)
@given(data=st.data(), total=st.integers(1, 13), n_docs=st.integers(1, 4),
       batch=st.integers(1, 3), kind=st.sampled_from(["causal", "full", "rule"]))
def test_document_offsets(data, total, n_docs, batch, kind):
    rows = data.draw(offsets_rows(total, n_docs, batch))
    m = longest(rows)
    inner, inner_ref = inner_mask(kind, m, m)
    offsets = torch.tensor(rows[0] if batch == 1 else rows)
    mask = document(inner, offsets)
    assert mask.has_intervals == (kind != "rule")
    expected = grid(batch, total, total, document_offsets_ref(inner_ref, rows))
    check(mask, expected, data)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), q_total=st.integers(1, 11), kv_total=st.integers(1, 11),
       n_docs=st.integers(1, 4), batch=st.integers(1, 2),
       kind=st.sampled_from(["causal", "full", "rule"]))
def test_document_cross_attention_offsets(data, q_total, kv_total, n_docs, batch, kind):
    q_rows = data.draw(offsets_rows(q_total, n_docs, batch))
    kv_rows = data.draw(offsets_rows(kv_total, n_docs, batch))
    inner, inner_ref = inner_mask(kind, longest(q_rows), longest(kv_rows))
    mask = document(inner, torch.tensor(q_rows), kv_offsets=torch.tensor(kv_rows))
    assert (mask.q_len, mask.kv_len) == (q_total, kv_total)
    expected = grid(batch, q_total, kv_total, document_offsets_ref(inner_ref, q_rows, kv_rows))
    # zero-length key documents leave their queries empty: documented convention
    check(mask, expected, data, empty_rows_allowed=True)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), q_total=st.integers(1, 11), batch=st.integers(1, 2),
       contiguous=st.booleans(), cross=st.booleans(),
       kind=st.sampled_from(["causal", "full", "rule"]))
def test_document_ids(data, q_total, batch, contiguous, cross, kind):
    def draw_ids(length):
        rows = [data.draw(st.lists(st.integers(0, 2), min_size=length, max_size=length))
                for _ in range(batch)]
        return [sorted(r) for r in rows] if contiguous else rows

    q_rows = draw_ids(q_total)
    kv_rows = draw_ids(data.draw(st.integers(1, 11))) if cross else None
    sizes = [r.count(i) for r in q_rows for i in range(3)]
    kv_sizes = sizes if kv_rows is None else [r.count(i) for r in kv_rows for i in range(3)]
    inner, inner_ref = inner_mask(kind, max(sizes), max(1, max(kv_sizes)))
    mask = document(inner, doc_ids=torch.tensor(q_rows),
                    kv_doc_ids=None if kv_rows is None else torch.tensor(kv_rows))
    structured = kind != "rule" and all(
        sum(1 for i in range(len(r)) if i == 0 or r[i] != r[i - 1]) == len(set(r))
        for r in q_rows + (kv_rows or []))
    assert mask.has_intervals == structured
    kv_len = q_total if kv_rows is None else len(kv_rows[0])
    expected = grid(batch, q_total, kv_len, document_ids_ref(inner_ref, q_rows, kv_rows))
    check(mask, expected, data, empty_rows_allowed=cross)


def test_document_batched_inner_pairs_rows():
    inner = prefix_lm(4, torch.tensor([0, 3]))
    mask = document(inner, torch.tensor([[0, 4, 6], [0, 2, 6]]))
    assert mask.batch == 2 and mask.has_intervals

    def inner_ref(b, q, k):
        return k < [0, 3][b] or k <= q

    expected = grid(2, 6, 6, document_offsets_ref(inner_ref, [[0, 4, 6], [0, 2, 6]]))
    full_check(mask, expected, block_sizes=(2, (3, 4)))


def test_document_zero_length_docs_and_large_shapes():
    offsets = torch.tensor([0, 0, 100, 100, 257, 300, 300])
    mask = document(causal(157), offsets)
    assert_matches_create_block_mask(mask, 128)
    assert_matches_create_block_mask(mask, (64, 128))
    assert torch.equal(mask.dense(), packed_causal_document(offsets).dense())


def test_document_empty_rows_convention():
    # query document 1 has no keys -> its rows attend to nothing
    mask = document(causal(2, 2, 2), [0, 2, 4], kv_offsets=[0, 2, 2])
    dense = mask.dense()[0, 0]
    assert dense[:2].all(-1).all() and not dense[2:].any()
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 2, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 2, 8, dtype=torch.float64)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense())
    assert torch.equal(sdpa[..., 2:, :], torch.zeros_like(sdpa[..., 2:, :]))
    additive = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.additive(torch.float64))
    assert torch.isfinite(additive).all()


def test_document_bad_input():
    with pytest.raises(TypeError, match="inner"):
        document("causal", [0, 4])
    with pytest.raises(ValueError, match="exactly one"):
        document(causal(4), [0, 4], doc_ids=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="exactly one"):
        document(causal(4))
    with pytest.raises(ValueError, match="offsets must start at 0"):
        document(causal(4), [1, 4])
    with pytest.raises(ValueError, match="non-decreasing"):
        document(causal(4), [0, 3, 2, 4])
    with pytest.raises(ValueError, match="same total"):
        document(causal(4), torch.tensor([[0, 2, 4], [0, 2, 3]]))
    with pytest.raises(TypeError, match="offsets"):
        document(causal(4), torch.tensor([0.0, 4.0]))
    with pytest.raises(ValueError, match="inner mask"):
        document(causal(3), [0, 4, 6])
    with pytest.raises(ValueError, match="same number of documents"):
        document(causal(4), [0, 2, 4], kv_offsets=[0, 4])
    with pytest.raises(ValueError, match="doc_ids"):
        document(causal(4), doc_ids=torch.tensor([0, -1, 0]))
    with pytest.raises(TypeError, match="doc_ids"):
        document(causal(4), doc_ids=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="inner mask 2"):
        document(prefix_lm(4, torch.tensor([1, 2])), torch.tensor([[0, 4]] * 3))


# ---------------------------------------------------------------- packed causal document
@settings(max_examples=25, deadline=None)
@given(data=st.data(), total=st.integers(1, 14), n_docs=st.integers(1, 5),
       batch=st.integers(1, 3))
def test_packed_causal_document(data, total, n_docs, batch):
    rows = data.draw(offsets_rows(total, n_docs, batch))
    mask = packed_causal_document(torch.tensor(rows))
    assert mask.has_intervals
    expected = grid(batch, total, total, packed_causal_document_ref(rows))
    check(mask, expected, data)
    # the same layout given by ids
    ids = torch.tensor([[sum(1 for c in r[1:] if c <= i) for i in range(total)] for r in rows])
    assert torch.equal(packed_causal_document(doc_ids=ids).dense(), mask.dense())


def test_packed_causal_document_noncontiguous_ids_fallback():
    ids = torch.tensor([0, 0, 1, 0, 1, 1])
    mask = packed_causal_document(doc_ids=ids)
    assert not mask.has_intervals
    expected = grid(1, 6, 6, lambda b, q, k: k <= q and ids[q] == ids[k])
    full_check(mask, expected, block_sizes=(2, (4, 3)))


# ---------------------------------------------------------------- shared prefix
@settings(max_examples=25, deadline=None)
@given(data=st.data(), total=st.integers(1, 14), n_docs=st.integers(1, 5),
       batch=st.integers(1, 2))
def test_shared_prefix(data, total, n_docs, batch):
    rows = data.draw(offsets_rows(total, n_docs, batch))
    pids = []
    for _ in range(batch):
        prefixes = data.draw(st.sets(st.integers(0, n_docs - 1), min_size=1))
        pids.append([d if d in prefixes else data.draw(st.sampled_from(sorted(prefixes)))
                     for d in range(n_docs)])
    mask = shared_prefix(torch.tensor(rows), torch.tensor(pids))
    assert mask.has_intervals and mask.batch == batch
    expected = grid(batch, total, total, shared_prefix_ref(rows, pids))
    check(mask, expected, data)


def test_shared_prefix_bad_input():
    with pytest.raises(ValueError, match="prefix_document_id"):
        shared_prefix([0, 2, 4], [0, 2])
    with pytest.raises(ValueError, match="its own prefix"):
        shared_prefix([0, 2, 4, 6], [1, 0, 0])
    with pytest.raises(ValueError, match="prefix_document_id"):
        shared_prefix([0, 2, 4], [0, 0, 0])
    with pytest.raises(TypeError, match="prefix_document_id"):
        shared_prefix([0, 2, 4], "00")


# ---------------------------------------------------------------- batchify
@settings(max_examples=30, deadline=None)
@given(data=st.data(), nq=st.integers(1, 5), nkv=st.integers(1, 5), groups=st.integers(1, 4),
       kind=st.sampled_from(["causal", "full", "rule"]))
def test_batchify(data, nq, nkv, groups, kind):
    inner, inner_ref = inner_mask(kind, nq, nkv)
    mask = batchify(inner, groups)
    assert mask.has_intervals == (kind != "rule")
    expected = grid(1, groups * nq, groups * nkv, batchify_ref(inner_ref, nq, nkv))
    check(mask, expected, data)


def test_batchify_bad_input():
    with pytest.raises(ValueError, match="num_groups"):
        batchify(causal(4), 0)
    with pytest.raises(TypeError, match="inner"):
        batchify(None, 2)


def test_flex_equals_sdpa():
    offsets = torch.tensor([[0, 3, 7, 11], [0, 5, 5, 11]])
    for mask in (document(causal(6), offsets), packed_causal_document(offsets),
                 shared_prefix(offsets, torch.tensor([[0, 0, 0], [0, 1, 0]])),
                 batchify(causal(3, 4), 3)):
        assert_flex_matches_sdpa(mask, block_size=(4, 2))
