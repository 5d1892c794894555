"""Block diffusion on transformers' DiffusionGemma: an encoder over the clean context, a
decoder over one canvas block of uniformly-noised response tokens.

Per example and step (every draw from the sample's own generator, so from ``(seed, step,
global sample index)`` only, in this order):

1. **Block selection.** The response is cut into canvas blocks of ``block_size`` tokens that
   start at the response (the collator block-aligns the final response with a supervised EOS
   fill, ``fill_from_response``). Every assistant turn of a multi-turn record contributes its
   blocks; one of them is drawn uniformly. The encoder sees the whole clean sequence, but the
   block's canvas rows see only the encoder keys *before* the block (:func:`dlmkit.masks.canvas`
   with ``prefix`` = the block start): the prompt, earlier turns and earlier blocks of the
   turn. A turn's last block that runs past its end (an intermediate turn, or a truncated row)
   is padded: the padded canvas positions are unsupervised and invisible.
2. **Self-conditioning coin** ``u < self_conditioning_p``.
3. **Corruption** of the block: :func:`~dlmkit.diffusion.corrupt_uniform_random`, one level
   per canvas block, only on its supervised positions.

Loss: the flat block-diffusion CE over the block's supervised tokens (corrupted or not) divided
by their global count (``num_tokens``, from the final canvas masks), plus
``encoder_loss_weight`` times the encoder's next-token loss over the clean sequence with its own
global count of scored pairs (``num_ar_tokens``): by default (``encoder_loss_targets=
"response"``) only pairs whose target is a supervised (response) token, as the ar family's SFT
loss — a user's prompts are not learned by heart; ``"all"`` scores every valid pair (NeMo's
recipe).

Self-conditioning (``self_conditioning_p > 0``): pass 1 decodes the block without it under
``no_grad`` (always, whatever the coins, so every rank runs the same forwards), pass 2 decodes
it again with pass 1's logits gated per example by the coin and is the one that backpropagates.

Only the selected block is decoded (its ``S`` query rows over ``[encoder | S canvas]`` keys).
NeMo's scheme forwards the whole response canvas and scores one block; since canvas attention
is block-diagonal and the encoder keys are clean, the selected block's logits are the same, so
loss and gradients are identical for about ``num_blocks`` times less decoder work.
``decode="all"`` runs that reference scheme (single-turn records only), for tests and benchmarks.
"""

from __future__ import annotations

import torch

from dlmkit.diffusion import BlockDiffusionLoss, LossOutput, corrupt_uniform_random, encoder_ar_loss
from dlmkit.diffusion.rng import draw_rows
from dlmkit.families.strategy import Strategy
from dlmkit.masks import canvas
from dlmkit.models import diffusion_gemma as dg

from .options import BlockDiffusionTraining


