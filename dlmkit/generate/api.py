"""The sampling entry points: load an exported model, generate, infill.

``generate(model, tokenizer, prompts, config)`` runs the decoder of ``config.sampler``'s family
(the registry, :mod:`dlmkit.families`: each family's folder holds its decoder and its sampler's
options); an export's default sampler is its training family's own. This module names no
family: a new family needs no change here.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dlmkit import families
from dlmkit.decoding.options import SamplerConfig, option_names
from dlmkit.decoding.runner import Runner

META_FILE = "dlmkit.json"
TOKENIZER_FILES = ("dlmkit_tokenizer.json", "tokenizer.json", "tokenizer_config.json")


def sampler_config(sampler: str, **options) -> SamplerConfig:
    """The resolved options of ``sampler`` (a family's name, :mod:`dlmkit.families`),
    rejecting options it does not use (with the ones it accepts)."""
    klass = families.sampling_class(sampler)
    accepts = option_names(klass)
    unknown = sorted(set(options) - accepts)
    if unknown:
        everywhere = set(families.sampler_options())
        if set(unknown) <= everywhere:
            raise ValueError(f"sampler {sampler!r} does not use option(s) {unknown}; it "
                             f"accepts {sorted(accepts)}")
        raise ValueError(f"unknown sampler option(s) {sorted(set(unknown) - everywhere)}; "
                         f"options are {sorted(everywhere)}")
    return klass(**options).resolved()


@dataclass
class GenerationResult:
    """What a sampler produced for a batch of prompts.

    Attributes:
        tokens: per prompt, the response ids with the stop token and everything after it
            (EOS fill) removed.
        texts: ``tokens`` decoded (special tokens skipped).
        forwards: model forward passes (each over the whole batch).
        generated: tokens decoded in all, each row counted up to and including its stop token.
        seconds: wall-clock time of the sampling.
        row_forwards: forwards counted once per row that still needed them.
    """

    tokens: list[list[int]]
    texts: list[str]
    forwards: int
    generated: int
    seconds: float
    row_forwards: int

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per forward of one sequence (``generated / row_forwards``): 1.0 for
        one-token-per-step decoding, whatever the batch size."""
        return self.generated / max(self.row_forwards, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / max(self.seconds, 1e-9)


class SamplerFamilyWarning(UserWarning):
    """A sampler decoding the export of a related family, not with the process it trained for."""


def check_sampler_family(family: str, sampler: str, where) -> None:
    """``sampler`` on an export of training strategy ``family`` (named in ``where``): silent when
    it decodes the family as trained, a :class:`SamplerFamilyWarning` for a related family's
    sampler, else a ValueError naming the samplers that fit."""
    record = families.get(family)
    own = record.name
    fits = (own, *record.also_decoded_by)
    if sampler in fits:
        return
    trained = f"{where} says strategy {family!r}"
    if sampler in record.related:
        warnings.warn(f"sampler {sampler!r} on a model trained as {family} ({trained}): both are "
                      "bidirectional masked diffusion, so it runs, but not with the reverse "
                      f"process this model was trained for; its own sampler is {own!r} (omit "
                      "--sampler)", SamplerFamilyWarning, stacklevel=3)
        return
    drafter = families.drafting()[0]
    hint = (f"; {drafter} is speculative decoding: pass a causal target as --model and its "
            "drafter export as --draft" if sampler == drafter else "")
    raise ValueError(f"sampler {sampler!r} does not decode this model ({trained}: trained "
                     f"for the {own} sampler); samplers for this model: "
                     f"{', '.join(fits)} (omit --sampler for {own}){hint}")


@dataclass
class LoadedModel:
    """An exported ``RUN/final`` directory: model, tokenizer and ``dlmkit.json``."""

    model: torch.nn.Module
    tokenizer: object
    meta: dict
    path: Path

    def config(self, sampler: str | None = None, **options) -> SamplerConfig:
        """A :class:`SamplerConfig` for this model: the sampler defaults to the training
        strategy, ``block_size`` (and SCDD's schedule) to what the model was trained with;
        ``options`` override (unknown or unused ones are errors)."""
        from dlmkit.decoding.options import trained_logit_shift

        name = self.meta.get("strategy")
        family = families.get(name) if name in families.names() else None
        if sampler is None:
            if family is None:
                where = self.path / META_FILE
                why = (f"{where}: strategy {name!r} has no sampler here" if self.meta
                       else f"{self.path} has no {META_FILE} (not exported by `dlmkit train`)")
                raise ValueError(f"{why}; pick one explicitly with --sampler "
                                 f"({', '.join(families.names())})")
            sampler = family.name
        elif family is not None:
            check_sampler_family(name, sampler, self.path / META_FILE)
        defaults: dict = {}
        if self.meta.get("max_new_tokens"):
            defaults["max_new_tokens"] = int(self.meta["max_new_tokens"])
        # A sampler other than the family's own gets no trained defaults: the options mean
        # different things to different samplers (mdlm's block is a semi-AR window).
        if family is not None and sampler == family.name:
            defaults.update(family.sampling.trained_defaults(self.meta, options))
        # How the model's logits are read is the model's, whichever sampler decodes it.
        if family is not None and "logit_shift" in option_names(families.sampling_class(
                sampler)):
            defaults["logit_shift"] = trained_logit_shift(self.meta, options)
        defaults.update(options)
        return sampler_config(sampler, **defaults)

    def check_block_size(self, config: SamplerConfig, block_size: int | None,
                         what: str = "--block-size", mode: str = "--mode ar") -> None:
        """A ``block_size`` asked of ``config``'s sampler that this model cannot decode with:
        hybrid's AR mode has no block, and bd3lm/hybrid diffusion decode under the block mask
        they were trained on. ``what`` / ``mode`` name the options as the caller's user wrote
        them. Raises ValueError."""
        unused = config.unused_block_size(mode)
        if block_size is not None and unused:
            raise ValueError(f"{what} is not used by {unused}; omit it")
        trained = self.meta.get("block_size")
        if (block_size is not None and trained and block_size != trained
                and config.decodes_trained_blocks()):
            raise ValueError(
                f"{what} {block_size} differs from the block size the model was trained with "
                f"({trained}, in {self.path / META_FILE}): {config.sampler} decodes block by "
                f"block under the block mask it was trained on, and this model has only seen "
                f"blocks of {trained}; omit {what}")


def load(path: str | Path, *, device: str | torch.device = "cpu",
         attention: str = "sdpa", what: str = "--model") -> LoadedModel:
    """Load ``RUN/final`` (model, tokenizer and ``dlmkit.json``), with clear errors that name
    ``path`` as ``what``, the option the user passed it with."""
    from dlmkit.data import load_tokenizer
    from dlmkit.models import check_model_directory, load_exported

    path = check_model_directory(path, what)  # a run directory, a checkpoint: what to pass
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{what} {path}: no tokenizer in the model directory (expected one of "
                         f"{', '.join(TOKENIZER_FILES)}; the recipe saves it next to the model)")
    try:
        tokenizer = load_tokenizer(str(path))
    except (FileNotFoundError, OSError, ValueError) as err:
        raise ValueError(f"{what} {path}: no usable tokenizer in the model directory ({err})"
                         ) from None
    meta_file = path / META_FILE
    meta: dict = {}
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{meta_file}: not valid JSON ({err})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{meta_file}: expected a JSON object, got {type(meta).__name__}")
    name = meta.get("strategy")
    if name in families.names():
        model = families.get(name).strategy.load_model(path, attention=attention, device=device)
    else:  # a plain HF causal LM (e.g. an ``ar`` target): decodable with --sampler
        model = load_exported(path, attention=attention, device=device)
    mask_id = meta.get("mask_token_id")
    if mask_id is not None and mask_id != tokenizer.mask_token_id:
        raise ValueError(f"{meta_file}: mask_token_id {mask_id} differs from the tokenizer's "
                         f"{tokenizer.mask_token_id}")
    return LoadedModel(model, tokenizer, meta, path)


def encode_prompt(tokenizer, prompt: str | Sequence[Mapping[str, str]] | Sequence[int]
                  ) -> list[int]:
    """The prompt as the model saw it in training, ending with the assistant header: a text is
    one user message, a list of ``{"role", "content"}`` dicts a conversation (its last turn
    must not be the assistant's: that is what gets generated), both rendered with the chat
    template and the generation prompt; token ids are passed through unchanged."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    elif not (isinstance(prompt, Sequence) and prompt
              and all(isinstance(m, Mapping) for m in prompt)):
        return [int(t) for t in prompt]
    if prompt[-1].get("role") == "assistant":
        raise ValueError("a conversation prompt must not end with an assistant message (the "
                         "assistant turn is what gets generated); drop it or add a user turn")
    encoded = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
    return list(encoded.input_ids)


def _strip(tokens: list[int], stop_ids: Sequence[int], mask_id: int) -> tuple[list[int], int]:
    """``(response, decoded count)``: cut at the first stop token (counted, not kept)."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[:i], i + 1
    if mask_id in tokens:
        raise RuntimeError("internal error: a MASK token survived decoding")
    return tokens, len(tokens)


def decoders() -> dict:
    """Sampler name -> its family's ``decode`` (:class:`~dlmkit.families.family.Family`)."""
    return {name: families.get(name).decode for name in families.names()}


def _prompt_generators(seed: int, first_index: int, count: int, device):
    from dlmkit.data.seeds import prompt_generators

    if isinstance(first_index, bool) or not isinstance(first_index, int) or first_index < 0:
        raise ValueError(f"first_index must be an int >= 0, got {first_index!r}")
    return prompt_generators(seed, range(first_index, first_index + count), device)


def max_positions(model) -> int | None:
    """The positions ``model`` was built for (``max_position_embeddings`` of its config; a
    speculative pair's target's), None where its config records no limit."""
    config = getattr(getattr(model, "target", model), "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def check_prompt_lengths(model, lengths: Sequence[int], widths: Sequence[int],
                         labels: Sequence[str]) -> None:
    """A ValueError when a prompt of ``lengths[i]`` tokens and the ``widths[i]`` tokens decoded
    after it need more positions than ``model`` has: past them a model reads positions it never
    saw and decodes noise without a word. ``labels`` name the prompts in the message."""
    limit = max_positions(model)
    if limit is None:
        return
    over = [i for i, (n, w) in enumerate(zip(lengths, widths)) if n + w > limit]
    if not over:
        return
    i = over[0]
    n, w = lengths[i], widths[i]
    more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    if not w:
        raise ValueError(f"{labels[i]} is {n} tokens, but the model has {limit} positions "
                         f"(max_position_embeddings in its config.json){more}; shorten it")
    room = (f"shorten it to at most {limit - w} tokens or decode fewer new tokens"
            if w < limit else f"decode fewer than {limit} new tokens")
    raise ValueError(f"{labels[i]} is {n} tokens and {w} more are decoded after it: {n + w} "
                     f"positions, but the model has {limit} (max_position_embeddings in its "
                     f"config.json){more}; {room}")


def generate(model, tokenizer, prompts: Sequence[str | Sequence[int]],
             config: SamplerConfig, *, first_index: int = 0,
             prompt_seeds: Sequence[tuple[int, int]] | None = None,
             on_commit=None) -> GenerationResult:
    """Decode ``prompts`` (texts are chat-encoded; id lists are used as given) in one batch.

    Batch invariant: prompt ``i`` samples from its own generator, seeded from ``(config.seed,
    first_index + i)`` (:func:`dlmkit.data.seeds.prompt_generators`), and every sampler draws a
    row's numbers from its generator alone, so a prompt's output does not depend on the other
    prompts of the batch or on the batch size. Decoding a long list in chunks therefore gives
    the same outputs as one batch when each chunk passes its offset as ``first_index``.

    ``prompt_seeds``: per prompt a ``(seed, prompt index)`` pair that replaces ``(config.seed,
    first_index + i)`` (a server batches requests that each bring their own seed).
    ``on_commit(i, tokens)``: called as prompt ``i``'s committed response grows, by the
    block-wise samplers (ar, hybrid, bd3lm, idlm, dflash, block_diffusion: each block or
    token); mdlm and scdd settle the whole canvas at once and never call it.
    """
    cfg = config.resolved()
    if isinstance(prompts, str):
        prompts = [prompts]
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    lengths = [len(e) for e in encoded]
    check_prompt_lengths(model, lengths, cfg.canvas_widths(lengths),
                         [f"prompt {first_index + i}" for i in range(len(encoded))])
    runner = Runner(model, vocab_size=tokenizer.vocab_size)
    runner.on_commit = on_commit
    if prompt_seeds is None:
        generator = _prompt_generators(cfg.seed, first_index, len(encoded), runner.device)
    else:
        if len(prompt_seeds) != len(encoded):
            raise ValueError(f"prompt_seeds holds {len(prompt_seeds)} (seed, index) pairs for "
                             f"{len(encoded)} prompts; give one per prompt")
        generator = [g for seed, index in prompt_seeds
                     for g in _prompt_generators(seed, index, 1, runner.device)]
    ids = {"mask_id": tokenizer.mask_token_id, "pad_id": tokenizer.pad_token_id}
    stop_ids = tuple(tokenizer.stop_token_ids)
    start = time.perf_counter()
    with torch.no_grad():
        out = families.get(cfg.sampler).decode(runner, encoded, cfg, stop_ids=stop_ids,
                                               generator=generator, **ids)
    seconds = time.perf_counter() - start
    stripped = [_strip(row, stop_ids, tokenizer.mask_token_id) for row in out]
    tokens = [t for t, _ in stripped]
    return GenerationResult(
        tokens=tokens,
        texts=[tokenizer.decode(t, skip_special_tokens=True) for t in tokens],
        forwards=runner.forwards, generated=sum(n for _, n in stripped), seconds=seconds,
        row_forwards=runner.row_forwards)


INFILL_MARKER = "[MASK]"


def encode_infill(tokenizer, prompt: str, template: str, span_length: int) -> list[int]:
    """The conversation ``user: prompt / assistant: template`` with each ``[MASK]`` in
    ``template`` replaced by ``span_length`` mask tokens (the response region, where the model
    was trained to denoise)."""
    if INFILL_MARKER not in template:
        raise ValueError(f"infill template {template!r} has no {INFILL_MARKER} span to fill")
    if isinstance(span_length, bool) or not isinstance(span_length, int) or span_length < 1:
        raise ValueError(f"span_length must be an int >= 1, got {span_length!r}")
    user = [{"role": "user", "content": prompt}]
    head = tokenizer.apply_chat_template(user, add_generation_prompt=True).input_ids
    empty = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": ""}]).input_ids
    if list(empty[:len(head)]) != list(head):
        raise ValueError("the chat template is not prefix-stable; cannot place infill spans")
    body: list[int] = []
    for i, piece in enumerate(template.split(INFILL_MARKER)):
        if i:
            body += [tokenizer.mask_token_id] * span_length
        body += tokenizer.encode(piece)
    return list(head) + body + list(empty[len(head):])


def infill(model, tokenizer, sequences: Sequence[Sequence[int]],
           config: SamplerConfig) -> GenerationResult:
    """Fill the mask tokens of ``sequences`` with the masked-diffusion sampler; ``tokens`` are
    the whole sequences (every non-mask token unchanged), ``texts`` their decoding. ``steps``
    defaults to one per mask of the longest row; ``threshold`` applies here too."""
    fill = families.get(config.sampler).infill
    if fill is None:
        can = [n for n in families.names() if families.get(n).infill is not None]
        raise ValueError(f"infilling needs a bidirectional model ({' or '.join(can)}), got "
                         f"sampler {config.sampler!r}")
    masks = max(list(s).count(tokenizer.mask_token_id) for s in sequences)
    cfg = dataclasses.replace(config, steps=config.steps or max(masks, 1)).resolved()
    # the masks are filled in place: nothing is decoded past a sequence's end
    check_prompt_lengths(model, [len(s) for s in sequences], [0] * len(sequences),
                         [f"sequence {i}" for i in range(len(sequences))])
    runner = Runner(model, vocab_size=tokenizer.vocab_size)
    generator = _prompt_generators(cfg.seed, 0, len(sequences), runner.device)
    start = time.perf_counter()
    out = fill(runner, sequences, cfg, mask_id=tokenizer.mask_token_id,
               pad_id=tokenizer.pad_token_id, generator=generator)
    seconds = time.perf_counter() - start
    filled = sum(list(s).count(tokenizer.mask_token_id) for s in sequences)
    return GenerationResult(out, [tokenizer.decode(t, skip_special_tokens=True) for t in out],
                            runner.forwards, filled, seconds, runner.row_forwards)
