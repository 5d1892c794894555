import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.catalogue.window import (
    dilated_sliding_window,
    global_sliding_window,
    sliding_window,
)
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_catalog import (
    dilated_sliding_window_ref,
    global_sliding_window_ref,
    sliding_window_ref,
)
from tests.masks.strategies import block_sizes


@settings(max_examples=25, deadline=None)
@given(data=st.data(), q_len=st.integers(1, 14), extra=st.integers(0, 5),
       window=st.integers(0, 6), align=st.sampled_from(["top_left", "bottom_right"]))
def test_sliding_window(data, q_len, extra, window, align):
    kv_len = q_len + extra
    mask = sliding_window(q_len, window, kv_len, align=align)
    expected = grid(1, q_len, kv_len, sliding_window_ref(q_len, kv_len, window, align))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_sliding_window_is_inclusive():
    rows = sliding_window(10, 3).dense()[0, 0].sum(-1).tolist()
    assert rows == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]  # window + 1 keys once warmed up


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 16), window=st.integers(0, 7),
       dilation=st.integers(1, 4))
def test_dilated_sliding_window(data, seq_len, window, dilation):
    mask = dilated_sliding_window(seq_len, window, dilation)
    expected = grid(1, seq_len, seq_len, dilated_sliding_window_ref(window, dilation))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 14), window=st.integers(0, 4),
       batch=st.integers(1, 3))
def test_global_sliding_window(data, seq_len, window, batch):
    rows = [data.draw(st.lists(st.integers(0, 1), min_size=seq_len, max_size=seq_len))
            for _ in range(batch)]
    is_global = torch.tensor(rows, dtype=data.draw(st.sampled_from([torch.bool, torch.int64])))
    mask = global_sliding_window(seq_len, window, is_global)
    assert mask.batch == batch and mask.has_intervals
    expected = grid(batch, seq_len, seq_len, global_sliding_window_ref(window, rows))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_global_positions_are_data():
    g = torch.zeros(9, dtype=torch.bool)
    g[4] = True
    one = global_sliding_window(9, 1, g)
    g2 = g.clone()
    g2[0] = True
    two = global_sliding_window(9, 1, g2)
    assert one.dense()[0, 0, 0].sum() == 3 and two.dense()[0, 0, 0].all()
    # 1-D global tensor = one layout for every row
    assert global_sliding_window(9, 1, g).batch == 1


def test_large_shapes_match_torch():
    assert_matches_create_block_mask(sliding_window(300, 40), (128, 64))
    assert_matches_create_block_mask(dilated_sliding_window(300, 40, 3), 128)
    g = torch.zeros(2, 300, dtype=torch.bool)
    g[0, [0, 1, 2, 150]] = True
    g[1, 299] = True
    assert_matches_create_block_mask(global_sliding_window(300, 20, g), (64, 128))


def test_flex_equals_sdpa():
    g = torch.tensor([1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0])
    for mask in (sliding_window(11, 2), dilated_sliding_window(11, 4, 2),
                 global_sliding_window(11, 1, g)):
        assert_flex_matches_sdpa(mask, block_size=4)


def test_bad_input():
    with pytest.raises(ValueError, match="window"):
        sliding_window(8, -1)
    with pytest.raises(TypeError, match="window"):
        sliding_window(8, 1.5)
    with pytest.raises(ValueError, match="align"):
        sliding_window(8, 2, align="center")
    with pytest.raises(ValueError, match="kv_len"):
        sliding_window(8, 2, 4)  # last queries would see nothing
    with pytest.raises(ValueError, match="kv_len"):
        sliding_window(8, 2, 4, align="bottom_right")
    with pytest.raises(ValueError, match="dilation"):
        dilated_sliding_window(8, 2, 0)
    with pytest.raises(TypeError, match="dilation"):
        dilated_sliding_window(8, 2, 1.0)
    with pytest.raises(ValueError, match="is_global"):
        global_sliding_window(8, 2, torch.zeros(7, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_global"):
        global_sliding_window(8, 2, torch.full((8,), 2))
    with pytest.raises(TypeError, match="is_global"):
        global_sliding_window(8, 2, [0] * 8)


@pytest.mark.parametrize("window,dilation", [(0, 1), (5, 1), (7, 2), (40, 3), (9, 10)])
def test_dilated_closed_form_tile_map_equals_interval_tile_map(window, dilation):
    from dlmkit.masks.tiles import tile_map_from_intervals

    mask = dilated_sliding_window(301, window, dilation)
    lo, hi = mask.row_intervals()
    for q_block, kv_block in ((1, 1), (4, 4), (3, 7), (64, 128), (128, 128)):
        expected = tile_map_from_intervals(lo, hi, 301, 301, q_block, kv_block)
        assert torch.equal(mask.tile_map((q_block, kv_block)), expected), (q_block, kv_block)
