import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

from dlmkit.masks.catalogue.vsa import (
    EXAMPLES,
    VSACoarseResult,
    compute_vsa_coarse_attention,
    compute_vsa_tile_scores,
    compute_vsa_topk_indices,
    create_vsa_block_mask,
    create_vsa_flash_block_mask,
    create_vsa_tile_metadata,
    lift_vsa_tile_output,
    pool_to_vsa_tiles,
    tile_vsa_sequence,
    untile_vsa_sequence,
    vsa,
    vsa_additive_combine,
    vsa_gated_mix,
    vsa_topk_from_sparsity,
)
from tests.masks.compare import assert_block_masks_equal, assert_flex_matches_sdpa, full_check
from tests.masks.reference import grid
from tests.masks.reference_video import dense_attention, vsa_metadata_ref, vsa_ref
from tests.masks.strategies import block_sizes

# ------------------------------------------------------------------ metadata and layout


def test_metadata_example_from_spec():
    meta = create_vsa_tile_metadata((5, 9, 10), (4, 4, 4))
    assert meta.num_tiles_twh == (2, 3, 3) and meta.num_tiles == 18
    assert meta.tile_numel == 64 and meta.seq_len == 450 and meta.padded_seq_len == 1152
    assert meta.variable_block_sizes.tolist() == [64, 64, 32, 64, 64, 32, 16, 16, 8,
                                                  16, 16, 8, 16, 16, 8, 4, 4, 2]


@settings(max_examples=25, deadline=None)
@given(shape=st.tuples(*[st.integers(1, 6)] * 3), tile=st.tuples(*[st.integers(1, 3)] * 3))
def test_metadata_matches_enumeration(shape, tile):
    meta = create_vsa_tile_metadata(shape, tile)
    perm, sizes, non_pad = vsa_metadata_ref(shape, tile)
    assert meta.tile_index.tolist() == perm
    assert meta.variable_block_sizes.tolist() == sizes
    assert meta.non_pad_index.tolist() == non_pad
    n = meta.seq_len
    assert torch.equal(meta.tile_index[meta.reverse_tile_index], torch.arange(n))
    assert torch.equal(meta.untile_index, meta.non_pad_index[meta.reverse_tile_index])
    x = torch.randn(2, n, 3)
    tiled = tile_vsa_sequence(x, meta)
    assert tiled.shape == (2, meta.padded_seq_len, 3)
    assert torch.equal(untile_vsa_sequence(tiled, meta), x)
    # Real tokens first in every tile, padding (zeros) in the tail slots.
    slot = torch.arange(meta.padded_seq_len) % meta.tile_numel
    real = slot < meta.variable_block_sizes.repeat_interleave(meta.tile_numel)
    assert torch.equal(real.nonzero().flatten(), meta.non_pad_index)
    assert tiled[:, ~real].eq(0).all()
    assert torch.equal(tiled[:, real], x[:, meta.tile_index])


def test_tile_along_other_dim():
    meta = create_vsa_tile_metadata((2, 3, 3), (2, 2, 2))
    x = torch.randn(18, 2, 4)
    tiled = tile_vsa_sequence(x, meta, dim=0)
    assert tiled.shape == (meta.padded_seq_len, 2, 4)
    assert torch.equal(untile_vsa_sequence(tiled, meta, dim=0), x)


# ------------------------------------------------------------------ coarse stage


def _naive_pool(x, T, sizes=None):
    n = x.shape[-2] // T
    out = torch.empty(*x.shape[:-2], n, x.shape[-1], dtype=torch.float64)
    for i in range(n):
        count = T if sizes is None else int(sizes[i])
        out[..., i, :] = x[..., i * T:i * T + count, :].double().mean(-2)
    return out


def test_pooling_against_naive():
    x = torch.randn(2, 3, 5 * 4, 6)
    torch.testing.assert_close(pool_to_vsa_tiles(x, 4).double(), _naive_pool(x, 4))
    sizes = torch.tensor([4, 1, 3, 4, 2])
    garbage = x.clone()
    for i, s in enumerate(sizes.tolist()):
        garbage[..., i * 4 + s:(i + 1) * 4, :] = 1e6  # padding content must not matter
    pooled = pool_to_vsa_tiles(garbage, 4, sizes)
    torch.testing.assert_close(pooled.double(), _naive_pool(x, 4, sizes), rtol=1e-6, atol=1e-6)
    half = pool_to_vsa_tiles(x.half(), 4, sizes)
    assert half.dtype == torch.float16


