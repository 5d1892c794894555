import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.cache import MaskCache
from dlmkit.masks.catalogue.chunk_causal import chunk_causal, expert_cross, expert_self
from dlmkit.masks.catalogue.tags import (
    KIND_CLEAN,
    KIND_GLOBAL,
    KIND_NOISED,
    Slot,
    TokenTags,
    window_tags,
)
from tests.masks.compare import assert_flex_matches_sdpa, full_check
from tests.masks.reference import grid, with_padding
from tests.masks.reference_dllm import chunk_causal_ref, expert_cross_ref, expert_self_ref
from tests.masks.strategies import block_sizes, padding

KINDS = (KIND_GLOBAL, KIND_NOISED, KIND_CLEAN)


@st.composite
def slot_layouts(draw, max_slots=4):
    slots = draw(st.lists(st.builds(Slot, st.sampled_from(KINDS), st.integers(1, 4),
                                    st.integers(1, 3), st.integers(0, 2)),
                          min_size=1, max_size=max_slots))
    return window_tags(slots, draw(st.integers(1, 3)))


@st.composite
def raw_tags(draw, max_len=14):
    """Arbitrary interleavings: kinds, chunks and frames drawn per token."""
    n = draw(st.integers(1, max_len))
    kind = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    chunk = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    frame = [3 * c + draw(st.integers(0, 2)) for c in chunk]
    return TokenTags(torch.tensor(kind), torch.tensor(chunk), torch.tensor(frame))


def lists(tags):
    return tags.kind.tolist(), tags.chunk.tolist(), tags.frame.tolist()


