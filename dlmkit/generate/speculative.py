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

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dlmkit.diffusion import rng

from .stream import exclude


class DFlashPair(nn.Module):
    """A frozen target causal LM and its DFlash drafter, checked to fit each other.

    ``stats`` accumulates over calls: per row, ``target_forwards`` (prefill + verification),
    ``draft_forwards``, ``verify_forwards``, ``verified_tokens`` (tokens produced by the
    verification forwards, bonus included) and ``generated``; ``target_calls``, the batched
    target forwards.
    """

    def __init__(self, target, drafter) -> None:
        super().__init__()
        from dlmkit.strategies.dflash import check_pair

        tc = target.config.get_text_config() if hasattr(target.config, "get_text_config") \
            else target.config
        check_pair(drafter.config, tc.hidden_size, tc.vocab_size, where="--draft")
        bad = [i for i in drafter.config.target_layer_ids
               if not 0 <= i < tc.num_hidden_layers]
        if bad:
            raise ValueError(f"--draft: the drafter reads target layers "
                             f"{drafter.config.target_layer_ids}, the target has only "
                             f"{tc.num_hidden_layers} (ids 0..{tc.num_hidden_layers - 1})")
        self.target, self.drafter = target, drafter
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.stats = dict.fromkeys(("target_forwards", "target_calls", "draft_forwards",
                                    "verify_forwards", "verified_tokens", "generated"), 0)
        import inspect

        params = inspect.signature(target.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def block_size(self) -> int:
        return int(self.drafter.config.block_size)

    def target_step(self, ids: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor,
                    cache, rows: int):
        """Target over ``ids [B, n]`` at ``positions [B, n]``, appended to ``cache``, whose
        columns (old and new) a row may see where ``key_valid [B, C + n]`` is true: ``(logits
        [B, n, V] float, context [B, n, len(layer_ids) * H])``. ``rows``: how many rows still
        decode (the per-row forward count)."""
        out = self.target(input_ids=ids, position_ids=positions, use_cache=True,
                          attention_mask=key_valid.long(),
                          output_hidden_states=[i + 1 for i in self.layer_ids],
                          **{self._cache_kw: cache})
        self.stats["target_calls"] += 1
        self.stats["target_forwards"] += rows
        context = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return out.logits.float(), context

    def draft_step(self, anchors: torch.Tensor, positions: torch.Tensor, context: torch.Tensor,
                   context_positions: torch.Tensor, key_valid: torch.Tensor, cache,
                   mask_id: int, rows: int) -> torch.Tensor:
        """Drafter logits ``[B, bs - 1, V]`` for the blocks anchored by ``anchors [B]`` at
        ``positions [B]``. ``context [B, m, W]`` (at ``context_positions [B, m]``) holds the
        target hidden states not yet in the drafter's ``cache``; ``key_valid [B, cached + m]``
        which of the cached and new context columns each row may see."""
        bs = self.block_size
        batch, device = anchors.shape[0], anchors.device
        block = torch.full((batch, bs), mask_id, dtype=torch.long, device=device)
        block[:, 0] = anchors
        noise = self.target.get_input_embeddings()(block)
        pos = torch.cat([context_positions,
                         positions[:, None] + torch.arange(bs, device=device)], 1)
        keys = torch.cat([key_valid, torch.ones(batch, bs, dtype=torch.bool, device=device)], 1)
        hidden = self.drafter(noise_embeds=noise, context_hidden_states=context,
                              position_ids=pos, attention_mask=keys, cache=cache).last_hidden_state
        cache.crop(-bs)  # the blocks' keys: only accepted context stays cached
        self.stats["draft_forwards"] += rows
        return self.target.get_output_embeddings()(hidden[:, 1:]).float()


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


def read_meta(path) -> dict:
    meta = Path(path) / "dlmkit.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def check_draft_pair(target_path, target_meta: dict, draft_path) -> None:
    """From the two ``dlmkit.json`` files, before any weights load: ``draft_path`` is a DFlash
    drafter export and the target (``target_meta``, ``{}`` for a plain Hugging Face model) a
    causal LM, the only kind that can verify drafts."""
    draft_meta = read_meta(draft_path)
    kind = draft_meta.get("strategy")
    if kind != "dflash":
        what = (f"its dlmkit.json says strategy {kind!r}" if draft_meta
                else "it has no dlmkit.json")
        raise ValueError(f"--draft {draft_path}: not a DFlash drafter export ({what}); --draft "
                         "takes RUN/final of a run trained with strategy.name=dflash against "
                         "the target passed as --model")
    family = target_meta.get("strategy")
    if family not in (None, "ar"):
        recorded = draft_meta.get("target")
        hint = f" (this drafter was trained against {recorded})" if recorded else ""
        raise ValueError(f"--model {target_path}: trained with strategy {family!r}, not a causal "
                         "LM; speculative decoding verifies the drafts with the target's "
                         "next-token predictions, so --model with --draft must be an ar export "
                         "(RUN/final of strategy.name=ar) or a plain Hugging Face causal LM"
                         f"{hint}")


def load_drafter(path, *, device="cpu"):
    from dlmkit.models import quiet_transformers
    from dlmkit.models.dflash import DFlashDrafter

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"--draft {path}: not a drafter directory (no config.json)")
    with quiet_transformers():
        drafter, info = DFlashDrafter.from_pretrained(path, local_files_only=True,
                                                      output_loading_info=True)
    # transformers initialises absent tensors at random and only logs it: a drafter with
    # random weights drafts noise (tau 1.0) while looking like it works.
    missing = sorted(info["missing_keys"]) + sorted(k for k, *_ in info["mismatched_keys"])
    if missing:
        total = len(drafter.state_dict())
        raise ValueError(f"--draft {path}: the weights file lacks {len(missing)} of the "
                         f"drafter's {total} tensors (or has them in another shape: "
                         f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                         "they would be random. Pass the final/ directory of a dflash run")
    return drafter.to(device).eval()


