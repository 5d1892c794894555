"""DFlash speculative decoding: greedy output is token for token the target's own greedy
decoding (whatever the drafter proposes), sampling follows the speculative acceptance rule
(checked statistically), the drafter's decode-time logits equal its training path's, and
transformers' own DFlash ``generate`` runs our drafter as is."""

from __future__ import annotations

import pytest
import torch

from dlmkit.data import get_task
from dlmkit.families.dflash.decode import (
    accept,
    speculative_decode,
    speculative_decode_batch,
)
from dlmkit.families.dflash.pair import DFlashPair
from dlmkit.generate import generate, sampler_config
from dlmkit.generate.api import encode_prompt
from dlmkit.models.dflash import DFlashDraftConfig, DFlashDrafter
from tests.generate.helpers import MASK, STOPS, TOK, V, tiny_model

BS = 4


def drafter_for(target, block_size=BS, seed=0):
    torch.manual_seed(seed)
    c = target.config
    config = DFlashDraftConfig(hidden_size=c.hidden_size, num_attention_heads=4,
                               intermediate_size=64, num_hidden_layers=1, block_size=block_size,
                               mask_token_id=MASK, target_layer_ids=[0, c.num_hidden_layers - 1],
                               target_hidden_size=c.hidden_size, vocab_size=c.vocab_size)
    return DFlashDrafter(config).eval()


class OracleDraft(DFlashPair):
    """Drafts each row's known greedy continuation (``references[b]``), wrong at random offsets:
    every accepted length from 0 to ``bs - 1`` occurs, so the cache crops and the acceptance
    rule are all exercised (a wrong token that slipped through would change the output)."""

    references: list[list[int]]

    def draft_step(self, anchors, positions, context, context_positions, key_valid, cache,
                   mask_id, rows):
        self.stats["draft_forwards"] += rows
        logits = torch.zeros(anchors.shape[0], self.block_size - 1, V)
        for b, reference in enumerate(self.references):
            for i in range(self.block_size - 1):
                at = int(positions[b]) + 1 + i
                token = reference[at] if at < len(reference) else 0
                if torch.rand(()) < 0.25:
                    token = (token + 1) % (V - 1)
                logits[b, i, token] = 10.0
        return logits


def tied(target, ids, continuation, tolerance=1e-4) -> bool:
    """Whether the target's greedy choice along ``continuation`` ever had a runner-up within
    ``tolerance`` (a floating-point tie: a different but equally exact evaluation order, such as
    verifying a block instead of one token, may break it the other way)."""
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([ids + continuation])).logits[0]
    top = logits[len(ids) - 1:-1, :MASK].topk(2, dim=-1).values
    return bool(((top[:, 0] - top[:, 1]) < tolerance).any())


def greedy_reference(target, prompts, max_new):
    out = generate(target, TOK, prompts, sampler_config("ar", max_new_tokens=max_new))
    return out.tokens