def supervised_runs(loss_mask: torch.Tensor, valid: torch.Tensor | None = None
                    ) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: the maximal runs of supervised (and real) positions of one row
    — one per assistant turn."""
    sup = loss_mask != 0
    if valid is not None:
        sup = sup & (valid != 0)
    edges = torch.diff(sup.long(), prepend=sup.new_zeros(1).long(),
                       append=sup.new_zeros(1).long())
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return list(zip(starts, ends))


def canvas_blocks(runs: list[tuple[int, int]], block_size: int) -> list[tuple[int, int]]:
    """``[(start, length), ...]``: each run cut into blocks of ``block_size`` from its start
    (``length`` = the block's supervised tokens, < ``block_size`` only at a run's end)."""
    return [(s, min(block_size, end - s)) for a, end in runs for s in range(a, end, block_size)]


class BlockDiffusionStrategy(Strategy):
    name = "block_diffusion"
    default_model = "tiny-diffusion-gemma"
    # Trained defaults (why: docs/families/block_diffusion.md#why-these-defaults).
    default_lr = 1.5e-3
    default_steps = 6000
    default_warmup_steps = 20
    default_ema_decay = 0.999
    fill_from_response = True
    options = BlockDiffusionTraining

    def validate(self) -> None:
        self.loss_fn = BlockDiffusionLoss(chunk_size=self.loss_chunk_size)
        self.max_positions = None  # the model's position budget, known once it is built

    # -- the model ---------------------------------------------------------------------------
    def build_model(self, spec, *, vocab_size, attention, dtype, overrides=None):
        model = dg.build(spec, vocab_size, attention=attention, dtype=dtype, overrides=overrides,
                         canvas_length=self.config["block_size"])
        self.max_positions = model.config.get_text_config().max_position_embeddings
        return model

    @classmethod
    def load_model(cls, path, *, attention="sdpa", device="cpu"):
        return dg.load(path, attention=attention, device=device)

    def check_dataset(self, dataset, collator) -> None:
        """Every assistant turn must fit the canvas budget (``max_blocks`` blocks) and every
        sample, block-filled, the model's positions: each sample as the collator lays it out
        (:meth:`~dlmkit.data.Collator.keeps`: under the length cap a response keeps its whole
        blocks only)."""
        S, budget = self.config["block_size"], self.config["max_blocks"]
        kept, aligned, _ = dataset.kept_by(collator)
        for i in range(len(dataset)):
            runs = supervised_runs(dataset[i]["loss_mask"][:int(kept[i])])
            for a, e in runs:
                blocks = -(-(e - a) // S)
                if budget is not None and blocks > budget:
                    raise ValueError(
                        f"{dataset.sources[i]}: a response of {e - a} tokens needs {blocks} "
                        f"canvas blocks of {S}, more than the canvas budget "
                        f"strategy.max_blocks={budget} ({budget * S} tokens)")
            end = int(aligned[i])
            if self.max_positions is not None and end > self.max_positions:
                raise ValueError(
                    f"{dataset.sources[i]}: {end} tokens (block-filled) exceed the model's "
                    f"max_position_embeddings={self.max_positions}")

    # -- hooks -------------------------------------------------------------------------------
    def prepare(self, batch, generators):
        ids, valid = batch["input_ids"], batch["attention_valid"]
        positions, device = batch["position_ids"], ids.device
        B, L = ids.shape
        S = self.config["block_size"]
        runs = [supervised_runs(batch["loss_mask"][b], valid[b]) for b in range(B)]
        blocks = [canvas_blocks(r, S) for r in runs]
        u = draw_rows(generators, B, 2, device)
        counts = torch.tensor([max(len(b), 1) for b in blocks], device=device)
        chosen = torch.minimum((u[:, 0] * counts).floor().long(), counts - 1)
        coins = u[:, 1] < self.config["self_conditioning_p"]
        start = torch.tensor([blocks[b][int(chosen[b])][0] if blocks[b] else L
                              for b in range(B)], device=device)
        length = torch.tensor([blocks[b][int(chosen[b])][1] if blocks[b] else 0
                               for b in range(B)], device=device)

        target, loss_mask = self._gather(ids, start, length, S)
        noisy, noise_mask, _ = corrupt_uniform_random(
            target, loss_mask, self.vocab_size, eps=self.config["eps"], generator=generators)
        ar_targets = valid != 0
        if self.config["encoder_loss_targets"] == "response":
            ar_targets = ar_targets & (batch["loss_mask"] != 0)
        prepared = {"input_ids": ids, "position_ids": positions, "valid": valid,
                    "ar_targets": ar_targets, "self_condition": coins, "block": chosen,
                    "layout": self.layout_key(batch)}
        if self.config["decode"] == "all":
            return {**prepared, **self._all_blocks(batch, runs, blocks, chosen, noisy,
                                                   generators)}
        key = ("selected", start.cpu().numpy().tobytes(), length.cpu().numpy().tobytes(),
               *prepared["layout"])
        mask = self.cached_mask(key, lambda: canvas(start, length, L, S, canvas_length=S,
                                                    valid=valid))
        return {**prepared, "canvas_ids": noisy, "target_ids": target, "loss_mask": loss_mask,
                "noise_mask": noise_mask, "canvas_positions": self._positions(positions, start,
                                                                              S),
                "starts": start, "lengths": length, "mask": mask, "mask_key": key}

    @staticmethod
    def _gather(ids, start, length, width):
        """``(tokens, supervised)`` ``[B, width]``: ``ids[b, start_b + j]`` for ``j <
        length_b``, 0 (unsupervised padding) after."""
        j = torch.arange(width, device=ids.device)
        inside = j < length.unsqueeze(1)
        cols = (start.unsqueeze(1) + j).clamp(max=ids.shape[1] - 1)
        tokens = torch.where(inside, ids.gather(1, cols), torch.zeros_like(cols))
        return tokens, inside

    @staticmethod
    def _positions(positions, start, width):
        """Canvas position ids: the block continues the position count of its start column."""
        L = positions.shape[1]
        first = positions.gather(1, start.clamp(max=L - 1).unsqueeze(1))
        first = first + (start.unsqueeze(1) - (L - 1)).clamp(min=0)  # a start past the row
        return first + torch.arange(width, device=positions.device)

    def _all_blocks(self, batch, runs, blocks, chosen, selected_noisy, generators) -> dict:
        """NeMo's scheme: the whole response window as the canvas; only the chosen block is
        scored, and it holds exactly the noisy tokens the selected-block scheme decodes."""
        ids, valid = batch["input_ids"], batch["attention_valid"]
        B, L = ids.shape
        S, device = self.config["block_size"], ids.device
        if any(len(r) > 1 for r in runs):
            raise ValueError("strategy.decode='all' (the reference one-canvas scheme) needs "
                             "single-turn records; decode='selected' trains every turn")
        prefix = torch.tensor([r[0][0] if r else L for r in runs], device=device)
        response = torch.tensor([r[0][1] - r[0][0] if r else 0 for r in runs], device=device)
        R = max(1, max(len(b) for b in blocks)) * S
        target, supervised = self._gather(ids, prefix, response, R)
        others, _, _ = corrupt_uniform_random(target, supervised, self.vocab_size,
                                              eps=self.config["eps"], generator=generators)
        block_of = torch.arange(R, device=device) // S
        mine = block_of.unsqueeze(0) == chosen.unsqueeze(1)
        noisy = others.clone()
        rows, cols = torch.nonzero(mine, as_tuple=True)
        noisy[rows, cols] = selected_noisy[rows, cols - chosen[rows] * S]
        key = ("all", prefix.cpu().numpy().tobytes(), response.cpu().numpy().tobytes(),
               *self.layout_key(batch))
        mask = self.cached_mask(key, lambda: canvas(prefix, response, L, S, canvas_length=R,
                                                    valid=valid))
        return {"canvas_ids": noisy, "target_ids": target, "loss_mask": supervised & mine,
                "noise_mask": (noisy != target) & supervised,
                "canvas_positions": self._positions(batch["position_ids"], prefix, R),
                "starts": prefix, "lengths": response, "mask": mask, "mask_key": key}

    def counts(self, prepared):
        valid = prepared["valid"] != 0
        return {"num_tokens": (prepared["loss_mask"] != 0).sum(),
                "num_ar_tokens": (valid[:, :-1] & prepared["ar_targets"][:, 1:]).sum()}

    def attention_masks(self, model, prepared) -> tuple[dict, dict]:
        """``(encoder, decoder)`` masks by layer type, cached per layout."""
        L = prepared["input_ids"].shape[1]
        width = prepared["canvas_ids"].shape[1]
        encoder = dg.encoder_masks(model, L, prepared["valid"], cache=self.cached_mask,
                                   key=prepared["layout"])
        window = dg.sliding_window(model)
        decoder = {}
        for kind in dg.layer_types(model):
            if kind == "full_attention":
                decoder[kind] = prepared["mask"]
                continue
            decoder[kind] = self.cached_mask(
                ("sliding", window, *prepared["mask_key"]),
                lambda: canvas(prepared["starts"], prepared["lengths"], L,
                               self.config["block_size"], window, canvas_length=width,
                               valid=prepared["valid"]))
        return encoder, decoder

    def loss(self, model, prepared, denominators):
        encoder, decoder = self.attention_masks(model, prepared)
        call = dict(input_ids=prepared["input_ids"], attention_mask=dg.rendered(encoder, model),
                    position_ids=prepared["position_ids"],
                    decoder_input_ids=prepared["canvas_ids"],
                    decoder_attention_mask=dg.rendered(decoder, model),
                    decoder_position_ids=prepared["canvas_positions"])
        if self.config["self_conditioning_p"] > 0:
            with torch.no_grad():
                first = model(**call, cache=dg.new_cache()).logits
            call.update(self_conditioning_logits=first,
                        self_conditioning_mask=prepared["self_condition"])
        out = model(**call, cache=dg.new_cache())
        diffusion = self.loss_fn(logits=out.logits, target_ids=prepared["target_ids"],
                                 loss_mask=prepared["loss_mask"],
                                 num_tokens=denominators["num_tokens"]).total
        weight = float(self.config["encoder_loss_weight"])
        ar = diffusion.new_zeros(())
        if weight > 0:
            logits = dg.softcapped_logits(model, out.encoder_last_hidden_state)
            ar = encoder_ar_loss(logits, prepared["input_ids"], prepared["valid"],
                                 target_mask=prepared["ar_targets"],
                                 num_tokens=denominators["num_ar_tokens"],
                                 chunk_size=self.loss_chunk_size)
        total = diffusion + weight * ar
        return LossOutput(total, diffusion.detach(),
                          {"diffusion": diffusion.detach(), "encoder_ar": ar.detach()})
