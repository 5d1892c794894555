"""Rollouts: ``G`` completions per prompt from the family's own sampler.

Completion ``c`` of prompt ``p`` at step ``s`` decodes from one generator seeded from ``(seed,
s, p, c)`` (:func:`completion_seed`), and the samplers draw a row's numbers from its own
generator only (:func:`dlmkit.generate.api.generate`'s batch invariance), so a completion does
not depend on which rank decodes it, on ``rollout.batch_size`` or on the other rows of its
batch. The estimators' noise draws from a second stream of the same ``(seed, s, p, c)``.

What a completion *is* for the estimators (``ids``): the decoded tokens up to and including the
first stop token. The samplers keep decoding a finished row while others in its batch run (its
tail would depend on them), so everything after the stop is dropped; the fixed-length families
(mdlm, scdd), trained on rows filled with EOS to one length, get that fill back up to the
row's canvas width, as trained. The block family (bd3lm) was trained on rows whose last block
the collator completes with EOS (``data.block_align``): a completion gets that fill back to the
end of its last block (blocks counted from the prompt's first token), so the estimators score
whole blocks, as trained and as the sampler decodes them, never a cut-off block the model has
not seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmkit.data.seeds import prompt_generators, sample_seed

ROLLOUT_STREAM = 0  # the sampler's generator
NOISE_STREAM = 1    # the estimators' noise (masks, prompt masks)


def completion_seed(seed: int, step: int, prompt_index: int, completion: int,
                    stream: int) -> int:
    """A seed in ``[0, 2^63)`` that is a function of ``(seed, step, global prompt index,
    completion index, stream)`` only (chains of :func:`~dlmkit.data.seeds.sample_seed`)."""
    return sample_seed(sample_seed(seed, step, prompt_index), stream, completion)


def completion_generator(seed: int, step: int, prompt_index: int, completion: int,
                         stream: int, device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(completion_seed(seed, step, prompt_index, completion, stream))
    return g


@dataclass
class Completion:
    """One rollout: ``ids`` the scored continuation (see the module docstring), ``text`` the
    response as decoded (cut at its stop token), ``prompt_ids`` the encoded prompt."""

    prompt_index: int
    completion: int
    prompt_ids: list[int]
    ids: list[int]
    text: str


def rollout(model, tokenizer, prompts: list[tuple[int, object]], group_size: int, cfg,
            *, seed: int, step: int, batch_size: int | None = None,
            fixed_length: bool = False, block_fill: int | None = None) -> list[Completion]:
    """``group_size`` completions of each ``(global prompt index, prompt)``, in prompt-major
    order; ``cfg`` a :class:`~dlmkit.decoding.options.SamplerConfig` (its own seed unused),
    ``batch_size`` rows per sampler call (None: all). ``fixed_length``: fill each completion
    after its stop token with EOS to its canvas width; ``block_fill``: the trained block size,
    fill each completion with EOS to the end of its last block (see the module docstring)."""
    from dlmkit import families
    from dlmkit.decoding.runner import Runner
    from dlmkit.generate.api import check_prompt_lengths, encode_prompt

    cfg = cfg.resolved()
    rows = [(index, c, encode_prompt(tokenizer, prompt)) for index, prompt in prompts
            for c in range(group_size)]
    lengths = [len(ids) for _, _, ids in rows]
    widths = cfg.canvas_widths(lengths)
    check_prompt_lengths(model, lengths, widths, [f"prompt {i}" for i, _, _ in rows])
    runner = Runner(model, vocab_size=tokenizer.vocab_size)
    stop_ids = tuple(tokenizer.stop_token_ids)
    size = batch_size or len(rows)
    out: list[Completion] = []
    was_training = model.training
    model.eval()
    try:
        for at in range(0, len(rows), size):
            chunk = rows[at:at + size]
            generators = [g for index, c, _ in chunk for g in prompt_generators(
                completion_seed(seed, step, index, c, ROLLOUT_STREAM), [0], runner.device)]
            with torch.no_grad():
                decode = families.get(cfg.sampler).decode
                decoded = decode(runner, [ids for _, _, ids in chunk], cfg, stop_ids=stop_ids,
                                 generator=generators, mask_id=tokenizer.mask_token_id,
                                 pad_id=tokenizer.pad_token_id)
            for (index, c, prompt_ids), row, width in zip(chunk, decoded,
                                                          widths[at:at + size]):
                response, ids = _cut(list(row)[:width], stop_ids)
                if fixed_length and len(ids) < width:
                    ids = ids + [tokenizer.eos_token_id] * (width - len(ids))
                elif block_fill:
                    ids = ids + [tokenizer.eos_token_id] * (-(len(prompt_ids) + len(ids))
                                                            % block_fill)
                if tokenizer.mask_token_id in ids:
                    raise RuntimeError(f"internal error: a MASK token survived decoding of "
                                       f"prompt {index}, completion {c}")
                out.append(Completion(index, c, prompt_ids, ids,
                                      tokenizer.decode(response, skip_special_tokens=True)))
    finally:
        model.train(was_training)
    return out


def _cut(row: list[int], stop_ids) -> tuple[list[int], list[int]]:
    """``(response, scored ids)``: the tokens before the first stop token, and those with it."""
    for i, t in enumerate(row):
        if t in stop_ids:
            return row[:i], row[:i + 1]
    return row, row
