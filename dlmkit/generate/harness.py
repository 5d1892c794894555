"""lm-evaluation-harness adapter: a registered model ``dlmkit`` for exported runs.

    dlmkit lm-eval --model dlmkit --model_args pretrained=RUN/final[,OPTION=VALUE...] \\
        --tasks NAME [--include_path DIR] ...

(``dlmkit lm-eval`` is lm-eval's own command line with this module imported, which registers
the model: lm-eval has no plugin mechanism for third-party models.) From Python: import this
module, then ``lm_eval.simple_evaluate(model="dlmkit", model_args="pretrained=...")``.

Requests:

* ``generate_until`` -- the model's own sampler and options (its ``dlmkit.json`` defaults, any
  sampler option as a model argument: ``steps=16,threshold=0.9``); ``max_gen_toks`` from the
  task or the sampler's ``max_new_tokens``; ``temperature`` / ``do_sample`` from the task; the
  text is cut at the first ``until`` string.
* ``loglikelihood`` -- by the family's ``likelihood`` scorer (:mod:`.likelihood`): exact for
  causal streams (``ar``, ``hybrid``, ``idlm``), a Monte-Carlo ELBO for masked diffusion
  (``mdlm``, ``scdd``: scdd's over the non-mask tokens, as it trains and decodes) and per
  block for block diffusion (``bd3lm``; ``mc_samples`` draws, default 32), where ``is_greedy``
  means the model's own greedy sampler, decoding exactly as many tokens, produces the
  continuation. Other families raise an error naming those that can.
* ``loglikelihood_rolling`` (perplexity tasks) is not supported (a clear error).

With ``chat=true`` (default) a request's context is the user message and the continuation
the assistant's reply, rendered with the model's chat template as in training; ``chat=false``
scores and continues the raw text (``tokenizer.encode``), for models trained without turns.
"""

from __future__ import annotations

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from dlmkit import families
from dlmkit.decoding.likelihood import ELBO_SCORERS, causal_loglikelihood, elbo
from dlmkit.decoding.options import SamplerConfig
from dlmkit.decoding.runner import Runner

from .api import encode_prompt, generate, load


def _families(scorer: str) -> list[str]:
    return [n for n in families.names() if families.get(n).likelihood == scorer]