@settings(max_examples=30, deadline=None)
@given(tags=st.one_of(slot_layouts(), raw_tags()), data=st.data())
def test_chunk_causal_matches_reference_and_torch(tags, data):
    kind, chunk, _ = lists(tags)
    valid = data.draw(padding(tags.length))
    mask = chunk_causal(tags, valid, cache=None)
    rows = None if valid is None else valid.tolist()
    rule = with_padding(rows, tags.length, chunk_causal_ref(kind, chunk))
    expected = grid(mask.batch, tags.length, tags.length, rule)
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=30, deadline=None)
@given(kv=st.one_of(slot_layouts(), raw_tags()), data=st.data())
def test_expert_cross_matches_reference_and_torch(kv, data):
    kind, chunk, frame = lists(kv)
    present = sorted({c for k, c in zip(kind, chunk) if k != KIND_GLOBAL})
    n = data.draw(st.integers(1, 6))
    q_kind = data.draw(st.lists(st.sampled_from(KINDS if present else [KIND_GLOBAL]),
                                min_size=n, max_size=n))
    q_chunk = [data.draw(st.sampled_from(present)) if k != KIND_GLOBAL else -1 for k in q_kind]
    q = TokenTags(torch.tensor(q_kind), torch.tensor(q_chunk), torch.zeros(n, dtype=torch.int))
    window = data.draw(st.one_of(st.none(), st.integers(0, 4)))
    sink = data.draw(st.integers(0, kv.length - 1))
    rule = expert_cross_ref(q_kind, q_chunk, kind, chunk, frame, window, sink)
    unsunk = expert_cross_ref(q_kind, q_chunk, kind, chunk, frame, window)
    nothing = [r for r in range(n) if not any(unsunk(0, r, k)
        for k in range(kv.length))]
    if nothing:
        with pytest.raises(ValueError, match=f"query {nothing[0]} .* may see no key"):
            expert_cross(q, kv, window, cache=None)
    mask = expert_cross(q, kv, window, sink=sink, cache=None)
    full_check(mask, grid(1, n, kv.length, rule),
               block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


@settings(max_examples=15, deadline=None)
@given(tags=st.one_of(slot_layouts(), raw_tags()), data=st.data())
def test_expert_self_matches_reference_and_torch(tags, data):
    valid = data.draw(padding(tags.length))
    mask = expert_self(tags, valid, cache=None)
    rows = None if valid is None else valid.tolist()
    rule = with_padding(rows, tags.length, expert_self_ref(tags.chunk.tolist()))
    full_check(mask, grid(mask.batch, tags.length, tags.length, rule),
               block_sizes=(data.draw(block_sizes),))


def video_layout():
    return window_tags([Slot(KIND_GLOBAL, 1, 3), Slot(KIND_CLEAN, 6, 2),
                        Slot(KIND_NOISED, 6, 2)], chunk_size=2)


def test_named_invariants():
    tags = video_layout()
    dense = chunk_causal(tags, cache=None).dense()[0, 0]
    kind, chunk = tags.kind, tags.chunk
    clean, noised, glob = kind == KIND_CLEAN, kind == KIND_NOISED, kind == KIND_GLOBAL
    assert not dense[clean][:, noised].any()  # clean never sees noised
    same_chunk = chunk.view(-1, 1) == chunk.view(1, -1)
    assert not (dense & noised.view(-1, 1) & clean.view(1, -1) & same_chunk).any()
    assert not dense[glob][:, ~glob].any() and dense[glob][:, glob].all()  # globals see globals
    assert dense[:, glob].all()  # everybody sees the globals
    cc = dense[clean][:, clean]  # clean sub-mask is chunk-block-causal
    assert torch.equal(cc, chunk[clean].view(1, -1) <= chunk[clean].view(-1, 1))
    nn = dense[noised][:, noised]  # noised sub-mask is block-diagonal
    assert torch.equal(nn, chunk[noised].view(-1, 1) == chunk[noised].view(1, -1))
    assert dense.diagonal().all()
    assert chunk_causal(tags, cache=None).has_intervals
    assert chunk_causal(tags, cache=None).row_intervals()[0].shape[-1] <= 3


def test_window_is_measured_from_the_query_chunks_first_frame_inclusive():
    main = video_layout()  # frames 0..5, chunks of 2 frames
    expert = window_tags([Slot(KIND_NOISED, 6, 1)], chunk_size=2)  # one action per frame
    frame, kind = main.frame, main.kind
    for window in (0, 1, 3, None):
        dense = expert_cross(expert, main, window, cache=None).dense()[0, 0]
        for q in range(expert.length):
            c = int(expert.chunk[q])
            first = 2 * c
            low = 0 if window is None else first - window
            seen = set(frame[dense[q] & (kind == KIND_CLEAN)].tolist())
            assert seen == set(range(max(0, low), first))  # exactly `window` frames back
            noised = frame[dense[q] & (kind == KIND_NOISED)].tolist()
            assert set(noised) == {first, first + 1}  # own chunk only, not earlier ones
            assert dense[q, kind == KIND_GLOBAL].all()


def test_rows_with_nothing_visible_attend_only_the_declared_sink():
    # Two clean chunks (frames 0-3) then a noised chunk (frames 4-5); no global token. A
    # noised query of chunk 0 and a global query may see nothing: the old fallback gave them
    # the clean copy of frame 0 (chunk 0's own clean frame) with weight 1.
    kv = window_tags([Slot(KIND_CLEAN, 4, 1), Slot(KIND_NOISED, 2, 1, first_frame=4)],
                     chunk_size=2)
    q = TokenTags(torch.tensor([KIND_NOISED, KIND_GLOBAL, KIND_NOISED]),
                  torch.tensor([0, 0, 2]), torch.tensor([0, 0, 4]))
    with pytest.raises(ValueError, match=r"query 0 \(NOISED, chunk 0\) may see no key.*sink="):
        expert_cross(q, kv, cache=None)
    mask = expert_cross(q, kv, sink=5, cache=None)  # say key 5 is an information-free token
    dense = mask.dense()[0, 0]
    assert dense[0].nonzero().flatten().tolist() == [5]
    assert dense[1].nonzero().flatten().tolist() == [5]
    assert dense[2].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]  # rules unchanged
    assert not dense[:2, 0].any()  # no leak of the forbidden clean frame
    assert torch.isfinite(torch.softmax(mask.additive(torch.float32)[0, 0], -1)).all()
    with pytest.raises(ValueError, match="sink must index a key of kv_tags"):
        expert_cross(q, kv, sink=6, cache=None)
    # With a GLOBAL token no row is empty, so no sink is needed and none is used.
    main = window_tags([Slot(KIND_GLOBAL, 1, 1), Slot(KIND_CLEAN, 4, 1),
                        Slot(KIND_NOISED, 2, 1, first_frame=4)], chunk_size=2)
    dense = expert_cross(q, main, cache=None).dense()[0, 0]
    assert dense[:2].nonzero().tolist() == [[0, 0], [1, 0]]


