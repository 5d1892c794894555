"""Sampler options: the base that every family's decoding options extend, checked once.

Each family declares its sampler's options as a frozen dataclass in its folder
(``dlmkit/families/<name>/options.py``), built from the pieces below; the field metadata holds
the help text (``dlmkit generate --help`` and the server's schema are generated from it). A
family's sampler takes exactly the options its class declares: setting one it does not declare
is an error naming the ones it accepts, never a silent no-op.

``steps`` means the same for every diffusion sampler: denoising steps for ``max_new_tokens``
tokens (``steps == max_new_tokens`` is one token per step). Block samplers give each block
``steps * block_size / max_new_tokens`` of them (at least 1); the masked-diffusion sampler
splits them over its blocks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

from .primitives import REMASKING


def option(default, help: str, *, choices=None, flag_const=None):
    """A dataclass field with its help text (what ``--help`` and the docs print); ``choices``:
    the values allowed (a tuple, or the name of a class attribute holding them); ``flag_const``:
    the value of the bare command-line flag (``--cache`` alone)."""
    metadata = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    if flag_const is not None:
        metadata["flag_const"] = flag_const
    return field(default=default, metadata=metadata)


def help_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


@dataclass(frozen=True)
class SamplerConfig:
    """How to decode: the options every sampler takes. ``None`` means "the sampler's default"
    (filled in by :meth:`resolved`). A family's options subclass this with its own fields; its
    ``sampler`` names the family (the registry, :mod:`dlmkit.families`). Built by name with
    :func:`dlmkit.generate.sampler_config`."""

    max_new_tokens: int = option(
        32, "most tokens per response (default: max_new_tokens of the model's dlmkit.json, the "
            "longest training response rounded up to the block; 32 without one)")
    temperature: float = option(
        0.0, "0 = greedy; else Gumbel-max sampling of softmax(logits / T)")
    seed: int = option(0, "seeds each prompt's generator, with the prompt's index")

    sampler: ClassVar[str] = ""

    def resolved(self) -> SamplerConfig:
        """A checked copy with the sampler's defaults filled in."""
        self.check_common()
        return self.check()

    def check_common(self) -> None:
        """The options every sampler takes."""
        check_int("max_new_tokens", self.max_new_tokens, 1)
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
                or not self.temperature >= 0 or math.isinf(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        check_int("seed", self.seed, 0)

    def check(self) -> SamplerConfig:
        """The family's own checks and defaults (a copy); the base has none."""
        return self

    def canvas_widths(self, prompt_lengths) -> list[int]:
        """Each prompt's decoded width: ``max_new_tokens``."""
        return [self.max_new_tokens for _ in prompt_lengths]

    def for_width(self, width: int) -> SamplerConfig:
        """The config of one batch whose canvas is ``width`` tokens wide (only canvases that
        fill to ``pad_to`` depend on it)."""
        return self

    def canvas_from_batch(self) -> bool:
        """The batch's widest prompt sizes every row's canvas (:meth:`for_width`), so only
        requests of the same canvas width may share a batch."""
        return False

    def unused_block_size(self, mode: str = "") -> str | None:
        """What decodes without a ``block_size`` here, with why (None: this one takes it);
        ``mode`` names the option that chose it as the caller's user wrote it."""
        return None

    def decodes_trained_blocks(self) -> bool:
        """Decodes block by block under the block mask the model was trained on, so another
        block size would feed it a layout it never saw."""
        return False

    @classmethod
    def trained_defaults(cls, meta: dict, options: dict) -> dict:
        """Options read from an export's ``dlmkit.json`` (``meta``) when this family's own
        sampler decodes it; ``options`` are the user's, which win. Default: the trained block
        size, for samplers that take one."""
        block = meta.get("block_size")
        if block and "block_size" in option_names(cls):
            return {"block_size": int(block)}
        return {}


def option_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class Steps(SamplerConfig):
    """Denoising samplers: a step budget."""

    steps: int | None = option(None, "denoising steps for max_new_tokens tokens (default: "
                                     "max_new_tokens, one token a step)")

    def resolved(self) -> SamplerConfig:
        if self.steps is None:
            # With pad_to the canvas width is the batch's: the default waits for for_width.
            if getattr(self, "pad_to", None) is None:
                return dataclasses.replace(self, steps=self.max_new_tokens).resolved()
        else:
            check_int("steps", self.steps, 1)
        return super().resolved()

    def block_steps(self) -> int:
        """Steps per block for the block samplers."""
        return max(1, round(self.steps * self.block_size / self.max_new_tokens))


@dataclass(frozen=True)
class CommitRules(Steps):
    """Which proposals a denoising step commits."""

    remasking: str = option("low_confidence", "which proposals to commit first",
                            choices=REMASKING)
    threshold: float | None = option(
        None, "confidence-threshold parallel decoding: each step commits every proposal with "
              "confidence >= threshold (and at least its scheduled count), in (0, 1]")
    factor: float | None = option(
        None, "Fast-dLLM's factor rule instead (> 0): each step commits the n most confident "
              "proposals while (r + 1) (1 - c_r) < factor for their ranks r")

    def resolved(self) -> SamplerConfig:
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        if self.threshold is not None:
            if (isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float))
                    or not 0.0 < self.threshold <= 1.0):
                raise ValueError(f"threshold must be a number in (0, 1], got {self.threshold!r}")
            if self.remasking == "random":
                raise ValueError("threshold needs a model confidence; remasking='random' has "
                                 "none (use low_confidence, margin or entropy)")
        if self.factor is not None:
            if (isinstance(self.factor, bool) or not isinstance(self.factor, (int, float))
                    or not 0.0 < self.factor < math.inf):
                raise ValueError(f"factor must be a finite number > 0, got {self.factor!r}")
            if self.threshold is not None:
                raise ValueError("threshold and factor are two parallel commit rules; set one")
            if self.remasking == "random":
                raise ValueError("factor needs a model confidence; remasking='random' has "
                                 "none (use low_confidence, margin or entropy)")
        return super().resolved()


