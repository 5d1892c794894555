"""Each strategy feeds the model exactly what it should: corrupted ids only at supervised
positions, ``[x_t | x_0]`` with positions ``[p | p]``, the factory's mask, and denominators
that count exactly the scored positions."""

from __future__ import annotations

import math

import pytest
import torch

from dlmkit import strategies
from dlmkit.data import Collator, SFTDataset, load_tokenizer
from dlmkit.data.seeds import sample_generators
from dlmkit.masks import block_diffusion, canvas, idlm
from dlmkit.masks.bidirectional import bidirectional
from dlmkit.masks.causal import padded_causal
from dlmkit.masks.hybrid import hybrid
from dlmkit.models import build_model

BLOCK = 4
TWO_STREAM = {"bd3lm": block_diffusion, "hybrid": hybrid, "idlm": idlm}
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
# Strategies that train one model on the batch itself; dflash drafts for a frozen target and
# feeds its drafter anchor blocks, not the sequence: tests/strategies/test_dflash.py.
SINGLE_MODEL = [n for n in strategies.names() if n != "dflash"]
CANVAS = "block_diffusion"  # encoder over the clean stream, decoder over one noisy block


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("byte")


def make_batch(tokenizer, name, n=6, block_align=True):
    data = SFTDataset.from_task("reverse", "train", tokenizer, n=n, seed=0)
    block = BLOCK if (name in TWO_STREAM or name == CANVAS) and block_align else None
    collate = Collator(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                       block_size=block, fill_from_response=strategies.get(name).fill_from_response)
    return collate([data[i] for i in range(n)])


def make_strategy(tokenizer, name, **options):
    if name in TWO_STREAM or name == CANVAS:
        options.setdefault("block_size", BLOCK)
    return strategies.get(name)(options, mask_token_id=tokenizer.mask_token_id,
                                vocab_size=tokenizer.vocab_size)


def make_model(strategy, tokenizer, name):
    if name == CANVAS:  # DiffusionGemma, built by its strategy
        return strategy.build_model(strategy.default_model, vocab_size=tokenizer.vocab_size,
                                    attention="sdpa", dtype=torch.float32, overrides=TINY)
    return build_model("tiny-llama", tokenizer.vocab_size, attention="sdpa", overrides=TINY)


