"""MDLM / LLaDA sampler, infilling, SCDD ancestral sampler."""

import pytest
import torch

from dlmkit import families
from dlmkit.decoding.runner import Runner
from dlmkit.families.scdd.decode import step_weights
from dlmkit.generate import generate, infill, sampler_config

from .helpers import (
    MASK,
    STOPS,
    TOK,
    Recorder,
    Rigged,
    V,
    positional_logits,
    prompt_ids,
    tiny_model,
)

TEXTS = ["rev abc", "sort 31", "99+1=", "x"]  # ragged


def run(model, sampler, texts=TEXTS, **options):
    return generate(model, TOK, texts, sampler_config(sampler, **options))


def check_clean(result, max_new):
    for row in result.tokens:
        assert MASK not in row and len(row) <= max_new
        assert not set(row) & set(STOPS)


@pytest.mark.parametrize("options", [
    dict(max_new_tokens=8, block_size=4),
    dict(max_new_tokens=8, temperature=1.0, remasking="random", steps=4),
    dict(max_new_tokens=8, block_size=2, remasking="margin", threshold=0.5, steps=4),
    dict(max_new_tokens=8, remasking="entropy", cache="prefix"),
    dict(max_new_tokens=8, block_size=4, factor=1.0, cache="dual"),
])
def test_mdlm_no_mask_left_prompt_preserved(options):
    rec = Recorder(tiny_model())
    result = run(rec, "mdlm", **options)
    check_clean(result, 8)
    prompts = prompt_ids(*TEXTS)
    width = max(map(len, prompts))
    for call in rec.calls:
        if call["ids"].shape[1] < width + 8:
            continue  # a cached step runs only the suffix
        for row, p in enumerate(prompts):
            assert call["ids"][row, width - len(p):width].tolist() == p
    assert result.forwards == len(rec.calls) and result.forwards <= options.get("steps", 8)


def test_mdlm_ragged_rows_equal_rows_alone():
    model = tiny_model()
    batch = run(model, "mdlm", max_new_tokens=8, block_size=4)
    for text, tokens in zip(TEXTS, batch.tokens):
        assert run(model, "mdlm", [text], max_new_tokens=8, block_size=4).tokens[0] == tokens


def test_same_seed_same_output():
    model = tiny_model()
    for sampler, opts in [("mdlm", dict(steps=4)), ("scdd", dict(steps=3))]:
        a = run(model, sampler, max_new_tokens=8, temperature=1.0, seed=5, **opts)
        b = run(model, sampler, max_new_tokens=8, temperature=1.0, seed=5, **opts)
        c = run(model, sampler, max_new_tokens=8, temperature=1.0, seed=6, **opts)
        assert a.tokens == b.tokens and a.tokens != c.tokens


def falling_confidence(ids, pos):
    """Every position proposes 'a'; confidence falls with the position id."""
    logits = torch.zeros(*ids.shape, V)
    logits[..., 97] = 10.0 - 0.1 * pos.float()
    logits[..., MASK] = 50.0
    return logits


def test_rigged_confidence_decodes_left_to_right():
    fake = Rigged(falling_confidence)
    run(fake, "mdlm", ["hi"], max_new_tokens=6)
    width = len(prompt_ids("hi")[0])
    order = []
    for (ids, _), (nxt, _) in zip(fake.calls, fake.calls[1:] + [(None, None)]):
        if nxt is not None:
            committed = (ids[0, width:] == MASK) & (nxt[0, width:] != MASK)
            order += committed.nonzero()[:, 0].tolist()
    assert order == sorted(order) and len(fake.calls) == 6


