import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask

from dlmkit.masks.causal import causal
from tests.masks.compare import (
    assert_block_masks_equal,
    assert_flex_matches_sdpa,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_catalog import causal_ref
from tests.masks.strategies import block_sizes


@settings(max_examples=25, deadline=None)
@given(data=st.data(), q_len=st.integers(1, 14), kv_len=st.integers(1, 14),
       align=st.sampled_from(["top_left", "bottom_right"]), extra=st.integers(0, 3))
def test_matches_reference_and_torch(data, q_len, kv_len, align, extra):
    base = kv_len - q_len if align == "bottom_right" else 0
    offset = max(0, -base) + extra  # smallest offset that leaves no empty row, plus extra
    mask = causal(q_len, kv_len, offset, align=align)
    expected = grid(1, q_len, kv_len, causal_ref(q_len, kv_len, offset, align))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@pytest.mark.parametrize("q_len,kv_len", [(256, 256), (200, 300), (300, 200), (97, 97)])
def test_tuple_block_sizes_128_64_regression(q_len, kv_len):
    # attention-gym's fast causal builder drops visible KV blocks when q_block != kv_block
    # (256 x 256 with (128, 64) gives rows [[1,0,0,0],[1,1,0,0]] instead of
    # [[1,1,0,0],[1,1,1,1]]) and labels padded blocks full.
    mask = causal(q_len, kv_len)
    for bs in ((128, 64), (64, 128)):
        theirs = create_block_mask(mask.mask_mod, 1, None, q_len, kv_len, device="cpu",
                                   BLOCK_SIZE=bs)
        assert_block_masks_equal(mask.block_mask(bs), theirs, f"{q_len}x{kv_len} {bs}")
    if (q_len, kv_len) == (256, 256):
        dense = mask.block_mask((128, 64)).to_dense()[0, 0]
        assert dense.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_bottom_right_last_query_sees_last_key():
    mask = causal(3, 7, align="bottom_right")
    d = mask.dense()[0, 0]
    assert d[-1].all() and d[0].sum() == 5
    assert causal(3, 7, 1).dense()[0, 0, 0].sum() == 2


def test_flex_equals_sdpa():
    for mask in (causal(11), causal(7, 13, align="bottom_right"), causal(13, 7, 2)):
        assert_flex_matches_sdpa(mask, block_size=(4, 8))


def test_bad_input():
    with pytest.raises(ValueError, match="q_len"):
        causal(0)
    with pytest.raises(TypeError, match="kv_len"):
        causal(4, 2.0)
    with pytest.raises(ValueError, match="align"):
        causal(4, align="middle")
    with pytest.raises(ValueError, match="offset"):
        causal(8, 4, align="bottom_right")
    with pytest.raises(TypeError, match="offset"):
        causal(4, offset=0.5)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 14), batch=st.integers(1, 3))
def test_padded_causal_matches_reference(data, seq_len, batch):
    """Autoregressive SFT mask: causal over the real tokens, every row keeps its diagonal."""
    from dlmkit.masks.causal import padded_causal

    valid = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 1), min_size=seq_len,
                                                     max_size=seq_len),
                                            min_size=batch, max_size=batch)))
    q = torch.arange(seq_len).view(1, -1, 1)
    k = torch.arange(seq_len).view(1, 1, -1)
    real = valid.bool()
    expected = ((k <= q) & real[:, :, None] & real[:, None, :]) | (q == k)
    full_check(padded_causal(seq_len, valid), expected,
               block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))