def load_pair(path, *, device="cpu", attention="sdpa", target=None) -> DFlashPair:
    """A drafter export (``RUN/final`` of ``strategy.name=dflash``) with its target: ``target``
    (a model) or the directory recorded in its ``dlmkit.json``."""
    from dlmkit.models import load_exported

    if target is None:
        recorded = read_meta(path).get("target")
        if not recorded or not Path(recorded).is_dir():
            raise ValueError(f"{path}: its dlmkit.json records no existing target directory "
                             f"({recorded!r}); pass the target with --model and this drafter "
                             "with --draft")
        target = load_exported(recorded, attention=attention, device=device)
    return DFlashPair(target, load_drafter(path, device=device))


def attach_draft(loaded, draft_path, *, device="cpu"):
    """``LoadedModel`` of the target -> one whose model is the (target, drafter) pair and whose
    default sampler is ``dflash`` with the drafter's block size."""
    import dataclasses

    check_draft_pair(loaded.path, loaded.meta, draft_path)
    pair = DFlashPair(loaded.model, load_drafter(draft_path, device=device))
    meta = {**loaded.meta, "strategy": "dflash", "block_size": pair.block_size}
    return dataclasses.replace(loaded, model=pair, meta=meta)


def summary(model) -> str | None:
    """One line of speculative-decoding figures for a :class:`DFlashPair` (else None)."""
    if not isinstance(model, DFlashPair):
        return None
    st = model.stats
    tau = st["verified_tokens"] / max(st["verify_forwards"], 1)
    return (f"speculative: tau {tau:.2f} tokens per verification forward (bonus included)  "
            f"target forwards: {st['target_forwards']} (prefill included, "
            f"{st['target_forwards'] / max(st['generated'], 1):.3f} per token)  "
            f"draft forwards: {st['draft_forwards']}  block: {model.block_size}")
