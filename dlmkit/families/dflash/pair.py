"""A DFlash drafter and its target as one model: the checks that they fit each other, and
loading them from their exports (``dlmkit generate --draft``, ``strategy.load_model``)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import nn


def check_pair(draft_config, hidden_size: int, vocab_size: int, layer_ids=None,
               block_size: int | None = None, *, where: str = "drafter") -> None:
    """A drafter fits a target: same hidden size and vocabulary (it borrows the target's
    embeddings and LM head), and (when given) the same context layers and block size."""
    if draft_config.hidden_size != hidden_size:
        raise ValueError(f"{where}: drafter hidden size {draft_config.hidden_size} does not match "
                         f"the target's {hidden_size}")
    if draft_config.vocab_size is not None and draft_config.vocab_size != vocab_size:
        raise ValueError(f"{where}: drafter vocabulary {draft_config.vocab_size} does not match "
                         f"the target's {vocab_size}")
    if layer_ids is not None and list(draft_config.target_layer_ids) != list(layer_ids):
        raise ValueError(f"{where}: drafter reads target layers {draft_config.target_layer_ids}, "
                         f"the strategy asks for {list(layer_ids)}")
    if block_size is not None and draft_config.block_size != block_size:
        raise ValueError(f"{where}: drafter block size {draft_config.block_size} differs from "
                         f"strategy.block_size {block_size}")


class DFlashPair(nn.Module):
    """A frozen target causal LM and its DFlash drafter, checked to fit each other.

    ``stats`` accumulates over calls: per row, ``target_forwards`` (prefill + verification),
    ``draft_forwards``, ``verify_forwards``, ``verified_tokens`` (tokens produced by the
    verification forwards, bonus included) and ``generated``; ``target_calls``, the batched
    target forwards.
    """

    def __init__(self, target, drafter) -> None:
        super().__init__()
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
    from dlmkit import families

    family = target_meta.get("strategy")
    if family is not None and not (family in families.names()
                                   and families.get(family).plain_causal):
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
