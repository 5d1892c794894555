"""Tiny models for the sampler tests: a seeded random HF model and rigged fakes."""

from __future__ import annotations

import copy
import functools

import torch

from dlmkit.data import ByteTokenizer

TOK = ByteTokenizer()
MASK = TOK.mask_token_id
V = TOK.vocab_size
STOPS = tuple(TOK.stop_token_ids)


@functools.lru_cache(maxsize=2)
def _tiny_prototype(seed: int):
    from dlmkit.models import build_model

    torch.manual_seed(seed)
    return build_model("tiny-llama", V, attention="sdpa").eval()


def tiny_model(seed: int = 0):
    """A seeded random tiny Llama, a copy of one built once per seed: a test may convert it
    (``.double()`` converts in place), hook it or train it without touching the next test's
    model (a shared instance once made a later test's DFlash pair fail with a double/float
    matmul)."""
    return copy.deepcopy(_tiny_prototype(seed))


def prompt_ids(*texts: str) -> list[list[int]]:
    return [TOK.apply_chat_template([{"role": "user", "content": t}],
                                    add_generation_prompt=True).input_ids for t in texts]


class Rigged(torch.nn.Module):
    """A fake model: ``logits = fn(input_ids, position_ids)``; ignores the mask and cache."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # device/dtype for the Runner
        self.calls = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=None):
        self.calls.append((input_ids.clone(), position_ids.clone()))
        return self.fn(input_ids, position_ids)


class Recorder(torch.nn.Module):
    """Wraps a real model and records every call's inputs and logits."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.calls = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=None):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=cache is not None)
        self.calls.append({"ids": input_ids.clone(), "mask": attention_mask,
                           "pos": position_ids.clone(), "logits": out.logits.float(),
                           "cached": cache is not None})
        return out


def positional_logits(sharp: float = 5.0, target=None):
    """Logits that ignore the input: position ``p`` predicts ``target(p)`` with a margin
    ``sharp``; MASK logit huge (samplers must exclude it)."""
    target = target or (lambda p: 97 + p % 20)

    def fn(ids, pos):
        logits = torch.zeros(*ids.shape, V)
        logits.scatter_(-1, target(pos).unsqueeze(-1).long(), sharp)
        logits[..., MASK] = 100.0
        return logits

    return fn
