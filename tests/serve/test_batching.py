"""The decoding hooks the server relies on: per-prompt seeds and commit callbacks."""

from __future__ import annotations

import pytest

from dlmkit.generate import generate, load


@pytest.mark.parametrize("family", ["bd3lm", "hybrid", "ar", "idlm", "mdlm"])
def test_on_commit_reports_committed_tokens(export, family):
    """Each report is a prefix of the final answer: bd3lm/hybrid once per block (ending where
    a block of 4 ends, the prompt may end mid-block), ar once per token, idlm per accepted run;
    mdlm (the whole canvas at once) never reports."""
    loaded = load(export(family))
    calls = []
    prompts = ["rev abc", "sort 3142"]
    result = generate(loaded.model, loaded.tokenizer, prompts,
                      loaded.config(None, max_new_tokens=8),
                      on_commit=lambda row, tokens: calls.append((row, tokens)))
    if family == "mdlm":
        assert calls == []
        return
    for row, prompt in enumerate(prompts):
        seen = [tokens for r, tokens in calls if r == row]
        final = result.tokens[row]
        decoded = min(len(final) + 1, 8)  # with its stop token
        assert all(t[:len(final)] == final[:len(t)] for t in seen)
        lengths = [len(t) for t in seen]
        assert lengths == sorted(lengths) and lengths[-1] >= decoded
        if family == "ar":
            assert lengths == list(range(1, decoded + 1))
        elif family in ("bd3lm", "hybrid"):
            start = len(loaded.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True).input_ids)
            assert all((start + n) % 4 == 0 or n == 8 for n in lengths), lengths
            assert len(set(lengths)) >= 2


def test_prompt_seeds_replace_seed_and_index(export):
    loaded = load(export("bd3lm"))
    config = loaded.config(None, max_new_tokens=8, temperature=1.0)
    prompts = ["rev abc", "x", "rev abc"]
    mixed = generate(loaded.model, loaded.tokenizer, prompts, config,
                     prompt_seeds=[(7, 0), (3, 2), (7, 1)])
    for prompt, (seed, index), got in zip(prompts, [(7, 0), (3, 2), (7, 1)], mixed.tokens):
        alone = generate(loaded.model, loaded.tokenizer, [prompt],
                         loaded.config(None, max_new_tokens=8, temperature=1.0, seed=seed),
                         first_index=index)
        assert got == alone.tokens[0]
    with pytest.raises(ValueError, match="prompt_seeds holds 1 .seed, index. pairs for 3"):
        generate(loaded.model, loaded.tokenizer, prompts, config, prompt_seeds=[(1, 0)])