def _qkv(seed=0, qt=4, nt=5, T=4, d=8, batch=(2, 3)):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, qt * T, d, generator=g)
    k = torch.randn(*batch, nt * T, d, generator=g)
    v = torch.randn(*batch, nt * T, d, generator=g)
    return q, k, v


def test_scores_topk_and_coarse_attention_against_dense():
    q, k, v = _qkv()
    q_sizes, kv_sizes = torch.tensor([4, 4, 4, 2]), torch.tensor([4, 3, 4, 4, 1])
    pq, pk = _naive_pool(q, 4, q_sizes), _naive_pool(k, 4, kv_sizes)
    pv = _naive_pool(v, 4, kv_sizes)
    scores = pq @ pk.transpose(-1, -2) / math.sqrt(8)
    ours = compute_vsa_tile_scores(q, k, 4, q_variable_block_sizes=q_sizes,
                                   kv_variable_block_sizes=kv_sizes)
    torch.testing.assert_close(ours.double(), scores, rtol=1e-5, atol=1e-5)
    scaled = compute_vsa_tile_scores(q, k, 4, scale=0.5)
    torch.testing.assert_close(scaled.double(), _naive_pool(q, 4) @ _naive_pool(k, 4).mT * 0.5,
                               rtol=1e-5, atol=1e-5)

    result = compute_vsa_coarse_attention(q, k, v, 4, 2, q_variable_block_sizes=q_sizes,
                                          kv_variable_block_sizes=kv_sizes)
    assert isinstance(result, VSACoarseResult)
    torch.testing.assert_close(result.output.double(), torch.softmax(scores, -1) @ pv,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.lse.double(), torch.logsumexp(scores, -1),
                               rtol=1e-5, atol=1e-5)
    best = scores.topk(2, -1).indices.sort(-1).values
    assert result.topk_indices.dtype == torch.int32
    assert torch.equal(result.topk_indices.long(), best)
    direct = compute_vsa_topk_indices(q, k, 4, 2, q_variable_block_sizes=q_sizes,
                                      kv_variable_block_sizes=kv_sizes)
    assert torch.equal(direct, result.topk_indices)
    unsorted = compute_vsa_topk_indices(q, k, 4, 2, sort_indices=False,
                                        q_variable_block_sizes=q_sizes,
                                        kv_variable_block_sizes=kv_sizes)
    assert torch.equal(unsorted.long(), scores.topk(2, -1).indices)


def test_include_self_replaces_lowest_pick():
    # Hand-made scores through pooled vectors: tile i of q equals basis e_i, k tiles chosen so
    # that query tile 0 prefers tiles 3, 2, 1 (never itself).
    T, d = 2, 4
    basis = torch.eye(d)
    q = basis.repeat_interleave(T, 0)                         # 4 query tiles
    keys = torch.tensor([[0.0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0]])
    keys[:, 1:] = torch.tensor([[4.0, 0, 0], [0, 4, 0], [0, 0, 4], [0, 0, 0]])
    k = keys.repeat_interleave(T, 0)
    plain = compute_vsa_topk_indices(q, k, T, 3, sort_indices=False)
    assert plain[0].tolist() == [3, 2, 1]
    forced = compute_vsa_topk_indices(q, k, T, 3, sort_indices=False, include_self=True)
    assert forced[0].tolist() == [3, 2, 0]                    # lowest pick replaced by own id
    for i in range(4):
        picks = plain[i].tolist()
        want = picks if i in picks else picks[:-1] + [i]
        assert forced[i].tolist() == want
    assert any(i in plain[i].tolist() for i in range(4))  # both cases exercised
    # Another random case, sorted output.
    q, k, _ = _qkv(3, qt=5, nt=6)
    plain = compute_vsa_topk_indices(q, k, 4, 3, sort_indices=False)
    forced = compute_vsa_topk_indices(q, k, 4, 3, include_self=True)
    for idx in itertools.product(*map(range, plain.shape[:-1])):
        picks, own = plain[idx].tolist(), idx[-1]
        want = sorted(picks if own in picks else picks[:-1] + [own])
        assert forced[idx].tolist() == want
    with pytest.raises(ValueError, match="include_self"):
        compute_vsa_topk_indices(torch.randn(12, 4), torch.randn(8, 4), 2, 2, include_self=True)


