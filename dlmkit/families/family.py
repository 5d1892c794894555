"""The record that makes a family: everything the recipe, the decoding runtime, the command
line, the server and RL read about one family, in one place (its folder fills it in)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dlmkit.decoding.options import SamplerConfig
from dlmkit.families.strategy import Strategy


@dataclass(frozen=True)
class Drafting:
    """Speculative decoding with a drafter export beside a target (``--draft``).

    Attributes:
        check: ``check(target_path, target_meta, draft_path)``: the pair fits, from their
            ``dlmkit.json`` files, before any weights load (ValueError).
        attach: ``attach(loaded, draft_path, device=...)``: the target's ``LoadedModel`` ->
            one decoding the (target, drafter) pair with this family's sampler.
        summary: ``summary(model) -> str | None``: one line of speculative figures.
    """

    check: Callable
    attach: Callable
    summary: Callable


@dataclass(frozen=True)
class Family:
    """One dLLM family.

    Attributes:
        name: the name in configs (``strategy.name``), ``dlmkit.json`` and ``--sampler``.
        paper: where the method comes from (one line, for the docs and ``--help``).
        trains: what the training objective is, in a few words.
        strategy: the training strategy class (:class:`~dlmkit.families.strategy.Strategy`).
        sampling: its sampler's options, a frozen dataclass extending
            :class:`~dlmkit.decoding.options.SamplerConfig`; its ``sampler`` is ``name``.
        decode: ``decode(runner, encoded prompts, resolved options, *, stop_ids, generator,
            mask_id, pad_id) -> list of token-id rows`` (the generated part, before the stop
            token is stripped).
        likelihood: how the export scores a continuation (lm-eval loglikelihood requests): a
            scorer of :mod:`dlmkit.decoding.likelihood`, or None when it cannot.
        also_decoded_by: other families' samplers that decode this family's export exactly as
            trained (the clean causal stream of hybrid and idlm is a causal LM: ``ar``).
        related: samplers of a family with the same layout but another reverse process: they
            run on this export with a warning.
        infill: ``infill(runner, sequences, resolved options, *, mask_id, pad_id, generator)``
            filling mask tokens in place (bidirectional families), or None.
        plain_causal: its sampler decodes any Hugging Face causal LM as it is (a model
            directory without ``dlmkit.json``).
        drafting: speculative decoding with this family's drafter export (``--draft``).
        training: the training options class (``strategy.<option>``, a frozen dataclass of
            :mod:`dlmkit.families.options`); default: ``strategy.options``, which it must be.
    """

    name: str
    paper: str
    trains: str
    strategy: type[Strategy]
    sampling: type[SamplerConfig]
    decode: Callable
    likelihood: str | None = None
    also_decoded_by: tuple[str, ...] = ()
    related: tuple[str, ...] = ()
    infill: Callable | None = None
    plain_causal: bool = False
    drafting: Drafting | None = None
    training: type | dict | None = None

    def __post_init__(self) -> None:
        if self.strategy.name != self.name or self.sampling.sampler != self.name:
            raise RuntimeError(f"internal error: family {self.name!r} has strategy "
                               f"{self.strategy.name!r} and sampler {self.sampling.sampler!r}")
        if self.training is None:
            object.__setattr__(self, "training", self.strategy.options)
        elif self.training is not self.strategy.options:
            raise RuntimeError(f"internal error: family {self.name!r} has training options "
                               f"{self.training!r} but its strategy takes "
                               f"{self.strategy.options!r}")
