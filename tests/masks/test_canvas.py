import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.canvas import canvas
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_dllm import canvas_ref
from tests.masks.strategies import block_sizes


@st.composite
def canvas_configs(draw):
    enc = draw(st.integers(1, 16))
    batch = draw(st.integers(1, 3))
    prefix = [draw(st.integers(0, enc)) for _ in range(batch)]
    response = [draw(st.integers(0, enc - p)) for p in prefix]
    if max(response) == 0:
        response[0] = 1 if prefix[0] < enc else 0
        if response[0] == 0:
            prefix[0], response[0] = enc - 1, 1
    extra = draw(st.integers(0, 3))
    return dict(prefix=prefix, response=response, enc=enc, bs=draw(st.integers(1, 6)),
                window=draw(st.one_of(st.none(), st.integers(0, 8))),
                canvas_length=max(response) + extra)


def build(cfg, **override):
    cfg = {**cfg, **override}
    return canvas(torch.tensor(cfg["prefix"]), torch.tensor(cfg["response"]), cfg["enc"],
                  cfg["bs"], cfg["window"], canvas_length=cfg["canvas_length"])


@settings(max_examples=40, deadline=None)
@given(cfg=canvas_configs(), data=st.data())
def test_matches_reference_and_torch(cfg, data):
    mask = build(cfg)
    assert mask.has_intervals
    rule = canvas_ref(cfg["prefix"], cfg["response"], cfg["enc"], cfg["bs"], cfg["window"])
    expected = grid(len(cfg["prefix"]), cfg["canvas_length"],
                    cfg["enc"] + cfg["canvas_length"], rule)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=25, deadline=None)
@given(cfg=canvas_configs())
def test_invariants(cfg):
    full = build(cfg, window=None).dense()[:, 0]
    sliding = build(cfg).dense()[:, 0]
    E, S = cfg["enc"], cfg["bs"]
    assert not (sliding & ~full).any()
    assert torch.equal(sliding[..., E:], full[..., E:])  # canvas columns unaffected
    for b, (p, r) in enumerate(zip(cfg["prefix"], cfg["response"])):
        for j in range(cfg["canvas_length"]):
            row_full, row_slide = full[b, j], sliding[b, j]
            if j >= r:  # padded canvas row: its own diagonal only
                assert row_full.nonzero().flatten().tolist() == [E + j]
                continue
            boundary = p + j // S * S
            assert row_full[:p].all()  # prompt always visible (full)
            assert row_full[:boundary].all()
            assert not row_full[boundary:E].any()  # strict leakage boundary and the tail
            lo = max(0, boundary - cfg["window"] + 1) if cfg["window"] is not None else 0
            assert row_slide[lo:boundary].all() and not row_slide[:lo].any()
            # block-anchored: every query of the block sees the same encoder columns
            first = j // S * S
            assert torch.equal(row_slide[:E], sliding[b, first, :E])
            assert torch.equal(row_full[:E], full[b, first, :E])


def test_strict_boundary_hides_own_block():
    # a ">=" mask would leak the clean copy of the query's own block
    dense = canvas(0, 8, 8, 4).dense()[0, 0]
    assert not dense[4:, 4:8].any() and dense[4:, :4].all()
    assert not dense[:4, :8].any()


def test_single_block_sees_no_encoder_response():
    dense = canvas(3, 6, 10, 6).dense()[0, 0]
    assert dense[:, :3].all() and not dense[:, 3:10].any() and dense[:, 10:].all()


def test_sliding_keeps_prompt_for_early_block_and_none_equals_full():
    dense = canvas(5, 4, 9, 2, sliding_window=100).dense()[0, 0]
    assert dense[0, :5].all()
    assert torch.equal(canvas(5, 4, 9, 2).dense(), canvas(5, 4, 9, 2, None).dense())
    narrow = canvas(5, 4, 9, 2, sliding_window=3).dense()[0, 0, :, :9]
    assert narrow[0].nonzero().flatten().tolist() == [3, 4]
    assert narrow[2].nonzero().flatten().tolist() == [5, 6]


def test_int_prefix_broadcasts_and_per_example_prefixes():
    assert canvas(2, 4, 8, 2).batch == 1
    mask = canvas(torch.tensor([0, 2, 4]), 4, 8, 2)
    assert mask.batch == 3
    dense = mask.dense()[:, 0]
    for b, p in enumerate([0, 2, 4]):
        assert dense[b, 2, :8].nonzero().flatten().tolist() == list(range(p + 2))


