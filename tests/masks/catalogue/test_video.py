import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dlmkit.masks.catalogue.video import EXAMPLES, sta, svg_spatial, svg_temporal
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_video import sta_ref, svg_spatial_ref, svg_temporal_ref
from tests.masks.strategies import block_sizes


@st.composite
def sta_configs(draw):
    dims = draw(st.sampled_from([2, 3]))
    tile = tuple(draw(st.integers(1, 3 if dims == 2 else 2)) for _ in range(dims))
    canvas = tuple(t * draw(st.integers(1, 3)) for t in tile)
    kernel = tuple(t * draw(st.integers(1, 4)) for t in tile)  # may exceed the canvas
    text = draw(st.integers(0, 4))
    extra = draw(st.integers(0, 3))
    return canvas, kernel, tile, text, extra


@settings(max_examples=40, deadline=None)
@given(config=sta_configs(), data=st.data())
def test_sta_matches_reference_and_torch(config, data):
    canvas, kernel, tile, text, extra = config
    n = math.prod(canvas) + text + extra
    assume(n <= 120)
    mask = sta(canvas, kernel, tile, text, seq_len=n)
    assert mask.has_intervals
    expected = grid(1, n, n, sta_ref(canvas, kernel, tile, text))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_sta_window_is_kernel_tiles_wide():
    # 2-D, 4x4 tile grid of 2x2 tiles, kernel 3x2 tiles: every vision query sees 6 tiles.
    mask = sta((8, 8), (6, 4), (2, 2))
    assert mask.dense()[0, 0].sum(-1).eq(6 * 4).all()
    # Even kernel (2 tiles): window [centre - 1, centre]; tile 0 clamps to [0, 1].
    dense = sta((8, 2), (4, 2), (2, 2)).dense()[0, 0]
    tile_of = torch.arange(16) // 4
    seen = [sorted(set(tile_of[dense[q]].tolist())) for q in range(0, 16, 4)]
    assert seen == [[0, 1], [0, 1], [1, 2], [2, 3]]


def test_sta_text_and_padding_rows():
    mask = sta((4, 4), (2, 2), (2, 2), text_len=3, seq_len=22)
    dense = mask.dense()[0, 0]
    vision, used = 16, 19
    assert dense[:vision, vision:used].all()          # vision rows see all text
    assert dense[vision:, :used].all()                # text and padding rows see everything
    assert not dense[:, used:].any()                  # padding keys never attended
    assert mask.name.startswith("sta_4x4")


@st.composite
def svg_configs(draw):
    prompt = draw(st.integers(0, 4))
    frames = draw(st.integers(1, 4))
    per_frame = draw(st.integers(1, 6))
    width = draw(st.sampled_from([0.3, 0.5, 1, 1.5, 2, 3]))
    return prompt, frames, per_frame, width


@settings(max_examples=30, deadline=None)
@given(config=svg_configs(), sink=st.booleans(), round_width=st.integers(1, 8), data=st.data())
def test_svg_spatial_matches_reference_and_torch(config, sink, round_width, data):
    prompt, frames, tpf, width = config
    band = int(width * tpf // round_width) * round_width
    if band == 0 and prompt == 0 and not sink:
        with pytest.raises(ValueError, match="empty"):
            svg_spatial(prompt, frames, tpf, width, sink, round_width)
        return
    mask = svg_spatial(prompt, frames, tpf, width, sink, round_width)
    n = prompt + frames * tpf
    expected = grid(1, n, n, svg_spatial_ref(prompt, tpf, width, sink, round_width))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=30, deadline=None)
