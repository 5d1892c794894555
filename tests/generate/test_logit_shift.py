"""``strategy.logit_shift`` (docs/logit_shift.md): the token at position ``i`` is read from the
model's output at ``i - 1`` (bd3lm: a block's first token from the clean stream's last position
of the block before) in the loss, every sampler, the ELBO scorers and the export.

The equivalence tests wrap an unshifted model so that its logits move one position left (the
output at ``i`` becomes the inner model's at ``i + 1``, a next-token head): read with the shift,
the wrapper must give exactly what the inner model gives without it. Dropping the shift in any
one place, or reading a bd3lm block's first token from the wrong stream, breaks them.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dlmkit.decoding.likelihood import block_elbo, masked_elbo
from dlmkit.decoding.runner import Runner
from dlmkit.families.bd3lm.decode import sample_blocks
from dlmkit.families.bd3lm.strategy import BD3LMStrategy
from dlmkit.families.mdlm.decode import infill_masked, sample_masked
from dlmkit.families.mdlm.strategy import MDLMStrategy
from dlmkit.families.scdd.decode import sample_scdd
from dlmkit.families.scdd.strategy import SCDDStrategy
from dlmkit.generate import load, sampler_config

from .helpers import MASK, STOPS, TOK, Rigged, V, positional_logits, prompt_ids, tiny_model

PAD = TOK.pad_token_id
S = 4  # bd3lm block


class NextToken(torch.nn.Module):
    """``inner``'s logits moved one position left: the output at ``c`` is the inner model's at
    ``c + 1`` (the last column, which predicts nothing, is 0)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=None):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=cache is not None)
        logits = out.logits
        return SimpleNamespace(logits=torch.cat([logits[:, 1:], torch.zeros_like(logits[:, :1])],
                                                1))


class NextTokenTwoStream(NextToken):
    """The same over ``[x_t | x_0]`` (blocks of ``S`` from column 0): noisy row ``j`` holds the
    inner noisy row ``j + 1`` inside a block; where ``j + 1`` starts a block the inner noisy row
    ``j + 1`` moves to the *clean* row ``j`` and the noisy row ``j`` is 0."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=None):
        logits = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, use_cache=False).logits
        length = logits.shape[1] // 2
        noisy, clean = logits[:, :length], logits[:, length:].clone()
        nxt = torch.cat([noisy[:, 1:], torch.zeros_like(noisy[:, :1])], 1)
        starts = (torch.arange(length) + 1) % S == 0
        starts[-1] = False
        new_noisy = torch.where(starts[None, :, None], 0.0, nxt)
        clean[:, starts] = nxt[:, starts]
        return SimpleNamespace(logits=torch.cat([new_noisy, clean], 1))


def _runner(model):
    return Runner(model, vocab_size=V)


def _gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


PROMPTS = prompt_ids("abc", "hello world", "x")


# -- samplers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [
    {"max_new_tokens": 8, "steps": 8, "block_size": 4},
    {"max_new_tokens": 8, "steps": 4, "temperature": 1.0, "remasking": "margin"},
    {"pad_to": 28, "threshold": 0.5},
])
def test_mdlm_sampler_reads_the_shifted_logits(options):
    def decode(model, shift):
        cfg = sampler_config("mdlm", logit_shift=shift, **options)
        return sample_masked(_runner(model), PROMPTS, cfg, mask_id=MASK, pad_id=PAD,
                             stop_ids=STOPS, generator=_gens(3))

    model = tiny_model()
    assert torch.equal(decode(NextToken(model), True), decode(model, False))


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_mdlm_cached_decoding_reads_the_shifted_logits(cache):
    """The caches start their forwards one column early; a model whose logits depend on the
    position alone pins which column each token is read from (a real model's cached decode is
    an approximation that moves with the window)."""
    def target(p):
        return 97 + (p * 7) % 23

    def decode(fn, shift):
        cfg = sampler_config("mdlm", max_new_tokens=12, steps=6, block_size=4,
                                         cache=cache, logit_shift=shift)
        return sample_masked(_runner(Rigged(fn)), PROMPTS, cfg, mask_id=MASK, pad_id=PAD,
                             stop_ids=STOPS, generator=_gens(3))

    plain = decode(positional_logits(target=target), False)
    shifted = decode(positional_logits(target=lambda p: target(p + 1)), True)
    assert torch.equal(shifted, plain)
    assert not torch.equal(decode(positional_logits(target=lambda p: target(p + 1)), False),
                           plain)


@pytest.mark.parametrize("revise", [False, True])
def test_scdd_sampler_reads_the_shifted_logits(revise):
    def decode(model, shift):
        cfg = sampler_config("scdd", max_new_tokens=8, steps=6, temperature=1.0,
                                         revise=revise, logit_shift=shift)
        return sample_scdd(_runner(model), PROMPTS, cfg, mask_id=MASK, pad_id=PAD,
                           generator=_gens(3))

    model = tiny_model()
    assert torch.equal(decode(NextToken(model), True), decode(model, False))


def test_bd3lm_sampler_reads_the_shifted_logits():
    """A block's first token is read from the last column of the clean block before it (here
    the wrapper's, which is the inner model's noisy first column)."""
    prompts = prompt_ids("abcd", "hi", "a longer prompt")  # ends at and off block boundaries

    def decode(model, shift):
        cfg = sampler_config("bd3lm", max_new_tokens=12, steps=12, block_size=S,
                                         logit_shift=shift)
        return sample_blocks(_runner(model), prompts, cfg, mask_id=MASK, pad_id=PAD,
                             stop_ids=STOPS, generator=_gens(3))

    model = tiny_model()
    assert torch.equal(decode(NextToken(model), True), decode(model, False))


def test_bd3lm_cached_decoding_keeps_the_block_head():
    """With the cache the later steps of a block do not run the clean column before it: its
    logits are kept from the block's first forward."""
    def target(p):
        return 97 + (p * 5) % 19

    prompts = prompt_ids("abcd", "hi", "a longer prompt")

    def decode(fn, shift):
        cfg = sampler_config("bd3lm", max_new_tokens=12, steps=12, block_size=S,
                                         cache="prefix", logit_shift=shift)
        return sample_blocks(_runner(Rigged(fn)), prompts, cfg, mask_id=MASK, pad_id=PAD,
                             stop_ids=STOPS, generator=_gens(3))

    plain = decode(positional_logits(target=target), False)
    assert torch.equal(decode(positional_logits(target=lambda p: target(p + 1)), True), plain)


