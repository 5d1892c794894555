"""A family's training options (``strategy.<option>``) as a typed, documented dataclass.

Each family's ``options.py`` declares a frozen dataclass deriving :class:`TrainingOptions`
(e.g. ``MDLMTraining``): one field per option, made with :func:`option`, which carries its
default, its help text and what is allowed. :func:`check` validates a mapping of option values
against that class from the annotations and the metadata alone, so a family's ``validate()``
keeps only what a single field cannot say (rules between options, building the loss).

Annotations understood: ``bool``, ``int``, ``float`` (an int is accepted), ``str``,
``list[int]`` (a non-empty list or tuple), each optionally ``| None``. A bool is never taken for
an int or a float. Metadata (all optional but ``help``):

* ``choices``: the allowed values;
* ``low`` / ``high`` with ``ends`` (``"[]"``, ``"[)"``, ``"(]"``, ``"()"``): a numeric range
  (messages print the bounds as written: ``0.0`` or ``0``); one end only: a bound on that side
  (numbers must then be finite);
* ``positive``: an int >= 1, or a number > 0;
* ``null``: what ``None`` means; required exactly when the annotation allows ``None``;
* ``regime``: ``(from scratch, adapting)``, for an option whose default depends on the regime
  (its default is then ``None``, resolved before the strategy is built:
  :func:`dlmkit.train.regime.resolve_regime_options`): the first value trains from a preset,
  the second fine-tunes a checkpoint that does not record the option (a causal LM, another
  family's export); a checkpoint that records it keeps its own value. A strategy built with the
  option still ``None`` (outside the recipe) takes the from-scratch value.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import textwrap
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from dlmkit.diffusion.timesteps import TIME_SAMPLING

ENDS = ("[]", "[)", "(]", "()")


def option(default, help: str, *, choices: tuple | None = None, low: float | None = None,
           high: float | None = None, ends: str = "[]", positive: bool = False,
           null: str | None = None, regime: tuple | None = None):
    """A training option: a dataclass field with its default, help text and what is allowed
    (see the module docstring). ``help`` says what the option does; where the evidence for its
    default lives is the family's docs page (docs/families/<name>.md#why-these-defaults)."""
    if ends not in ENDS:
        raise ValueError(f"ends must be one of {ENDS}, got {ends!r}")
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = tuple(choices)
    if low is not None or high is not None:
        metadata["range"] = (low, high, ends)
    if positive:
        metadata["positive"] = True
    if regime is not None:
        if default is not None or len(regime) != 2:
            raise ValueError("an option with regime=(from scratch, adapting) has the default "
                             f"None, got default {default!r}, regime {regime!r}")
        metadata["regime"] = tuple(regime)
        scratch, adapt = (_literal(v) for v in regime)
        null = null or (f"{adapt} when fine-tuning a causal checkpoint (any without the "
                        f"option), {scratch} from scratch; an export with it keeps its own")
    if null is not None:
        metadata["null"] = null
    if isinstance(default, (list, dict, set)):
        raise TypeError(f"option default must be immutable (a tuple, not a list), got "
                        f"{default!r}")
    return field(default=default, metadata=metadata)


def _literal(value) -> str:
    """``value`` as a config file writes it (``true``, ``4.0``)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def regime_options(cls) -> dict[str, tuple]:
    """``{option: (from scratch, adapting)}`` of the options class ``cls`` whose default
    depends on the regime (``option(..., regime=...)``); empty for untyped options."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return {}
    return {f.name: f.metadata["regime"] for f in dataclasses.fields(cls)
            if "regime" in f.metadata}


class _DefaultsView(type):
    """Lets the options class itself be read as a read-only mapping of its defaults, so code
    that reads ``Strategy.options`` as the dict it used to be (``cls.options.items()``,
    ``{**cls.options}``, ``"t_min" in cls.options``) keeps working; new code calls
    :func:`defaults` / ``Strategy.defaults()``."""

    def keys(cls):
        return defaults(cls).keys()

    def items(cls):
        return defaults(cls).items()

    def values(cls):
        return defaults(cls).values()

    def __getitem__(cls, key: str):
        return defaults(cls)[key]

    def __iter__(cls):
        return iter(defaults(cls))

    def __contains__(cls, key) -> bool:
        return key in defaults(cls)


class TrainingOptions(metaclass=_DefaultsView):
    """Base of every family's training options dataclass (``@dataclass(frozen=True)``)."""


