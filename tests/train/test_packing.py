"""Packed training (``data.pack=true``): the gradient of a step does not depend on how its
samples were packed into rows or split into micro-batches, because every document takes its
noise from its own ``(seed, step, sample)`` generator, sees only itself, and scores only
pairs inside itself."""

from __future__ import annotations

import pytest
import torch

from dlmkit.data import Collator, GlobalBatchSampler
from dlmkit.data.seeds import document_generators, sample_seed

from .helpers import cli_args, config, losses, run_cli
from .test_recipe import gradients

PACK = ["data.pack=true", "data.max_seq_len=64"]


def assert_same_gradients(loss, grads, ref_loss, ref, what):
    assert loss == pytest.approx(ref_loss, rel=1e-5), what
    for key in ref:
        torch.testing.assert_close(grads[key], ref[key], rtol=1e-4, atol=1e-6,
                                   msg=lambda m, k=key: f"{what}, {k}: {m}")


@pytest.mark.parametrize("name", ["bd3lm", "idlm", "hybrid"])
def test_packed_gradient_does_not_depend_on_packing_or_micro_batch_size(name):
    # Unpacked, one sample per row: the reference every packing must reproduce.
    ref_loss, ref = gradients(config("train.micro_batch_size=8", strategy=name))
    for micro in (8, 4, 2, 1):
        cfg = config(*PACK, f"train.micro_batch_size={micro}", strategy=name)
        loss, grads = gradients(cfg)
        assert_same_gradients(loss, grads, ref_loss, ref, f"{name}, micro-batch {micro}")


def test_packed_gradient_without_block_alignment_does_not_depend_on_micro_batch_size():
    # data.block_align=false: documents start mid-block; noise blocks follow each document's
    # own blocks (as the mask's do), so the split still does not matter.
    unaligned = [*PACK, "data.block_align=false"]
    ref_loss, ref = gradients(config(*unaligned, "train.micro_batch_size=8", strategy="bd3lm"))
    loss, grads = gradients(config(*unaligned, "train.micro_batch_size=2", strategy="bd3lm"))
    assert_same_gradients(loss, grads, ref_loss, ref, "bd3lm, block_align=false")


def test_packing_puts_several_documents_in_a_row():
    """The invariance test above means something only if rows really hold several samples."""
    from dlmkit.train.recipe import build_components

    from .test_recipe import CPU

    c = build_components(config(*PACK, strategy="bd3lm"), CPU)
    batch = c.collator([c.train_set[i] for i in c.sampler.micro_batches(0)[0]])
    assert batch["input_ids"].shape[0] < 8 and int(batch["doc_ids"].max()) >= 1


def test_a_sample_drawn_twice_in_a_step_gets_independent_noise_under_any_split():
    # 5 samples, 8 draws per step: samples repeat within the step's global batch.
    collator = Collator(pad_token_id=0, eos_token_id=1, block_size=2, max_seq_len=64, pack=True)
    seeds = {}
    for world in (1, 2):
        for micro in (1, 2, 4):
            per_layout = []
            for rank in range(world):
                sampler = GlobalBatchSampler(5, 8, rank=rank, world_size=world,
                                             micro_batch_size=micro, seed=3)
                for step in (0, 1):
                    for idx, rep in zip(sampler.micro_batches(step),
                                        sampler.micro_batch_repeats(step)):
                        batch = collator([{"input_ids": [5 + i] * (i + 1), "sample_index": i}
                                          for i in idx])
                        gens = document_generators(7, step, batch, list(zip(idx, rep)))
                        per_layout += [(step, g.initial_seed()) for g in gens]
            seeds[world, micro] = sorted(per_layout)
    reference = seeds[1, 1]
    assert all(s == reference for s in seeds.values())
    assert len(set(reference)) == 16  # 8 draws a step, every one its own seed
    full = GlobalBatchSampler(5, 8, seed=3).global_batch(0)
    assert len(set(full)) < 8  # the premise: some sample is drawn twice in step 0
    # A first draw keeps the seed it always had.
    assert {(0, sample_seed(7, 0, i)) for i in set(full)} <= set(reference)


@pytest.mark.slow
def test_two_ranks_train_packed_as_one_process(tmp_path):
    # 1 process x 4 micro-batches of 4 vs 2 ranks x 4 micro-batches of 2: rows pack different
    # samples together, so only per-document noise makes the runs agree.
    settings = [*PACK, "train.steps=3", "train.global_batch_size=16", "train.val_every=3"]
    single = tmp_path / "single"
    run_cli(cli_args(single, *settings, "train.micro_batch_size=4", strategy="bd3lm"))
    ranks = tmp_path / "ranks"
    run_cli(cli_args(ranks, *settings, "train.micro_batch_size=2", "train.distributed=ddp",
                     strategy="bd3lm"), nproc=2)
    assert losses(ranks) == pytest.approx(losses(single), rel=1e-4)
    assert losses(ranks, "validation") == pytest.approx(losses(single, "validation"), rel=1e-4)
