import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.catalogue.natten import EXAMPLES, natten
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_video import natten_layout, natten_ref
from tests.masks.strategies import block_sizes


@st.composite
def natten_configs(draw):
    layout = draw(st.sampled_from(["row", "tiled", "morton"]))
    tile_w = tile_h = 1
    if layout == "row":
        w, h = draw(st.integers(1, 8)), draw(st.integers(1, 7))
    elif layout == "tiled":
        tile_w, tile_h = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        w, h = tile_w * draw(st.integers(1, 3)), tile_h * draw(st.integers(1, 3))
    else:
        w, h = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4, 8]))
    kernel_w, kernel_h = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    return w, h, kernel_w, kernel_h, layout, tile_w, tile_h


def _build(w, h, kw, kh, layout, tile_w, tile_h):
    tiles = {"tile_w": tile_w, "tile_h": tile_h} if layout == "tiled" else {}
    return natten(w, h, kw, kh, layout=layout, **tiles)


@settings(max_examples=40, deadline=None)
@given(config=natten_configs(), data=st.data())
def test_matches_reference_and_torch(config, data):
    w, h, kw, kh, layout, tile_w, tile_h = config
    mask = _build(*config)
    assert mask.has_intervals == (layout != "morton")
    expected = grid(1, w * h, w * h, natten_ref(w, h, kw, kh, layout, tile_w, tile_h))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))
    # Every query sees the same number of keys: min(window, side) per axis.
    per_row = min(2 * (kh // 2) + 1, h) * min(2 * (kw // 2) + 1, w)
    assert expected.sum(-1).eq(per_row).all()


def test_non_square_canvas_regression():
    # attention-gym's generate_natten clamps rows with the width: on a 6 wide x 3 high canvas
    # with a 3x3 kernel its last-row queries get 6 keys instead of 9.
    mask = natten(6, 3, 3, 3)
    dense = mask.dense()[0, 0]
    assert dense.sum(-1).eq(9).all()
    for x in range(6):
        q = 2 * 6 + x  # last row
        x0 = min(max(x - 1, 0), 3)
        want = {y * 6 + c for y in range(3) for c in range(x0, x0 + 3)}
        assert set(dense[q].nonzero().flatten().tolist()) == want
    full_check(mask, grid(1, 18, 18, natten_ref(6, 3, 3, 3)))


def test_even_kernel_rounds_up_to_odd_window():
    dense = natten(9, 9, 4, 2).dense()[0, 0]
    assert dense.sum(-1).eq(5 * 3).all()
    centre = 4 * 9 + 4
    keys = dense[centre].view(9, 9).nonzero()
    assert keys[:, 0].unique().tolist() == [3, 4, 5]           # kernel_h=2 -> 3 rows
    assert keys[:, 1].unique().tolist() == [2, 3, 4, 5, 6]     # kernel_w=4 -> 5 columns


def test_kernel_larger_than_canvas_sees_whole_axis():
    dense = natten(5, 2, 3, 7).dense()[0, 0]
    for q in range(10):
        keys = dense[q].view(2, 5).nonzero()
        assert keys[:, 0].unique().tolist() == [0, 1]


@pytest.mark.parametrize("layout,tiles", [("tiled", {"tile_w": 4, "tile_h": 2}),
                                          ("morton", {})])
def test_layouts_are_permutations_of_row_major(layout, tiles):
    w, h = 8, 4
    row = natten(w, h, 5, 3).dense()[0, 0]
    other = natten(w, h, 5, 3, layout=layout, **tiles).dense()[0, 0]
    coords = natten_layout(w, h, layout, tiles.get("tile_w", 1), tiles.get("tile_h", 1))
    perm = torch.tensor([y * w + x for y, x in coords])  # layout index -> row-major index
    assert torch.equal(other, row[perm][:, perm])


def test_tiled_intervals_are_few_runs_per_row():
    mask = natten(16, 16, 5, 5, layout="tiled", tile_w=4, tile_h=4)
    lo, hi = mask.row_intervals()
    runs = (hi > lo).sum(-1)
    assert int(runs.max()) <= 5 * 2  # window rows x tile columns touched (merged when adjacent)


def test_larger_canvas_against_torch():
    for mask in (natten(24, 16, 7, 5),
                 natten(24, 16, 7, 5, layout="tiled", tile_w=8, tile_h=4),
                 natten(16, 32, 5, 3, layout="morton")):
        for bs in (128, (64, 32), (16, 48)):
            assert_matches_create_block_mask(mask, bs)


def test_flex_forward_equals_sdpa():
    for mask in (natten(6, 3, 3), natten(8, 4, 3, 5, layout="morton"),
                 natten(6, 4, 3, 3, layout="tiled", tile_w=3, tile_h=2)):
        for bs in (4, (8, 2)):
            assert_flex_matches_sdpa(mask, block_size=bs)


def test_examples_build():
    for name, build in EXAMPLES.items():
        mask = build(300, 16)
        assert mask.q_len == mask.kv_len >= 64, name
        assert mask.tile_map(16).shape[0] == 1


def test_bad_input():
    with pytest.raises(ValueError, match="canvas_w"):
        natten(0, 3, 3)
    with pytest.raises(TypeError, match="canvas_h"):
        natten(3, 2.0, 3)
    with pytest.raises(ValueError, match="kernel_w"):
        natten(3, 3, 0)
    with pytest.raises(ValueError, match="kernel_h"):
        natten(3, 3, 3, -1)
    with pytest.raises(ValueError, match="layout"):
        natten(4, 4, 3, layout="column")
    with pytest.raises(ValueError, match="tile_w"):
        natten(4, 4, 3, layout="tiled")
    with pytest.raises(ValueError, match="canvas_w=6, tile_w=4"):
        natten(6, 4, 3, layout="tiled", tile_w=4)
    with pytest.raises(ValueError, match="canvas_h=6, tile_h=4"):
        natten(8, 6, 3, layout="tiled", tile_w=4)
    with pytest.raises(ValueError, match="tile_w"):
        natten(4, 4, 3, layout="row", tile_w=2)
    with pytest.raises(ValueError, match="canvas_w=6"):
        natten(6, 8, 3, layout="morton")
    with pytest.raises(ValueError, match="canvas_h=12"):
        natten(8, 12, 3, layout="morton")
