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

Rows are decoded one at a time (acceptance lengths differ per row). ``tau`` (acceptance
length) is tokens per verification forward, bonus included; the prefill forward is counted in
``forwards`` (tokens per target forward overall) but not in ``tau``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .stream import exclude


class DFlashPair(nn.Module):
    """A frozen target causal LM and its DFlash drafter, checked to fit each other.

    ``stats`` accumulates over calls: ``target_forwards`` (prefill + verification),
    ``draft_forwards``, ``verify_forwards``, ``verified_tokens`` (tokens produced by the
    verification forwards, bonus included) and ``generated``.
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
        self.stats = dict.fromkeys(("target_forwards", "draft_forwards", "verify_forwards",
                                    "verified_tokens", "generated"), 0)
        import inspect

        params = inspect.signature(target.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def block_size(self) -> int:
        return int(self.drafter.config.block_size)

    def target_step(self, ids: torch.Tensor, position: int, cache):
        """Target over ``ids [1, n]`` at positions ``position ..``: ``(logits [n, V] float,
        context [1, n, len(ids) * H])``."""
        pos = torch.arange(position, position + ids.shape[1], device=ids.device).unsqueeze(0)
        out = self.target(input_ids=ids, position_ids=pos, use_cache=True,
                          output_hidden_states=[i + 1 for i in self.layer_ids],
                          **{self._cache_kw: cache})
        self.stats["target_forwards"] += 1
        context = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return out.logits[0].float(), context

    def draft_step(self, anchor: int, position: int, context, context_position: int, cache,
                   mask_id: int) -> torch.Tensor:
        """Drafter logits ``[bs - 1, V]`` for the block anchored at ``position``; ``context``
        holds the hidden states of positions ``context_position .. position - 1`` not yet in
        the drafter cache."""
        bs = self.block_size
        device = context.device
        block = torch.full((1, bs), mask_id, dtype=torch.long, device=device)
        block[0, 0] = anchor
        noise = self.target.get_input_embeddings()(block)
        pos = torch.arange(context_position, position + bs, device=device).unsqueeze(0)
        hidden = self.drafter(noise_embeds=noise, context_hidden_states=context,
                              position_ids=pos, cache=cache).last_hidden_state
        cache.crop(-bs)  # the block's keys: only accepted context stays cached
        self.stats["draft_forwards"] += 1
        return self.target.get_output_embeddings()(hidden[0, 1:]).float()


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
    """One prompt's response ids, up to and including its first stop token.

    ``block_size`` (default the drafter's) caps the block verified per forward at
    ``block_size - 1`` drafts; ``vocab_size`` cuts the logits to the tokenizer's vocabulary.
    """
    from transformers import DynamicCache

    bs = pair.block_size if block_size is None else block_size
    if not 2 <= bs <= pair.block_size:
        raise ValueError(f"block_size must be in [2, {pair.block_size}] (the drafter's block), "
                         f"got {bs}")
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    device = next(pair.parameters()).device
    stops = set(stop_ids)

    def cut(logits):
        logits = logits if vocab_size is None else logits[..., :vocab_size]
        return exclude(logits, mask_id)

    target_cache, draft_cache = DynamicCache(), DynamicCache()
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    logits, context = pair.target_step(ids, 0, target_cache)
    token = int(_draw(cut(logits[-1]), temperature, generator))
    out = [token]
    context_position, position = 0, len(prompt)  # ``token`` sits at ``position``
    while out[-1] not in stops and len(out) < max_new_tokens:
        # Never verify more than the response can still take (the bonus included).
        k = min(bs - 1, max_new_tokens - len(out) - 1)
        if k > 0:
            draft_logits = cut(pair.draft_step(token, position, context, context_position,
                                               draft_cache, mask_id)[:k])
            draft = _draw(draft_logits, temperature, generator)
        else:
            draft_logits = draft = torch.zeros((0,), dtype=torch.long, device=device)
        block = torch.cat([torch.tensor([token], device=device), draft]).unsqueeze(0)
        logits, verified = pair.target_step(block, position, target_cache)
        n, token = accept(cut(logits), draft_logits, draft, temperature, generator)
        if k > n:
            target_cache.crop(-(k - n))  # the rejected drafts
        pair.stats["verify_forwards"] += 1
        pair.stats["verified_tokens"] += n + 1
        context, context_position = verified[:, :n + 1], position
        position += n + 1
        for t in draft[:n].tolist() + [token]:
            out.append(t)
            if t in stops:
                break
    pair.stats["generated"] += len(out)
    return out


def decode_dflash(runner, encoded, cfg, *, stop_ids, generator, mask_id, pad_id):
    """The ``dflash`` sampler (``DECODERS`` entry): ``runner.model`` is a :class:`DFlashPair`.
    Target forwards are reported as the runner's forwards, so ``tokens_per_forward`` is
    generated tokens per target forward."""
    pair = runner.model
    if not isinstance(pair, DFlashPair):
        raise ValueError("the dflash sampler needs a target and a drafter: pass the target with "
                         "--model and the drafter with --draft (or --model a drafter export)")
    rows = []
    for row, prompt in enumerate(encoded):
        before = pair.stats["target_forwards"]
        g = generator[row] if isinstance(generator, (list, tuple)) else generator
        rows.append(speculative_decode(pair, prompt, max_new_tokens=cfg.max_new_tokens,
                                       temperature=cfg.temperature, stop_ids=stop_ids,
                                       mask_id=mask_id, generator=g, block_size=cfg.block_size,
                                       vocab_size=runner.vocab_size))
        used = pair.stats["target_forwards"] - before
        runner.forwards += used
        runner.row_forwards += used
    return rows


def read_meta(path) -> dict:
    meta = Path(path) / "dlmkit.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def load_drafter(path, *, device="cpu"):
    from dlmkit.models.dflash import DFlashDrafter

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"--draft {path}: not a drafter directory (no config.json)")
    return DFlashDrafter.from_pretrained(path, local_files_only=True).to(device).eval()


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
