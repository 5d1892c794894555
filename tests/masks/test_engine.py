"""The mask engine itself: user rules, intervals, combinators, tile maps, cache, pictures."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks import Mask, MaskCache, causal
from dlmkit.masks import core as core_module
from dlmkit.masks.tiles import normalize_intervals, tile_map_from_intervals, tile_map_from_rule
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    assert_matches_create_mask,
    full_check,
)
from tests.masks.reference import causal_ref, grid
from tests.masks.strategies import block_sizes


def padded_causal_rule(valid):
    """A user rule with per-row data: causal over real tokens, diagonal for padding."""

    def rule(b, q, kv):
        return ((kv <= q) & (valid[b, kv] > 0) & (valid[b, q] > 0)) | (q == kv)

    return rule


@st.composite
def random_intervals(draw):
    """A random structured mask: per row up to 3 arbitrary (possibly overlapping) intervals."""
    batch = draw(st.integers(1, 2))
    q_len, kv_len = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    k = draw(st.integers(1, 3))
    values = st.integers(-2, kv_len + 2)
    n = batch * q_len * k
    lo = torch.tensor(draw(st.lists(values, min_size=n, max_size=n)))
    hi = torch.tensor(draw(st.lists(values, min_size=n, max_size=n)))
    return lo.view(batch, q_len, k), hi.view(batch, q_len, k), kv_len


def interval_rule(lo, hi):
    def rule(b, q, kv):
        inside = (kv.unsqueeze(-1) >= lo[b, q]) & (kv.unsqueeze(-1) < hi[b, q])
        return inside.any(-1)

    return rule


@settings(max_examples=60, deadline=None)
@given(random_intervals())
def test_normalize_intervals_keeps_the_set_and_separates_runs(case):
    lo, hi, kv_len = case
    nlo, nhi = normalize_intervals(lo, hi, kv_len)
    keys = torch.arange(kv_len)
    before = ((keys >= lo.unsqueeze(-1)) & (keys < hi.unsqueeze(-1))).any(-2)
    after = ((keys >= nlo.unsqueeze(-1)) & (keys < nhi.unsqueeze(-1))).any(-2)
    assert torch.equal(before, after)
    real = nhi > nlo
    for b, q in zip(*torch.nonzero(real.any(-1), as_tuple=True)):
        runs = sorted(zip(nlo[b, q][real[b, q]].tolist(), nhi[b, q][real[b, q]].tolist()))
        for (_, end), (start, _) in zip(runs, runs[1:]):
            assert start > end, runs  # disjoint and never touching


@settings(max_examples=60, deadline=None)
@given(random_intervals(), block_sizes)
def test_tile_map_from_intervals_equals_rule_evaluation(case, block):
    lo, hi, kv_len = case
    batch, q_len, _ = lo.shape
    q_block, kv_block = (block, block) if isinstance(block, int) else block
    nlo, nhi = normalize_intervals(lo, hi, kv_len)
    fast = tile_map_from_intervals(nlo, nhi, q_len, kv_len, q_block, kv_block)
    slow = tile_map_from_rule(interval_rule(lo, hi), batch, q_len, kv_len, q_block, kv_block,
                              torch.device("cpu"))
    assert torch.equal(fast, slow)


@settings(max_examples=30, deadline=None)
@given(random_intervals(), block_sizes)
def test_user_rule_with_intervals_matches_torch(case, block):
    lo, hi, kv_len = case
    batch, q_len, _ = lo.shape
    mask = Mask.from_rule(interval_rule(lo, hi), q_len, kv_len, batch,
                          intervals=lambda: (lo, hi))
    assert mask.has_intervals
    assert_matches_create_mask(mask)
    assert_matches_create_block_mask(mask, block)


def test_user_rule_without_intervals_uses_the_tile_row_fallback():
    valid = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    mask = Mask.from_rule(padded_causal_rule(valid), 7, 7, batch=2)
    assert not mask.has_intervals

    def allowed(b, q, k):
        return q == k or (k <= q and bool(valid[b, k]) and bool(valid[b, q]))

    full_check(mask, grid(2, 7, 7, allowed))
    assert_flex_matches_sdpa(mask, block_size=(4, 2))


def test_fallback_dense_works_in_row_chunks(monkeypatch):
    monkeypatch.setattr(core_module, "_ROW_CHUNK_ELEMENTS", 16)
    valid = torch.ones(2, 37, dtype=torch.long)
    valid[1, 30:] = 0
    mask = Mask.from_rule(padded_causal_rule(valid), 37, 37, batch=2)
    assert_matches_create_mask(mask)


def test_structured_dense_evaluates_only_partial_tiles(monkeypatch):
    monkeypatch.setattr(core_module, "_DENSE_TILE", 4)
    monkeypatch.setattr(core_module, "_ROW_CHUNK_ELEMENTS", 16)  # "large": take the tile path
    calls = []

    def rule(b, q, kv):
        calls.append(q.numel() * kv.numel())
        return kv <= q

    q = torch.arange(64).view(1, 64, 1)
    mask = Mask.from_rule(rule, 64, 64, intervals=lambda: (torch.zeros_like(q), q + 1))
    assert torch.equal(mask.dense()[0, 0], torch.ones(64, 64, dtype=torch.bool).tril())
    assert sum(calls) == 16 * 16  # the 16 diagonal 4x4 tiles, nothing else


@settings(max_examples=30, deadline=None)
@given(q_len=st.integers(1, 10), kv_len=st.integers(1, 10), shift=st.integers(0, 4),
       window=st.integers(0, 5), block=block_sizes, structured=st.booleans())
def test_combinators(q_len, kv_len, shift, window, block, structured):
    a = causal(q_len, kv_len, shift)
    lo = torch.arange(q_len).view(1, q_len, 1) - window

    def near(b, q, kv):
        return (kv >= q - window) & (kv <= q + window)

    b_mask = Mask.from_rule(near, q_len, kv_len,
                            intervals=(lambda: (lo, lo + 2 * window + 1)) if structured else None)
    both, either = a & b_mask, a | b_mask
    assert both.has_intervals == structured and either.has_intervals == structured
    ref_a = causal_ref(q_len, kv_len, shift)

    def ref_b(b, q, k):
        return q - window <= k <= q + window

    expected_and = grid(1, q_len, kv_len, lambda b, q, k: ref_a(b, q, k) and ref_b(b, q, k))
    expected_or = grid(1, q_len, kv_len, lambda b, q, k: ref_a(b, q, k) or ref_b(b, q, k))
    assert torch.equal(both.dense()[:, 0], expected_and)
    assert torch.equal(either.dense()[:, 0], expected_or)
    assert_matches_create_block_mask(both, block)
    assert_matches_create_block_mask(either, block)


def test_combinator_broadcasts_batch_and_checks_shapes():
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1]])
    per_row = Mask.from_rule(lambda b, q, kv: valid[b, kv] > 0, 4, 4, batch=3)
    combined = causal(4) & per_row
    assert combined.batch == 3
    expected = torch.ones(4, 4, dtype=torch.bool).tril() & valid.bool().unsqueeze(1)
    assert torch.equal(combined.dense()[:, 0], expected)
    assert_matches_create_block_mask(combined, 2)
    with pytest.raises(ValueError, match="q_len and kv_len must match"):
        causal(4) & causal(5)
    with pytest.raises(ValueError, match="broadcast"):
        per_row & Mask.from_rule(lambda b, q, kv: kv >= 0, 4, 4, batch=2)


def test_batch_one_mask_broadcasts_in_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    mask = causal(9)
    q = torch.randn(3, 2, 9, 4, dtype=torch.float64)
    out = flex_attention(q, q, q, block_mask=mask.block_mask(4))
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, ref)


def test_block_mask_q_side_built_without_from_kv_blocks(monkeypatch):
    from torch.nn.attention import flex_attention as fa

    def forbidden(*args, **kwargs):
        raise AssertionError("the Q side must not be rebuilt by dense transposition")

    monkeypatch.setattr(fa, "_transpose_ordered", forbidden)
    block = causal(300).block_mask(16)
    assert block.q_indices.shape == (1, 1, 19, 19)


def test_mask_cache_is_lru():
    cache = MaskCache(max_entries=2)
    built = []

    def build(key):
        def make():
            built.append(key)
            return causal(key)
        return make

    first = cache.get(4, build(4))
    assert cache.get(4, build(4)) is first
    cache.get(5, build(5))
    cache.get(4, build(4))       # 4 becomes most recent
    cache.get(6, build(6))       # evicts 5
    assert 5 not in cache and 4 in cache and 6 in cache
    assert built == [4, 5, 6]
    assert (cache.hits, cache.misses) == (2, 3)
    with pytest.raises(ValueError, match="max_entries"):
        MaskCache(0)
    with pytest.raises(TypeError, match="hashable"):
        cache.get([1], build(1))


def test_terminal_picture():
    text = str(causal(3))
    assert text.splitlines()[1:] == ["# . .", "# # .", "# # #"]
    big = str(causal(1000))
    lines = big.splitlines()
    assert "one cell" in lines[0] and len(lines) == 1 + 63
    assert lines[1].startswith("+ .")


def test_png_picture(tmp_path):
    path = causal(12).render(tmp_path / "causal.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    big = causal(5000).render(tmp_path / "big.png")
    assert big.stat().st_size > 0


def test_bad_input():
    with pytest.raises(TypeError, match="rule"):
        Mask.from_rule("not callable", 4, 4)
    with pytest.raises(ValueError, match="q_len"):
        Mask.from_rule(lambda b, q, kv: kv <= q, 0, 4)
    with pytest.raises(TypeError, match="kv_len"):
        Mask.from_rule(lambda b, q, kv: kv <= q, 4, 4.0)
    with pytest.raises(TypeError, match="dtype"):
        causal(4).additive(torch.int32)
    bad = Mask.from_rule(lambda b, q, kv: kv <= q, 4, 4,
                         intervals=lambda: (torch.zeros(1, 3, 1), torch.ones(1, 3, 1)))
    with pytest.raises(ValueError, match="intervals"):
        bad.block_mask(2)
    with pytest.raises(ValueError, match="batch_index"):
        causal(4).render("x.png", batch_index=2)


def test_closed_form_tiles_hook_is_used_and_checked(monkeypatch):
    monkeypatch.setattr(core_module, "_ROW_CHUNK_ELEMENTS", 16)  # dense via the tile path
    calls = []

    def tiles(q_block, kv_block):
        calls.append((q_block, kv_block))
        return causal(10).tile_map((q_block, kv_block))[:1]

    mask = Mask.from_rule(lambda b, q, kv: kv <= q, 10, 10, tiles=tiles)
    assert mask.structured and not mask.has_intervals
    assert_matches_create_block_mask(mask, (4, 3))
    assert_matches_create_mask(mask)  # dense forms also come from the closed-form tile map
    assert (4, 3) in calls and (core_module._DENSE_TILE, core_module._DENSE_TILE) in calls
    broken = Mask.from_rule(lambda b, q, kv: kv <= q, 10, 10,
                            tiles=lambda qb, kb: torch.zeros(1, 2, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="tiles"):
        broken.block_mask(4)


def test_block_masks_are_memoised_per_block_size():
    mask = causal(40)
    assert mask.block_mask(8) is mask.block_mask(8)
    assert mask.block_mask((8, 4)) is not mask.block_mask(8)
