"""DiffusionGemma block-diffusion sampler: canvas by canvas over the encoder's KV cache.

The encoder fills a cache with the (left-padded) prompts; then, per canvas of ``block_size``
tokens:

1. the canvas starts as uniform random tokens;
2. each denoising step runs the decoder on the canvas against the cache (every canvas token
   sees the whole canvas and every real cached token; sliding layers only the last ``W - 1``
   cached columns, as transformers' sliding cache holds), with the previous step's logits as
   self-conditioning (none on the first step);
3. the step's logits are tempered (``temperature``, or the linear schedule from ``t_max`` at the
   first step to ``t_min`` at the last), a denoiser canvas is drawn from them (argmax at
   temperature 0), and a *commit rule* says which positions take the denoiser's token; every
   other position is renoised with a fresh uniform token:

   * ``entropy_bound=B``: the lowest-entropy positions whose entropies, less the largest of
     them, sum to at most ``B`` (transformers' ``EntropyBoundSampler``);
   * otherwise positions are *committed* as in masked diffusion: each step the
     ``remasking`` confidence (``low_confidence``, ``margin``, ``entropy``, ``random``) picks
     the linear schedule's count of the most confident uncommitted positions
     (:func:`~dlmkit.decoding.primitives.scheduled_count`; with ``threshold`` also every one at
     least that confident, with ``factor`` Fast-dLLM's factor rule, as in the mdlm sampler:
     :func:`~dlmkit.decoding.primitives.select_transfers`); committed tokens stay fixed, the
     others are renoised, and the canvas ends when all are committed;

4. **adaptive stopping** (``stability_threshold`` and ``confidence_threshold``): a row stops
   denoising when its argmax canvas has not changed for ``stability_threshold`` steps and its
   mean token entropy is below ``confidence_threshold``. The canvas ends when every row has
   stopped or its steps (:meth:`SamplerConfig.block_steps`) run out;
5. the canvas's argmax (its committed tokens, under the confidence rules) is its output; it is
   encoded into the cache (one encoder forward) for the next canvas. A row ends at a canvas
   containing a stop token; the batch stops when every row has.

Random numbers come from ``generator`` in transformers' order (per canvas: the initial canvas;
per step: the multinomial draw, then the renoising draw); a list of generators (what
``dlmkit generate`` passes: one per prompt) gives row ``b`` its own stream, drawn the same way.
With one generator seeded like transformers' global RNG, the
entropy-bound rule, the temperature schedule and adaptive stopping, one prompt (or prompts of
equal length: transformers gives padded rows other position ids) decodes to exactly what
``DiffusionGemmaForBlockDiffusion.generate`` gives, up to float rounding of the explicit masks.

``runner.forwards`` counts decoder forwards (denoising steps), ``row_forwards`` those of rows
still denoising, like transformers' ``tokens_per_forward``; the one encoder forward per canvas is
not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.decoding.options import SamplerConfig
from dlmkit.decoding.primitives import confidence, scheduled_count, select_transfers
from dlmkit.decoding.runner import Runner, left_pad, positions, rule_mask
from dlmkit.diffusion.rng import Generators, check_generator
from dlmkit.masks import canvas_encoder
from dlmkit.models import diffusion_gemma as dg


def _uniform_tokens(generator: Generators, batch: int, width: int, vocab: int, device):
    """``[B, width]`` uniform token ids: one draw for the batch from a single generator
    (transformers' order), row ``b`` from ``generator[b]`` for a list (batch invariance)."""
    if isinstance(generator, torch.Generator):
        return torch.randint(0, vocab, (batch, width), generator=generator, device=device)
    return torch.stack([torch.randint(0, vocab, (width,), generator=g, device=device)
                        for g in generator])


def _multinomial(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One token per position of ``probs [B, S, V]``, drawn like ``_uniform_tokens``."""
    batch, width, vocab = probs.shape
    if isinstance(generator, torch.Generator):
        return torch.multinomial(probs.view(-1, vocab), 1, generator=generator).view(batch,
                                                                                      width)
    return torch.stack([torch.multinomial(probs[b], 1, generator=g).squeeze(-1)
                        for b, g in enumerate(generator)])


def entropy_bound_accept(logits: torch.Tensor, bound: float) -> torch.Tensor:
    """bool ``[B, S]``: the positions, by increasing entropy, whose entropies less their
    maximum sum to at most ``bound`` (always at least the most certain one)."""
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    ordered, order = entropy.sort(-1)
    keep = ordered.cumsum(-1) - ordered <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


class _Stopping:
    """transformers' stable-and-confident rule, per row."""

    def __init__(self, stability: int, threshold: float) -> None:
        self.stability, self.threshold, self.history = stability, threshold, None

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.stability == 0:
            stable = torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device)
        else:
            if self.history is None:
                self.history = torch.full((self.stability, *argmax.shape), -1,
                                          dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax).all(-1).all(0)
            self.history = torch.cat([self.history[1:], argmax[None]])
        entropy = torch.distributions.Categorical(logits=logits).entropy()
        return stable & (entropy.mean(-1) < self.threshold)


def sample_canvas(runner: Runner, prompts: Sequence[Sequence[int]], cfg: SamplerConfig, *,
                  pad_id: int, stop_ids: Sequence[int], generator: Generators
                  ) -> torch.Tensor:
    """Generated tokens ``[B, max_new_tokens]`` (each canvas's final argmax; rows that ended
    earlier hold ``pad_id`` in later canvases)."""
    model = dg.unwrap(runner.model)
    device = runner.device
    S, batch = cfg.block_size, len(prompts)
    check_generator(generator, batch)
    vocab = runner.vocab_size or model.config.get_text_config().vocab_size
    window = dg.sliding_window(model)
    kinds = dg.layer_types(model)
    ids, valid = left_pad(prompts, pad_id, device)
    pos = positions(valid)
    next_pos = pos[:, -1:] + 1
    cache = dg.new_cache()
    stops = torch.as_tensor(list(stop_ids), device=device)
    steps = cfg.block_steps()
    num_canvases = -(-cfg.max_new_tokens // S)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    out = []

    def encode(tokens, token_pos, key_valid):
        """Append ``tokens [B, T]`` to the cache: causal over the real cached columns."""
        width, length = tokens.shape[1], key_valid.shape[1]
        start = length - width
        full = canvas_encoder(length, key_valid)
        masks = {}
        for kind in kinds:
            w = window if kind == "sliding_attention" else None
            base = full if w is None else canvas_encoder(length, key_valid, w)
            masks[kind] = _rows(base, start, length, batch, device)
        model.model.encoder(input_ids=tokens, attention_mask=dg.rendered(masks, model),
                            position_ids=token_pos, cache=cache)

    def decoder_masks(key_valid):
        cached = key_valid.shape[1]
        masks = {}
        for kind in kinds:
            w = window if kind == "sliding_attention" else None

            def rule(b, q, kv, w=w):
                enc = (kv < cached) & (key_valid[b, kv.clamp(max=cached - 1)] > 0)
                if w is not None:
                    enc = enc & (kv > cached - w)
                return enc | (kv >= cached)

            masks[kind] = rule_mask(rule, S, cached + S, batch, f"canvas_decode_{kind}", device)
        return dg.rendered(masks, model)

    key_valid = valid
    encode(ids, pos, key_valid)
    for index in range(num_canvases):
        if index:
            # the previous canvas becomes context: encode it (it is real for every row)
            key_valid = torch.cat([key_valid, torch.ones_like(key_valid[:, :S])], 1)
            encode(out[-1], next_pos - S + torch.arange(S, device=device), key_valid)
        canvas_pos = next_pos + torch.arange(S, device=device)
        masks = decoder_masks(key_valid)
        current = _uniform_tokens(generator, batch, S, vocab, device)
        argmax = current
        stopping = (None if cfg.stability_threshold is None
                    else _Stopping(cfg.stability_threshold, cfg.confidence_threshold))
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        committed = torch.zeros(batch, S, dtype=torch.bool, device=device)
        previous = None
        for remaining in range(steps, 0, -1):
            logits = model(cache=cache, decoder_input_ids=current,
                           decoder_attention_mask=masks, decoder_position_ids=canvas_pos,
                           self_conditioning_logits=previous).logits[..., :vocab]
            runner.forwards += 1
            runner.row_forwards += int((~(done | finished)).sum())
            temperature = cfg.temperature if cfg.t_min is None else \
                cfg.t_min + (cfg.t_max - cfg.t_min) * remaining / steps
            scaled = logits if temperature == 0 else logits / temperature
            if temperature == 0:
                proposal = scaled.argmax(-1)
            else:
                proposal = _multinomial(torch.softmax(scaled, -1, dtype=torch.float32),
                                        generator)
            new_argmax = scaled.argmax(-1)
            if cfg.entropy_bound is not None:
                accept = entropy_bound_accept(scaled, cfg.entropy_bound)
                new_current = torch.where(accept, proposal, current)
            else:
                # commit the scheduled count of the most confident uncommitted positions (and
                # whatever the threshold or factor rule adds); committed tokens stay fixed
                scores = confidence(logits, proposal, cfg.remasking, generator)
                chosen = select_transfers(scores, ~committed,
                                          scheduled_count((~committed).sum(1), remaining),
                                          cfg.threshold, cfg.factor)
                new_current = torch.where(chosen, proposal, current)
                committed = committed | chosen
                accept = committed
            noise_draw = _uniform_tokens(generator, batch, S, vocab, device)
            new_current = torch.where(accept, new_current, noise_draw)
            if cfg.entropy_bound is None:  # the output: committed tokens, else the argmax
                new_argmax = torch.where(committed, new_current, new_argmax)
            if bool(done.any()):  # a row that stopped keeps its canvas and logits
                new_argmax = torch.where(done[:, None], argmax, new_argmax)
                new_current = torch.where(done[:, None], current, new_current)
                scaled = torch.where(done[:, None, None], previous, scaled)
            if stopping is not None:
                done |= stopping(new_argmax, scaled)
            if cfg.entropy_bound is None:  # every position committed: the canvas is done
                done |= committed.all(-1)
            current, argmax = new_current, new_argmax
            previous = scaled.to(model.model.decoder.embed_tokens.weight.dtype)
            if bool(done.all()):
                break
        block = torch.where(finished[:, None], torch.full_like(argmax, pad_id), argmax)
        out.append(block)
        if runner.on_commit is not None:  # the canvas is final: tell a streaming listener
            for row, tokens in enumerate(torch.cat(out, 1)[:, :cfg.max_new_tokens].tolist()):
                runner.committed(row, tokens)
        finished |= torch.isin(block, stops).any(1)
        next_pos = next_pos + S
        if bool(finished.all()):
            break
    tokens = torch.cat(out, 1)[:, :cfg.max_new_tokens]
    pad = cfg.max_new_tokens - tokens.shape[1]
    return torch.nn.functional.pad(tokens, (0, pad), value=pad_id) if pad else tokens


def _rows(mask, start: int, length: int, batch: int, device):
    """Query rows ``[start, length)`` of a self-attention mask over ``length`` keys."""

    full = mask.mask_mod

    def rule(b, q, kv):
        return full(b, 0, q + start, kv)

    return rule_mask(rule, length - start, length, max(batch, mask.batch), "encoder_rows",
                     device)


def decode(runner: Runner, encoded, cfg: SamplerConfig, *, mask_id, **ids) -> list[list[int]]:
    """The block_diffusion sampler (:class:`~dlmkit.families.family.Family` ``decode``)."""
    return sample_canvas(runner, encoded, cfg, **ids).tolist()
