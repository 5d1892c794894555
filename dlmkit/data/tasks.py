"""Bundled synthetic SFT tasks: deterministic, offline, small enough to learn on a CPU.

Each task maps integers ``0..space_size-1`` one-to-one onto problems. A problem's split is a
fixed function of its prompt text (a BLAKE2 hash), so train / validation / test never share a
problem, whatever the sizes or seeds asked for; within a split, which problems are drawn is a
deterministic function of ``(task, parameters, split, seed)``.

Default parameters and sizes (byte tokenizer, so tokens are bytes; the chat template adds 5
more, so a whole short-task example is at most 20 tokens). ``records(split)`` returns 8,000
train (all 7,984 for addition), 256 validation and 512 test problems by default.

=========  ==========================  ======  ========  =========================
task       example                     prompt  response  problems (train/val/test)
=========  ==========================  ======  ========  =========================
addition   ``"47+85="`` -> ``"132"``   4-6     1-3       10,000 (7,984/1,025/991)
reverse    ``"rev cab"`` -> ``"bac"``  6-9     2-5       37,440 (~80/10/10 %)
sort       ``"sort 3142"`` -> ``1234``  7-10    2-5       111,100 (~80/10/10 %)
copy       ``"copy hbad.."`` -> same    37      32        8**32 (~80/10/10 %)
=========  ==========================  ======  ========  =========================

The short tasks' responses are at most 8 bytes for every parameter choice the constructors
accept, so a ~1M-parameter model sees short, fixed-format targets. ``reverse`` and ``sort`` are
the easiest to learn (pure position permutations); ``addition`` needs carries.

``copy`` is the **long-answer** task (:data:`LONG_TASKS`): a 32-letter string (lengths
``min_len..max_len`` up to 64) repeated back, so decoding generates 33+ tokens over several
blocks. That is what makes parallel commits and KV caches measurable (a 2-6 token answer ends
before either can matter) while a tiny model still learns it on a CPU in minutes.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = ["LONG_TASKS", "SPLITS", "Addition", "Copy", "Reverse", "Sort", "SyntheticTask",
           "get_task", "task_names"]

SPLITS = ("train", "validation", "test")
# Hash buckets out of 100 per split.
_SPLIT_BUCKETS = {"train": range(0, 80), "validation": range(80, 90), "test": range(90, 100)}
DEFAULT_SIZES = {"train": 8000, "validation": 256, "test": 512}
_ENUMERATE_BELOW = 50_000  # spaces up to this size are enumerated; larger ones are sampled
MAX_RESPONSE_CHARS = 8  # the short tasks
MAX_LONG_CHARS = 64  # the long-answer task


def _bucket(task: str, prompt: str) -> int:
    digest = hashlib.blake2b(f"{task}\x00{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 100


def _check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    return value


@dataclass(frozen=True)
class SyntheticTask:
    """A finite problem space with a fixed split. Subclasses define :meth:`problem`."""

    name: str = field(init=False, default="")

    @property
    def space_size(self) -> int:
        raise NotImplementedError

    def problem(self, index: int) -> tuple[str, str]:
        """The ``(prompt, response)`` pair numbered ``index`` in ``[0, space_size)``."""
        raise NotImplementedError

    def split_of(self, prompt: str) -> str:
        """Which split a problem belongs to (fixed by its prompt text)."""
        b = _bucket(self.name, prompt)
        return next(s for s, r in _SPLIT_BUCKETS.items() if b in r)

    @functools.lru_cache(maxsize=8)  # noqa: B019 (tasks are small frozen values)
    def _members(self, split: str) -> list[int]:
        bucket = _SPLIT_BUCKETS[split]
        return [
            i for i in range(self.space_size) if _bucket(self.name, self.problem(i)[0]) in bucket
        ]

    def records(self, split: str, n: int | None = None, seed: int = 0) -> list[dict[str, str]]:
        """``n`` distinct ``{"prompt", "response"}`` records of ``split``.

        Args:
            split: ``"train"``, ``"validation"`` or ``"test"``.
            n: how many (default: ``DEFAULT_SIZES[split]``, capped at what the split holds).
            seed: picks which problems; the same arguments always give the same list.

        Raises:
            ValueError: unknown split, or ``n`` larger than the split holds.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        explicit = n is not None
        if n is None:
            n = DEFAULT_SIZES[split]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        rng = random.Random(f"{self!r}|{split}|{seed}")
        bucket = _SPLIT_BUCKETS[split]
        size = self.space_size
        if size <= _ENUMERATE_BELOW or n > size * len(bucket) / 100 / 4:
            members = [i for i in range(size) if _bucket(self.name, self.problem(i)[0]) in bucket]
            if n > len(members):
                if explicit:
                    raise ValueError(
                        f"n={n} but the {split!r} split of {self!r} holds {len(members)} problems"
                    )
                n = len(members)
            chosen = rng.sample(members, n)
        else:  # the split holds > 4n problems: rejection sampling terminates quickly
            seen: set[int] = set()
            chosen = []
            while len(chosen) < n:
                i = rng.randrange(size)
                if i not in seen and _bucket(self.name, self.problem(i)[0]) in bucket:
                    seen.add(i)
                    chosen.append(i)
        return [dict(zip(("prompt", "response"), self.problem(i))) for i in chosen]