def check_greedy_lossless(count: int, max_new: int, seed: int) -> None:
    """Speculative greedy == target greedy on the first ``count`` addition test prompts; a
    prompt may differ only where the target's own choice was a floating-point tie."""
    target = tiny_model(0)
    prompts = [r["prompt"] for r in get_task("addition").records("test", count)]
    want = greedy_reference(target, prompts, max_new)
    pair = OracleDraft(target, drafter_for(target))
    torch.manual_seed(seed)
    ties, lengths = [], set()
    for prompt, expected in zip(prompts, want):
        ids = encode_prompt(TOK, prompt)
        pair.references = [ids + expected]
        before = dict(pair.stats)
        got = speculative_decode(pair, ids, max_new_tokens=max_new, temperature=0,
                                 stop_ids=STOPS, mask_id=MASK)
        if (got[:-1] if got and got[-1] in STOPS else got) != expected:
            ties.append(prompt)
            assert tied(target, ids, expected), f"{prompt!r}: differs without a tie"
        steps = pair.stats["verify_forwards"] - before["verify_forwards"]
        lengths.add((pair.stats["verified_tokens"] - before["verified_tokens"]) / max(steps, 1))
    assert len(ties) <= max(1, len(prompts) // 100), ties  # random logits tie rarely
    assert pair.stats["verified_tokens"] > pair.stats["verify_forwards"]  # drafts accepted
    assert len(lengths) > 3  # many acceptance lengths: every crop path ran


def test_greedy_speculative_equals_target_greedy_on_test_prompts():
    check_greedy_lossless(64, 12, seed=0)


def test_a_batch_verifies_every_row_together_and_each_equals_target_greedy():
    """48 ragged prompts in one batch, drafts wrong at random offsets, so in every cycle the
    rows accept different lengths, and a stop token that only some rows produce (at different
    places): each row is still its target greedy decode up to its first stop, and one target
    forward serves every row still decoding."""
    target = tiny_model(0)
    prompts = [r["prompt"] for r in get_task("addition").records("test", 48)]
    want = greedy_reference(target, prompts, 12)  # the untrained target never stops by itself
    tokens = [t for w in want for t in set(w)]
    stop = max(set(tokens), key=lambda t: min(tokens.count(t), len(want) - tokens.count(t)))
    expected = [w[:w.index(stop) + 1] if stop in w else w for w in want]
    assert 0 < sum(stop in w for w in want) < len(want)
    pair = OracleDraft(target, drafter_for(target))
    encoded = [encode_prompt(TOK, p) for p in prompts]
    assert len({len(e) for e in encoded}) > 1  # ragged: prompt padding is exercised
    pair.references = [ids + w for ids, w in zip(encoded, want)]
    torch.manual_seed(0)
    got = speculative_decode_batch(pair, encoded, max_new_tokens=12, temperature=0,
                                   stop_ids=(*STOPS, stop), mask_id=MASK)
    got = [g[:-1] if g and g[-1] in STOPS else g for g in got]  # as the ar sampler strips
    wrong = [(p, g, e) for p, ids, g, e, w in zip(prompts, encoded, got, expected, want)
             if g != e and not tied(target, ids, w)]
    assert not wrong
    st = pair.stats
    assert st["verified_tokens"] > 1.5 * st["verify_forwards"]  # drafts were accepted
    assert st["target_calls"] * 8 < st["target_forwards"]  # ... and rows verified together
    assert len({len(g) for g in got}) > 3  # rows stopped at different lengths


@pytest.mark.slow
def test_greedy_speculative_equals_target_greedy_on_every_test_prompt():
    check_greedy_lossless(991, 8, seed=1)  # the whole addition test split


def test_sampler_dflash_through_generate_with_a_real_drafter():
    """The whole path (dlmkit.generate, sampler ``dflash``, the drafter's KV cache): greedy
    equals the target's; forwards are the target's batched calls, row forwards its per-row
    ones."""
    target = tiny_model(0)
    prompts = ["1+2=", "33+4=", "5+60="]
    pair = DFlashPair(target, drafter_for(target))
    got = generate(pair, TOK, prompts, sampler_config(
        "dflash", block_size=BS, max_new_tokens=10))
    assert got.tokens == greedy_reference(target, prompts, 10)
    assert got.forwards == pair.stats["target_calls"]  # batched: one call for every row
    assert got.row_forwards == pair.stats["target_forwards"] > got.forwards
    assert pair.stats["draft_forwards"] >= pair.stats["verify_forwards"] - len(prompts)


def test_transformers_dflash_generate_runs_our_drafter_with_the_same_tokens():
    from transformers import GenerationConfig

    target = tiny_model(0)
    drafter = drafter_for(target)
    calls = []
    drafter.register_forward_hook(lambda *a: calls.append(1))
    pair = DFlashPair(target, drafter)
    for prompt in ["1+2=", "45+6="]:
        ids = encode_prompt(TOK, prompt)
        ours = speculative_decode(pair, ids, max_new_tokens=10, temperature=0, stop_ids=STOPS,
                                  mask_id=MASK)
        config = GenerationConfig(max_new_tokens=10, do_sample=False, speculation_type="dflash",
                                  eos_token_id=list(STOPS), pad_token_id=TOK.pad_token_id)
        x = torch.tensor([ids])
        theirs = target.generate(x, attention_mask=torch.ones_like(x), generation_config=config,
                                 assistant_model=drafter)
        assert theirs[0, len(ids):].tolist() == ours
    assert calls, "transformers never called the drafter"


class RecordingPair(DFlashPair):
    """Keeps every drafted block's ``(anchors, positions, logits)`` as decoding computed them."""

    def __init__(self, target, drafter):
        super().__init__(target, drafter)
        self.blocks = []

    def draft_step(self, anchors, positions, *args, **kwargs):
        logits = super().draft_step(anchors, positions, *args, **kwargs)
        self.blocks.append((anchors.clone(), positions.clone(), logits))
        return logits


def test_drafter_decodes_with_the_context_it_is_trained_on():
    """A drafter's logits for a block as speculative decoding computes them (the target's
    hidden states gathered cycle by cycle in the drafter's KV cache, rejected drafts hidden,
    each block's keys cropped, ragged prompts padded) equal the training path's for a block
    anchored at the same token of the same sequence (DFlashStrategy.prepare's layout, the
    target's one causal forward, draft_hidden, the target's LM head). The oracle-drafter tests
    above cannot see this: their drafts ignore the context."""
    from dlmkit import strategies
    from tests.train.helpers import tiny_target

    s = strategies.get("dflash")({"target": str(tiny_target()), "block_size": BS},
                                 mask_token_id=MASK, vocab_size=V)
    s.setup(torch.device("cpu"))
    torch.manual_seed(0)
    drafter = s.build_model("dflash-tiny", vocab_size=V, attention="sdpa",
                            dtype=torch.float32).eval()
    pair = RecordingPair(s.target, drafter)
    encoded = [encode_prompt(TOK, p) for p in ["1+2=", "33+44=", "5+60="]]
    # Sampling: two untrained models are both near uniform, so p / q is near 1 and drafts are
    # accepted (greedy would reject them all), and accepted drafts become context too.
    gens = [torch.Generator().manual_seed(i) for i in range(len(encoded))]
    out = speculative_decode_batch(pair, encoded, max_new_tokens=16, temperature=1.0,
                                   stop_ids=STOPS, mask_id=MASK, generator=gens)
    assert pair.stats["verified_tokens"] > 2 * pair.stats["verify_forwards"]  # drafts taken
    head = s.target.get_output_embeddings()
    compared = 0
    for b, (prompt, response) in enumerate(zip(encoded, out)):
        seq = torch.tensor([prompt + response])
        # The blocks drafted while row b still decoded: its anchor is a token of its output
        # with at least one more token after it.
        blocks = [(int(p[b]), int(a[b]), logits[b]) for a, p, logits in pair.blocks
                  if int(p[b]) < seq.shape[1] - 1]
        assert all(int(seq[0, p]) == a for p, a, _ in blocks)
        anchors = torch.tensor([[p for p, _, _ in blocks]])
        s.sample_anchors = lambda batch, generators, a=anchors: (
            a, torch.ones_like(a, dtype=torch.bool), 0)
        ones = torch.ones_like(seq)
        prepared = s.prepare({"input_ids": seq, "attention_valid": ones, "loss_mask": ones,
                              "position_ids": torch.arange(seq.shape[1])[None]}, None)
        with torch.no_grad():
            hidden = s.draft_hidden(drafter, prepared, s.target_context(prepared))
            trained = head(hidden.view(len(blocks), BS, -1)[:, 1:]).float()
        for (position, _, decoded), logits in zip(blocks, trained):
            torch.testing.assert_close(decoded, logits, rtol=0, atol=1e-5,
                                       msg=f"row {b}, block at {position}")
        compared += len(blocks)
        assert max(p for p, _, _ in blocks) > len(prompt)  # blocks after the first cycle too
    assert compared >= 9


def test_accept_greedy_longest_agreeing_prefix_plus_bonus():
    target = torch.full((4, 6), -5.0)
    for row, token in enumerate([2, 3, 1, 4]):
        target[row, token] = 5.0
    assert accept(target, None, torch.tensor([2, 3, 1]), 0, None) == (3, 4)
    assert accept(target, None, torch.tensor([2, 0, 1]), 0, None) == (1, 3)
    assert accept(target, None, torch.tensor([5, 3, 1]), 0, None) == (0, 2)


def test_accept_sampling_gives_the_target_distribution():
    """Speculative sampling: the first emitted token is distributed as the target's ``p_0``
    and, once ``d_1`` is accepted, the second as ``p_1``, whatever the drafter's ``q``
    (chi-square, 20000 draws, far beyond the 0.9999 quantile only if the rule is wrong)."""
    g = torch.Generator().manual_seed(0)
    p_logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4],
                                       [0.25, 0.25, 0.25, 0.25]]))
    q_logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
    q = q_logits.softmax(-1)
    first, second = torch.zeros(4), torch.zeros(4)
    trials = 20000
    for _ in range(trials):
        draft = torch.multinomial(q, 1, generator=g).squeeze(-1)
        n, nxt = accept(p_logits, q_logits, draft, 1.0, g)
        tokens = draft[:n].tolist() + [nxt]
        first[tokens[0]] += 1
        if len(tokens) > 1:
            second[tokens[1]] += 1
    p = p_logits.softmax(-1)

    def chi2(counts, probs):
        expected = probs * counts.sum()
        return float(((counts - expected) ** 2 / expected).sum())

    assert chi2(first, p[0]) < 21.1  # df = 3: P(chi2 > 21.1) = 1e-4
    assert second.sum() > 1000 and chi2(second, p[1]) < 21.1
    # the rule is not vacuous: drawing the first token from q instead fails the same test
    assert chi2(torch.bincount(torch.multinomial(q[0], trials, replacement=True,
                                                 generator=g), minlength=4).float(), p[0]) > 100


