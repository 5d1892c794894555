"""The strategy interface: how one dLLM family trains (its folder holds the rest: the decoder,
the sampler's options, the registry record, :mod:`dlmkit.families`).

A strategy owns its model(s), its corruption, its attention mask, how the model is fed and its
loss. Once per run the recipe calls:

* ``build_model(spec, ...)`` — the trained model (default: a Hugging Face causal LM from a
  preset or a local directory; a family with another architecture overrides it);
* ``setup(device)`` — load the frozen auxiliary models the family needs (default: none); they
  live on the strategy, are never trained, wrapped for DDP/FSDP or checkpointed;

then, per micro-batch:

1. ``prepare(batch, generators)`` — corrupt (every random number from the per-sample
   generators) and lay out the model input; returns a dict of tensors and the ``Mask``;
2. ``counts(prepared)`` — the local denominators of the loss, keyed by the loss's argument
   names; the recipe sums them over micro-batches and ranks *before* any forward;
3. ``loss(model, prepared, denominators)`` — forward and loss with the global denominators.

So the gradient of a step is the whole-batch token mean whatever the micro-batch/rank split.

For the export, ``export_meta()`` adds the family's own fields to ``dlmkit.json`` and
``load_model(path, ...)`` loads it. Nothing outside ``dlmkit/families/`` branches on a family
name.
"""

from __future__ import annotations

from typing import Any

import torch

from dlmkit.diffusion.corruption import corrupt_uniform
from dlmkit.diffusion.timesteps import strata
from dlmkit.families.options import NoOptions, TrainingOptions, regime_options
from dlmkit.families.options import check as check_options
from dlmkit.families.options import defaults as option_defaults
from dlmkit.masks import MaskCache
from dlmkit.models import build_model, forward_logits, load_exported


