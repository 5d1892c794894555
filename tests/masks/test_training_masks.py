"""bidirectional (MDLM) and hybrid (AR + diffusion) training masks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks import bidirectional, hybrid
from tests.masks.compare import assert_flex_matches_sdpa, full_check
from tests.masks.reference import block_diffusion_ref, grid, idlm_ref, with_padding
from tests.masks.strategies import block_sizes, padding


def hybrid_ref(L, S):
    noisy_rows, clean_rows = block_diffusion_ref(L, S), idlm_ref(L, S)
    return lambda b, q, k: noisy_rows(b, q, k) if q < L else clean_rows(b, q, k)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 13), block=st.integers(1, 7))
def test_hybrid_matches_reference_and_torch(data, seq_len, block):
    valid = data.draw(padding(seq_len))
    mask = hybrid(seq_len, block, valid)
    batch = 1 if valid is None else valid.shape[0]
    rows = None if valid is None else valid.tolist()
    expected = grid(batch, 2 * seq_len, 2 * seq_len,
                    with_padding(rows, seq_len, hybrid_ref(seq_len, block)))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 20))
def test_bidirectional_matches_reference_and_torch(data, seq_len):
    valid = data.draw(padding(seq_len))
    mask = bidirectional(seq_len, valid)
    batch = 1 if valid is None else valid.shape[0]
    rows = None if valid is None else valid.tolist()
    expected = grid(batch, seq_len, seq_len, with_padding(rows, seq_len, lambda b, q, k: True))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_hybrid_clean_half_is_token_causal_and_flex_matches_sdpa():
    mask = hybrid(6, 3)
    dense = mask.dense()[0, 0]
    clean = dense[6:, 6:]
    assert bool((clean == clean.new_ones(6, 6).tril()).all())
    assert not bool(dense[6:, :6].any())  # the clean half never sees the noisy half
    assert_flex_matches_sdpa(mask, block_size=4)


def test_bad_input():
    with pytest.raises(ValueError, match="seq_len"):
        bidirectional(0)
    with pytest.raises(ValueError, match="block_size"):
        hybrid(4, 0)
