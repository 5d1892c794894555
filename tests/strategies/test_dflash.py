"""DFlash training: anchors and blocks exactly as specified, no draft query sees target context
at or after its anchor, global denominators (dropped samples add nothing), clear errors before
training, metrics in the train log, and an export that decodes speculatively."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmkit import strategies
from dlmkit.data import Collator, SFTDataset, load_tokenizer
from dlmkit.data.seeds import sample_generators
from dlmkit.train.distributed import World
from dlmkit.train.recipe import accumulate_gradients, build_components
from tests.train.helpers import cli_args, config, records, tiny_target

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
BS = 4


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("byte")


def make(tokenizer, **options):
    options = {"target": str(tiny_target()), "block_size": BS, "num_blocks_per_sample": 3,
               **options}
    return strategies.get("dflash")(options, mask_token_id=tokenizer.mask_token_id,
                                    vocab_size=tokenizer.vocab_size)


def batch_of(tokenizer, n=8, task="reverse"):
    data = SFTDataset.from_task(task, "train", tokenizer, n=n, seed=0)
    collate = Collator(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return collate([data[i] for i in range(n)])


def prepare(s, batch, step=0):
    return s.prepare(batch, sample_generators(0, step, batch["sample_index"].tolist()))


@pytest.mark.parametrize("overlap", [True, False])
def test_anchors_and_blocks_exactly_as_specified(tokenizer, overlap):
    batch = batch_of(tokenizer)
    s = make(tokenizer, overlap=overlap, min_supervised=6)
    p = prepare(s, batch)
    ids, sup = batch["input_ids"], batch["loss_mask"] != 0
    valid_len = batch["attention_valid"].sum(1)
    mask_id = tokenizer.mask_token_id
    noise = p["noise_ids"].view(len(ids), -1, BS)
    targets = p["target_ids"].view(len(ids), -1, BS - 1)
    scored = p["block_mask"].view(len(ids), -1, BS - 1)
    dropped = 0
    for b in range(len(ids)):
        if int(sup[b].sum()) < 6:  # too few supervised tokens: dropped whole
            dropped += 1
            assert not p["keep"][b].any()
        for j in range(noise.shape[1]):
            a = int(p["anchors"][b, j])
            if not p["keep"][b, j]:
                assert (noise[b, j] == mask_id).all() and not scored[b, j].any()
                continue
            assert noise[b, j, 0] == ids[b, a], "the anchor token is clean"
            assert (noise[b, j, 1:] == mask_id).all(), "the rest of the block is masked"
            assert a + BS <= valid_len[b], "a block never crosses the valid length"
            assert sup[b, a + 1], "the first drafted token is supervised"
            assert torch.equal(targets[b, j], ids[b, a + 1:a + BS])
            assert torch.equal(scored[b, j], sup[b, a + 1:a + BS])
            assert torch.equal(p["draft_position_ids"].view(len(ids), -1, BS)[b, j],
                               a + torch.arange(BS))
        kept = [int(a) for a, k in zip(p["anchors"][b], p["keep"][b]) if k]
        if not overlap:
            assert all(abs(x - y) >= BS for i, x in enumerate(kept) for y in kept[i + 1:])
    assert p["dropped_samples"] == dropped and 0 < dropped < len(ids)
    assert int(s.counts(p)["num_tokens"]) == int(p["block_mask"].sum())


def test_dropped_samples_add_nothing_to_any_denominator(tokenizer):
    batch = batch_of(tokenizer)
    s = make(tokenizer, min_supervised=6)
    p = prepare(s, batch)
    kept_rows = [b for b in range(len(batch["input_ids"])) if p["keep"][b].any()]
    assert len(kept_rows) < len(batch["input_ids"])
    sub = {k: v[kept_rows] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    alone = prepare(s, sub)
    assert torch.equal(alone["anchors"], p["anchors"][kept_rows])
    assert s.counts(alone) == s.counts(p)
    assert alone["dropped_samples"] == 0


def test_anchors_depend_on_seed_step_and_sample_only(tokenizer):
    batch = batch_of(tokenizer)
    s = make(tokenizer)
    a, b, c = prepare(s, batch, 0), prepare(s, batch, 0), prepare(s, batch, 1)
    assert torch.equal(a["anchors"], b["anchors"])
    assert not torch.equal(a["anchors"], c["anchors"])
    one = {k: v[2:3] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    assert torch.equal(prepare(s, one)["anchors"], a["anchors"][2:3])


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("attention", ["sdpa", "flex_attention"])
def test_no_draft_query_sees_context_at_or_after_its_anchor(tokenizer, blocks, attention):
    """Perturbing the target context at and after block j's anchor leaves block j unchanged
    (dense mask on SDPA, BlockMask on FlexAttention, N = 1 included); perturbing the position
    just before the anchor changes it (the test can fail)."""
    torch.manual_seed(0)
    batch = batch_of(tokenizer, n=4, task="copy")
    s = make(tokenizer, num_blocks_per_sample=blocks, block_size=8)
    model = s.build_model("dflash-tiny", vocab_size=tokenizer.vocab_size, attention=attention,
                          dtype=torch.float32).eval()
    s.setup(torch.device("cpu"))
    p = prepare(s, batch)
    context = s.target_context(p)
    with torch.no_grad():
        base = s.draft_hidden(model, p, context).view(4, blocks, 8, -1)
        for b in range(4):
            for j in range(blocks):
                a = int(p["anchors"][b, j])
                after = context.clone()
                after[b, a:] = torch.randn_like(after[b, a:]) * 10
                got = s.draft_hidden(model, p, after).view(4, blocks, 8, -1)
                torch.testing.assert_close(got[b, j], base[b, j], rtol=1e-5, atol=1e-5)
                before = context.clone()
                before[b, a - 1] += 10
                moved = s.draft_hidden(model, p, before).view(4, blocks, 8, -1)
                assert not torch.allclose(moved[b, j], base[b, j], atol=1e-4)


def gradients(cfg):
    c = build_components(cfg, CPU)
    loss, _ = accumulate_gradients(0, c.step_context(cfg, CPU))
    return loss, {n: p.grad.clone() for n, p in c.model.named_parameters()}


def test_one_and_four_micro_batches_give_the_same_loss_and_gradients():
    whole_loss, whole = gradients(config("train.micro_batch_size=8", strategy="dflash"))
    split_loss, split = gradients(config("train.micro_batch_size=2", strategy="dflash"))
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    for key in whole:
        torch.testing.assert_close(split[key], whole[key], rtol=1e-4, atol=1e-7)


def test_target_is_frozen_and_not_optimised():
    c = build_components(config(strategy="dflash"), CPU)
    target = c.strategy.target
    assert not any(q.requires_grad for q in target.parameters()) and not target.training
    optimised = {id(q) for g in c.optimizer.param_groups for q in g["params"]}
    assert not any(id(q) in optimised for q in target.parameters())
    assert c.strategy.layer_ids == [0, 1, 2]  # 3 layers, 3 context layers


def test_train_logs_draft_accuracy_and_exports_a_speculative_model(tmp_path):
    from dlmkit.cli import main
    from dlmkit.families.dflash.pair import DFlashPair
    from dlmkit.generate import load

    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2", strategy="dflash"))
    for r in records(run_dir):
        assert 0 <= r["draft_acc"] <= 1 and isinstance(r["dropped_samples"], int)
        assert all(0 <= r[f"draft_acc_{k}"] <= 1 for k in range(1, BS))
        assert math.isfinite(r["loss"])
    meta = json.loads((run_dir / "final" / "dlmkit.json").read_text())
    assert meta["strategy"] == "dflash" and meta["target_layer_ids"] == [0, 1, 2]
    assert meta["target"] == str(tiny_target().resolve())
    loaded = load(run_dir / "final")
    assert isinstance(loaded.model, DFlashPair) and loaded.config().sampler == "dflash"
    assert loaded.config().block_size == BS


@pytest.mark.parametrize("extra,message", [
    (["strategy.target=/no/such/dir"], "strategy.target '/no/such/dir' is not a directory"),
    (["strategy.target_layer_ids=[0, 7]"], r"has 3 layers .*layer\(s\) \[7\] do not exist"),
    (["strategy.block_size=1"], "block_size must be an int >= 2"),
    (["model.config={hidden_size: 32}"], "does not match the target's hidden size 64"),
])
def test_bad_input_is_an_error_before_training(extra, message):
    with pytest.raises(ValueError, match=message):
        build_components(config(*extra, strategy="dflash"), CPU)


def test_target_required_and_vocab_mismatch(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="strategy.target is required"):
        strategies.get("dflash")({}, mask_token_id=tokenizer.mask_token_id,
                                 vocab_size=tokenizer.vocab_size)
    from dlmkit.models import build_model

    small = build_model("tiny-llama", 100, attention="sdpa",
                        overrides={"hidden_size": 64, "num_hidden_layers": 1})
    small.save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match=r"target's vocabulary \(100\) is smaller"):
        make(tokenizer, target=str(tmp_path / "small"))


def test_drafter_directory_must_fit_the_target(tmp_path, tokenizer):
    from dlmkit.models.dflash import DFlashDraftConfig, DFlashDrafter

    for name, cfg in {"hidden": dict(hidden_size=32, target_hidden_size=32),
                      "vocab": dict(hidden_size=64, vocab_size=99)}.items():
        DFlashDrafter(DFlashDraftConfig(block_size=BS, target_layer_ids=[0, 1, 2],
                                        **cfg)).save_pretrained(tmp_path / name)
    s = make(tokenizer)
    kw = dict(vocab_size=tokenizer.vocab_size, attention="sdpa", dtype=torch.float32)
    with pytest.raises(ValueError, match="drafter hidden size 32 does not match the target's 64"):
        s.build_model(str(tmp_path / "hidden"), **kw)
    with pytest.raises(ValueError, match="drafter vocabulary 99 does not match"):
        s.build_model(str(tmp_path / "vocab"), **kw)