def test_threshold_never_strands_masks_and_saves_forwards():
    # confidence 0.6 everywhere: a 0.99 threshold commits only the schedule's share
    def flat(ids, pos):
        logits = torch.full((*ids.shape, V), -30.0)
        logits[..., 97] = 0.0
        logits[..., 98] = -0.4
        return logits

    result = run(Rigged(flat), "mdlm", ["hi", "there"], max_new_tokens=8, block_size=4,
                 steps=2, threshold=0.99)
    assert result.forwards == 2 and all(len(t) == 8 for t in result.tokens)
    confident = run(Rigged(positional_logits(sharp=20.0)), "mdlm", ["hi"], max_new_tokens=8,
                    threshold=0.9)
    assert confident.forwards == 1 and len(confident.tokens[0]) == 8
    one_per_step = run(Rigged(positional_logits(sharp=20.0)), "mdlm", ["hi"], max_new_tokens=8)
    assert one_per_step.forwards == 8 and one_per_step.tokens == confident.tokens
    assert one_per_step.tokens_per_forward == 1.0 and confident.tokens_per_forward == 8.0


def test_per_row_stop_ends_early_and_strips_fill():
    end = TOK.end_of_turn_token_id

    def answer(ids, pos):  # "ok" then end-of-turn then EOS fill, very confident
        target = torch.where(pos == 6, 111, torch.where(pos == 7, 107, torch.where(
            pos == 8, end, TOK.eos_token_id)))
        return positional_logits(sharp=30.0, target=lambda p: target)(ids, pos)

    result = run(Rigged(answer), "mdlm", ["hi"], max_new_tokens=16, block_size=4)
    assert result.texts == ["ok"] and result.forwards == 3 and result.generated == 3
    # the long row's answer is empty (its first position already predicts EOS): it stops
    # after one forward and no longer counts while the batch goes on
    both = run(Rigged(answer), "mdlm", ["hi", "a much longer prompt"], max_new_tokens=16,
               block_size=4)
    assert both.texts == ["ok", ""] and both.forwards == 3 and both.row_forwards == 4


def test_infill_respects_spans():
    seq = [*prompt_ids("rev abc")[0], 99, MASK, MASK, 97, MASK, TOK.end_of_turn_token_id]
    short = [*prompt_ids("x")[0], MASK, 98]
    result = infill(tiny_model(), TOK, [seq, short], families.get("mdlm").sampling(threshold=0.5))
    for before, after in zip([seq, short], result.tokens):
        assert len(after) == len(before) and MASK not in after
        assert all(a == b for a, b in zip(after, before) if b != MASK)
    assert result.forwards <= 3


def test_scdd_revise_no_mask_and_final_pass_denoises_everything():
    fn = positional_logits(sharp=8.0)
    result = run(Rigged(fn), "scdd", ["hi", "longer prompt"], max_new_tokens=6, steps=4,
                 temperature=1.0, revise=True)
    assert result.forwards == 5
    for text, p in zip(result.tokens, prompt_ids("hi", "longer prompt")):
        assert text == [97 + q % 20 for q in range(len(p), len(p) + 6)]
    check_clean(run(tiny_model(), "scdd", max_new_tokens=8, steps=3, temperature=1.0,
                    revise=True), 8)


def _visible_disagrees(ids, pos):
    """Masked positions predict ``97 + p % 20``; a visible response token predicts ``z + 1``:
    a model whose predictions at visible positions contradict what it committed."""
    logits = positional_logits(sharp=8.0)(ids, pos)
    response = (ids != MASK) & (pos >= 20)  # the tests' prompts are shorter than 20 tokens
    shifted = torch.zeros_like(logits).scatter_(-1, ((ids + 1) % (V - 1)).unsqueeze(-1), 30.0)
    return torch.where(response.unsqueeze(-1), shifted, logits)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_scdd_default_commits_once_and_keeps_what_it_committed(temperature):
    texts = ["hi", "x"]
    pad = {"max_new_tokens": 24}  # canvas positions 20+ exist for both prompts
    rec = Rigged(_visible_disagrees)
    result = run(rec, "scdd", texts, steps=24, temperature=temperature, **pad)
    width = max(map(len, prompt_ids(*texts)))
    # Once a canvas position holds a token, every later forward sees the same token.
    canvases = [ids[:, width:] for ids, _ in rec.calls]
    for before, after in zip(canvases, canvases[1:]):
        committed = before != MASK
        assert torch.equal(after[committed], before[committed])
    # Greedy: every released token is the masked-time argmax, never a visible-time one.
    if temperature == 0:
        for row, p in zip(result.tokens, prompt_ids(*texts)):
            assert row == [97 + q % 20 for q in range(len(p), len(p) + len(row))]
    assert result.forwards <= 24  # stops once nothing is masked
    revised = run(Rigged(_visible_disagrees), "scdd", texts, steps=24,
                  temperature=temperature, revise=True, **pad)
    assert revised.tokens != result.tokens  # the final pass follows the visible predictions