def prepare(strategy, batch, step=0):
    gens = sample_generators(0, step, batch["sample_index"].tolist())
    return strategy.prepare(batch, gens)


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_corruption_only_at_supervised_positions(tokenizer, name):
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    p = prepare(s, batch)
    L = batch["input_ids"].shape[1]
    ids, sup = batch["input_ids"], batch["loss_mask"] != 0
    noisy = p["input_ids"][:, :L]
    changed = noisy != ids
    if name == "ar":  # autoregressive SFT: the model sees the clean tokens
        assert not changed.any() and torch.equal(p["target_ids"], ids)
        return
    if name == CANVAS:  # the encoder sees x_0; the canvas block is the corrupted part
        assert not changed.any()
        cols = p["starts"].unsqueeze(1) + torch.arange(BLOCK)
        inside = torch.arange(BLOCK) < p["lengths"].unsqueeze(1)
        assert torch.equal(p["target_ids"][inside], ids.gather(1, cols.clamp(max=L - 1))[inside])
        assert sup.gather(1, cols.clamp(max=L - 1))[inside].all()
        hit = p["canvas_ids"] != p["target_ids"]
        assert hit.any() and not hit[~p["loss_mask"]].any()
        assert not (hit & ~p["noise_mask"]).any() and (p["canvas_ids"] < s.vocab_size).all()
        return
    assert not changed[~sup].any(), "a position outside the loss mask was corrupted"
    assert changed.any(), "nothing was corrupted"
    assert torch.equal(p["target_ids"], ids)
    if name == "scdd":
        # absorbing or uniform channel: changed tokens are the mask token or another real id
        assert (noisy[changed] < tokenizer.vocab_size).all()
    elif name == "idlm":
        assert (noisy[sup] == tokenizer.mask_token_id).all()  # all-masked
    else:
        assert (noisy[changed] == tokenizer.mask_token_id).all()
        # noise_mask marks exactly the masked positions
        assert torch.equal(p["noise_mask"].bool(), changed)


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_layout_positions_and_mask(tokenizer, name):
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    p = prepare(s, batch)
    ids, pos, valid = batch["input_ids"], batch["position_ids"], batch["attention_valid"]
    L = ids.shape[1]
    if name in TWO_STREAM:
        assert p["input_ids"].shape == (ids.shape[0], 2 * L)
        assert torch.equal(p["input_ids"][:, L:], ids), "clean half must be x_0"
        assert torch.equal(p["position_ids"], torch.cat([pos, pos], 1))
        expected = TWO_STREAM[name](L, BLOCK, valid)
    elif name == "ar":
        assert torch.equal(p["input_ids"], ids) and torch.equal(p["position_ids"], pos)
        expected = padded_causal(L, valid)
    elif name == CANVAS:
        assert torch.equal(p["input_ids"], ids) and torch.equal(p["position_ids"], pos)
        assert torch.equal(p["canvas_positions"],
                           pos.gather(1, p["starts"].unsqueeze(1)) + torch.arange(BLOCK))
        expected = canvas(p["starts"], p["lengths"], L, BLOCK, canvas_length=BLOCK, valid=valid)
    else:
        assert p["input_ids"].shape == ids.shape
        assert torch.equal(p["position_ids"], pos)
        expected = bidirectional(L, valid)
    got = p["mask"].dense()
    want = expected.dense()
    assert torch.equal(got.expand_as(want), want.expand_as(got))


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_counts_are_hand_computed_denominators(tokenizer, name):
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    p = prepare(s, batch)
    sup = batch["loss_mask"] != 0
    valid = batch["attention_valid"] != 0
    counts = {k: int(v) for k, v in s.counts(p).items()}
    n_sup = int(sup.sum())
    if name in ("mdlm", "scdd", "bd3lm"):
        assert counts == {"num_tokens": n_sup}
    elif name == "hybrid":
        masked = int((p["noise_mask"].bool() & sup).sum())
        # next-token targets: supervised tokens that have a predecessor in their row
        assert counts == {"num_tokens": masked, "num_ar_tokens": int(sup[:, 1:].sum())}
    elif name == "idlm":
        assert counts == {"num_tokens": int((sup & valid)[:, 1:].sum())}
    elif name == "ar":
        # next-token pairs: supervised tokens with a predecessor in their row
        assert counts == {"num_tokens": int(sup[:, 1:].sum())}
    elif name == CANVAS:
        # the selected block's supervised tokens; the encoder's next-token pairs whose target
        # is a supervised token (the default encoder_loss_targets="response")
        response_pairs = int((valid[:, :-1] & (sup & valid)[:, 1:]).sum())
        assert counts == {"num_tokens": int(p["lengths"].sum()), "num_ar_tokens": response_pairs}
        # encoder_loss_targets="all" (NeMo's recipe): every valid next-token pair
        s = make_strategy(tokenizer, name, encoder_loss_targets="all")
        counts = {k: int(v) for k, v in s.counts(prepare(s, batch)).items()}
        assert counts["num_ar_tokens"] == int((valid[:, :-1] & valid[:, 1:]).sum())
        assert 0 < response_pairs < counts["num_ar_tokens"]
    else:
        raise AssertionError(f"no hand-computed denominators for strategy {name!r}")


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_noise_depends_on_seed_step_and_sample_only(tokenizer, name):
    if name in ("idlm", "ar"):
        pytest.skip(f"{name} draws no random numbers (all-masked / clean input)")
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    a, b, c = prepare(s, batch, 0), prepare(s, batch, 0), prepare(s, batch, 1)
    noisy = "canvas_ids" if name == CANVAS else "input_ids"
    assert torch.equal(a[noisy], b[noisy])
    assert not torch.equal(a[noisy], c[noisy])
    # row 2 alone gets the same noise as inside the batch (per-sample generators)
    one = {k: v[2:3] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    alone = prepare(s, one, 0)
    assert torch.equal(alone[noisy], a[noisy][2:3])


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_loss_and_gradients_finite(tokenizer, name):
    torch.manual_seed(0)
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    p = prepare(s, batch)
    model = make_model(s, tokenizer, name)
    denominators = {k: float(v) for k, v in s.counts(p).items()}
    out = s.loss(model, p, denominators)
    value = float(out.total.detach())
    assert math.isfinite(value) and value > 0
    out.total.backward()
    grads = [q.grad for q in model.parameters() if q.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_global_denominator_scales_the_loss(tokenizer, name):
    """Losses divide by the denominator they are given: doubling it halves the loss."""
    torch.manual_seed(0)
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    p = prepare(s, batch)
    model = make_model(s, tokenizer, name)
    d = {k: float(v) for k, v in s.counts(p).items()}
    with torch.no_grad():
        one = float(s.loss(model, p, d).total)
        two = float(s.loss(model, p, {k: 2 * v for k, v in d.items()}).total)
    assert two == pytest.approx(one / 2, rel=1e-5)


@pytest.mark.parametrize("name", SINGLE_MODEL)
def test_mask_cache_hits_on_repeated_layout(tokenizer, name):
    batch = make_batch(tokenizer, name)
    s = make_strategy(tokenizer, name)
    first = prepare(s, batch, 0)
    misses = s.masks.misses
    # the canvas mask follows the drawn block too: only the same step repeats its layout
    second = prepare(s, batch, 0 if name == CANVAS else 1)
    assert s.masks.misses == misses and s.masks.hits >= 1
    assert second["mask"] is first["mask"]
    other = make_batch(tokenizer, name, n=3)
    prepare(s, other)
    assert s.masks.misses == misses + 1


def test_registry_and_option_errors(tokenizer):
    assert set(strategies.names()) >= {"mdlm", "scdd", "hybrid", "idlm", "bd3lm"}
    with pytest.raises(ValueError, match="unknown strategy 'nope'.*mdlm"):
        strategies.get("nope")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['blok_size'\].*block_size"):
        make_strategy(tokenizer, "bd3lm", blok_size=4)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        make_strategy(tokenizer, "idlm", block_size=0)
    with pytest.raises(ValueError, match="corruption must be one of"):
        make_strategy(tokenizer, "hybrid", corruption="zigzag")
    with pytest.raises(ValueError, match="mask_token_id 300 is outside the vocabulary"):
        strategies.get("mdlm")({}, mask_token_id=300, vocab_size=300)


def test_bd3lm_noise_level_is_per_block(tokenizer):
    batch = make_batch(tokenizer, "bd3lm")
    p = prepare(make_strategy(tokenizer, "bd3lm"), batch)
    sup = batch["loss_mask"] != 0
    B, L = batch["input_ids"].shape
    levels = p["p_mask"].view(B, L // BLOCK, BLOCK)
    blocks = sup.view(B, L // BLOCK, BLOCK).all(-1)
    assert torch.equal(levels[blocks].amax(-1), levels[blocks].amin(-1))
    assert len(torch.unique(levels[blocks][:, 0])) > 1, "blocks should get different levels"


def test_hybrid_blockwise_corruption(tokenizer):
    batch = make_batch(tokenizer, "hybrid")
    s = make_strategy(tokenizer, "hybrid", corruption="blockwise")
    p = prepare(s, batch)
    L = batch["input_ids"].shape[1]
    changed = p["input_ids"][:, :L] != batch["input_ids"]
    assert not changed[batch["loss_mask"] == 0].any()
    assert (p["input_ids"][:, :L][changed] == tokenizer.mask_token_id).all()
