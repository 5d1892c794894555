"""Batch invariance of every sampler: a prompt's output depends on its own prompt, the sampler
options, the seed and its prompt index only -- never on the other prompts of its batch or on
the batch size (greedy and sampled)."""

import functools

import pytest
import torch

from dlmkit.generate import SAMPLERS, evaluate, generate, sampler_config

from .helpers import MASK, TOK, V, tiny_model

TEXTS = ["rev abc", "sort 3142", "9+1=", "x", "copy abcdefgh"]  # ragged: 5..17 tokens
OTHERS = ["a much longer prompt than any of the others", "q"]

# (sampler, options) per case; every sampler in SAMPLERS must appear (checked below).
CASES = {
    "mdlm": dict(max_new_tokens=8, block_size=4),
    "mdlm_threshold": dict(max_new_tokens=8, block_size=4, threshold=0.2, steps=8),
    "mdlm_random": dict(max_new_tokens=8, remasking="random", steps=4),
    "mdlm_prefix_cache": dict(max_new_tokens=8, block_size=4, cache="prefix"),
    "mdlm_dual_cache": dict(max_new_tokens=8, block_size=4, cache="dual"),
    "scdd": dict(max_new_tokens=6, steps=4),
    "scdd_revise": dict(max_new_tokens=6, steps=4, revise=True),
    "bd3lm": dict(max_new_tokens=8, block_size=4),
    "bd3lm_cache": dict(max_new_tokens=8, block_size=4, cache="prefix", threshold=0.2),
    "hybrid": dict(max_new_tokens=8, block_size=4),
    "hybrid_ar": dict(max_new_tokens=8, mode="ar"),
    "idlm": dict(max_new_tokens=8, block_size=3),
    "ar": dict(max_new_tokens=8),
    "dflash": dict(max_new_tokens=8, block_size=4),
    "block_diffusion": dict(max_new_tokens=8, block_size=4, steps=6),
}


@functools.lru_cache(maxsize=1)
def dflash_pair():
    """The tiny target with an untrained drafter (speculative decoding needs both)."""
    from dlmkit.families.dflash.pair import DFlashPair
    from dlmkit.models.dflash import DFlashDraftConfig, DFlashDrafter

    torch.manual_seed(1)
    drafter = DFlashDrafter(DFlashDraftConfig(block_size=4, target_layer_ids=[0, 1],
                                              vocab_size=V, mask_token_id=MASK)).eval()
    return DFlashPair(tiny_model(), drafter)


@functools.lru_cache(maxsize=1)
def canvas_model():
    """A tiny DiffusionGemma (encoder + canvas decoder) for the block_diffusion sampler."""
    from dlmkit.models import diffusion_gemma as dg

    torch.manual_seed(0)
    return dg.build("tiny-diffusion-gemma", V, attention="sdpa", canvas_length=4,
                    overrides={"hidden_size": 64, "num_hidden_layers": 2}).eval()


MODELS = {"dflash": dflash_pair, "block_diffusion": canvas_model}


def sampler_of(case: str) -> str:
    return case if case in SAMPLERS else case.split("_")[0]


def test_every_sampler_has_a_batch_invariance_case():
    assert set(SAMPLERS) <= {sampler_of(c) for c in CASES}


def decode(sampler, texts, first_index=0, **options):
    cfg = sampler_config(sampler, **options)
    model = MODELS.get(sampler, tiny_model)()
    return generate(model, TOK, texts, cfg, first_index=first_index).tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", sorted(CASES))
def test_output_does_not_depend_on_the_batch(case, temperature):
    sampler, options = sampler_of(case), dict(CASES[case], temperature=temperature)
    whole = decode(sampler, TEXTS, **options)
    # The same prompts in other batch sizes, with other companions.
    chunked = (decode(sampler, TEXTS[:1], **options)
               + decode(sampler, TEXTS[1:3], first_index=1, **options)
               + decode(sampler, TEXTS[3:], first_index=3, **options))
    assert chunked == whole
    for i, text in enumerate(TEXTS):
        mixed = decode(sampler, [text, *OTHERS], first_index=i, **options)
        assert mixed[0] == whole[i], (case, i)
    if temperature > 0:  # the case really samples: another seed moves some output
        assert decode(sampler, TEXTS, seed=1, **options) != whole


def test_evaluate_gives_the_same_rows_for_every_batch_size():
    records = [{"prompt": t, "response": "abc"} for t in TEXTS]
    cfg = sampler_config("mdlm", max_new_tokens=8, block_size=4, temperature=1.0,
                                     remasking="random")
    outputs = [[r["output"] for r in evaluate(tiny_model(), TOK, records, cfg,
                                              batch_size=b)[1]] for b in (1, 2, 5)]
    assert outputs[0] == outputs[1] == outputs[2]