def test_scdd_step_weights_are_the_posterior():
    p = torch.softmax(torch.randn(1, 2, 7, dtype=torch.float64), -1)
    p[..., 6] = 0
    p = p / p.sum(-1, keepdim=True)
    z = torch.tensor([[6, 2]])  # MASK (id 6), visible 2
    schedule = dict(max_ratio=0.1, gamma_shape=1.0, t_peak=0.5)
    w = step_weights(z, p, 0.6, 0.5, 6, schedule)
    # from MASK: mass that stays MASK + mass released sums to one
    assert w[0, 0].sum().item() == pytest.approx(1.0)
    # t -> s = 0 releases every mask into p and keeps no MASK
    w0 = step_weights(z, p, 0.2, 0.0, 6, schedule)
    assert w0[0, 0, 6].item() == 0 and torch.allclose(w0[0, 0] / w0[0, 0].sum(), p[0, 0])
    assert w[0, 1, 6].item() == 0 and bool((w >= 0).all())
    # max_ratio = 0 is MDLM: a visible token never changes
    w_mdlm = step_weights(z, p, 0.6, 0.5, 6, dict(max_ratio=0.0, gamma_shape=1.0, t_peak=0.5))
    assert (w_mdlm[0, 1] > 0).nonzero().flatten().tolist() == [2]


def test_runner_counts_forwards():
    runner = Runner(Rigged(positional_logits()))
    from dlmkit.masks import causal
    runner(torch.zeros(1, 3, dtype=torch.long), causal(3), torch.arange(3)[None])
    assert runner.forwards == 1


@pytest.mark.parametrize("sampler", ["scdd", "mdlm"])
def test_samplers_use_the_tokenizers_vocabulary_when_the_embedding_table_is_padded(sampler):
    # A checkpoint's embedding table is often larger than the tokenizer; its extra columns are
    # no tokens. Here they hold the largest logits: a sampler that used them would emit ids
    # >= V (and SCDD would mix K = V + 5 - 1 into a posterior trained with K = V - 1).
    def padded(ids, pos):
        logits = positional_logits()(ids, pos)
        return torch.cat([logits, torch.full((*ids.shape, 6), 200.0)], -1)

    opts = dict(max_new_tokens=6, steps=3, temperature=1.0)
    result = run(Rigged(padded), sampler, ["hi", "longer prompt"], **opts)
    plain = run(Rigged(positional_logits()), sampler, ["hi", "longer prompt"], **opts)
    assert result.tokens == plain.tokens
    assert all(t < V for row in result.tokens for t in row)


def test_mdlm_caches_are_exact_for_one_layer_and_run_less():
    # With one layer the keys/values are projections of the token embeddings alone, so the
    # prefix and dual caches drop no information: any difference from the uncached decode is a
    # bug in the key order, the mask or the positions, not the approximation.
    from dlmkit.models import build_model

    torch.manual_seed(0)
    model = build_model("tiny-llama", V, attention="sdpa",
                        overrides={"num_hidden_layers": 1}).eval()
    opts = dict(max_new_tokens=12, block_size=4, steps=12)
    for temperature in (0.0, 1.0):
        plain = run(model, "mdlm", temperature=temperature, **opts)
        for kind in ("prefix", "dual"):
            rec = Recorder(model)
            cached = run(rec, "mdlm", temperature=temperature, cache=kind, **opts)
            assert cached.tokens == plain.tokens, (kind, temperature)
            assert cached.forwards == plain.forwards
            width = max(map(len, prompt_ids(*TEXTS))) + 12
            # the first step of each block runs the canvas; its others the suffix / the block
            lengths = {c["ids"].shape[1] for c in rec.calls}
            if kind == "dual":
                assert lengths == {width, 4}
            else:
                assert width in lengths and lengths <= {width, 12, 8, 4} and len(lengths) > 1


