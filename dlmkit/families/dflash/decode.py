"""DFlash speculative decoding: a drafter proposes a block, the target verifies it in one forward.

One cycle, from the last accepted token ``t`` at position ``p`` (the *anchor*):

1. the drafter reads ``[t, MASK x (bs - 1)]`` at positions ``p .. p + bs - 1`` with the target's
   hidden states of every accepted token before ``p`` as context (kept in the drafter's own KV
   cache, so each cycle only adds the newly accepted ones) and proposes ``d_1 .. d_k``;
2. the target runs ``[t, d_1 .. d_k]`` in one forward over its KV cache: logits ``L_0 .. L_k``;
3. greedy: the longest prefix with ``d_i == argmax L_{i-1}`` is accepted, plus the target's own
   token ``argmax L_n`` (the *bonus*), so the output is token for token the target's greedy
   decoding. Sampling: the standard speculative rule (Leviathan et al. 2023; Chen et al. 2023),
   accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``, on the first rejection draw
   from ``norm(max(0, p_i - q_i))``, after ``k`` acceptances draw the bonus from ``p_k``; the
   output is distributed exactly as the target's own samples;
4. the target cache drops the rejected drafts; the accepted tokens' hidden states become new
   drafter context; the bonus is the next anchor.

**Batches.** The rows of a batch run these cycles together, one target and one drafter forward
per cycle for all of them, although each row accepts a different number of drafts. The caches
are shared column by column: every cycle appends ``k + 1`` columns for every row (``k`` the
most drafts any row may still take), and a per-row key-validity mask hides a row's rejected
drafts, its prompt padding and every column after it has stopped; positions are per row. A row
therefore gets the same logits it would get alone (up to float rounding of the masked
attention) and draws its random numbers in the same order from its own generator, so its
output does not depend on its batch. The price: a row's cache holds ``k + 1`` columns per
cycle however few it accepted.

``tau`` (acceptance length) is tokens per verification forward of one row, bonus included;
``target_forwards`` counts per row too (prefill included: tokens per target forward overall, not
in ``tau``); ``target_calls`` counts the batched forwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.decoding.stream import exclude
from dlmkit.diffusion import rng
from dlmkit.families.dflash.pair import DFlashPair


def accept(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft: torch.Tensor,
           temperature: float, generator: torch.Generator | None) -> tuple[int, int]:
    """``(n, next)``: how many of the ``k`` drafted tokens ``draft [k]`` are accepted and the
    token that follows them, given target logits ``[k + 1, V]`` (row ``i`` predicts the token
    after ``i`` drafts) and the drafter's ``[k, V]`` (which ``draft`` was sampled from).

    ``temperature == 0``: longest prefix equal to the target's argmax, then its argmax.
    Otherwise the speculative-sampling rule (see the module docstring), in float64.
    """
    k = draft.shape[0]
    if temperature == 0:
        choice = target_logits.argmax(-1)
        agree = (choice[:k] == draft).long().cumprod(0)
        n = int(agree.sum())
        return n, int(choice[n])
    p = torch.softmax(target_logits.double() / temperature, -1)
    q = torch.softmax(draft_logits.double() / temperature, -1)
    device = target_logits.device
    for i in range(k):
        d = int(draft[i])
        u = float(torch.rand((), generator=generator, dtype=torch.float64, device=device))
        if u * float(q[i, d]) < float(p[i, d]):  # u < p/q without dividing by q
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q: the rejection cannot happen; be safe
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def _draw(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def speculative_decode(pair: DFlashPair, prompt: Sequence[int], *, max_new_tokens: int,
                       temperature: float, stop_ids: Sequence[int], mask_id: int,
                       generator: torch.Generator | None = None, block_size: int | None = None,
                       vocab_size: int | None = None) -> list[int]:
    """One prompt's response ids, up to and including its first stop token (a batch of one of
    :func:`speculative_decode_batch`)."""
    return speculative_decode_batch(pair, [prompt], max_new_tokens=max_new_tokens,
                                    temperature=temperature, stop_ids=stop_ids,
                                    mask_id=mask_id, generator=generator,
                                    block_size=block_size, vocab_size=vocab_size)[0]


@torch.no_grad()
def speculative_decode_batch(pair: DFlashPair, prompts: Sequence[Sequence[int]], *,
                             max_new_tokens: int, temperature: float, stop_ids: Sequence[int],
                             mask_id: int, generator: rng.Generators | None = None,
                             block_size: int | None = None,
                             vocab_size: int | None = None,
                             on_commit=None) -> list[list[int]]:
    """Each prompt's response ids, up to and including its first stop token; the rows decode
    together (see the module docstring); with a list of generators row ``b`` draws only from
    ``generator[b]``, one generator is shared by the rows.

    ``block_size`` (default the drafter's) caps the block verified per forward at
    ``block_size - 1`` drafts; ``vocab_size`` cuts the logits to the tokenizer's vocabulary.
    """
    from transformers import DynamicCache

    bs = pair.block_size if block_size is None else block_size
    if not 2 <= bs <= pair.block_size:
        raise ValueError(f"block_size must be in [2, {pair.block_size}] (the drafter's block), "
                         f"got {bs}")
    if not prompts or any(not p for p in prompts):
        raise ValueError("every prompt must hold at least one token")
    batch = len(prompts)
    if generator is not None:
        rng.check_generator(generator, batch)
    generators = [None if generator is None else rng.for_row(generator, b)
                  for b in range(batch)]
    device = next(pair.parameters()).device
    stops = set(stop_ids)

    def cut(logits):
        logits = logits if vocab_size is None else logits[..., :vocab_size]
        return exclude(logits, mask_id)

    # Prefill: the prompts right-padded into one block of columns; padding is never a key.
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    width = int(lengths.max())
    cols = torch.arange(width, device=device)
    valid = cols[None, :] < lengths[:, None]  # [B, C]: which cache columns each row sees
    ids = torch.tensor([list(p) + [0] * (width - len(p)) for p in prompts], device=device)
    positions = torch.where(valid, cols[None, :], 0)
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    logits, context = pair.target_step(ids, positions, valid, target_cache, batch)
    last = cut(logits[torch.arange(batch, device=device), lengths - 1])
    out = [[int(_draw(last[b], temperature, generators[b]))] for b in range(batch)]
    # The drafter's pending context: target hidden states it has not cached yet.
    context_positions, context_valid = positions, valid
    draft_valid = valid[:, :0]  # the drafter cache's column validity
    position = lengths.clone()  # each row's anchor (its last token) sits here
    active = [out[b][-1] not in stops and len(out[b]) < max_new_tokens for b in range(batch)]
    while any(active):
        live = torch.tensor(active, device=device)
        rows = int(live.sum())
        # Never verify more than a response can still take (the bonus included).
        ks = [min(bs - 1, max_new_tokens - len(out[b]) - 1) if active[b] else 0
              for b in range(batch)]
        k = max(ks)
        anchors = torch.tensor([o[-1] for o in out], device=device)
        drafts = torch.zeros(batch, k, dtype=torch.long, device=device)
        draft_logits = None
        if k > 0:
            draft_valid = torch.cat([draft_valid, context_valid], 1)  # cached once drafted
            draft_logits = cut(pair.draft_step(anchors, position, context, context_positions,
                                               draft_valid, draft_cache, mask_id, rows)[:, :k])
            for b in range(batch):
                if ks[b]:
                    drafts[b, :ks[b]] = _draw(draft_logits[b, :ks[b]], temperature,
                                              generators[b])
        block = torch.cat([anchors[:, None], drafts], 1)  # [B, k + 1]
        block_positions = position[:, None] + torch.arange(k + 1, device=device)
        keys = torch.cat([valid, live[:, None].expand(batch, k + 1)], 1)
        logits, verified = pair.target_step(block, block_positions, keys, target_cache, rows)
        logits = cut(logits)
        accepted = torch.zeros(batch, k + 1, dtype=torch.bool, device=device)
        for b in range(batch):
            if not active[b]:
                continue
            kb = ks[b]
            proposed = logits[b, :0] if draft_logits is None else draft_logits[b, :kb]
            n, token = accept(logits[b, :kb + 1], proposed, drafts[b, :kb], temperature,
                              generators[b])
            accepted[b, :n + 1] = True
            pair.stats["verify_forwards"] += 1
            pair.stats["verified_tokens"] += n + 1
            position[b] += n + 1
            for t in drafts[b, :n].tolist() + [token]:
                out[b].append(t)
                if t in stops:
                    break
            active[b] = out[b][-1] not in stops and len(out[b]) < max_new_tokens
            if on_commit is not None:
                on_commit(b, out[b])
        # Rejected drafts stay in the caches as columns no row sees again.
        valid = torch.cat([valid, accepted], 1)
        context, context_positions, context_valid = verified, block_positions, accepted
    pair.stats["generated"] += sum(len(o) for o in out)
    return out


def decode_dflash(runner, encoded, cfg, *, stop_ids, generator, mask_id, pad_id):
    """The ``dflash`` sampler (``DECODERS`` entry): ``runner.model`` is a :class:`DFlashPair`.
    The batch decodes together; the runner counts the batched target forwards as
    ``forwards`` and the per-row ones as ``row_forwards`` (``tokens_per_forward``: generated
    tokens per target forward of one row)."""
    pair = runner.model
    if not isinstance(pair, DFlashPair):
        raise ValueError("the dflash sampler needs a target and a drafter: pass the target with "
                         "--model and the drafter with --draft (or --model a drafter export)")
    calls, rows = pair.stats["target_calls"], pair.stats["target_forwards"]
    out = speculative_decode_batch(pair, encoded, max_new_tokens=cfg.max_new_tokens,
                                   temperature=cfg.temperature, stop_ids=stop_ids,
                                   mask_id=mask_id, generator=generator,
                                   block_size=cfg.block_size, vocab_size=runner.vocab_size,
                                   on_commit=runner.committed)
    runner.forwards += pair.stats["target_calls"] - calls
    runner.row_forwards += pair.stats["target_forwards"] - rows
    return out