def test_infill_with_the_shift():
    model = tiny_model()
    seqs = [[97, MASK, MASK, 98, MASK, 99], [100, 101, MASK, MASK]]

    def fill(m, shift, cache="none"):
        cfg = sampler_config("mdlm", steps=5, logit_shift=shift, cache=cache)
        return infill_masked(_runner(m), seqs, cfg, mask_id=MASK, pad_id=PAD, generator=_gens(2))

    assert fill(NextToken(model), True) == fill(model, False)
    cfg = sampler_config("mdlm", steps=2, logit_shift=True)
    with pytest.raises(ValueError, match=r"sequences\[1\] starts with a mask token.*logit_shift"):
        infill_masked(_runner(model), [[97, MASK], [MASK, 98]], cfg, mask_id=MASK, pad_id=PAD,
                      generator=_gens(2))


# -- likelihood -------------------------------------------------------------------------------
@pytest.mark.parametrize("exclude_mask", [False, True])
def test_masked_elbo_reads_the_shifted_logits(exclude_mask):
    model = tiny_model()
    prompt, cont = prompt_ids("abc")[0], [104, 105, 106, 107, 108]

    def score(m, shift):
        return masked_elbo(_runner(m), prompt, cont, mask_id=MASK, samples=8,
                           generator=torch.Generator().manual_seed(3), exclude_mask=exclude_mask,
                           logit_shift=shift)

    assert score(NextToken(model), True) == pytest.approx(score(model, False), abs=1e-5)
    with pytest.raises(ValueError, match="empty prompt"):
        masked_elbo(_runner(model), [], cont, mask_id=MASK, samples=1,
                    generator=torch.Generator(), logit_shift=True)


def test_block_elbo_reads_a_block_start_from_the_clean_stream():
    model = tiny_model()
    prompt = prompt_ids("abc")[0]
    cont = list(range(100, 111))  # crosses several block boundaries

    def score(m, shift):
        return block_elbo(_runner(m), prompt, cont, mask_id=MASK, block_size=S, samples=8,
                          generator=torch.Generator().manual_seed(5), logit_shift=shift)

    assert score(NextTokenTwoStream(model), True) == pytest.approx(score(model, False),
                                                                    abs=1e-5)


# -- training loss ----------------------------------------------------------------------------
def _batch(rows=3, length=16, prompt=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (rows, length), generator=g)
    loss_mask = torch.ones(rows, length, dtype=torch.long)
    loss_mask[:, :prompt] = 0  # the first token is a prompt token: no predecessor is needed
    return {"input_ids": ids, "loss_mask": loss_mask,
            "attention_valid": torch.ones(rows, length, dtype=torch.long),
            "position_ids": torch.arange(length).expand(rows, -1).clone(),
            "doc_ids": torch.zeros(rows, length, dtype=torch.long)}


@pytest.mark.parametrize("cls,wrap,extra", [
    (MDLMStrategy, NextToken, {}),
    (SCDDStrategy, NextToken, {"max_ratio": 0.1}),
    (BD3LMStrategy, NextTokenTwoStream, {"block_size": S}),
])
def test_loss_of_the_shifted_model_equals_the_unshifted(cls, wrap, extra):
    model = tiny_model()
    losses = []
    for shift, m in ((False, model), (True, wrap(model))):
        strategy = cls({"logit_shift": shift, **extra}, mask_token_id=MASK, vocab_size=V)
        prepared = strategy.prepare(_batch(), _gens(3, seed=11))
        counts = strategy.counts(prepared)
        with torch.no_grad():
            losses.append(strategy.loss(m, prepared, counts).total)
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-5)


