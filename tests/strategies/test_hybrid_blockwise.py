"""hybrid with ``corruption: blockwise`` reads ``t_max`` and ``time_sampling`` (they were
validated and then ignored): the level of each block is drawn from ``[t_min, t_max)`` and
stratified over the global batch like the uniform corruption's."""

from __future__ import annotations

import pytest
import torch

from dlmkit import strategies
from dlmkit.data import Collator, SFTDataset, load_tokenizer
from dlmkit.data.seeds import sample_generators
from dlmkit.diffusion import corrupt_blockwise

BLOCK, ROWS = 4, 8


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("byte")


def make_batch(tokenizer, slots=True):
    data = SFTDataset.from_task("reverse", "train", tokenizer, n=ROWS, seed=0)
    collate = Collator(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                       block_size=BLOCK,
                       fill_from_response=strategies.get("hybrid").fill_from_response)
    batch = collate([data[i] for i in range(ROWS)])
    if slots:  # as the recipe adds them: slot k of a global batch of ROWS
        batch["doc_slot"], batch["num_slots"] = torch.arange(ROWS)[:, None], ROWS
    return batch


def prepared(tokenizer, batch, **options):
    s = strategies.get("hybrid")({"block_size": BLOCK, "corruption": "blockwise", **options},
                                 mask_token_id=tokenizer.mask_token_id,
                                 vocab_size=tokenizer.vocab_size)
    return s.prepare(batch, sample_generators(0, 0, batch["sample_index"].tolist()))


def first_block_levels(batch, p_mask):
    """Each row's first block level: blockwise puts the level ``m`` on unsupervised positions,
    and position 0 (BOS) never is supervised."""
    assert not bool((batch["loss_mask"][:, 0] != 0).any())
    return p_mask[:, 0].double()


def test_hybrid_blockwise_honours_t_max_and_time_sampling(tokenizer):
    batch = make_batch(tokenizer)
    iid = prepared(tokenizer, batch, time_sampling="iid")
    clipped = prepared(tokenizer, batch, time_sampling="iid", t_max=0.5)
    # The review's case: t_max 0.5 with iid gave the noise of t_max 1 with stratified.
    assert not torch.equal(clipped["noise_mask"], prepared(tokenizer, batch)["noise_mask"])
    unsupervised = batch["loss_mask"] == 0  # where p_mask is the block's level
    m_iid = iid["p_mask"][unsupervised].double()
    m_clipped = clipped["p_mask"][unsupervised].double()
    assert (m_clipped >= 0.2).all() and (m_clipped < 0.5).all() and (m_iid >= 0.5).any()
    # t_max rescales the same draws: m = t_min + (t_max - t_min) U.
    u = (m_iid - 0.2) / 0.8
    torch.testing.assert_close(m_clipped, 0.2 + 0.3 * u, rtol=0, atol=1e-6)

    # Stratified (the default): the rows' first-block levels fall one per stratum of
    # [t_min, t_max); the i.i.d. ones on the same draws do not.
    def strata_hit(levels, lo=0.2, hi=1.0):
        return sorted(((levels - lo) / (hi - lo) * ROWS).floor().long().tolist())

    stratified = prepared(tokenizer, batch)
    assert strata_hit(first_block_levels(batch, stratified["p_mask"])) == list(range(ROWS))
    assert strata_hit(first_block_levels(batch, iid["p_mask"])) != list(range(ROWS))
    both = prepared(tokenizer, batch, t_max=0.5)
    assert strata_hit(first_block_levels(batch, both["p_mask"]), hi=0.5) == list(range(ROWS))


def test_hybrid_blockwise_defaults_keep_their_draws_without_slots(tokenizer):
    """Without slots (a batch straight from the collator) there is nothing to stratify: the
    defaults give exactly corrupt_blockwise's i.i.d. draws at [t_min, 1)."""
    batch = make_batch(tokenizer, slots=False)
    out = prepared(tokenizer, batch)
    gens = sample_generators(0, 0, batch["sample_index"].tolist())
    noisy, noise, p = corrupt_blockwise(batch["input_ids"], batch["loss_mask"],
                                        tokenizer.mask_token_id, block_size=BLOCK, eps=0.2,
                                        generator=gens)
    length = batch["input_ids"].shape[1]
    assert torch.equal(out["input_ids"][:, :length], noisy)
    assert torch.equal(out["noise_mask"], noise) and torch.equal(out["p_mask"], p)
    assert noise.any() and not bool((noise & (batch["loss_mask"] == 0)).any())
    assert strategies.get("hybrid").defaults()["time_sampling"] == "stratified"  # the default


def test_half_life_ratio_is_blockwise_only(tokenizer):
    def make(**options):
        return strategies.get("hybrid")({"block_size": BLOCK, **options},
                                        mask_token_id=tokenizer.mask_token_id,
                                        vocab_size=tokenizer.vocab_size)

    make(corruption="blockwise", half_life_ratio=0.5)
    make(corruption="uniform")
    with pytest.raises(ValueError, match="strategy.half_life_ratio is read by corruption "
                                         "'blockwise' only; with corruption 'uniform' leave it "
                                         "at 0.25, got 0.5"):
        make(corruption="uniform", half_life_ratio=0.5)
