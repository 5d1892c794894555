"""The DiffusionGemma canvas sampler: the same tokens as transformers' own ``generate`` where
the settings are equivalent, batch invariance over ragged prompts, option errors."""

from __future__ import annotations

import pytest
import torch

from dlmkit.data import load_tokenizer
from dlmkit.decoding.runner import Runner
from dlmkit.families.block_diffusion.decode import sample_canvas
from dlmkit.generate import sampler_config
from dlmkit.models import diffusion_gemma as dg

BLOCK, NEW, STEPS = 4, 12, 5
TRANSFORMERS = dict(t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.005)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("byte")


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    return dg.build("tiny-diffusion-gemma", tokenizer.vocab_size, attention="sdpa",
                    canvas_length=BLOCK,
                    overrides={"hidden_size": 64, "num_hidden_layers": 2}).eval()


def prompt(tokenizer, text):
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True).input_ids


def decode(model, tokenizer, prompts, generator, **options):
    cfg = sampler_config("block_diffusion", max_new_tokens=NEW, block_size=BLOCK,
                                     **options)
    runner = Runner(model, vocab_size=tokenizer.vocab_size)
    with torch.no_grad():
        out = sample_canvas(runner, prompts, cfg, pad_id=tokenizer.pad_token_id,
                            stop_ids=tokenizer.stop_token_ids, generator=generator)
    return out, runner


@pytest.mark.parametrize("texts", [["rev abcd"], ["rev abcd", "rev hgfe"]])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_tokens_as_transformers_generate(model, tokenizer, texts, seed):
    """Entropy-bound commits, the linear temperature schedule, adaptive stopping, the same
    seed and equal-length prompts: transformers' generate and ours draw the same numbers in
    the same order, so the generated tokens are identical."""
    prompts = [prompt(tokenizer, t) for t in texts]
    ours, runner = decode(model, tokenizer, prompts, torch.Generator().manual_seed(seed),
                          entropy_bound=0.1, steps=STEPS * NEW // BLOCK, **TRANSFORMERS)
    torch.manual_seed(seed)
    theirs = model.generate(torch.tensor(prompts), max_new_tokens=NEW,
                            max_denoising_steps=STEPS, eos_token_id=list(tokenizer.stop_token_ids),
                            pad_token_id=tokenizer.pad_token_id, **TRANSFORMERS)
    assert ours.tolist() == theirs.sequences[:, len(prompts[0]):].tolist()
    assert runner.forwards <= STEPS * NEW // BLOCK


def test_a_prompt_decodes_the_same_alone_and_in_a_ragged_batch(model, tokenizer):
    prompts = [prompt(tokenizer, t) for t in ("rev ab", "rev abcdefg", "rev hgf")]
    seeds = [11, 12, 13]
    batch, _ = decode(model, tokenizer, prompts,
                      [torch.Generator().manual_seed(s) for s in seeds], steps=6)
    for row, (p, s) in enumerate(zip(prompts, seeds)):
        alone, _ = decode(model, tokenizer, [p], [torch.Generator().manual_seed(s)], steps=6)
        assert alone[0].tolist() == batch[row].tolist()


def test_threshold_ends_a_canvas_early(model, tokenizer):
    prompts = [prompt(tokenizer, "rev abcd")]
    _, full = decode(model, tokenizer, prompts, torch.Generator().manual_seed(0), steps=24)
    _, fast = decode(model, tokenizer, prompts, torch.Generator().manual_seed(0), steps=24,
                     threshold=1e-6)  # everything is that confident: one step per canvas
    # 8 steps per canvas of 4: the schedule commits ceil(left / steps left) = 1 per step, so
    # a canvas is committed after 4 forwards; a threshold everything passes commits it in 1
    assert full.forwards == 4 * NEW // BLOCK
    assert fast.forwards == NEW // BLOCK


def test_the_factor_rule_ends_a_canvas_early_and_a_tiny_factor_changes_nothing(model,
                                                                               tokenizer):
    """Fast-dLLM's factor rule commits the ``n`` most confident while ``(n + 1)(1 - c_n) <
    f``: a factor above ``(W + 1)`` passes every rank (one step per canvas); one no rank can
    pass leaves the schedule's commits alone, so the tokens are those of the plain decode."""
    prompts = [prompt(tokenizer, "rev abcd"), prompt(tokenizer, "rev hgfedcb")]

    def run(**options):
        return decode(model, tokenizer, prompts,
                      [torch.Generator().manual_seed(s) for s in (0, 1)], steps=24, **options)

    plain, full = run()
    same, tiny = run(factor=1e-12)
    _, fast = run(factor=BLOCK + 2.0)
    assert same.tolist() == plain.tolist()
    assert tiny.forwards == full.forwards == 4 * NEW // BLOCK
    assert fast.forwards == NEW // BLOCK


@pytest.mark.parametrize("options, message", [
    ({"t_min": 0.4}, "t_min and t_max go together"),
    ({"t_min": 0.8, "t_max": 0.4}, "t_min must be < t_max"),
    ({"t_min": 0.4, "t_max": 0.8, "temperature": 1.0}, "replace temperature"),
    ({"entropy_bound": 0.0}, "entropy_bound must be a finite number > 0"),
    ({"entropy_bound": 0.1, "threshold": 0.9}, "entropy_bound and threshold are two commit"),
    ({"entropy_bound": 0.1, "factor": 1.0}, "entropy_bound and factor are two commit rules"),
    ({"threshold": 0.9, "factor": 1.0}, "threshold and factor are two parallel commit rules"),
    ({"factor": 0.0}, "factor must be a finite number > 0"),
    ({"stability_threshold": 1}, "go together"),
    ({"stability_threshold": -1, "confidence_threshold": 0.1}, "stability_threshold must be"),
])
def test_option_errors(options, message):
    with pytest.raises(ValueError, match=message):
        sampler_config("block_diffusion", block_size=BLOCK, **options)
    with pytest.raises(ValueError, match="needs block_size"):
        sampler_config("block_diffusion")
    with pytest.raises(ValueError, match="does not use option"):
        sampler_config("mdlm", entropy_bound=0.1)