@pytest.mark.parametrize("cls,extra", [(MDLMStrategy, {}), (BD3LMStrategy, {"block_size": S})])
def test_a_documents_first_token_is_never_corrupted_scored_or_counted(cls, extra):
    """The rule for the position with no predecessor: out of the loss mask before corruption."""
    batch, docs = _batch(prompt=0), 3
    if cls is BD3LMStrategy:  # two packed documents in row 0: positions restart at column 8
        batch["doc_ids"][0, 8:] = 1
        batch["position_ids"][0, 8:] -= 8
        docs = 4
    strategy = cls({"logit_shift": True, "t_min": 0.99, **extra}, mask_token_id=MASK,
                   vocab_size=V)
    prepared = strategy.prepare(batch, _gens(docs))
    first = batch["position_ids"] == 0
    assert not bool(prepared["noise_mask"][first].any())
    assert int(strategy.counts(prepared)["num_tokens"]) == int(batch["loss_mask"].sum()) - int(
        first.sum())
    plain = cls({"t_min": 0.99, **extra}, mask_token_id=MASK, vocab_size=V)
    assert int(plain.counts(plain.prepare(batch, _gens(docs)))["num_tokens"]) == int(
        batch["loss_mask"].sum())


def test_the_option_is_checked():
    with pytest.raises(ValueError, match=r"strategy.logit_shift must be true, false or null "
                                         r"\(true when fine-tuning a causal checkpoint \(any "
                                         r"without the option\), false from scratch; an "
                                         r"export with it keeps its own\), got 1"):
        MDLMStrategy({"logit_shift": 1}, mask_token_id=MASK, vocab_size=V)
    with pytest.raises(ValueError, match="logit_shift must be True or False"):
        sampler_config("mdlm", logit_shift="yes")
    with pytest.raises(ValueError, match="does not use option.*logit_shift"):
        sampler_config("idlm", block_size=4, logit_shift=True)


# -- export -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shifted_export(tmp_path_factory):
    from dlmkit.train import recipe
    from tests.train.helpers import config

    run = tmp_path_factory.mktemp("shift") / "run"
    recipe.run(config("train.steps=2", "strategy.logit_shift=true", strategy="bd3lm",
                      output_dir=run))
    return run / "final"


def test_export_records_and_decodes_with_the_shift(shifted_export, capsys):
    from dlmkit.cli import main

    meta = json.loads((shifted_export / "dlmkit.json").read_text())
    assert meta["options"]["logit_shift"] is True
    loaded = load(shifted_export)
    cfg = loaded.config(max_new_tokens=8)
    assert cfg.logit_shift is True
    with pytest.raises(ValueError, match="logit_shift=False differs from the model's"):
        loaded.config(logit_shift=False)
    # `dlmkit generate` decodes as the library does with the trained shift
    from dlmkit.generate import generate

    expected = generate(loaded.model, loaded.tokenizer, ["abc"], cfg).texts[0]
    assert main(["generate", "--model", str(shifted_export), "--prompt", "abc",
                 "--max-new-tokens", "8", "--device", "cpu"]) in (0, None)
    assert f"> abc\n{expected}\n" in capsys.readouterr().out


def test_lm_eval_scores_with_the_trained_shift(shifted_export):
    from dlmkit.decoding.likelihood import elbo
    from dlmkit.generate.harness import DlmkitLM

    lm = DlmkitLM(pretrained=str(shifted_export), mc_samples=4)
    prompt, cont = lm._split("abc", "cba")
    got = lm.loglikelihood([SimpleNamespace(args=("abc", "cba"))])[0][0]

    def direct(shift):
        return elbo("block_elbo", _runner(lm.loaded.model), prompt, cont, mask_id=MASK,
                    samples=4, generator=torch.Generator().manual_seed(0), batch_size=8,
                    block_size=4, logit_shift=shift)

    assert got == pytest.approx(direct(True), abs=1e-6)
    assert got != pytest.approx(direct(False), abs=1e-6)


def test_an_export_without_the_key_decodes_unshifted(exported):
    from dlmkit.generate.api import SamplerFamilyWarning

    path = exported("mdlm")
    assert load(path).config().logit_shift is False
    meta = json.loads((path / "dlmkit.json").read_text())
    meta["options"]["logit_shift"] = True
    (path / "dlmkit.json").write_text(json.dumps(meta))
    assert load(path).config().logit_shift is True
    with pytest.warns(SamplerFamilyWarning):  # a related sampler reads the model the same way
        assert load(path).config("scdd").logit_shift is True