def test_drafter_must_fit_the_target():
    target = tiny_model(0)
    other = DFlashDrafter(DFlashDraftConfig(hidden_size=64, block_size=BS,
                                            target_layer_ids=[0]))
    with pytest.raises(ValueError, match="drafter hidden size 64 does not match the target's"):
        DFlashPair(target, other)
    deep = drafter_for(target)
    deep.config.target_layer_ids = [0, 9]
    with pytest.raises(ValueError, match="reads target layers .* has only 3"):
        DFlashPair(target, deep)
    with pytest.raises(ValueError, match="block_size must be an int >= 2"):
        DFlashDraftConfig(block_size=1)


@pytest.mark.slow
def test_speculative_sampling_end_to_end_gives_the_target_joint_distribution():
    """Whole decoding loop (drafter, verification, cache crops), a vocabulary of 8: the joint
    law of the first two sampled tokens equals the target's ``p(t1) p(t2 | t1)`` (chi-square
    over 49 cells, 3000 draws), with drafts both accepted and rejected along the way."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    vocab, mask = 8, 7  # no stop token (stop_ids=(99,) below never occurs)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=4)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(30)  # peaked, unequal distributions (not near-uniform)
    config = DFlashDraftConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                               block_size=3, mask_token_id=mask, target_layer_ids=[0, 1],
                               target_hidden_size=32, vocab_size=vocab)
    pair = DFlashPair(target, DFlashDrafter(config).eval())
    prompt = [1, 2, 3]
    with torch.no_grad():
        p1 = target(input_ids=torch.tensor([prompt])).logits[0, -1, :mask].softmax(-1)
        rows = torch.tensor([prompt + [t] for t in range(mask)])
        p2 = target(input_ids=rows).logits[:, -1, :mask].softmax(-1)
    joint = p1[:, None] * p2  # [t1, t2]
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(mask, mask)
    trials = 3000
    for _ in range(trials):
        out = speculative_decode(pair, prompt, max_new_tokens=3, temperature=1.0,
                                 stop_ids=(99,), mask_id=mask, generator=g)
        counts[out[0], out[1]] += 1
    expected = joint * trials
    big = expected >= 5  # pool the rare cells into one
    stat = ((counts[big] - expected[big]) ** 2 / expected[big]).sum()
    rest_e, rest_c = expected[~big].sum(), counts[~big].sum()
    if rest_e > 0:
        stat += (rest_c - rest_e) ** 2 / rest_e
    cells = int(big.sum()) + int(rest_e > 0)
    # chi-square with cells - 1 dof: mean cells - 1, sd sqrt(2 (cells - 1)); 5 sd is ~1e-6
    assert stat < cells - 1 + 5 * (2 * (cells - 1)) ** 0.5, (float(stat), cells)
    st = pair.stats
    assert 0 < st["verified_tokens"] - st["verify_forwards"] < st["verify_forwards"] * 2


def test_drafter_loads_with_transformers_auto_classes(tmp_path):
    """An exported drafter is an ordinary transformers model (``AutoModel``), so it plugs into
    ``generate(assistant_model=...)`` without dlmkit's loader."""
    from transformers import AutoModel

    target = tiny_model(0)
    drafter = drafter_for(target)
    drafter.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is DFlashDrafter
    assert loaded.config.target_layer_ids == drafter.config.target_layer_ids
    for name, value in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
