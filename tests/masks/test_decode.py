import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks import block_diffusion, causal, idlm
from dlmkit.masks.decode import block_diffusion_decode, causal_decode, dflash_decode, idlm_decode
from dlmkit.masks.dflash import dflash
from tests.masks.compare import assert_flex_matches_sdpa, full_check
from tests.masks.strategies import block_sizes


def sub_grid(mask, rows, cols):
    return mask.dense()[:, 0][:, rows][:, :, cols]


@settings(max_examples=25, deadline=None)
@given(prefix=st.integers(0, 9), block=st.integers(1, 4), blocks=st.integers(1, 3),
       tail=st.integers(0, 3), data=st.data())
def test_block_diffusion_decode_is_rows_of_the_training_mask(prefix, block, blocks, tail, data):
    n = blocks * block
    L = prefix + n + tail
    training = block_diffusion(L, block)
    rows = list(range(prefix, prefix + n))  # the noisy tokens being decoded
    cols = [L + k for k in range(prefix)] + rows  # clean cache, then the noisy tokens
    mask = block_diffusion_decode(prefix, block, blocks)
    # A cached token of the first block's head [prefix // block * block, prefix) is committed:
    # in training the block's noisy rows see it in x_t, so its cache column is also x_t's.
    head = [k if k >= prefix // block * block else L + k for k in range(prefix)] + rows
    expected = sub_grid(training, rows, cols) | sub_grid(training, rows, head)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes),))


def test_block_diffusion_decode_sees_committed_tokens_of_its_own_block():
    dense = block_diffusion_decode(5, 4, 1).dense()[0, 0]  # keys [cache 0..4 | new 5..8]
    assert dense[0, 4]  # position 5 sees position 4, committed in its own block [4, 8)
    assert dense[:, :5].all()  # every row sees the whole cache
    assert dense[:3, 5:8].all() and not dense[:3, 8].any()  # own block [4, 8) only
    assert dense[3, 5:].tolist() == [False, False, False, True]  # position 8: block [8, 12)


@settings(max_examples=20, deadline=None)
@given(blocks_before=st.integers(0, 3), verify=st.integers(0, 5), block=st.integers(1, 4),
       data=st.data())
def test_idlm_decode_is_rows_of_the_training_mask(blocks_before, verify, block, data):
    # The noisy block starts on the training block grid: P + V is a multiple of block_size.
    start = (blocks_before * block + verify + block - 1) // block * block
    verify = min(verify, start)
    prefix = start - verify
    L = start + block
    training = idlm(L, block)
    clean_rows = [L + k for k in range(prefix, start)]
    noisy_rows = list(range(start, L))
    cols = [L + k for k in range(start)] + noisy_rows
    mask = idlm_decode(prefix, verify, block)
    expected = sub_grid(training, clean_rows + noisy_rows, cols)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes),))


@settings(max_examples=15, deadline=None)
@given(cache=st.integers(0, 12), new=st.integers(1, 6), data=st.data())
def test_causal_decode_is_rows_of_causal(cache, new, data):
    L = cache + new
    expected = sub_grid(causal(L), list(range(cache, L)), list(range(L)))
    full_check(causal_decode(cache, new), expected, block_sizes=(data.draw(block_sizes),))


@settings(max_examples=15, deadline=None)
@given(ctx=st.integers(0, 12), block=st.integers(1, 4), causal_=st.booleans(),
       window=st.one_of(st.none(), st.integers(0, 6)), data=st.data())
def test_dflash_decode_is_rows_of_a_training_block(ctx, block, causal_, window, data):
    # training: two blocks, the second anchored at `ctx` over a longer context
    long_ctx = ctx + 5
    training = dflash(torch.tensor([[min(2, ctx), ctx]]), None, long_ctx, block, causal_, window)
    rows = list(range(block, 2 * block))
    cols = list(range(ctx)) + [long_ctx + block + k for k in range(block)]
    mask = dflash_decode(ctx, block, causal_, window)
    full_check(mask, sub_grid(training, rows, cols), block_sizes=(data.draw(block_sizes),))


def test_several_blocks_see_the_cache_and_themselves_only():
    dense = block_diffusion_decode(4, 2, 3).dense()[0, 0]
    for j in range(3):
        row = dense[2 * j]
        assert row[:4].all()
        assert row[4:].nonzero().flatten().tolist() == [2 * j, 2 * j + 1]


def test_flex_forward_equals_sdpa():
    for mask in (block_diffusion_decode(7, 4, 3), idlm_decode(8, 3, 4), causal_decode(9, 5)):
        assert_flex_matches_sdpa(mask, block_size=(8, 4))


def test_bad_input():
    with pytest.raises(ValueError, match="prefix_len must be >= 0, got -1"):
        block_diffusion_decode(-1, 4)
    with pytest.raises(ValueError, match="num_blocks must be >= 1, got 0"):
        block_diffusion_decode(4, 4, 0)
    with pytest.raises(ValueError, match="verify_len must be >= 0, got -2"):
        idlm_decode(4, -2, 4)
    with pytest.raises(ValueError, match="cache_len must be >= 0, got -1"):
        causal_decode(-1, 2)
    with pytest.raises(ValueError, match="num_tokens must be >= 1, got 0"):
        causal_decode(3, 0)
    with pytest.raises(ValueError, match="ctx_len must be >= 0"):
        dflash_decode(-1, 4)