def test_flex_forward_equals_sdpa():
    tags = video_layout()
    valid = torch.ones(2, tags.length, dtype=torch.bool)
    valid[1, -5:] = False
    expert = window_tags([Slot(KIND_GLOBAL, 1, 2), Slot(KIND_NOISED, 6, 1)], chunk_size=2)
    masks = (chunk_causal(tags, cache=None), chunk_causal(tags, valid),
             expert_cross(expert, tags, 2, cache=None), expert_self(expert, cache=None))
    for mask, block in zip(masks, (4, (8, 4), (4, 8), 128)):
        assert_flex_matches_sdpa(mask, block_size=block)


def test_cache_is_keyed_by_layout():
    cache = MaskCache(4)
    a = chunk_causal(video_layout(), cache=cache)
    assert chunk_causal(video_layout(), cache=cache) is a and cache.hits == 1
    assert a.block_mask(8) is a.block_mask(8)
    other = window_tags([Slot(KIND_GLOBAL, 1, 3), Slot(KIND_CLEAN, 6, 2),
                         Slot(KIND_NOISED, 6, 2)], chunk_size=3)
    assert chunk_causal(other, cache=cache) is not a
    expert = window_tags([Slot(KIND_NOISED, 6, 1)], chunk_size=2)
    w1 = expert_cross(expert, video_layout(), 1, cache=cache)
    assert expert_cross(expert, video_layout(), 1, cache=cache) is w1
    assert expert_cross(expert, video_layout(), 2, cache=cache) is not w1
    assert expert_self(expert, cache=cache) is expert_self(expert, cache=cache)
    assert len(cache) == 4


def test_window_tags_layout():
    tags = window_tags([Slot(KIND_GLOBAL, 1, 2), Slot(KIND_CLEAN, 3, 2, first_frame=1)], 2)
    assert tags.length == 8 and tags.kind.dtype == torch.int32
    assert tags.frame.tolist() == [-1, -1, 1, 1, 2, 2, 3, 3]
    assert tags.chunk.tolist() == [-1, -1, 0, 0, 1, 1, 1, 1]
    # globals are normalised to the sentinel whatever was given
    raw = TokenTags(torch.tensor([0, 2]), torch.tensor([5, 1]), torch.tensor([7, 3]))
    assert raw.chunk.tolist() == [-1, 1] and raw.frame.tolist() == [-1, 3]


def test_bad_input():
    with pytest.raises(ValueError, match=r"kind must be one of KIND_GLOBAL \(0\), KIND_NOISED "
                                         r"\(1\), KIND_CLEAN \(2\), got 7 at position 1"):
        TokenTags(torch.tensor([0, 7]), torch.tensor([0, 0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="Slot.kind must be one of .* got 3"):
        Slot(3, 1, 1)
    with pytest.raises(ValueError, match="Slot.frames must be >= 1, got 0"):
        Slot(KIND_CLEAN, 0, 1)
    with pytest.raises(ValueError, match="one length"):
        TokenTags(torch.tensor([1, 1]), torch.tensor([0]), torch.tensor([0, 0]))
    with pytest.raises(TypeError, match="TokenTags.frame must hold integers"):
        TokenTags(torch.tensor([1]), torch.tensor([0]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="chunk must be >= 0 for video tokens, got -1"):
        TokenTags(torch.tensor([1]), torch.tensor([-1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        window_tags([Slot(KIND_CLEAN, 2, 2)], 0)
    with pytest.raises(TypeError, match=r"slots\[0\] must be a Slot"):
        window_tags([(KIND_CLEAN, 2, 2)], 1)
    tags = video_layout()
    with pytest.raises(ValueError, match="window must be >= 0, got -1"):
        expert_cross(tags, tags, -1)
    expert = window_tags([Slot(KIND_NOISED, 9, 1)], chunk_size=2)
    with pytest.raises(ValueError, match="chunk 3 .* no video tokens in kv_tags"):
        expert_cross(expert, tags, 1)
    with pytest.raises(TypeError, match="tags must be a TokenTags"):
        chunk_causal(torch.zeros(4))