def test_mdlm_dual_cache_differs_from_uncached_only_by_the_approximation():
    # Two layers: the cached keys/values of layer 2 are stale within a block, so tokens may
    # move, but the first step of every block is an ordinary full forward.
    rec = Recorder(tiny_model())
    run(rec, "mdlm", max_new_tokens=8, block_size=4, steps=8, cache="dual")
    full = [c for c in rec.calls if not c["ids"].shape[1] == 4]
    plain = Recorder(tiny_model())
    run(plain, "mdlm", max_new_tokens=8, block_size=4, steps=8)
    assert torch.allclose(full[0]["logits"], plain.calls[0]["logits"], atol=1e-5)
    block = [c for c in rec.calls if c["ids"].shape[1] == 4]
    assert block and all(c["cached"] for c in block)


# ------------------------------------------------------------------------------- pad_to


@pytest.mark.parametrize(("sampler", "options"), [
    ("mdlm", {}), ("mdlm", dict(block_size=4)), ("mdlm", dict(cache="prefix")),
    ("scdd", {}),
])
def test_pad_to_fills_every_row_to_the_trained_length(sampler, options):
    """Each prompt's canvas ends at ``pad_to`` (prompt + canvas = pad_to real tokens), as the
    fixed-length families' training rows do; the batch decodes each row as it would alone
    (mdlm; scdd's ancestral draws depend on the batch's shape)."""
    rec = Recorder(tiny_model())
    texts = ["rev abc", "x", "a longer prompt here"]
    pad_to = 30
    result = run(rec, sampler, texts, pad_to=pad_to, max_new_tokens=5, **options)
    prompts = prompt_ids(*texts)
    first = rec.calls[0]["ids"]  # the first call runs the whole canvas, still all MASK
    real = (first != TOK.pad_token_id).sum(1).tolist()
    assert real == [pad_to] * 3  # prompt + canvas, every row
    widths = [pad_to - len(p) for p in prompts]
    assert first.shape[1] == max(map(len, prompts)) + max(widths) + (
        -max(widths) % options.get("block_size", 1))
    assert [int((row == MASK).sum()) for row in first] == widths
    for row, text in enumerate(texts):
        assert MASK not in result.tokens[row] and len(result.tokens[row]) <= widths[row]
        if sampler == "mdlm":
            alone = run(tiny_model(), sampler, [text], pad_to=pad_to, max_new_tokens=5,
                        **options)
            assert alone.tokens[0] == result.tokens[row]


def test_pad_to_gives_a_prompt_that_long_max_new_tokens():
    config = sampler_config("mdlm", pad_to=10, max_new_tokens=4)
    assert config.canvas_widths([3, 9, 10, 25]) == [7, 1, 4, 4]
    assert config.steps is None and config.block_size is None  # the batch's width decides
    batch = config.for_width(7)
    assert (batch.max_new_tokens, batch.steps, batch.block_size, batch.pad_to) == (7, 7, 7, None)
    blocks = sampler_config("mdlm", pad_to=10, block_size=4, steps=2).for_width(7)
    assert (blocks.max_new_tokens, blocks.steps, blocks.block_size) == (8, 2, 4)
    with pytest.raises(ValueError, match="pad_to must be an int >= 1"):
        sampler_config("mdlm", pad_to=0)
    with pytest.raises(ValueError, match="does not use option.*pad_to"):
        sampler_config("bd3lm", pad_to=10, block_size=4)