@register_model("dlmkit")
class DlmkitLM(LM):
    """``pretrained``: an exported ``RUN/final``. Options: ``device``, ``attention``,
    ``batch_size``, ``sampler``, ``mc_samples``, ``chat``, ``seed`` and every sampler option."""

    def __init__(self, pretrained: str, device: str = "cpu", attention: str = "sdpa",
                 batch_size: int | str = 8, sampler: str | None = None, mc_samples: int = 32,
                 chat: bool = True, max_batch_size=None, **options) -> None:
        super().__init__()
        if isinstance(batch_size, str) and batch_size.isdigit():  # lm-eval's --batch_size
            batch_size = int(batch_size)
        unknown = sorted(set(options) - set(families.sampler_options()))
        if unknown:
            raise ValueError(f"dlmkit model_args: unknown option(s) {unknown}; valid: "
                             f"pretrained, device, attention, batch_size, sampler, mc_samples, "
                             f"chat, {', '.join(sorted(families.sampler_options()))}")
        for name, value in (("batch_size", batch_size), ("mc_samples", mc_samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"dlmkit model_args: {name} must be an int >= 1, got {value!r}")
        if not isinstance(chat, bool):
            raise ValueError(f"dlmkit model_args: chat must be true or false, got {chat!r}")
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"dlmkit model: device {device!r} but torch has no CUDA here; "
                             "pass --device cpu")
        self.loaded = load(pretrained, device=device, attention=attention,
                           what="--model_args pretrained")  # as the user passed it
        self.sampler, self.options = sampler, options
        self.config = self.loaded.config(sampler, **options)
        self.batch_size, self.mc_samples, self.chat = batch_size, mc_samples, chat
        self._device = torch.device(device)
        name = self.loaded.meta.get("strategy")
        self.scorer = families.get(name).likelihood if name in families.names() else None
        self.strategy = name

    # -- encoding ----------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def _prompt(self, context: str) -> list[int]:
        if self.chat:
            return encode_prompt(self.tokenizer, context)
        ids = self.tokenizer.encode(context, add_special_tokens=True)
        return ids or [self.tokenizer.bos_token_id or self.tokenizer.eos_token_id]

    def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """``(prompt ids, continuation ids)``. Chat: the continuation is the assistant reply's
        content tokens as the template renders them (its end-of-turn marker excluded)."""
        if not self.chat:
            return self._prompt(context), self.tokenizer.encode(continuation)
        user = [{"role": "user", "content": context}]
        head = self._prompt(context)
        full = self.tokenizer.apply_chat_template(
            user + [{"role": "assistant", "content": continuation}]).input_ids
        empty = self.tokenizer.apply_chat_template(
            user + [{"role": "assistant", "content": ""}]).input_ids
        tail = len(empty) - len(head)  # the end-of-turn marker after the content
        if list(full[:len(head)]) != head \
                or list(full[len(full) - tail:]) != list(empty[len(empty) - tail:]):
            raise ValueError("the chat template is not prefix-stable; pass chat=false")
        return head, list(full[len(head):len(full) - tail])

    # -- requests ----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            _, kwargs = request.args
            groups.setdefault(self._gen_options(kwargs), []).append(i)
        for options, indices in groups.items():
            config = self._config(**dict(options))
            for at in range(0, len(indices), self.batch_size):
                chunk = indices[at:at + self.batch_size]
                prompts = [self._prompt(requests[i].args[0]) for i in chunk]
                result = generate(self.loaded.model, self.tokenizer, prompts, config,
                                  first_index=chunk[0])
                for i, text in zip(chunk, result.texts):
                    out[i] = _cut(text, requests[i].args[1].get("until"))
        return out

    def _config(self, **overrides) -> SamplerConfig:
        """The sampler config with ``overrides`` resolved afresh (steps, an mdlm block follow
        a new ``max_new_tokens``; the model's trained defaults still apply)."""
        return self.loaded.config(self.sampler, **{**self.options, **overrides})

    def _gen_options(self, kwargs: dict) -> tuple:
        options = {}
        if kwargs.get("max_gen_toks") is not None:
            options["max_new_tokens"] = int(kwargs["max_gen_toks"])
        temperature = float(kwargs.get("temperature", self.config.temperature) or 0.0)
        if kwargs.get("do_sample") is False:
            temperature = 0.0
        options["temperature"] = temperature
        return tuple(sorted(options.items()))

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if self.scorer is None:
            raise ValueError(
                f"lm-eval loglikelihood requests: strategy {self.strategy!r} cannot score a "
                f"continuation; families that can: {', '.join(_families('causal'))} (exact), "
                f"{', '.join(n for s in ELBO_SCORERS for n in _families(s))} "
                "(Monte-Carlo ELBO); use tasks with "
                "generate_until requests for this model")
        rows = [self._split(*request.args) for request in requests]
        runner = Runner(self.loaded.model, vocab_size=self.tokenizer.vocab_size)
        out: list[tuple[float, bool]] = []
        with torch.no_grad():
            if self.scorer == "causal":
                for at in range(0, len(rows), self.batch_size):
                    out += causal_loglikelihood(runner, rows[at:at + self.batch_size],
                                                pad_id=self.tokenizer.pad_token_id)
                return out
            for index, (prompt, cont) in enumerate(rows):
                generator = torch.Generator(device=runner.device).manual_seed(
                    self.config.seed * 1_000_003 + index)
                block = self.loaded.meta.get("block_size") if self.scorer == "block_elbo" \
                    else None
                score = elbo(self.scorer, runner, prompt, cont,
                             mask_id=self.tokenizer.mask_token_id, samples=self.mc_samples,
                             generator=generator, batch_size=self.batch_size, block_size=block,
                             logit_shift=self.config.logit_shift)
                out.append((score, self._greedy(prompt, cont, index)))
        return out

    def _greedy(self, prompt: list[int], continuation: list[int], index: int) -> bool:
        """Whether the model's greedy sampler, decoding ``len(continuation)`` tokens, gives
        exactly the continuation."""
        config = self._config(max_new_tokens=len(continuation), temperature=0.0)
        result = generate(self.loaded.model, self.tokenizer, [prompt], config,
                          first_index=index)
        return result.tokens[0] == continuation

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise ValueError("lm-eval loglikelihood_rolling (perplexity) requests are not supported "
                         "by the dlmkit model; supported: generate_until, loglikelihood")

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        raise ValueError("the dlmkit model renders every request with its own chat template "
                         "(model_args chat=true, the default); do not pass --apply_chat_template")


def _cut(text: str, until) -> str:
    """``text`` up to the first of the ``until`` strings."""
    if isinstance(until, str):
        until = [until]
    for stop in until or []:
        if stop and stop in text:
            text = text[:text.index(stop)]
    return text