@dataclass(frozen=True)
class Cached(SamplerConfig):
    """Samplers with a KV cache: ``caches`` lists the kinds (``none`` first)."""

    cache: str = option("none", "KV cache kind (bare --cache: prefix; the sampler's docs say "
                                "which are exact)", choices="caches", flag_const="prefix")

    caches: ClassVar[tuple[str, ...]] = ("none",)

    def resolved(self) -> SamplerConfig:
        if self.cache not in self.caches:
            raise ValueError(f"cache must be one of {self.caches} for the {self.sampler} "
                             f"sampler, got {self.cache!r}")
        return super().resolved()


@dataclass(frozen=True)
class LogitShift(SamplerConfig):
    """Families trainable with ``strategy.logit_shift`` (docs/logit_shift.md)."""

    logit_shift: bool = option(
        False, "the model was trained with strategy.logit_shift: the token at position i is "
               "read from the logits at i - 1; read from dlmkit.json, must match training")

    def resolved(self) -> SamplerConfig:
        if not isinstance(self.logit_shift, bool):
            raise ValueError(f"logit_shift must be True or False, got {self.logit_shift!r}")
        return super().resolved()

    @classmethod
    def trained_defaults(cls, meta: dict, options: dict) -> dict:
        return {**super().trained_defaults(meta, options),
                "logit_shift": trained_logit_shift(meta, options)}


def trained_logit_shift(meta: dict, options: dict) -> bool:
    """``strategy.logit_shift`` of the export whose ``dlmkit.json`` is ``meta`` (an export
    without the key was trained without it). It is how the model's logits are read, not a
    decoding choice: a different ``logit_shift`` in the user's ``options`` is an error."""
    trained = (meta.get("options") or {}).get("logit_shift", False)
    if not isinstance(trained, bool):
        raise ValueError(f"dlmkit.json: options.logit_shift must be true or false, got "
                         f"{trained!r}")
    asked = options.get("logit_shift", trained)
    if asked != trained:
        raise ValueError(f"logit_shift={asked!r} differs from the model's: it was trained "
                         f"with logit_shift={trained} (options.logit_shift in dlmkit.json), "
                         "so its logits must be read that way; omit logit_shift")
    return trained


@dataclass(frozen=True)
class PaddedCanvas(SamplerConfig):
    """The fixed-length masked families: each prompt's canvas fills the sequence to ``pad_to``
    tokens, as they are trained."""

    pad_to: int | None = option(
        None, "each prompt's canvas fills the sequence to this total length (prompt + canvas), "
              "as the fixed-length families are trained; read from dlmkit.json unless "
              "max_new_tokens or pad_to is given; a prompt that long or longer gets "
              "max_new_tokens. steps and block_size then default to the batch's canvas width")

    def resolved(self) -> SamplerConfig:
        if self.pad_to is not None:
            check_int("pad_to", self.pad_to, 1)
        return super().resolved()

    def canvas_from_batch(self) -> bool:
        return self.pad_to is not None

    def canvas_widths(self, prompt_lengths) -> list[int]:
        """Each prompt's canvas: ``pad_to - length`` tokens with ``pad_to`` (a prompt that long
        or longer: ``max_new_tokens``), else ``max_new_tokens``."""
        if self.pad_to is None:
            return [self.max_new_tokens for _ in prompt_lengths]
        return [self.pad_to - n if n < self.pad_to else self.max_new_tokens
                for n in prompt_lengths]

    def for_width(self, width: int) -> SamplerConfig:
        """The resolved config of one batch whose canvas is ``width`` tokens wide (``pad_to``
        resolved: rounded up to ``block_size``, the default of ``steps`` and ``block_size``)."""
        if self.pad_to is None:
            return self
        block = getattr(self, "block_size", None) or width
        width = -(-width // block) * block
        return dataclasses.replace(self, pad_to=None, max_new_tokens=width).resolved()

    @classmethod
    def trained_defaults(cls, meta: dict, options: dict) -> dict:
        """The trained row length (``pad_to``), unless the user sets the canvas."""
        defaults = super().trained_defaults(meta, options)
        if meta.get("pad_to") and not {"pad_to", "max_new_tokens"} & set(options):
            defaults["pad_to"] = int(meta["pad_to"])
        return defaults


def needs_block_size(cfg: SamplerConfig) -> None:
    if cfg.block_size is None:
        raise ValueError(f"sampler {cfg.sampler!r} needs block_size (the trained block size; it "
                         "is read from the model's dlmkit.json when there is one)")
    check_int("block_size", cfg.block_size, 1)


def number(name: str, value, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")
    return float(value)


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value