@dataclass(frozen=True)
class Addition(SyntheticTask):
    """``"a+b="`` -> ``str(a + b)`` with ``0 <= a, b < 10**max_digits`` (``max_digits`` 1..7)."""

    max_digits: int = 2
    name: str = field(init=False, default="addition")

    def __post_init__(self):
        _check_int("max_digits", self.max_digits, 1, MAX_RESPONSE_CHARS - 1)

    @property
    def space_size(self) -> int:
        return 10 ** (2 * self.max_digits)

    def problem(self, index: int) -> tuple[str, str]:
        a, b = divmod(index, 10**self.max_digits)
        return f"{a}+{b}=", str(a + b)


@dataclass(frozen=True)
class _StringTask(SyntheticTask):
    """Strings over ``alphabet`` of length ``min_len..max_len`` (``max_len <= max_chars``)."""

    alphabet: str = "abcdefgh"
    min_len: int = 2
    max_len: int = 5
    prefix = ""
    max_chars: ClassVar[int] = MAX_RESPONSE_CHARS

    def __post_init__(self):
        if not isinstance(self.alphabet, str) or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(
                f"alphabet must be a str of distinct characters, got {self.alphabet!r}"
            )
        if len(self.alphabet) < 2 or not self.alphabet.isascii() or not self.alphabet.isprintable():
            raise ValueError(
                f"alphabet must hold at least 2 printable ASCII characters, got {self.alphabet!r}"
            )
        _check_int("min_len", self.min_len, 1, self.max_chars)
        _check_int("max_len", self.max_len, self.min_len, self.max_chars)

    @property
    def space_size(self) -> int:
        k = len(self.alphabet)
        return sum(k**n for n in range(self.min_len, self.max_len + 1))

    def _string(self, index: int) -> str:
        k = len(self.alphabet)
        for n in range(self.min_len, self.max_len + 1):
            if index < k**n:
                chars = []
                for _ in range(n):
                    index, d = divmod(index, k)
                    chars.append(self.alphabet[d])
                return "".join(chars)
            index -= k**n
        raise IndexError(f"index must be in [0, {self.space_size}), got {index}")

    def problem(self, index: int) -> tuple[str, str]:
        s = self._string(index)
        return f"{self.prefix} {s}", self.solve(s)

    def solve(self, s: str) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Reverse(_StringTask):
    """``"rev abc"`` -> ``"cba"``; default 8 letters, lengths 2..5."""

    name: str = field(init=False, default="reverse")
    prefix = "rev"

    def solve(self, s: str) -> str:
        return s[::-1]


@dataclass(frozen=True)
class Sort(_StringTask):
    """``"sort 3142"`` -> ``"1234"``; default digits, lengths 2..5."""

    alphabet: str = "0123456789"
    name: str = field(init=False, default="sort")
    prefix = "sort"

    def solve(self, s: str) -> str:
        return "".join(sorted(s))


@dataclass(frozen=True)
class Copy(_StringTask):
    """``"copy hbadgcfe..."`` -> ``"hbadgcfe..."``; default 8 letters, length 32 (up to 64).

    The long-answer task: the answer is as long as the input, so every generated token is
    checkable and exact match needs all of them right.
    """

    min_len: int = 32
    max_len: int = 32
    name: str = field(init=False, default="copy")
    prefix = "copy"
    max_chars: ClassVar[int] = MAX_LONG_CHARS

    def solve(self, s: str) -> str:
        return s


_TASKS = {"addition": Addition, "copy": Copy, "reverse": Reverse, "sort": Sort}
# Tasks whose answers span several decoding blocks (>= 32 generated tokens).
LONG_TASKS = ("copy",)


def task_names() -> list[str]:
    """Names accepted by :func:`get_task`."""
    return sorted(_TASKS)


def get_task(name: str, **params) -> SyntheticTask:
    """The task called ``name``, built with ``params`` (e.g. ``max_digits=3``).

    Raises:
        ValueError: unknown name (lists the valid ones) or a bad parameter.
    """
    if name not in _TASKS:
        raise ValueError(f"task must be one of {task_names()}, got {name!r}")
    try:
        return _TASKS[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters {params} for task {name!r}: {e}") from None
