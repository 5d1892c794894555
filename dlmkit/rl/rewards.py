"""Rewards: a function of ``(prompt, completion, record)`` returning a float.

``prompt`` is the prompt's text (its last user turn), ``completion`` the decoded response (cut
at its stop token), ``record`` the data record: ``{"prompt", "response", "source"}`` with
``response`` the reference answer (a bundled task's record also keeps its own fields). A user's
reward is named ``module:function`` (the module importable from the current directory or the
Python path). A reward that raises, or returns anything but a finite number, stops the run
with a :class:`RewardError` naming the function and the prompt.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Callable

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
DEFAULT_FORMAT = r"\s*-?\d+(?:\.\d+)?\s*"


class RewardError(ValueError):
    """A reward function failed or returned a value that is not a finite number."""


def exact_answer(prompt: str, completion: str, record: dict) -> float:
    """1.0 when the completion equals the reference answer (surrounding whitespace ignored)."""
    return float(completion.strip() == str(record["response"]).strip())


def numeric_answer(prompt: str, completion: str, record: dict) -> float:
    """1.0 when the last number in the completion equals the last number in the reference
    answer (as numbers: ``7.0`` matches ``7``); 0.0 when either has none."""
    got, want = _NUMBER.findall(completion), _NUMBER.findall(str(record["response"]))
    if not got or not want:
        return 0.0
    return float(math.isclose(float(got[-1]), float(want[-1]), rel_tol=1e-9, abs_tol=1e-9))


def format_reward(pattern: str | None = None) -> Callable[[str, str, dict], float]:
    """A reward of 1.0 when the whole completion matches ``pattern`` (default: one number)."""
    regex = re.compile(pattern or DEFAULT_FORMAT)

    def format_check(prompt: str, completion: str, record: dict) -> float:
        return float(regex.fullmatch(completion) is not None)

    format_check.__qualname__ = f"format_check[{regex.pattern!r}]"
    return format_check


def resolve_reward(spec: str, pattern: str | None = None) -> Callable[[str, str, dict], float]:
    """The reward ``reward.function`` names: a bundled one or ``module:function``."""
    if spec == "exact_answer":
        return exact_answer
    if spec == "numeric_answer":
        return numeric_answer
    if spec == "format":
        try:
            return format_reward(pattern)
        except re.error as err:
            raise ValueError(f"reward.pattern {pattern!r} is not a valid regular expression "
                             f"({err})") from None
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"reward.function {spec!r}: expected 'module:function'")
    if "" not in sys.path:  # a reward module beside the config, as `python -m` would find it
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward.function {spec!r}: cannot import module {module_name!r} "
                         f"({err})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"reward.function {spec!r}: module {module_name!r} has no function "
                         f"{name!r}")
    return fn


def reward_name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def score(fn, prompt: str, completion: str, record: dict, *, where: str) -> float:
    """``fn(prompt, completion, record)`` as a float; a RewardError naming ``fn`` and ``where``
    (the prompt's index and text) when it raises or returns a non-finite or non-number."""
    try:
        value = fn(prompt, completion, record)
    except Exception as err:  # noqa: BLE001 - any failure of user code stops the run, named
        raise RewardError(f"reward function {reward_name(fn)} raised {type(err).__name__}: "
                          f"{err} on {where} (completion {completion!r})") from err
    if not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise RewardError(f"reward function {reward_name(fn)} returned {value!r} "
                          f"({type(value).__name__}), not a number, on {where}")
    value = float(value)
    if not math.isfinite(value):
        raise RewardError(f"reward function {reward_name(fn)} returned {value} on {where} "
                          f"(completion {completion!r}); rewards must be finite numbers")
    return value
