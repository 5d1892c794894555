"""bench/adapt_suspects.py: its token-causal-clean bd3lm mask against brute force, and its
patches of the scorers' layout and the samplers' commit order, undone on exit."""

from __future__ import annotations

import pytest
import torch

from tests.scripts import bench_script


@pytest.mark.parametrize("seq_len,block", [(4, 2), (7, 3), (5, 1), (6, 6)])
def test_token_causal_clean_mask_is_bd3lm_s_but_the_clean_stream(seq_len, block):
    from dlmkit.masks import block_diffusion

    got = bench_script("adapt_suspects").token_causal_clean(seq_len, block).dense()[0, 0]
    L = seq_len
    want = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    for q in range(2 * L):
        for kv in range(2 * L):
            if q < L and kv < L:
                want[q, kv] = q // block == kv // block
            elif q < L:
                want[q, kv] = (kv - L) // block < q // block
            elif kv >= L:
                want[q, kv] = kv <= q  # the clean stream, token-causal
    assert torch.equal(got, want)
    bd3lm = block_diffusion(L, block).dense()[0, 0]
    assert torch.equal(got[:L], bd3lm[:L])  # the noisy rows are bd3lm's
    assert torch.equal(got[L:, L:] <= bd3lm[L:, L:], torch.ones(L, L, dtype=torch.bool))


def test_the_patches_are_undone_and_order_left_to_right():
    from dlmkit.decoding import commit, likelihood

    suspects = bench_script("adapt_suspects")
    layout, confidence = likelihood.layout_attention, commit.confidence
    with suspects.clean_attention("token"):
        assert likelihood.layout_attention is not layout
        mask, _ = likelihood.layout_attention("block", 4, block_size=2)
        assert mask.dense()[0, 0, 4, 5].item() is False  # clean row 0 does not see clean 1
        with suspects.commit_order("left_to_right"):
            scores = commit.confidence(torch.zeros(2, 5, 3), torch.zeros(2, 5, dtype=torch.long),
                                       "low_confidence", None)
            assert (scores[:, :-1] > scores[:, 1:]).all()  # the leftmost is the surest
    assert likelihood.layout_attention is layout and commit.confidence is confidence
    with pytest.raises(RuntimeError), suspects.clean_attention("token"):
        raise RuntimeError
    assert likelihood.layout_attention is layout
