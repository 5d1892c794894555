import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.catalogue.prefix import prefix_lm
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_catalog import prefix_lm_ref
from tests.masks.strategies import block_sizes


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 14), per_row=st.booleans())
def test_matches_reference_and_torch(data, seq_len, per_row):
    if per_row:
        lengths = data.draw(st.lists(st.integers(0, seq_len), min_size=1, max_size=3))
        mask = prefix_lm(seq_len, torch.tensor(lengths))
        assert mask.batch == len(lengths)
    else:
        lengths = [data.draw(st.integers(0, seq_len))]
        mask = prefix_lm(seq_len, lengths[0])
    expected = grid(mask.batch, seq_len, seq_len, prefix_lm_ref(lengths))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_prefix_is_strict():
    # Keys 0 .. P-1 are the prefix (the tutorial notebook's k <= P is off by one).
    d = prefix_lm(6, 2).dense()[0, 0]
    assert d[0].tolist() == [True, True, False, False, False, False]
    assert torch.equal(prefix_lm(6, 0).dense(), prefix_lm(6, 1).dense())  # both causal


def test_large_and_flex():
    assert_matches_create_block_mask(prefix_lm(300, torch.tensor([0, 131, 300])), (64, 128))
    assert_flex_matches_sdpa(prefix_lm(11, torch.tensor([3, 7])), block_size=4)


def test_bad_input():
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm(8, 9)
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm(8, -1)
    with pytest.raises(TypeError, match="prefix_length"):
        prefix_lm(8, 2.0)
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm(8, torch.tensor([1, 9]))
    with pytest.raises(TypeError, match="prefix_length"):
        prefix_lm(8, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="seq_len"):
        prefix_lm(0, 0)