def test_additive_values_and_flex_equals_sdpa():
    mask = canvas(torch.tensor([3, 0, 6]), torch.tensor([7, 4, 2]), 13, 3, sliding_window=4)
    add = mask.additive(torch.bfloat16)
    assert set(add.unique().tolist()) == {0.0, torch.finfo(torch.bfloat16).min}
    assert_flex_matches_sdpa(mask, block_size=(8, 4))
    assert_flex_matches_sdpa(canvas(torch.tensor([3, 0, 6]), torch.tensor([7, 4, 2]), 13, 3),
                             block_size=4)


def test_large_block_mask_matches_torch():
    prefix = torch.tensor([100, 37, 400])
    response = torch.tensor([300, 411, 50])
    for window in (None, 128):
        mask = canvas(prefix, response, 500, 64, window)
        assert_matches_create_block_mask(mask, 128)
        assert_matches_create_block_mask(mask, (64, 128))


def test_bad_input():
    with pytest.raises(ValueError, match=r"prefix_lengths \+ response_length must be <= "
                                         r"enc_len=8, got 5 \+ 4 = 9 in row 1"):
        canvas(torch.tensor([0, 5]), 4, 8, 2)
    with pytest.raises(ValueError, match="prefix_lengths must be >= 0, got -1"):
        canvas(torch.tensor([2, -1]), 4, 8, 2)
    with pytest.raises(ValueError, match="prefix_lengths must be >= 0, got -3"):
        canvas(-3, 4, 8, 2)
    with pytest.raises(ValueError, match="sliding_window must be >= 0, got -2"):
        canvas(2, 4, 8, 2, sliding_window=-2)
    with pytest.raises(ValueError, match="prefix_lengths must be an int or a 1-D tensor"):
        canvas(torch.zeros(2, 2, dtype=torch.long), 4, 8, 2)
    with pytest.raises(TypeError, match="prefix_lengths must hold integers"):
        canvas(torch.tensor([1.5]), 4, 8, 2)
    with pytest.raises(ValueError, match="same batch size"):
        canvas(torch.tensor([1, 2]), torch.tensor([1, 2, 3]), 8, 2)
    with pytest.raises(ValueError, match="canvas_length must be >= the longest response"):
        canvas(0, 4, 8, 2, canvas_length=3)
    with pytest.raises(ValueError, match="response_length is 0"):
        canvas(0, 0, 8, 2)
    with pytest.raises(ValueError, match="block_size"):
        canvas(0, 4, 8, 0)
    with pytest.raises(ValueError, match="enc_len"):
        canvas(0, 4, 0, 2)


@st.composite
def padded_canvas_configs(draw):
    cfg = draw(canvas_configs())
    batch, enc = len(cfg["prefix"]), cfg["enc"]
    kind = draw(st.sampled_from(["left", "right", "holes"]))
    rows = []
    for _ in range(batch):
        if kind == "holes":
            rows.append([draw(st.integers(0, 1)) for _ in range(enc)])
        else:
            n = draw(st.integers(0, enc))
            rows.append([0] * (enc - n) + [1] * n if kind == "left" else [1] * n + [0] * (enc - n))
    return cfg, rows


@settings(max_examples=40, deadline=None)
@given(case=padded_canvas_configs(), data=st.data())
def test_encoder_validity_blocks_padded_columns(case, data):
    """``valid``: the reference with padded encoder columns removed; rows stay non-empty."""
    cfg, rows = case
    valid = torch.tensor(rows)
    mask = canvas(torch.tensor(cfg["prefix"]), torch.tensor(cfg["response"]), cfg["enc"],
                  cfg["bs"], cfg["window"], canvas_length=cfg["canvas_length"], valid=valid)
    base = canvas_ref(cfg["prefix"], cfg["response"], cfg["enc"], cfg["bs"], cfg["window"])

    def rule(b, j, k):
        return base(b, j, k) and (k >= cfg["enc"] or rows[b][k] == 1)

    expected = grid(len(rows), cfg["canvas_length"], cfg["enc"] + cfg["canvas_length"], rule)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 20), window=st.one_of(st.none(), st.integers(1, 8)),
       data=st.data())
def test_canvas_encoder_is_causal_windowed_and_padded(length, window, data):
    """transformers' convention: kv <= q and kv > q - W; padded keys blocked, padded rows keep
    their diagonal (dlmkit.masks.padding)."""
    from dlmkit.masks import canvas_encoder

    n = data.draw(st.integers(0, length))
    left = data.draw(st.booleans())
    row = [0] * (length - n) + [1] * n if left else [1] * n + [0] * (length - n)
    mask = canvas_encoder(length, torch.tensor([row]), window)

    def rule(b, q, k):
        seen = k <= q and (window is None or k > q - window)
        return (seen and row[q] == 1 and row[k] == 1) or q == k

    full_check(mask, grid(1, length, length, rule),
               block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))