def test_topk_from_sparsity():
    grid_shape = (21, 30, 52)
    meta = create_vsa_tile_metadata(grid_shape, (4, 4, 4))
    assert vsa_topk_from_sparsity(math.prod(grid_shape), 64, meta.num_tiles, 0.875) == 64
    assert vsa_topk_from_sparsity(100, 10, 10, 1.0) == 1
    assert vsa_topk_from_sparsity(100, 10, 7, 0.0) == 7
    with pytest.raises(ValueError, match="sparsity"):
        vsa_topk_from_sparsity(100, 10, 10, 1.5)
    with pytest.raises(TypeError, match="sparsity"):
        vsa_topk_from_sparsity(100, 10, 10, "0.5")
    with pytest.raises(ValueError, match="tile_numel"):
        vsa_topk_from_sparsity(100, 0, 10, 0.5)


def test_lift_combine_and_gated_mix():
    coarse = torch.randn(2, 3, 4)
    lifted = lift_vsa_tile_output(coarse, 5)
    assert lifted.shape == (2, 15, 4)
    for t in range(15):
        assert torch.equal(lifted[:, t], coarse[:, t // 5])
    assert torch.equal(lift_vsa_tile_output(coarse, 5, 12), lifted[:, :12])
    fine = torch.randn(2, 13, 4)
    torch.testing.assert_close(vsa_additive_combine(fine, coarse, 0.25, 5),
                               fine + 0.25 * lifted[:, :13])
    gate = torch.rand(2, 13, 1)
    torch.testing.assert_close(vsa_gated_mix(fine, coarse, gate, 5),
                               gate * fine + (1 - gate) * lifted[:, :13])
    assert torch.equal(vsa_gated_mix(fine, coarse, 1.0, 5), fine)
    assert torch.equal(vsa_gated_mix(fine, coarse, 0.0, 5), lifted[:, :13])
    with pytest.raises(ValueError, match="seq_len"):
        lift_vsa_tile_output(coarse, 5, 16)


# ------------------------------------------------------------------ masks


@st.composite
def selections(draw, heads: bool = False):
    batch = draw(st.integers(1, 2))
    h = draw(st.integers(1, 3)) if heads else 1
    qt, nt = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    k = draw(st.integers(1, nt))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    topk = torch.stack([torch.randperm(nt, generator=g)[:k] for _ in range(batch * h * qt)])
    topk = topk.view(batch, h, qt, k).to(draw(st.sampled_from([torch.int32, torch.int64])))
    T = draw(st.integers(1, 4))
    sizes = None
    if draw(st.booleans()):
        sizes = torch.randint(1, T + 1, (nt,), generator=g)
    return topk, T, nt, sizes


@settings(max_examples=30, deadline=None)
@given(sel=selections(), data=st.data())
def test_vsa_mask_matches_reference_and_torch(sel, data):
    topk, T, nt, sizes = sel
    mask = vsa(topk[:, 0], T, nt, sizes)
    batch, _, qt, _ = topk.shape
    expected = grid(batch, qt * T, nt * T,
                    vsa_ref(topk[:, 0].tolist(), T, None if sizes is None else sizes.tolist()))
    full_check(mask, expected, block_sizes=(T, data.draw(block_sizes), data.draw(block_sizes)))


def _reference_dense(topk, T, nt, sizes):
    """Brute-force ``[B, H, QT*T, nt*T]`` pattern, one (b, h, q, kv) at a time."""
    B, H, QT, _ = topk.shape
    rows = topk.tolist()
    counts = sizes.tolist() if sizes is not None else [T] * nt
    dense = torch.zeros(B, H, QT * T, nt * T, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for q in range(QT * T):
                chosen = set(rows[b][h][q // T])
                for kv in range(nt * T):
                    dense[b, h, q, kv] = kv // T in chosen and kv % T < counts[kv // T]
    return dense


def _expand(blocks, block, q_len, kv_len):
    return blocks.repeat_interleave(block[0], -2).repeat_interleave(block[1], -1)[
        ..., :q_len, :kv_len]


@settings(max_examples=20, deadline=None)
@given(sel=selections(heads=True), flash=st.booleans())
def test_direct_block_masks_equal_create_block_mask(sel, flash):
    topk, T, nt, sizes = sel
    B, H, QT, _ = topk.shape
    if flash:
        kvb = max(d for d in range(1, T + 1) if T % d == 0 and (d < T or T == 1))
        ours = create_vsa_flash_block_mask(topk, T, nt, kvb, sizes)
        block = (T, kvb)
    else:
        ours = create_vsa_block_mask(topk, T, nt, sizes)
        block = (T, T)
    dense = _reference_dense(topk, T, nt, sizes)
    q_len, kv_len = QT * T, nt * T

    def mod(b, h, q, kv):
        return dense[b, h, q.clamp(max=q_len - 1), kv.clamp(max=kv_len - 1)]

    theirs = create_block_mask(mod, B, H, q_len, kv_len, device="cpu", BLOCK_SIZE=block)
    assert_block_masks_equal(ours, theirs, f"flash={flash} T={T} nt={nt}")
    # Eager flex applies only the mask_mod (it ignores the lists): it must be the pattern.
    assert torch.equal(create_mask(ours.mask_mod, B, H, q_len, kv_len, device="cpu"), dense)
    # What a fused kernel computes: full blocks whole, partial blocks through the mask_mod.
    full = torch.zeros(B, H, QT, kv_len // block[1], dtype=torch.bool)
    partial = torch.zeros_like(full)
    for lists, counts, target in ((ours.full_kv_indices, ours.full_kv_num_blocks, full),
                                  (ours.kv_indices, ours.kv_num_blocks, partial)):
        for idx in itertools.product(range(B), range(H), range(QT)):
            target[idx][lists[idx][:counts[idx]].long()] = True
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    q = torch.arange(q_len).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len).view(1, 1, 1, kv_len)
    padding_ok = ours.mask_mod(b, h, q, kv).expand(B, H, q_len, kv_len)
    effective = _expand(full, block, q_len, kv_len) | (
        _expand(partial, block, q_len, kv_len) & padding_ok)
    assert torch.equal(effective, dense)


def test_flex_with_direct_masks_matches_dense_attention():
    g = torch.Generator().manual_seed(1)
    B, H, QT, NT, T, K, D = 2, 2, 3, 4, 8, 2, 8
    topk = torch.stack([torch.randperm(NT, generator=g)[:K] for _ in range(B * H * QT)])
    topk = topk.view(B, H, QT, K).int()
    sizes = torch.tensor([8, 5, 8, 3])
    q = torch.randn(B, H, QT * T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, NT * T, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, NT * T, D, generator=g, dtype=torch.float64)
    for vbs in (None, sizes):
        allowed = torch.zeros(B, H, QT * T, NT * T, dtype=torch.bool)
        for b in range(B):
            for h in range(H):
                for qi in range(QT):
                    for t in topk[b, h, qi].tolist():
                        n = T if vbs is None else int(vbs[t])
                        allowed[b, h, qi * T:(qi + 1) * T, t * T:t * T + n] = True
        expected = dense_attention(q, k, v, allowed)
        for bm in (create_vsa_block_mask(topk, T, NT, vbs),
                   create_vsa_flash_block_mask(topk, T, NT, 4, vbs),
                   create_vsa_flash_block_mask(topk, T, NT, 2, vbs)):
            out = flex_attention(q, k, v, block_mask=bm)
            torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_flash_sub_blocks():
    bm = create_vsa_flash_block_mask(torch.tensor([[[[1], [0]]]]), 4, 2, 2, torch.tensor([4, 3]))
    assert bm.BLOCK_SIZE == (4, 2) and bm.seq_lengths == (8, 8)
    # Query tile 0 -> tile 1 (3 real tokens): sub-block 2 full, sub-block 3 partial.
    assert bm.full_kv_num_blocks[0, 0].tolist() == [1, 2]
    assert bm.kv_num_blocks[0, 0].tolist() == [1, 0]
    assert bm.full_kv_indices[0, 0, 0, 0] == 2 and bm.kv_indices[0, 0, 0, 0] == 3
    assert bm.full_kv_indices[0, 0, 1, :2].tolist() == [0, 1]
    # A tile whose last sub-block is all padding drops it.
    bm = create_vsa_flash_block_mask(torch.tensor([[[[0]]]]), 4, 1, 2, torch.tensor([2]))
    assert bm.full_kv_num_blocks.item() == 1 and bm.kv_num_blocks.item() == 0


def test_vsa_mask_block_mask_equals_direct_constructor():
    topk = torch.tensor([[[0, 2], [1, 0], [2, 1]], [[1, 2], [0, 1], [2, 0]]])
    sizes = torch.tensor([3, 2, 3])
    mask = vsa(topk, 3, 3, sizes)
    assert_block_masks_equal(create_vsa_block_mask(topk.unsqueeze(1), 3, 3, sizes),
                             mask.block_mask(3))
    assert_flex_matches_sdpa(mask, block_size=3)
    assert_flex_matches_sdpa(mask, block_size=(4, 2))
    # Docstring picture.
    dense = vsa(torch.tensor([[0], [0], [2]]), 2, 3).dense()[0, 0].int()
    assert dense.tolist() == [[1, 1, 0, 0, 0, 0]] * 4 + [[0, 0, 0, 0, 1, 1]] * 2


def test_examples_build():
    mask = EXAMPLES["vsa"](1000, 64)
    assert mask.q_len == 16 * 64 and mask.has_intervals
    assert int(mask.dense()[0, 0, :, 1000:].sum()) == 0  # padding of the last tile


def test_rejects_bad_selections():
    good = torch.tensor([[[[0, 1], [1, 2]]]])
    with pytest.raises(ValueError, match="duplicate tile id 1"):
        create_vsa_block_mask(torch.tensor([[[[1, 1], [0, 2]]]]), 4, 3)
    with pytest.raises(ValueError, match=r"must be in \[0, num_kv_tiles=3\), got 3"):
        create_vsa_block_mask(torch.tensor([[[[0, 3]]]]), 4, 3)
    with pytest.raises(ValueError, match="got -1"):
        create_vsa_flash_block_mask(torch.tensor([[[[-1, 0]]]]), 4, 3, 2)
    with pytest.raises(ValueError, match="duplicate"):
        vsa(torch.tensor([[2, 2]]), 4, 3)
    with pytest.raises(ValueError, match="num_kv_tiles=3"):
        vsa(torch.tensor([[0, 1, 2, 0]]), 4, 3)
    with pytest.raises(TypeError, match="integer"):
        create_vsa_block_mask(good.float(), 4, 3)
    with pytest.raises(ValueError, match="4-D"):
        create_vsa_block_mask(good[0], 4, 3)
    with pytest.raises(ValueError, match="heads"):
        vsa(torch.zeros(1, 2, 2, 1, dtype=torch.long), 4, 3)
    with pytest.raises(ValueError, match="variable_block_sizes"):
        create_vsa_block_mask(good, 4, 3, torch.tensor([4, 4]))
    with pytest.raises(ValueError, match=r"\[1, tile_numel=4\]"):
        create_vsa_block_mask(good, 4, 3, torch.tensor([4, 0, 4]))
    with pytest.raises(ValueError, match=r"\[1, tile_numel=4\]"):
        vsa(good[0], 4, 3, torch.tensor([4, 5, 4]))
    with pytest.raises(ValueError, match="kv_block_size=3 must divide tile_numel=4"):
        create_vsa_flash_block_mask(good, 4, 3, 3)
    with pytest.raises(ValueError, match="tile_numel"):
        create_vsa_block_mask(good, 0, 3)
    with pytest.raises(ValueError, match="num_kv_tiles"):
        create_vsa_block_mask(good, 4, 0)
    with pytest.raises(ValueError, match="top_k"):
        compute_vsa_topk_indices(torch.randn(8, 4), torch.randn(8, 4), 4, 3)
    with pytest.raises(ValueError, match="multiple of tile_numel=3"):
        pool_to_vsa_tiles(torch.randn(8, 4), 3)
    with pytest.raises(ValueError, match="dit_seq_shape"):
        create_vsa_tile_metadata((4, 0, 4))
    with pytest.raises(ValueError, match="tile_twh"):
        create_vsa_tile_metadata((4, 4, 4), (4, 4))
    meta = create_vsa_tile_metadata((2, 2, 2), (2, 2, 2))
    with pytest.raises(ValueError, match="must be 8"):
        tile_vsa_sequence(torch.randn(7, 3), meta)
    with pytest.raises(TypeError, match="VSATileMetadata"):
        untile_vsa_sequence(torch.randn(8, 3), None)
