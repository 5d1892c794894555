"""BD3-LM / hybrid block sampler, the causal stream, I-DLM strided decoding."""

import pytest
import torch

from dlmkit.decoding.runner import Runner
from dlmkit.decoding.stream import CausalStream
from dlmkit.generate import generate, sampler_config
from dlmkit.masks import block_diffusion
from dlmkit.masks.decode import block_diffusion_decode, idlm_decode
from dlmkit.masks.hybrid import hybrid
from dlmkit.models import forward_logits

from .helpers import MASK, TOK, Recorder, Rigged, positional_logits, prompt_ids, tiny_model

TEXTS = ["rev abc", "sort 3142", "9+1=", "x"]  # prompt lengths 11, 13, 8, 5 tokens


def run(model, sampler, texts=TEXTS, **options):
    return generate(model, TOK, texts, sampler_config(sampler, **options))


@pytest.mark.parametrize("sampler", ["bd3lm", "hybrid"])
def test_block_cached_equals_uncached(sampler):
    model = tiny_model()
    opts = dict(max_new_tokens=10, block_size=4, steps=5)
    plain, cached = run(model, sampler, **opts), run(model, sampler, cache="prefix", **opts)
    assert plain.tokens == cached.tokens and plain.forwards == cached.forwards
    assert all(MASK not in t and len(t) <= 10 for t in plain.tokens)
    sampled = [run(model, sampler, temperature=1.0, seed=3, cache=c, **opts).tokens
               for c in ("none", "prefix")]
    assert sampled[0] == sampled[1]


def test_block_ragged_rows_equal_rows_alone():
    model = tiny_model()
    batch = run(model, "bd3lm", max_new_tokens=6, block_size=4, cache="prefix")
    for text, tokens in zip(TEXTS, batch.tokens):
        alone = run(model, "bd3lm", [text], max_new_tokens=6, block_size=4, cache="prefix")
        assert alone.tokens[0] == tokens


@pytest.mark.parametrize("sampler,training_mask", [("bd3lm", block_diffusion),
                                                    ("hybrid", hybrid)])
def test_block_decode_logits_equal_training_layout(sampler, training_mask):
    """Every uncached decode forward equals the noisy rows of the training forward on
    [x_t | x_0] (positions 0..L-1 twice) for the same tokens."""
    model, S = tiny_model(), 4
    rec = Recorder(model)
    run(rec, sampler, ["rev abc"], max_new_tokens=7, block_size=S, steps=4)
    assert len(rec.calls) >= 3
    for call in rec.calls:
        ids = call["ids"]
        L = ids.shape[1]
        pos = torch.arange(L)[None]
        train = forward_logits(model, torch.cat([ids, ids], 1), training_mask(L, S),
                               torch.cat([pos, pos], 1))
        torch.testing.assert_close(call["logits"][:, L - S:], train[:, L - S:L],
                                   atol=1e-4, rtol=1e-4)


def test_block_cached_masks_are_the_decode_masks():
    rec = Recorder(tiny_model())
    run(rec, "bd3lm", ["rev ab"], max_new_tokens=8, block_size=4, cache="prefix", steps=8)
    later = [c for c in rec.calls if c["ids"].shape[1] == 4]  # noisy block alone, over cache
    assert later
    for call in later:
        cache_len = call["mask"].shape[-1] - 4
        assert torch.equal(call["mask"], block_diffusion_decode(cache_len, 4).dense())


def test_hybrid_ar_mode_equals_ar():
    model = tiny_model()
    a = run(model, "hybrid", mode="ar", max_new_tokens=6)
    b = run(model, "ar", max_new_tokens=6)
    assert a.tokens == b.tokens and a.forwards == b.forwards == 6


def test_stream_holes_and_idlm_decode_mask():
    model = tiny_model()
    rec = Recorder(model)
    runner = Runner(rec)
    stream = CausalStream(runner, 2)
    ids = torch.tensor([[TOK.pad_token_id, 1, 2, 3], [4, 5, 6, 7]])
    valid = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    clean, noisy = stream.forward(ids, valid, 3, MASK)
    # row 1 has no padding: its mask is exactly idlm_decode(0, 4, 3)
    assert torch.equal(rec.calls[0]["mask"][1:], idlm_decode(0, 4, 3).dense())
    stream.commit(torch.tensor([[False, True, True, False], [True] * 4]))  # row 0 rejects "3"
    clean2, _ = stream.forward(torch.tensor([[9], [9]]), torch.ones(2, 1, dtype=torch.long))
    # row 0 alone: tokens 1, 2, 9 at positions 0, 1, 2
    alone = forward_logits(model, torch.tensor([[1, 2, 9]]),
                           idlm_decode(0, 3, 1).__class__.from_rule(
                               lambda b, q, kv: kv <= q, 3, 3), torch.arange(3)[None])
    torch.testing.assert_close(clean2[0, -1], alone[0, -1], atol=1e-4, rtol=1e-4)
    assert stream.next_pos.tolist() == [2, 4]  # the second forward is not committed yet


def test_isd_greedy_equals_ar_token_for_token():
    model = tiny_model()
    ar = run(model, "ar", max_new_tokens=10)
    for stride in (2, 4):
        isd = run(model, "idlm", max_new_tokens=10, block_size=stride)
        assert isd.tokens == ar.tokens and isd.forwards <= ar.forwards


def test_isd_accepts_proposals_with_fewer_forwards():
    """A model whose clean and noisy streams agree (next token = f(position)): every proposal
    is accepted, N + 1 tokens per forward, and the output is still greedy AR's."""
    fn = positional_logits(sharp=6.0, target=lambda p: 97 + (p + 1) % 20)
    ar = run(Rigged(fn), "ar", ["hi", "a longer one"], max_new_tokens=12)
    isd = run(Rigged(fn), "idlm", ["hi", "a longer one"], max_new_tokens=12, block_size=3)
    assert isd.tokens == ar.tokens and all(len(t) == 12 for t in isd.tokens)
    # the prompt's forward commits 1 token, each later one N + 1 = 4: 1 + 4 + 4 + 4 >= 12
    assert ar.forwards == 12 and isd.forwards == 4
    assert isd.tokens_per_forward == pytest.approx(3.0)  # 12 tokens / 4 forwards per row


def test_isd_sampling_is_seeded_and_exact_for_agreeing_streams():
    model = tiny_model()
    a = run(model, "idlm", max_new_tokens=6, block_size=3, temperature=1.0, seed=1)
    b = run(model, "idlm", max_new_tokens=6, block_size=3, temperature=1.0, seed=1)
    assert a.tokens == b.tokens
    fn = positional_logits(sharp=40.0, target=lambda p: 97 + (p + 1) % 20)
    s = run(Rigged(fn), "idlm", ["hi"], max_new_tokens=8, block_size=3, temperature=1.0)
    n = len(prompt_ids("hi")[0])
    assert s.tokens[0] == [97 + (p + 1) % 20 for p in range(n - 1, n + 7)]
