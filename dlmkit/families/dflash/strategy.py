"""DFlash: train a block-diffusion drafter against a frozen target causal LM.

Per sample, ``num_blocks_per_sample`` anchor blocks are drawn from the sample's own generator
(so the draw depends on ``(seed, step, global sample index)`` only). Anchor ``a`` is a position
whose next token is supervised and whose block ``a .. a + bs - 1`` lies inside the row's real
tokens; the block holds the clean token at ``a`` followed by ``bs - 1`` mask tokens, and its
targets are the tokens at ``a + 1 .. a + bs - 1`` (scored where supervised). A sample with fewer
than ``min_supervised`` supervised tokens, or with no possible anchor, contributes nothing: its
blocks are dropped (``keep=False``, no target scored, nothing in any denominator) and counted in
the loss extra ``dropped_samples``.

The frozen target runs once per micro-batch under ``no_grad`` over the clean sequence (causal),
keeping only the hidden states of ``target_layer_ids``; their concatenation is the drafter's
context. One drafter forward covers all ``N`` blocks under the ``dflash`` mask (a block sees the
context strictly before its anchor and its own block, never another block; dense on CPU,
``BlockMask`` with FlexAttention). Loss: :class:`DFlashDecayLoss` on the target's LM head with
the global denominator; extras ``draft_correct``/``draft_count`` per block offset give
``draft_acc`` and ``draft_acc_k``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from dlmkit.diffusion import DFlashDecayLoss
from dlmkit.families.dflash.pair import check_pair
from dlmkit.families.strategy import Strategy
from dlmkit.masks import dflash
from dlmkit.masks.causal import padded_causal
from dlmkit.models import mask_argument

from .options import DFlashTraining

# The reference's decay by block size (DFlash paper); other sizes use max(2, bs / 2).
_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_layer_ids(num_layers: int, count: int) -> list[int]:
    """``count`` target layers evenly spaced: a single middle layer for one; otherwise from
    layer 1 to ``L - 3`` (the reference's span) when the target is deep enough, else over all
    layers."""
    count = min(count, num_layers)
    if count == 1:
        return [num_layers // 2]
    lo, hi = (1, num_layers - 3) if num_layers - 3 - 1 >= count - 1 else (0, num_layers - 1)
    return sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)})


def read_target_config(path) -> dict:
    """The target's ``config.json`` (with clear errors for a missing or non-model directory)."""
    target = Path(str(path)).expanduser()
    if not target.is_dir():
        raise ValueError(f"strategy.target {str(path)!r} is not a directory (pass a local "
                         "Hugging Face model directory, e.g. RUN/final of `dlmkit train --set "
                         "strategy.name=ar`)")
    config = target / "config.json"
    if not config.is_file():
        raise ValueError(f"strategy.target {str(path)!r} has no config.json (not a model "
                         "directory)")
    return json.loads(config.read_text())


class DFlashStrategy(Strategy):
    name = "dflash"
    default_model = "dflash-tiny"
    options = DFlashTraining

    # -- options and the target --------------------------------------------------------------
    def validate(self) -> None:
        c = self.config
        bs = c["block_size"]
        if c["target"] is None:
            raise ValueError("strategy.target is required for dflash: a local Hugging Face "
                             "causal LM directory (e.g. RUN/final of `dlmkit train --set "
                             "strategy.name=ar`)")
        target = read_target_config(c["target"])
        self.target_path = str(Path(str(c["target"])).expanduser().resolve())
        layers = int(target.get("num_hidden_layers", 0))
        self.target_hidden_size = int(target["hidden_size"])
        self.target_vocab_size = int(target["vocab_size"])
        ids = c["target_layer_ids"]
        if ids is None:
            ids = default_layer_ids(layers, c["num_target_layers"])
            if not ids:
                raise ValueError(f"strategy.target {c['target']!r} has no hidden layers "
                                 f"(num_hidden_layers={layers}) to take the context from")
        bad = [i for i in ids if not 0 <= i < layers]
        if bad:
            raise ValueError(f"strategy.target_layer_ids {list(ids)}: the target "
                             f"{c['target']!r} has {layers} layers (valid ids 0..{layers - 1}), "
                             f"so layer(s) {bad} do not exist")
        self.layer_ids = [int(i) for i in ids]
        if self.target_vocab_size < self.vocab_size:
            raise ValueError(f"the target's vocabulary ({self.target_vocab_size}) is smaller "
                             f"than the tokenizer's ({self.vocab_size}): the drafter embeds and "
                             f"scores tokens with the target, so they must share a vocabulary")
        gamma = c["gamma"] if c["gamma"] is not None else _GAMMA.get(bs, max(2.0, bs / 2))
        self.loss_fn = DFlashDecayLoss(bs, gamma=gamma, normalize=c["normalize"],
                                       chunk_size=self.loss_chunk_size)
        self.target = None
        self.target_seconds = 0.0  # time spent in target forwards (the target's step share)

    def build_model(self, spec, *, vocab_size, attention, dtype, overrides=None):
        from dlmkit.models.dflash import DRAFT_PRESETS, DFlashDraftConfig, DFlashDrafter

        overrides = dict(overrides or {})
        shape = dict(hidden_size=self.target_hidden_size, block_size=self.config["block_size"],
                     mask_token_id=self.mask_token_id, target_layer_ids=self.layer_ids,
                     target_hidden_size=self.target_hidden_size,
                     vocab_size=self.target_vocab_size)
        if spec in DRAFT_PRESETS:
            if overrides.get("hidden_size", self.target_hidden_size) != self.target_hidden_size:
                raise ValueError(f"model.config hidden_size {overrides['hidden_size']} does not "
                                 f"match the target's hidden size {self.target_hidden_size}: the "
                                 "drafter uses the target's embeddings and LM head")
            config = DFlashDraftConfig(**{**DRAFT_PRESETS[spec], **overrides, **shape})
            model = DFlashDrafter(config)
        elif Path(str(spec)).is_dir():
            if overrides:
                raise ValueError(f"model.config overrides apply to presets only, got {overrides}")
            from dlmkit.models import check_model_directory, quiet_transformers

            check_model_directory(spec, "model.name")
            with quiet_transformers():
                model = DFlashDrafter.from_pretrained(spec, local_files_only=True)
            check_pair(model.config, self.target_hidden_size, self.target_vocab_size,
                       self.layer_ids, self.config["block_size"], where=str(spec))
        else:
            raise ValueError(f"model.name must be a drafter preset ({', '.join(DRAFT_PRESETS)}) "
                             f"or a local drafter directory, got {spec!r}")
        self.attention = attention
        return model.to(dtype)

    def setup(self, device):
        from dlmkit.models import build_model

        # The frozen target: not wrapped, not optimised, not checkpointed.
        target = build_model(self.target_path, self.vocab_size, attention="sdpa",
                             what="strategy.target")
        target = target.to(device).eval().requires_grad_(False)
        self.target = target

    def export_meta(self):
        return {"target": self.target_path, "target_layer_ids": self.layer_ids,
                "block_size": self.config["block_size"]}

    @classmethod
    def load_model(cls, path, *, attention="sdpa", device="cpu"):
        from dlmkit.families.dflash.pair import load_pair

        return load_pair(path, device=device, attention=attention)

    def metrics(self, extras):
        """``draft_acc`` (top-1 accuracy over all scored block positions), ``draft_acc_k``
        per block offset ``k = 1 .. bs - 1`` (an acceptance-length proxy) and
        ``dropped_samples``, from the step's summed extras."""
        correct, count = extras["draft_correct"], extras["draft_count"]
        out = {"draft_acc": float(correct.sum() / count.sum().clamp_min(1)),
               "dropped_samples": int(extras["dropped_samples"])}
        for k, (c, n) in enumerate(zip(correct.tolist(), count.tolist()), 1):
            out[f"draft_acc_{k}"] = c / max(n, 1)
        return out

    # -- hooks -------------------------------------------------------------------------------
    def sample_anchors(self, batch, generators):
        """``(anchors [B, N] long, keep [B, N] bool, dropped)`` from the per-sample generators."""
        c = self.config
        bs, n = c["block_size"], c["num_blocks_per_sample"]
        minimum = c["min_supervised"] or bs
        sup = (batch["loss_mask"] != 0).cpu()
        valid = (batch["attention_valid"] != 0).cpu()
        rows, length = sup.shape
        anchors = torch.zeros((rows, n), dtype=torch.long)
        keep = torch.zeros((rows, n), dtype=torch.bool)
        position = torch.arange(length)
        dropped = 0
        for row in range(rows):
            valid_len = int(valid[row].sum())
            candidate = torch.zeros(length, dtype=torch.bool)
            candidate[:-1] = sup[row, 1:] & valid[row, 1:]
            candidate &= position + bs <= valid_len
            choices = position[candidate]
            if int(sup[row].sum()) < minimum or choices.numel() == 0:
                dropped += 1
                continue
            g = generators[row]
            if c["overlap"]:
                picks = torch.randint(choices.numel(), (n,), generator=g, device=g.device).cpu()
                anchors[row], keep[row] = choices[picks], True
            else:  # non-overlapping blocks: random order, keep those clear of earlier picks
                taken: list[int] = []
                for i in torch.randperm(choices.numel(), generator=g, device=g.device).tolist():
                    a = int(choices[i])
                    if all(abs(a - t) >= bs for t in taken):
                        taken.append(a)
                        if len(taken) == n:
                            break
                anchors[row, :len(taken)] = torch.tensor(sorted(taken))
                anchors[row, len(taken):] = taken[-1]
                keep[row, :len(taken)] = True
        return anchors, keep, dropped

    def prepare(self, batch, generators):
        bs = self.config["block_size"]
        ids, valid = batch["input_ids"], batch["attention_valid"]
        device = ids.device
        anchors, keep, dropped = self.sample_anchors(batch, generators)
        anchors, keep = anchors.to(device), keep.to(device)
        rows, length = ids.shape
        offsets = torch.arange(bs, device=device)
        block_pos = anchors.unsqueeze(-1) + offsets  # [B, N, bs]
        noise = torch.full(block_pos.shape, self.mask_token_id, dtype=ids.dtype, device=device)
        anchor_tokens = ids.gather(1, anchors)
        noise[..., 0] = torch.where(keep, anchor_tokens, self.mask_token_id)
        index = block_pos[..., 1:].clamp(max=length - 1).reshape(rows, -1)
        sup = (batch["loss_mask"] != 0) & (valid != 0)
        block_mask = sup.gather(1, index) & keep.repeat_interleave(bs - 1, dim=1)
        causal = self.cached_mask(self.layout_key(batch),
                                  lambda: padded_causal(length, valid, device=device))
        return {"input_ids": ids, "position_ids": batch["position_ids"], "target_mask": causal,
                "loss_mask": batch["loss_mask"], "anchors": anchors, "keep": keep,
                "noise_ids": noise.reshape(rows, -1),
                "draft_position_ids": block_pos.reshape(rows, -1),
                "mask": dflash(anchors, keep, length, bs, device=device),
                "target_ids": ids.gather(1, index), "block_mask": block_mask,
                "dropped_samples": dropped}

    def counts(self, prepared):
        return {"num_tokens": self.loss_fn.local_denominator(prepared["block_mask"])}

    @torch.no_grad()
    def target_context(self, prepared) -> torch.Tensor:
        """Concatenated target hidden states ``[B, L, len(ids) * H]`` (one no-grad forward)."""
        if self.target is None:
            raise RuntimeError("dflash: setup(device) must load the target before loss()")
        start = time.perf_counter()
        impl = self.target.config._attn_implementation
        mask = mask_argument(prepared["target_mask"], impl, self.target.dtype)
        ids = prepared["input_ids"]
        if isinstance(mask, torch.Tensor) and mask.shape[0] != ids.shape[0]:
            mask = mask.expand(ids.shape[0], *mask.shape[1:])
        out = self.target.model(input_ids=ids, attention_mask=mask,
                                position_ids=prepared["position_ids"], use_cache=False,
                                output_hidden_states=[i + 1 for i in self.layer_ids])
        context = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        self.target_seconds += time.perf_counter() - start
        return context

    def draft_hidden(self, model, prepared, context) -> torch.Tensor:
        """One drafter forward over all ``N`` blocks: last hidden state ``[B, N * bs, H]``."""
        with torch.no_grad():
            noise = self.target.get_input_embeddings()(prepared["noise_ids"])
        positions = torch.cat([prepared["position_ids"], prepared["draft_position_ids"]], 1)
        implementation = "flex_attention" if getattr(self, "attention", "sdpa") == \
            "flex_attention" else "sdpa"
        mask = mask_argument(prepared["mask"], implementation, torch.float32)
        return model(noise_embeds=noise, context_hidden_states=context,
                     position_ids=positions, attention_mask=mask).last_hidden_state

    def loss(self, model, prepared, denominators):
        bs = self.config["block_size"]
        hidden = self.draft_hidden(model, prepared, self.target_context(prepared))
        rows, n = prepared["anchors"].shape
        # Offset 0 is the clean anchor: only offsets 1 .. bs - 1 are predicted.
        drafted = hidden.view(rows, n, bs, -1)[:, :, 1:].reshape(rows, n * (bs - 1), -1)
        head = self.target.get_output_embeddings()
        out = self.loss_fn(target_ids=prepared["target_ids"], block_mask=prepared["block_mask"],
                           hidden=drafted, lm_head_weight=head.weight,
                           lm_head_bias=head.bias, num_tokens=denominators["num_tokens"])
        dropped = torch.tensor(float(prepared["dropped_samples"]))
        return out._replace(extras={**out.extras, "dropped_samples": dropped})
