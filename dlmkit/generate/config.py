"""Sampler options: one dataclass, checked once, with the options each sampler accepts.

``steps`` means the same for every diffusion sampler: denoising steps for ``max_new_tokens``
tokens (``steps == max_new_tokens`` is one token per step). Block samplers (bd3lm, hybrid in
diffusion mode) give each block ``steps * block_size / max_new_tokens`` of them (at least 1);
the masked-diffusion sampler splits them over its blocks. Setting an option that a sampler does
not use is an error, not a silent no-op.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .primitives import REMASKING

SAMPLERS = ("mdlm", "scdd", "bd3lm", "hybrid", "idlm", "ar", "dflash",
            "block_diffusion")
HYBRID_MODES = ("diffusion", "ar")

_COMMON = {"max_new_tokens", "temperature", "seed"}
_DIFFUSION = _COMMON | {"steps", "block_size", "remasking", "threshold", "factor", "cache"}
# Options each sampler accepts (besides ``sampler``).
OPTIONS: dict[str, frozenset[str]] = {
    "mdlm": frozenset(_DIFFUSION | {"pad_to", "logit_shift"}),
    "bd3lm": frozenset(_DIFFUSION | {"logit_shift"}),
    "hybrid": frozenset(_DIFFUSION | {"mode"}),
    "scdd": frozenset(_COMMON | {"steps", "max_ratio", "gamma_shape", "t_peak", "pad_to",
                                 "revise", "logit_shift"}),
    "idlm": frozenset(_COMMON | {"block_size"}),
    "ar": frozenset(_COMMON),
    # DiffusionGemma canvases: commit rules, temperature schedule, adaptive stopping
    "block_diffusion": frozenset(_COMMON | {"steps", "block_size", "remasking", "threshold",
                                            "factor", "entropy_bound", "t_min", "t_max",
                                            "stability_threshold", "confidence_threshold"}),
    # speculative decoding: target + DFlash drafter; block_size caps the drafted block
    "dflash": frozenset(_COMMON | {"block_size"}),
}
# What hybrid's autoregressive mode ignores (it has its own exact causal cache).
_HYBRID_DIFFUSION_ONLY = frozenset({"steps", "remasking", "threshold", "factor", "cache"})
# KV cache kinds each sampler supports (``cache`` option). Only the block samplers' cache is
# exact; the masked sampler's are Fast-dLLM's approximations (see :mod:`dlmkit.generate.masked`).
CACHES: dict[str, tuple[str, ...]] = {"mdlm": ("none", "prefix", "dual"),
                                      "bd3lm": ("none", "prefix"), "hybrid": ("none", "prefix")}


@dataclass(frozen=True)
class SamplerConfig:
    """How to decode. ``None`` means "the sampler's default" (see :meth:`resolved`).

    Attributes:
        sampler: one of :data:`SAMPLERS`.
        max_new_tokens: most tokens generated per prompt (> 0).
        pad_to: mdlm/scdd: each prompt's canvas fills the sequence to this total length (prompt
            + canvas), as the fixed-length families are trained (read from ``dlmkit.json``
            unless ``max_new_tokens`` or ``pad_to`` is given); a prompt of ``pad_to`` tokens or
            more gets ``max_new_tokens``. ``steps`` and ``block_size`` then default to the
            batch's canvas width (:meth:`for_width`).
        steps: denoising steps for ``max_new_tokens`` tokens (default ``max_new_tokens``).
        block_size: mdlm: semi-autoregressive block (default ``max_new_tokens``, must divide
            it); bd3lm/hybrid: the trained block size (required); idlm: the stride, tokens
            proposed per forward (default: the trained block size).
        temperature: 0 = greedy; else Gumbel-max sampling of ``softmax(logits / T)``.
        remasking: which proposals to commit first: ``low_confidence``, ``random``,
            ``margin`` or ``entropy``.
        threshold: confidence-threshold parallel decoding: each step commits every proposal
            with confidence >= threshold (and at least its scheduled count), in (0, 1].
        factor: Fast-dLLM's factor rule instead (> 0): each step commits the ``n`` most
            confident proposals while ``(r + 1) (1 - c_r) < factor`` for their ranks ``r``
            (:func:`~dlmkit.generate.primitives.select_transfers`). Without either rule a step
            commits its scheduled share (``steps`` sets the budget); every step commits >= 1.
        cache: KV cache kind (:data:`CACHES`). bd3lm/hybrid: ``prefix``, **exact** (the
            clean blocks' keys/values); mdlm: ``prefix`` (Fast-dLLM prefix cache) or ``dual``
            (DualCache: prefix and suffix, only the current block recomputed), both
            **approximations** (see :mod:`dlmkit.generate.masked`). ``none``: no cache.
        mode: hybrid only, ``diffusion`` (block diffusion) or ``ar`` (the clean causal stream).
        seed: seeds the sampler's own ``torch.Generator``.
        max_ratio, gamma_shape, t_peak: SCDD schedule (must match training).
        revise: scdd only. ``False`` (the default): masks are released on the trained schedule,
            each into a draw from the model's ``p``, and a committed token never changes.
            ``True``: SCDD's full reverse process — visible tokens are revised by the
            posterior, released ones carry the uniform channel, and a final pass takes the
            argmax at every position (:mod:`dlmkit.generate.scdd` says why it is off).
        logit_shift: mdlm, bd3lm, scdd: the model was trained with ``strategy.logit_shift``
            (docs/logit_shift.md): the token at position ``i`` is read from the logits at
            ``i - 1`` (bd3lm: a block's first token from the clean stream's last position of
            the block before). Read from ``dlmkit.json``; must match training.
        entropy_bound: block_diffusion: commit the lowest-entropy positions whose entropies,
            less their maximum, sum to at most this (transformers' entropy-bound sampler);
            None = the ``remasking``/``threshold`` rule.
        t_min, t_max: block_diffusion: linear temperature schedule, ``t_max`` at a canvas's
            first step to ``t_min`` at its last (both or neither; replaces ``temperature``).
        stability_threshold, confidence_threshold: block_diffusion adaptive stopping: a row
            stops denoising a canvas once its argmax is unchanged for ``stability_threshold``
            steps and its mean entropy is below ``confidence_threshold`` (both or neither).
    """

    sampler: str
    max_new_tokens: int = 32
    steps: int | None = None
    block_size: int | None = None
    temperature: float = 0.0
    remasking: str = "low_confidence"
    threshold: float | None = None
    factor: float | None = None
    cache: str = "none"
    mode: str = "diffusion"
    seed: int = 0
    max_ratio: float = 0.1
    gamma_shape: float = 1.0
    t_peak: float = 0.5
    entropy_bound: float | None = None
    t_min: float | None = None
    t_max: float | None = None
    stability_threshold: int | None = None
    confidence_threshold: float | None = None
    pad_to: int | None = None
    revise: bool = False
    logit_shift: bool = False

    @classmethod
    def from_options(cls, sampler: str, **options) -> SamplerConfig:
        """Build a config, rejecting options ``sampler`` does not use (with the valid ones)."""
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        fields = {f.name for f in dataclasses.fields(cls)} - {"sampler"}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise ValueError(f"unknown sampler option(s) {unknown}; options are {sorted(fields)}")
        return cls(sampler=sampler, **options).resolved()

    def resolved(self) -> SamplerConfig:
        """A checked copy with the sampler's defaults filled in."""
        s = self.sampler
        if s not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {s!r}")
        accepts, user = OPTIONS[s], f"sampler {s!r}"
        if s == "hybrid" and self.mode == "ar":  # the clean causal stream, one token a forward
            accepts, user = accepts - _HYBRID_DIFFUSION_ONLY, "hybrid mode='ar'"
        unused = sorted(f.name for f in dataclasses.fields(self)
                        if f.name != "sampler" and f.name not in accepts
                        and getattr(self, f.name) != f.default)
        if unused:
            raise ValueError(f"{user} does not use option(s) {unused}; it accepts "
                             f"{sorted(accepts)}")
        _int("max_new_tokens", self.max_new_tokens, 1)
        if self.pad_to is not None:
            _int("pad_to", self.pad_to, 1)
        steps = self.steps
        if "steps" in accepts:
            # With pad_to the canvas width is the batch's: the default waits for for_width.
            default = None if self.pad_to is not None else self.max_new_tokens
            steps = default if steps is None else _int("steps", steps, 1)
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
                or not self.temperature >= 0 or math.isinf(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
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
        if "cache" in OPTIONS[s] and self.cache not in CACHES[s]:
            raise ValueError(f"cache must be one of {CACHES[s]} for the {s} sampler, got "
                             f"{self.cache!r}")
        if self.mode not in HYBRID_MODES:
            raise ValueError(f"mode must be one of {HYBRID_MODES}, got {self.mode!r}")
        _int("seed", self.seed, 0)
        if not isinstance(self.revise, bool):
            raise ValueError(f"revise must be True or False, got {self.revise!r}")
        if not isinstance(self.logit_shift, bool):
            raise ValueError(f"logit_shift must be True or False, got {self.logit_shift!r}")
        block = self.block_size
        if block is not None:
            _int("block_size", block, 1)
        if s == "mdlm" and self.pad_to is None:
            block = self.max_new_tokens if block is None else block
            if self.max_new_tokens % block:
                valid = [d for d in range(1, self.max_new_tokens + 1)
                         if self.max_new_tokens % d == 0]
                raise ValueError(f"block_size={block} must divide max_new_tokens="
                                 f"{self.max_new_tokens} for the mdlm sampler (valid: {valid})")
            blocks = self.max_new_tokens // block
            if steps < blocks:
                raise ValueError(f"steps={steps} must be >= the number of blocks ({blocks} = "
                                 f"max_new_tokens / block_size) for the mdlm sampler")
        elif s in ("bd3lm", "hybrid", "idlm", "dflash") and block is None and not (
                s == "hybrid" and self.mode == "ar"):
            raise ValueError(f"sampler {s!r} needs block_size (the trained block size; it is "
                             "read from the model's dlmkit.json when there is one)")
        if s == "block_diffusion":
            if block is None:
                raise ValueError("sampler 'block_diffusion' needs block_size (the trained "
                                 "canvas block; read from the model's dlmkit.json)")
            _check_canvas_options(self)
        return dataclasses.replace(self, steps=steps, block_size=block)

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
        block = self.block_size or width
        width = -(-width // block) * block
        return dataclasses.replace(self, pad_to=None, max_new_tokens=width).resolved()

    def block_steps(self) -> int:
        """Steps per block for the block samplers."""
        return max(1, round(self.steps * self.block_size / self.max_new_tokens))


def _number(name: str, value, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")
    return float(value)


def _check_canvas_options(cfg: SamplerConfig) -> None:
    """The block_diffusion sampler's own options: pairs set together, ranges."""
    if cfg.entropy_bound is not None:
        _number("entropy_bound", cfg.entropy_bound, positive=True)
        for rule in ("threshold", "factor"):
            if getattr(cfg, rule) is not None:
                raise ValueError(f"entropy_bound and {rule} are two commit rules; set one")
    if (cfg.t_min is None) != (cfg.t_max is None):
        raise ValueError(f"t_min and t_max go together (a linear temperature schedule), got "
                         f"t_min={cfg.t_min!r}, t_max={cfg.t_max!r}")
    if cfg.t_min is not None:
        if not _number("t_min", cfg.t_min) < _number("t_max", cfg.t_max):
            raise ValueError(f"t_min must be < t_max, got {cfg.t_min!r} and {cfg.t_max!r}")
        if cfg.temperature != 0:
            raise ValueError("t_min/t_max replace temperature; do not set both")
    if (cfg.stability_threshold is None) != (cfg.confidence_threshold is None):
        raise ValueError("stability_threshold and confidence_threshold go together (adaptive "
                         f"stopping), got {cfg.stability_threshold!r} and "
                         f"{cfg.confidence_threshold!r}")
    if cfg.stability_threshold is not None:
        _int("stability_threshold", cfg.stability_threshold, 0)
        _number("confidence_threshold", cfg.confidence_threshold, positive=True)


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
