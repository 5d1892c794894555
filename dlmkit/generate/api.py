"""The sampling entry points: load an exported model, generate, infill, evaluate.

``generate(model, tokenizer, prompts, config)`` runs the decoder of ``config.sampler``
(:data:`DECODERS`); an export's default sampler is its training strategy's ``sampler``
(:func:`strategy_samplers`), so a new family needs no change here beyond its decoder:

============  ==============================================  ============================
sampler       family / layout it decodes                       module
============  ==============================================  ============================
``mdlm``      MDLM / LLaDA, bidirectional, unshifted           :mod:`.masked`
``scdd``      SCDD, bidirectional, ancestral (``revise``:       :mod:`.scdd`
              SCDD's self-correction and final pass)
``bd3lm``     BD3-LM, block diffusion over a clean cache       :mod:`.block`
``hybrid``    hybrid AR + diffusion: ``mode=diffusion``        :mod:`.block` / :mod:`.stream`
              (block diffusion) or ``mode=ar`` (clean stream)
``idlm``      I-DLM introspective strided decoding             :mod:`.idlm`
``ar``        plain autoregressive decoding (any causal LM)    :mod:`.stream`
``dflash``    speculative: DFlash drafter + target verifier     :mod:`.speculative`
============  ==============================================  ============================

``block_diffusion`` decodes DiffusionGemma canvases over an encoder cache
(:mod:`.block_diffusion`).
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

from dlmkit import strategies

from .block import sample_blocks
from .block_diffusion import sample_canvas
from .config import SamplerConfig
from .idlm import sample_isd
from .masked import infill_masked, sample_masked
from .runner import Runner
from .scdd import sample_scdd
from .speculative import decode_dflash
from .stream import sample_ar

META_FILE = "dlmkit.json"
TOKENIZER_FILES = ("dlmkit_tokenizer.json", "tokenizer.json", "tokenizer_config.json")


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


# Samplers that decode a family's export besides its own (``strategy.sampler``). The clean
# causal stream of hybrid and idlm is a causal LM: ``ar`` decodes it as trained (token for token
# hybrid's mode='ar'; idlm commits exactly that stream's greedy tokens). mdlm and scdd share the
# bidirectional masked layout, so each sampler runs on the other's export, but with a reverse
# process the model was not trained for (a warning). Any other pairing feeds the model a layout
# it never saw (the mdlm sampler on a bd3lm export decodes an empty answer): an error.
ALSO_DECODES = {"hybrid": ("ar",), "idlm": ("ar",)}
RELATED_SAMPLERS = {"mdlm": ("scdd",), "scdd": ("mdlm",)}


def check_sampler_family(family: str, sampler: str, where) -> None:
    """``sampler`` on an export of training strategy ``family`` (named in ``where``): silent when
    it decodes the family as trained, a :class:`SamplerFamilyWarning` for a related family's
    sampler, else a ValueError naming the samplers that fit."""
    own = strategies.get(family).sampler
    fits = (own, *ALSO_DECODES.get(family, ()))
    if sampler in fits:
        return
    trained = f"{where} says strategy {family!r}"
    if sampler in RELATED_SAMPLERS.get(family, ()):
        warnings.warn(f"sampler {sampler!r} on a model trained as {family} ({trained}): both are "
                      "bidirectional masked diffusion, so it runs, but not with the reverse "
                      f"process this model was trained for; its own sampler is {own!r} (omit "
                      "--sampler)", SamplerFamilyWarning, stacklevel=3)
        return
    hint = ("; dflash is speculative decoding: pass a causal target as --model and its "
            "drafter export as --draft" if sampler == "dflash" else "")
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
        from .config import OPTIONS, SAMPLERS

        name = self.meta.get("strategy")
        strategy = strategies.get(name) if name in strategies.names() else None
        if sampler is None:
            if strategy is None or not strategy.sampler:
                where = self.path / META_FILE
                why = (f"{where}: strategy {name!r} has no sampler here" if self.meta
                       else f"{self.path} has no {META_FILE} (not exported by `dlmkit train`)")
                raise ValueError(f"{why}; pick one explicitly with --sampler "
                                 f"({', '.join(SAMPLERS)})")
            sampler = strategy.sampler
        elif strategy is not None and strategy.sampler:
            check_sampler_family(name, sampler, self.path / META_FILE)
        defaults: dict = {}
        if self.meta.get("max_new_tokens"):
            defaults["max_new_tokens"] = int(self.meta["max_new_tokens"])
        # A sampler other than the family's own gets no trained defaults: the options mean
        # different things to different samplers (mdlm's block is a semi-AR window).
        if strategy is not None and sampler == strategy.sampler:
            defaults.update(strategy.sampler_defaults(self.meta, options))
        # How the model's logits are read is the model's, whichever sampler decodes it.
        if strategy is not None and "logit_shift" in OPTIONS.get(sampler, ()):
            defaults["logit_shift"] = strategy.trained_logit_shift(self.meta, options)
        defaults.update(options)
        return SamplerConfig.from_options(sampler, **defaults)

    def check_block_size(self, config: SamplerConfig, block_size: int | None,
                         what: str = "--block-size", mode: str = "--mode ar") -> None:
        """A ``block_size`` asked of ``config``'s sampler that this model cannot decode with:
        hybrid's AR mode has no block, and bd3lm/hybrid diffusion decode under the block mask
        they were trained on. ``what`` / ``mode`` name the options as the caller's user wrote
        them. Raises ValueError."""
        if block_size is not None and config.sampler == "hybrid" and config.mode == "ar":
            raise ValueError(f"{what} is not used by the hybrid sampler in {mode} (it decodes "
                             "token by token on the clean causal stream); omit it")
        trained = self.meta.get("block_size")
        if (block_size is not None and trained and block_size != trained
                and config.sampler in TRAINED_BLOCK_SAMPLERS and config.mode == "diffusion"):
            raise ValueError(
                f"{what} {block_size} differs from the block size the model was trained with "
                f"({trained}, in {self.path / META_FILE}): {config.sampler} decodes block by "
                f"block under the block mask it was trained on, and this model has only seen "
                f"blocks of {trained}; omit {what}")


# Samplers that decode in the fixed blocks the model was trained on (its block mask): another
# block size would feed it a layout it never saw.
TRAINED_BLOCK_SAMPLERS = ("bd3lm", "hybrid")


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
    if name in strategies.names():
        model = strategies.get(name).load_model(path, attention=attention, device=device)
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


def _own_canvases(out: torch.Tensor, encoded, cfg) -> list[list[int]]:
    """Each row's own canvas (with ``pad_to`` the canvases differ in width)."""
    widths = cfg.canvas_widths([len(p) for p in encoded])
    return [row[:w] for row, w in zip(out.tolist(), widths)]


