import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks import block_diffusion, idlm
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid, with_padding
from tests.masks.reference_dllm import packed_ref
from tests.masks.strategies import block_sizes, padding

FACTORIES = {"block_diffusion": block_diffusion, "idlm": idlm}


@st.composite
def doc_ids(draw, seq_len, batch):
    rows = [draw(st.lists(st.integers(0, 3), min_size=seq_len, max_size=seq_len))
            for _ in range(batch)]
    if draw(st.booleans()):
        rows = [sorted(r) for r in rows]  # contiguous documents (the packing case)
    return rows


@pytest.mark.parametrize("name", FACTORIES)
@settings(max_examples=20, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 11), block=st.integers(1, 5))
def test_matches_reference_and_torch(name, data, seq_len, block):
    valid = data.draw(padding(seq_len))
    batch = data.draw(st.integers(1, 3)) if valid is None else valid.shape[0]
    docs = data.draw(doc_ids(seq_len, data.draw(st.sampled_from([1, batch]))))
    mask = FACTORIES[name](seq_len, block, valid, doc_ids=torch.tensor(docs))
    assert mask.batch == max(1 if valid is None else batch, len(docs))
    docs = docs * (mask.batch // len(docs))
    rows = None if valid is None else (valid.tolist() * mask.batch)[: mask.batch]
    rule = with_padding(rows, seq_len, packed_ref(seq_len, block, docs, name))
    expected = grid(mask.batch, 2 * seq_len, 2 * seq_len, rule)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes),))


@pytest.mark.parametrize("name", FACTORIES)
def test_packed_row_is_the_unpacked_samples(name):
    factory = FACTORIES[name]
    lengths, S = [5, 3, 7], 2
    L = sum(lengths)
    docs = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths)).unsqueeze(0)
    packed = factory(L, S, doc_ids=docs)
    assert packed.has_intervals and packed.row_intervals()[0].shape[-1] <= 2
    dense = packed.dense()[0, 0]
    start = 0
    for n in lengths:
        idx = list(range(start, start + n)) + list(range(L + start, L + start + n))
        alone = factory(n, S).dense()[0, 0]
        assert torch.equal(dense[idx][:, idx], alone)
        other = torch.ones(2 * L, dtype=torch.bool)
        other[idx] = False
        assert not dense[idx][:, other].any()  # never across documents
        start += n


def test_scattered_documents_fall_back_to_rule_evaluation():
    docs = torch.tensor([[0, 1, 0, 1, 1, 0]])
    mask = idlm(6, 2, doc_ids=docs)
    assert not mask.has_intervals
    assert block_diffusion(6, 2, doc_ids=torch.tensor([[0, 0, 1, 1, 2, 2]])).has_intervals


def test_flex_and_large_block_mask():
    L = 200
    docs = torch.bucketize(torch.arange(L), torch.tensor([37, 150, 151, 180])).expand(2, L)
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, 190:] = False
    for factory in (block_diffusion, idlm):
        mask = factory(L, 16, valid, doc_ids=docs)
        assert mask.has_intervals
        assert_matches_create_block_mask(mask, 128)
        assert_matches_create_block_mask(mask, (64, 32))
    for factory in (block_diffusion, idlm):
        assert_flex_matches_sdpa(factory(13, 3, doc_ids=torch.tensor([[0] * 5 + [1] * 8])),
                                 block_size=(8, 4))


@pytest.mark.parametrize("factory", [block_diffusion, idlm])
def test_bad_input(factory):
    with pytest.raises(ValueError, match=r"doc_ids must have shape \[batch, 8\]"):
        factory(8, 4, doc_ids=torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(TypeError, match="doc_ids must hold integers"):
        factory(8, 4, doc_ids=torch.zeros(1, 8))
    with pytest.raises(ValueError, match="doc_ids must be >= 0, got minimum -1"):
        factory(8, 4, doc_ids=torch.full((1, 8), -1))
    with pytest.raises(ValueError, match="do not broadcast"):
        factory(8, 4, torch.ones(3, 8), doc_ids=torch.zeros(2, 8, dtype=torch.long))
