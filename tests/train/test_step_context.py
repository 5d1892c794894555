"""The batch contents are named where they are made, and the training step takes one context."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

from dlmkit.data import Collator
from dlmkit.data.collate import Batch
from dlmkit.train.distributed import World
from dlmkit.train.recipe import (
    StepBatch,
    StepContext,
    build_components,
    prepare_micro_batches,
    train_step,
)

from .helpers import config

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.mark.parametrize("pack", [False, True])
def test_the_collator_makes_exactly_the_keys_batch_names(pack):
    samples = [{"input_ids": list(range(10, 10 + n)), "loss_mask": [0, 0] + [1] * (n - 2),
                "sample_index": i} for i, n in enumerate((5, 9, 3))]
    made = Collator(pad_token_id=0, eos_token_id=2, block_size=4, max_seq_len=16,
                    pack=pack)(samples)
    assert set(made) == set(typing.get_type_hints(Batch))
    assert set(typing.get_type_hints(StepBatch)) - set(typing.get_type_hints(Batch)) == {
        "doc_slot", "num_slots"}


def test_a_step_context_holds_what_a_step_reads_and_a_step_updates_the_model():
    cfg = config("train.steps=2")
    c = build_components(cfg, CPU)
    ctx = c.step_context(cfg, CPU)
    assert isinstance(ctx, StepContext)
    assert (ctx.model, ctx.dataset, ctx.sampler, ctx.config) == (c.model, c.train_set,
                                                                 c.sampler, cfg)
    before = {n: p.detach().clone() for n, p in c.model.named_parameters()}
    stats = train_step(0, ctx)
    assert set(stats) == {"loss", "grad_norm", "tokens", "metrics"}
    assert any(not torch.equal(p, before[n]) for n, p in c.model.named_parameters())
    # the micro-batches of a step are a function of the context's sampler only
    halves = dataclasses.replace(ctx, sampler=type(c.sampler)(
        len(c.train_set), cfg.train.global_batch_size, micro_batch_size=4, seed=cfg.seed))
    assert len(prepare_micro_batches(1, halves)) == 2 and len(prepare_micro_batches(1, ctx)) == 1