@given(config=svg_configs(), data=st.data())
def test_svg_temporal_matches_reference_and_torch(config, data):
    prompt, frames, tpf, width = config
    band = int(width * tpf // frames)
    if band == 0 and prompt == 0:
        with pytest.raises(ValueError, match="empty"):
            svg_temporal(prompt, frames, tpf, width)
        return
    mask = svg_temporal(prompt, frames, tpf, width)
    n = prompt + frames * tpf
    expected = grid(1, n, n, svg_temporal_ref(prompt, frames, tpf, width))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_svg_defaults_are_attention_gym_defaults():
    spatial, temporal = svg_spatial(), svg_temporal()
    assert spatial.q_len == temporal.q_len == 226 + 13 * 1350
    assert spatial.name.endswith("band2688")   # floor(2 * 1350 / 128) * 128
    assert temporal.name.endswith("band207")   # floor(2 * 1350 / 13)
    # Structured: the tile map never touches the 17776^2 grid.
    tiles = spatial.tile_map(128)
    assert tiles.shape == (1, 139, 139)


def test_svg_spatial_band_can_vanish():
    # round_width larger than width * tokens_per_frame: video rows see only the prompt.
    dense = svg_spatial(2, 2, 4, width=1, round_width=8).dense()[0, 0]
    assert dense[2:, 2:].sum() == 0 and dense[2:, :2].all()


def test_larger_configs_against_torch():
    masks = (sta((4, 8, 8), (2, 4, 4), (1, 2, 2), text_len=20),
             svg_spatial(30, 5, 60, width=1.5, attn_sink=True, round_width=16),
             svg_temporal(30, 5, 60, width=2))
    for mask in masks:
        for bs in (128, (64, 32), (16, 48)):
            assert_matches_create_block_mask(mask, bs)


def test_flex_forward_equals_sdpa():
    masks = (sta((4, 4), (2, 4), (2, 2), text_len=3, seq_len=21),
             sta((2, 4, 4), (2, 4, 2), (1, 2, 2), text_len=2),
             svg_spatial(3, 3, 5, width=1, attn_sink=True, round_width=2),
             svg_temporal(3, 3, 5, width=1.5))
    for mask in masks:
        for bs in (4, (8, 2)):
            assert_flex_matches_sdpa(mask, block_size=bs)


def test_examples_build():
    for name, build in EXAMPLES.items():
        mask = build(2000, 64)
        assert 1000 <= mask.q_len <= 2100, (name, mask.q_len)
        assert mask.has_intervals
        mask.tile_map(64)


def test_bad_input():
    with pytest.raises(ValueError, match=r"canvas\[w\]=6 must be a multiple of tile\[w\]=4"):
        sta((4, 6), (4, 4), (2, 4))
    with pytest.raises(ValueError, match=r"kernel\[h\]=3"):
        sta((4, 4), (3, 2), (2, 2))
    with pytest.raises(ValueError, match="kernel must have 2"):
        sta((4, 4), (2, 2, 2), (2, 2))
    with pytest.raises(ValueError, match="canvas must have"):
        sta((4,), (2,), (2,))
    with pytest.raises(TypeError, match="canvas"):
        sta(16, 4, 2)
    with pytest.raises(ValueError, match=r"tile\[1\]"):
        sta((4, 4), (2, 2), (2, 0))
    with pytest.raises(ValueError, match="text_len"):
        sta((4, 4), (2, 2), (2, 2), text_len=-1)
    with pytest.raises(ValueError, match="seq_len"):
        sta((4, 4), (2, 2), (2, 2), text_len=2, seq_len=17)
    with pytest.raises(ValueError, match="prompt_len"):
        svg_spatial(-1)
    with pytest.raises(ValueError, match="num_frames"):
        svg_temporal(num_frames=0)
    with pytest.raises(ValueError, match="tokens_per_frame"):
        svg_spatial(tokens_per_frame=0)
    with pytest.raises(ValueError, match="width"):
        svg_temporal(width=0)
    with pytest.raises(TypeError, match="width"):
        svg_temporal(width="2")
    with pytest.raises(ValueError, match="round_width"):
        svg_spatial(round_width=0)
    with pytest.raises(TypeError, match="attn_sink"):
        svg_spatial(attn_sink=1)