def _decode_mdlm(runner, encoded, cfg, **kw):
    return _own_canvases(sample_masked(runner, encoded, cfg, **kw), encoded, cfg)


def _decode_scdd(runner, encoded, cfg, *, stop_ids, **kw):
    return _own_canvases(sample_scdd(runner, encoded, cfg, **kw), encoded, cfg)


def _decode_blocks(runner, encoded, cfg, **kw):
    return sample_blocks(runner, encoded, cfg, clean_causal=False, **kw).tolist()


def _decode_hybrid(runner, encoded, cfg, **kw):
    if cfg.mode == "ar":
        return _decode_ar(runner, encoded, cfg, **kw)
    return sample_blocks(runner, encoded, cfg, clean_causal=True, **kw).tolist()


def _decode_isd(runner, encoded, cfg, **kw):
    return sample_isd(runner, encoded, max_new_tokens=cfg.max_new_tokens, stride=cfg.block_size,
                      temperature=cfg.temperature, **kw)


def _decode_canvas(runner, encoded, cfg, *, mask_id, **kw):
    return sample_canvas(runner, encoded, cfg, **kw).tolist()


def _decode_ar(runner, encoded, cfg, **kw):
    return sample_ar(runner, encoded, max_new_tokens=cfg.max_new_tokens,
                     temperature=cfg.temperature, **kw)


# Sampler name -> ``decode(runner, encoded prompts, resolved config, *, stop_ids, generator,
# mask_id, pad_id) -> list of token-id rows`` (the generated part, before stripping).
DECODERS = {"mdlm": _decode_mdlm, "scdd": _decode_scdd, "bd3lm": _decode_blocks,
            "hybrid": _decode_hybrid, "idlm": _decode_isd, "ar": _decode_ar,
            "dflash": decode_dflash, "block_diffusion": _decode_canvas}


def strategy_samplers() -> dict[str, str]:
    """Training strategy -> the sampler that decodes its export (from the strategies)."""
    return {name: strategies.get(name).sampler for name in strategies.names()
            if strategies.get(name).sampler}


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
        out = DECODERS[cfg.sampler](runner, encoded, cfg, stop_ids=stop_ids,
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
    masks = max(list(s).count(tokenizer.mask_token_id) for s in sequences)
    cfg = dataclasses.replace(config, steps=config.steps or max(masks, 1)).resolved()
    if cfg.sampler not in ("mdlm", "scdd"):
        raise ValueError(f"infilling needs a bidirectional model (mdlm or scdd), got sampler "
                         f"{cfg.sampler!r}")
    # the masks are filled in place: nothing is decoded past a sequence's end
    check_prompt_lengths(model, [len(s) for s in sequences], [0] * len(sequences),
                         [f"sequence {i}" for i in range(len(sequences))])
    runner = Runner(model, vocab_size=tokenizer.vocab_size)
    generator = _prompt_generators(cfg.seed, 0, len(sequences), runner.device)
    start = time.perf_counter()
    out = infill_masked(runner, sequences, cfg, mask_id=tokenizer.mask_token_id,
                        pad_id=tokenizer.pad_token_id, generator=generator)
    seconds = time.perf_counter() - start
    filled = sum(list(s).count(tokenizer.mask_token_id) for s in sequences)
    return GenerationResult(out, [tokenizer.decode(t, skip_special_tokens=True) for t in out],
                            runner.forwards, filled, seconds, runner.row_forwards)


def evaluate(model, tokenizer, records: Sequence[dict], config: SamplerConfig,
             batch_size: int = 32) -> tuple[float, list[dict], GenerationResult]:
    """Exact match of generated responses against ``records`` (``{"prompt", "response"}``).

    Returns ``(accuracy in [0, 1], per-record rows {prompt, response, output, correct},
    totals as a GenerationResult over all batches)``. Conversations (``{"messages"}``
    records, several turns each) go through :mod:`dlmkit.generate.evaluation`.
    """
    from dlmkit.data import records_from_dicts

    from .evaluation import conversation_turns, score_turns

    turns = conversation_turns(records_from_dicts(records, "evaluate"))
    scored, totals = score_turns(model, tokenizer, turns, config, batch_size=batch_size)
    rows = [{"prompt": record["prompt"], "response": record["response"],
             "output": row["prediction"], "correct": row["correct"]}
            for record, row in zip(records, scored)]
    accuracy = sum(r["correct"] for r in rows) / max(len(rows), 1)
    return accuracy, rows, totals