class Strategy:
    """Base class; subclasses set ``name``, ``options`` and implement the hooks.

    ``options``: the family's training options, a frozen dataclass deriving
    :class:`~dlmkit.families.options.TrainingOptions` (one field per ``strategy.<option>``
    with its default, help and what it accepts; checked before ``validate()`` runs).
    :meth:`defaults` gives them as a dict. A strategy written before options were typed may
    still set a dict of defaults: only unknown keys are then rejected here, its ``validate()``
    checks the values. ``self.config``: the resolved values, a dict (what ``dlmkit.json`` and
    ``config.yaml`` record).
    """

    name: str = ""
    options: type[TrainingOptions] | dict[str, Any] = NoOptions
    supports_packing: bool = False
    # Block-align each sample's final response, not the whole sample (canvas blocks that
    # start at the response: the collator's ``fill_from_response``).
    fill_from_response: bool = False
    # ``data.supervise_padding: null`` takes this: the one-stream masked families decode on a
    # canvas longer than most answers, so they must learn to fill its tail with padding.
    supervise_padding: bool = False
    # With supervised padding, pad every row to the longest training example (Collator
    # ``pad_to``) and decode each prompt on a canvas that ends there (the sampler's ``pad_to``,
    # from dlmkit.json): a bidirectional model with relative positions uses the ends of the
    # sequence as landmarks, so they must not move with the batch's longest row.
    fixed_length: bool = False
    # The model preset used when ``model.name`` is not set (the family's architecture).
    default_model: str = "tiny-llama"
    # The peak learning rate and the step budget used when ``train.lr`` / ``train.steps`` (and
    # ``train.epochs``) are not set. Every default_* below is a family's measured choice:
    # the evidence is docs/families/<family>.md#why-these-defaults (and docs/suite.md).
    default_lr: float = 3.0e-3
    default_steps: int = 1200
    # The warmup used when ``train.warmup_steps`` is not set: None = 10% of the steps
    # (dlmkit.train.budget.resolve_warmup).
    default_warmup_steps: int | None = None
    # The weight average (dlmkit.train.ema) used when ``train.ema_decay`` is not set (0.0 =
    # none).
    default_ema_decay: float = 0.0
    # AdamW's weight decay on matrices when ``train.weight_decay`` is not set, from scratch.
    default_weight_decay: float = 0.5
    # What an unset train key becomes when fine-tuning a pretrained checkpoint
    # (dlmkit.train.regime; where each value comes from: docs/finetuning.md).
    finetune_defaults: dict = {"lr": 1.0e-5, "weight_decay": 0.0, "warmup_fraction": 0.03,
                               "ema_decay": 0.0, "epochs": 3}
    # Options whose default has changed since config.yaml recorded only the options a user set:
    # the value a checkpoint that does not record one was trained with, so that resuming it
    # continues the same training (dlmkit.train.resume). Every option is recorded now.
    former_defaults: dict = {}

    def __init__(self, options: dict | None = None, *, mask_token_id: int, vocab_size: int,
                 loss_chunk_size: int | None = None) -> None:
        options = dict(options or {})
        self.config = {**self.defaults(), **options}
        if isinstance(self.options, dict):  # untyped options: the family's validate() checks
            unknown = sorted(set(options) - set(self.options))
            if unknown:
                raise ValueError(f"strategy {self.name!r}: unknown option(s) {unknown}; valid: "
                                 f"{sorted(self.options) or 'none'}")
        else:
            check_options(self.options, self.config, family=self.name)
        # An option whose default depends on the regime, still null: the recipe resolves it
        # before building the strategy (dlmkit.train.regime.resolve_regime_options); built
        # elsewhere, the strategy trains as from scratch.
        for key, (scratch, _) in regime_options(self.options).items():
            if self.config.get(key) is None:
                self.config[key] = scratch
        if not 0 <= mask_token_id < vocab_size:
            raise ValueError(f"mask_token_id {mask_token_id} is outside the vocabulary "
                             f"[0, {vocab_size})")
        self.mask_token_id = mask_token_id
        self.vocab_size = vocab_size
        self.loss_chunk_size = loss_chunk_size
        self.masks = MaskCache(max_entries=64)
        self.validate()

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``{option: default}`` of this family's training options."""
        if isinstance(cls.options, dict):
            return dict(cls.options)
        return option_defaults(cls.options)

    def validate(self) -> None:
        """Check what the option fields cannot say alone (rules between options) and build
        the loss; raise ValueError naming the bad option. Each value has already been checked
        against its field."""

    def _noise_range_options(self) -> None:
        """``t_min`` < ``t_max`` (the clipped range of the mask probability) of the families
        that corrupt with :func:`corrupt_uniform`; each end's own range is its field's."""
        lo, hi = self.config["t_min"], self.config["t_max"]
        if not 0 < lo < hi <= 1:
            raise ValueError(f"strategy.t_min and strategy.t_max must satisfy "
                             f"0 < t_min < t_max <= 1, got t_min={lo!r}, t_max={hi!r}")

    # -- logit shift (the masked families that offer ``logit_shift``: mdlm, scdd, bd3lm) --------
    def shift_batch(self, batch: dict) -> dict:
        """With ``strategy.logit_shift`` the output at position ``i`` predicts the token at
        ``i + 1`` (docs/logit_shift.md); a document's first token (position id 0) has no
        predecessor in its document, so it is taken out of ``loss_mask`` before corrupting:
        never corrupted, never scored, not in the denominator. Without the option: ``batch``."""
        if not self.config.get("logit_shift"):
            return batch
        first = batch["position_ids"] == 0
        return {**batch, "loss_mask": batch["loss_mask"].masked_fill(first, 0)}

    def corrupt(self, corruption, batch: dict, generators, *args, **kwargs):
        """``corruption(input_ids, loss_mask, *args, generator=generators, **kwargs)``; the
        families that pack override it to corrupt document by document."""
        return corruption(batch["input_ids"], batch["loss_mask"], *args, generator=generators,
                          **kwargs)

    def corrupt_uniform(self, batch: dict, generators, block_size: int | None = None):
        """:func:`~dlmkit.diffusion.corrupt_uniform` with this family's noise range
        (``t_min``, ``t_max``) and time sampling, per block of ``block_size`` or per row."""
        stratum, num = self.time_strata(batch, block_size)
        return self.corrupt(corrupt_uniform, batch, generators, self.mask_token_id,
                            eps=float(self.config["t_min"]), t_max=float(self.config["t_max"]),
                            block_size=block_size, stratum=stratum, num_strata=num)

    # -- the model(s) ------------------------------------------------------------------------
    def build_model(self, spec: str, *, vocab_size: int, attention: str, dtype: torch.dtype,
                    overrides: dict | None = None) -> torch.nn.Module:
        """The model this family trains, from a preset name or a local model directory."""
        return build_model(spec, vocab_size, attention=attention, dtype=dtype,
                           overrides=overrides)

    def setup(self, device: torch.device) -> None:
        """Load the frozen auxiliary models (e.g. a DFlash target) onto ``device``."""

    def check_dataset(self, dataset, collator) -> None:
        """Reject data this family cannot train on (ValueError naming the sample), before any
        step; called on the training and validation sets as trained: after ``data.truncation``,
        each sample as ``collator`` lays it out (``dataset.kept_by(collator)``: what its
        length cap keeps)."""

    @classmethod
    def load_model(cls, path, *, attention: str = "sdpa", device="cpu") -> torch.nn.Module:
        """The exported model (``RUN/final``) in eval mode, for decoding."""
        return load_exported(path, attention=attention, device=device)

    def export_meta(self) -> dict:
        """Fields of ``dlmkit.json`` beyond the common ones (strategy, options, lengths)."""
        return {}

    # -- hooks -------------------------------------------------------------------------------
    def prepare(self, batch: dict, generators: list[torch.Generator]) -> dict:
        raise NotImplementedError

    def counts(self, prepared: dict) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model, prepared: dict, denominators: dict):
        raise NotImplementedError

    def metrics(self, extras: dict[str, torch.Tensor]) -> dict[str, float]:
        """Train-log fields from the loss ``extras`` of one step, each summed over
        micro-batches and ranks (default: none)."""
        return {}

    # -- shared helpers ----------------------------------------------------------------------
    def cached_mask(self, key: tuple, build):
        """Masks are reused while the layout (lengths, padding) repeats."""
        return self.masks.get((self.name, *key), build)

    @staticmethod
    def layout_key(batch: dict) -> tuple:
        valid = batch["attention_valid"]
        key = (tuple(valid.shape), valid.device.type, valid.cpu().numpy().tobytes())
        if batch.get("doc_ids") is not None and bool((batch["doc_ids"] > 0).any()):
            key += (batch["doc_ids"].cpu().numpy().tobytes(),)
        return key

    def time_strata(self, batch: dict, block_size: int | None = None):
        """``(stratum [B, L] or None, num_strata)`` for a corruption's stratified levels
        (:mod:`dlmkit.diffusion.timesteps`): from the slots the recipe adds to a batch
        (``doc_slot [B, D]``, ``num_slots``) and, per block, the block's index within its
        document. ``None`` (i.i.d. levels) with ``time_sampling: iid`` or a batch without slots
        (e.g. straight from the collator)."""
        if self.config.get("time_sampling") != "stratified" or batch.get("doc_slot") is None:
            return None, 1
        slot = batch["doc_slot"].gather(1, batch["doc_ids"].clamp_min(0))
        blocks = None if block_size is None else batch["position_ids"] // block_size
        num = int(batch["num_slots"])
        return strata(slot, num, blocks), num

    @staticmethod
    def logits(model, input_ids, mask, position_ids) -> torch.Tensor:
        return forward_logits(model, input_ids, mask, position_ids)


def doc_ids_of(batch: dict):
    """Document ids for packed rows (None when every row holds one sample)."""
    doc_ids = batch.get("doc_ids")
    if doc_ids is None or not bool((doc_ids > 0).any()):
        return None
    return doc_ids.clamp_min(0)
