from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.data import ByteTokenizer, Collator, GlobalBatchSampler, SFTDataset, eval_batches


def union_over_ranks(n, gbs, world, step, micro=None, seed=0):
    out = []
    for r in range(world):
        s = GlobalBatchSampler(n, gbs, rank=r, world_size=world, micro_batch_size=micro, seed=seed)
        for mb in s.micro_batches(step):
            out.extend(mb)
    return out


@given(
    st.integers(1, 50),
    st.sampled_from([(4, 1, None), (4, 2, None), (4, 4, None), (4, 2, 1), (8, 2, 2), (12, 3, 2)]),
    st.integers(0, 30),
    st.integers(0, 3),
)
@settings(max_examples=80, deadline=None)
def test_union_over_ranks_is_the_global_batch_for_any_world_size(n, split, step, seed):
    gbs, world, micro = split
    one = GlobalBatchSampler(n, gbs, seed=seed).global_batch(step)
    assert union_over_ranks(n, gbs, world, step, micro, seed) == one
    assert union_over_ranks(n, gbs, 1, step, None, seed) == one
    assert len(one) == gbs


@pytest.mark.parametrize("n", [7, 12, 13])
def test_every_epoch_visits_every_sample_once(n):
    s = GlobalBatchSampler(n, 4, seed=3)
    stream = list(itertools.chain.from_iterable(s.global_batch(k) for k in range(3 * n)))
    for e in range(3):
        assert sorted(stream[e * n : (e + 1) * n]) == list(range(n))
    assert stream[:n] != stream[n : 2 * n]  # epochs are reshuffled
    assert s.epoch_of(n) == pytest.approx(4.0)


def test_seed_and_shuffle():
    a = GlobalBatchSampler(100, 10, seed=0).global_batch(0)
    b = GlobalBatchSampler(100, 10, seed=1).global_batch(0)
    assert a != b
    assert GlobalBatchSampler(100, 10, seed=0).global_batch(0) == a
    assert GlobalBatchSampler(10, 4, shuffle=False).global_batch(2) == [8, 9, 0, 1]


def test_resume_from_a_step_continues_the_same_sequence():
    full = list(GlobalBatchSampler(23, 6, rank=1, world_size=2, micro_batch_size=1, num_steps=9))
    resumed = GlobalBatchSampler(
        23, 6, rank=1, world_size=2, micro_batch_size=1, start_step=5, num_steps=9
    )
    assert len(full) == 27 and len(resumed) == 12
    assert list(resumed) == full[15:]
    endless = iter(GlobalBatchSampler(23, 6, rank=1, world_size=2, micro_batch_size=1))
    assert list(itertools.islice(endless, 27)) == full
    with pytest.raises(TypeError, match="no length"):
        len(GlobalBatchSampler(23, 6))


def test_as_dataloader_batch_sampler():
    tok = ByteTokenizer()
    ds = SFTDataset.from_task("reverse", "validation", tok, n=10)
    sampler = GlobalBatchSampler(len(ds), 4, micro_batch_size=2, num_steps=2, seed=5)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, collate_fn=Collator(pad_token_id=tok.pad_token_id)
    )
    got = [b["sample_index"].tolist() for b in loader]
    assert got == [
        sampler.micro_batches(0)[0],
        sampler.micro_batches(0)[1],
    ] + sampler.micro_batches(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_samples": 0, "global_batch_size": 4}, "num_samples must be an int >= 1, got 0"),
        ({"num_samples": 8, "global_batch_size": 6, "world_size": 4}, "divisible by world_size"),
        ({"num_samples": 8, "global_batch_size": 8, "micro_batch_size": 3}, "must divide"),
        ({"num_samples": 8, "global_batch_size": 8, "rank": 2, "world_size": 2}, "rank must be"),
        ({"num_samples": 8, "global_batch_size": 8, "start_step": -1}, "start_step"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GlobalBatchSampler(**kwargs)


@given(st.integers(1, 40), st.integers(1, 9), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_eval_batches_cover_everything_once_in_order(n, gbs, world):
    shards = [eval_batches(n, gbs, rank=r, world_size=world) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # same number of batches on every rank
    flat = [i for k in range(len(shards[0])) for r in range(world) for i in shards[r][k]]
    assert flat == list(range(n))
    for k in range(len(shards[0])):
        sizes = [len(shards[r][k]) for r in range(world)]
        assert max(sizes) - min(sizes) <= 1