def defaults(cls) -> dict[str, Any]:
    """``{option: default}`` of a training options class, in declaration order."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def help_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


# -- the checker -----------------------------------------------------------------------------
@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _kind(cls, f: dataclasses.Field) -> tuple[type, bool]:
    """``(base type, nullable)`` of field ``f`` from its (string) annotation."""
    hint = _hints(cls)[f.name]
    args = typing.get_args(hint)
    nullable = type(None) in args
    if nullable:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"internal error: {cls.__name__}.{f.name}: unsupported annotation "
                            f"{hint!r}")
        hint = rest[0]
    base = typing.get_origin(hint) or hint
    if base not in (bool, int, float, str, list):
        raise TypeError(f"internal error: {cls.__name__}.{f.name}: unsupported annotation "
                        f"{hint!r}")
    if base is list and typing.get_args(hint) != (int,):
        raise TypeError(f"internal error: {cls.__name__}.{f.name}: only list[int] is supported, "
                        f"got {hint!r}")
    return base, nullable


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _span(low, high, ends: str) -> str:
    return f"{ends[0]}{low!r}, {high!r}{ends[1]}"


def _in_range(value, low, high, ends: str) -> bool:
    if low is not None and not (value >= low if ends[0] == "[" else value > low):
        return False
    return high is None or (value <= high if ends[1] == "]" else value < high)


def allowed(cls, f: dataclasses.Field) -> str:
    """What field ``f`` of ``cls`` accepts, in words (the error messages and the help)."""
    base, nullable = _kind(cls, f)
    meta = f.metadata
    if "choices" in meta:
        text = f"one of {meta['choices']}"
    elif base is bool:
        text = "true, false" if nullable else "true or false"
    elif base is list:
        text = "a non-empty list of ints"
    elif base is str:
        text = "a string"
    else:  # int or float: the same bounds, said of "an int" or of "a (finite) number"
        whole = base is int
        low, high, ends = meta.get("range", (None, None, "[]"))
        bounded = "an int" if whole else "a finite number"
        if meta.get("positive"):
            text = "a positive int" if whole else "a finite number > 0"
        elif low is not None and high is not None:
            text = f"{'an int' if whole else 'a number'} in {_span(low, high, ends)}"
        elif low is not None:
            text = f"{bounded} {'>=' if ends[0] == '[' else '>'} {low!r}"
        elif high is not None:
            text = f"{bounded} {'<=' if ends[1] == ']' else '<'} {high!r}"
        else:
            text = bounded
    if nullable:
        text += f" or null ({meta['null']})" if "null" in meta else " or null"
    return text


def _accepts(cls, f: dataclasses.Field, value) -> bool:
    base, nullable = _kind(cls, f)
    meta = f.metadata
    if value is None:
        return nullable
    if "choices" in meta:
        return any(value == c and type(value) is type(c) for c in meta["choices"])
    if base is bool:
        return isinstance(value, bool)
    if base is str:
        return isinstance(value, str)
    if base is list:
        return isinstance(value, (list, tuple)) and len(value) > 0 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
    if base is int:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
    elif not _number(value) or not math.isfinite(value):
        return False
    if meta.get("positive"):
        return value >= 1 if base is int else value > 0
    low, high, ends = meta.get("range", (None, None, "[]"))
    return _in_range(value, low, high, ends)


def check(cls, values: Mapping[str, Any], *, family: str) -> None:
    """Raise ValueError unless ``values`` (option -> value) holds only options of ``cls``, each
    with a value its field accepts. Options left out are not required (they take defaults)."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"strategy {family!r}: unknown option(s) {unknown}; valid: "
                         f"{sorted(known) or 'none'}")
    for key, value in values.items():
        f = known[key]
        if not _accepts(cls, f, value):
            raise ValueError(f"strategy.{key} must be {allowed(cls, f)}, got {value!r}")


def describe(cls, *, family: str, width: int = 88) -> str:
    """Every option of ``cls``: name, default, what is allowed and its help."""
    fields = dataclasses.fields(cls)
    if not fields:
        return f"strategy.<option> of {family}: none"
    lines = [f"strategy.<option> of {family}:"]
    for f in fields:
        lines += textwrap.wrap(f"{f.name} = {f.default!r}  ({allowed(cls, f)})", width,
                               initial_indent="  ", subsequent_indent="        ")
        lines += textwrap.wrap(help_of(f), width, initial_indent="      ",
                               subsequent_indent="      ")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class NoOptions(TrainingOptions):
    """A family without training options."""


# -- options several families share (one definition, each family's own field) ---------------
def block_size_option(default: int, help: str):
    return option(default, help, positive=True)


def t_min_option(default: float = 0.2, help: str = (
        "lower end of the mask probability drawn per corruption unit: clipped above 0 so the "
        "1/p loss weights stay bounded; must be < t_max")):
    return option(default, help, low=0, high=1, ends="()")


def t_max_option(default: float = 1.0, help: str = "upper end of the mask probability"):
    return option(default, help, low=0, high=1, ends="(]")


def time_sampling_option(help: str = (
        "how the mask probabilities are drawn: 'stratified' = one per stratum of [0, 1) over "
        "the global batch (dlmkit.diffusion.timesteps), 'iid' = independently per unit")):
    return option("stratified", help, choices=TIME_SAMPLING)


def logit_shift_option(help: str = (
        "the output at position i predicts the token at i + 1, as an autoregressive "
        "checkpoint's head was trained to (docs/logit_shift.md)")):
    return option(None, help, regime=(False, True))
