"""corrupt_documents: on a packed row each document gets exactly the noise it gets alone."""

from __future__ import annotations

import functools

import pytest
import torch

from dlmkit.diffusion import (
    corrupt_blockwise,
    corrupt_mix,
    corrupt_scdd,
    corrupt_uniform,
    corrupt_uniform_random,
)
from dlmkit.diffusion.documents import corrupt_documents

V, MASK = 20, 19
CORRUPTIONS = {
    "uniform": functools.partial(corrupt_uniform, mask_token_id=MASK),
    "uniform_blocks": functools.partial(corrupt_uniform, mask_token_id=MASK, block_size=3),
    "blockwise": functools.partial(corrupt_blockwise, mask_token_id=MASK, block_size=3),
    "blockwise_rows": functools.partial(corrupt_blockwise, mask_token_id=MASK),
    "uniform_random": functools.partial(corrupt_uniform_random, vocab_size=V, block_size=3),
    "mix": functools.partial(corrupt_mix, mask_token_id=MASK, vocab_size=V, mask_prob=0.3,
                             uniform_prob=0.3),
    "scdd": functools.partial(corrupt_scdd, mask_token_id=MASK, vocab_size=V, max_ratio=0.3),
}


def generators(*seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_packed_document_gets_the_noise_it_gets_alone(name):
    corruption = CORRUPTIONS[name]
    lengths = [[4, 7, 2], [9]]  # two rows; row 0 packs three documents at offsets 0, 4, 11
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, MASK, (2, 16), generator=g)
    loss_mask = (torch.rand(2, 16, generator=g) < 0.8).long()
    doc_ids = torch.full((2, 16), -1)
    at = 0
    for d, n in enumerate(lengths[0]):
        doc_ids[0, at:at + n] = d
        at += n
    doc_ids[1, :9] = 0
    loss_mask[doc_ids < 0] = 0
    seeds = [11, 12, 13, 14]
    noisy, noise, p = corrupt_documents(corruption, ids, loss_mask, doc_ids=doc_ids,
                                        generator=generators(*seeds))
    k = 0
    for row, row_lengths in enumerate(lengths):
        at = 0
        for n in row_lengths:
            span = slice(at, at + n)
            alone = corruption(ids[row:row + 1, span], loss_mask[row:row + 1, span],
                               generator=generators(seeds[k]))
            for got, want in zip((noisy, noise, p), alone):
                torch.testing.assert_close(got[row:row + 1, span], want)
            at, k = at + n, k + 1
    outside = doc_ids < 0
    assert torch.equal(noisy[outside], ids[outside]) and not noise[outside].any()
    assert bool((p[outside] == 1).all())


def test_per_position_arguments_are_cut_like_the_ids_and_one_document_per_row_is_a_plain_call():
    ids = torch.randint(0, MASK, (1, 6))
    ones = torch.ones(1, 6, dtype=torch.long)
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    seen = {}

    def spy(input_ids, loss_mask, *, generator, offset):
        seen["offset"] = offset
        return input_ids, loss_mask != 0, torch.zeros(input_ids.shape)

    corrupt_documents(spy, ids, ones, doc_ids=doc_ids, generator=generators(1, 2),
                      offset=torch.arange(6).view(1, 6))
    assert seen["offset"].tolist() == [[0, 1, 2], [3, 4, 5]]
    plain = corrupt_uniform(ids, ones, MASK, generator=generators(5))
    for a, b in zip(corrupt_documents(corrupt_uniform, ids, ones, MASK, doc_ids=None,
                                      generator=generators(5)), plain):
        assert torch.equal(a, b)


def test_bad_documents_are_named():
    ids, ones = torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="one contiguous run"):
        corrupt_documents(corrupt_uniform, ids, ones, MASK, doc_ids=torch.tensor([[0, 1, 0, 1]]),
                          generator=generators(1, 2))
    with pytest.raises(ValueError, match="in no document"):
        corrupt_documents(corrupt_uniform, ids, ones, MASK, doc_ids=torch.tensor([[0, 0, 0, -1]]),
                          generator=generators(1))
    with pytest.raises(ValueError, match=r"one per document \(2 in these packed rows\), got 1"):
        corrupt_documents(corrupt_uniform, ids, ones, MASK, doc_ids=torch.tensor([[0, 0, 1, 1]]),
                          generator=generators(1))
