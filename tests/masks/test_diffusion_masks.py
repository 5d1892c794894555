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
from tests.masks.reference import block_diffusion_ref, grid, idlm_ref, with_padding
from tests.masks.strategies import block_sizes, padding

FACTORIES = {"block_diffusion": (block_diffusion, block_diffusion_ref), "idlm": (idlm, idlm_ref)}


@pytest.mark.parametrize("name", FACTORIES)
@settings(max_examples=25, deadline=None)
@given(data=st.data(), seq_len=st.integers(1, 13), block=st.integers(1, 7))
def test_matches_reference_and_torch(name, data, seq_len, block):
    factory, ref = FACTORIES[name]
    valid = data.draw(padding(seq_len))
    mask = factory(seq_len, block, valid)
    batch = 1 if valid is None else valid.shape[0]
    rows = None if valid is None else valid.tolist()
    rule = with_padding(rows, seq_len, ref(seq_len, block))
    expected = grid(batch, 2 * seq_len, 2 * seq_len, rule)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@pytest.mark.parametrize("name", FACTORIES)
def test_structured_path_used_for_contiguous_padding(name):
    factory, _ = FACTORIES[name]
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert factory(5, 2, left).has_intervals
    holes = torch.tensor([[1, 0, 1, 1, 1]])
    assert not factory(5, 2, holes).has_intervals


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("valid", [
    None,
    torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]]),        # left padded
    torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0, 0]]),        # right padded
    torch.tensor([[0, 0, 0, 0, 0, 0, 0, 0, 0]]),        # empty sample
])
def test_eager_additive_softmax_is_finite(name, valid):
    factory, _ = FACTORIES[name]
    mask = factory(9, 4, valid)
    scores = torch.randn(mask.batch, 2, mask.q_len, mask.kv_len)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        probs = torch.softmax(scores.to(dtype) + mask.additive(dtype), dim=-1)
        assert torch.isfinite(probs).all(), dtype
    assert mask.additive(torch.float16).dtype == torch.float16
    assert mask.additive().min() == torch.finfo(torch.float32).min


@pytest.mark.parametrize("name", FACTORIES)
def test_flex_forward_equals_sdpa(name):
    factory, _ = FACTORIES[name]
    valid = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]])
    for mask in (factory(11, 3), factory(11, 3, valid)):
        for block in (4, (8, 4), 128):
            assert_flex_matches_sdpa(mask, block_size=block)


def test_block_size_equal_to_diffusion_block_has_no_partial_tiles():
    tiles = block_diffusion(64, 16).tile_map(16)
    assert int((tiles == 1).sum()) == 0
    n = 4  # blocks; the spec counts L'^2 n (n + 1) allowed pairs, i.e. n (n + 1) whole tiles
    assert int((tiles == 2).sum()) == n * (n + 1)


def test_outside_index_range_is_never_attended():
    # attention-gym's BD3 rule wraps around (row 2S behaves like row S); ours is blocked.
    L = 8
    mod = block_diffusion(L, 4).mask_mod
    z = torch.tensor(0)
    for q, kv in [(2 * L, 2 * L), (2 * L, L), (L, 2 * L), (3 * L - 1, 2 * L + 1)]:
        assert not bool(mod(z, z, torch.tensor(q), torch.tensor(kv)))


def test_large_block_mask_matches_torch():
    # Non-multiple length, big tiles, batch with both paddings.
    valid = torch.ones(2, 300, dtype=torch.bool)
    valid[0, :37] = False
    valid[1, 250:] = False
    for factory in (block_diffusion, idlm):
        assert_matches_create_block_mask(factory(300, 16, valid), 128)
        assert_matches_create_block_mask(factory(300, 16, valid), (64, 128))


@pytest.mark.parametrize("factory", [block_diffusion, idlm])
def test_bad_input(factory):
    with pytest.raises(ValueError, match="seq_len"):
        factory(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        factory(8, 0)
    with pytest.raises(TypeError, match="seq_len"):
        factory(8.0, 4)
    with pytest.raises(TypeError, match="block_size"):
        factory(8, 2.5)
    with pytest.raises(ValueError, match="valid"):
        factory(8, 4, torch.ones(2, 7))
    with pytest.raises(ValueError, match="0/1"):
        factory(8, 4, torch.full((1, 8), 2))
    with pytest.raises(TypeError, match="valid"):
        factory(8, 4, [[1] * 8])
    mask = factory(8, 4)
    for bad in (0, -1, (4,), (4, 0), (4, 2, 1)):
        with pytest.raises(ValueError, match="block_size"):
            mask.block_mask(bad)
    for bad in (2.0, "16", (4, 2.0)):
        with pytest.raises(TypeError, match="block_size"):
            mask.block_mask(bad)
