"""``MaskCache``: reuse masks (and their rendered forms) across steps with the same layout."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from .checks import check_positive_int


class MaskCache:
    """A least-recently-used cache keyed by a hashable layout key.

    The key must capture everything the mask depends on (lengths, block size, padding layout,
    rule name, device, ...). ``get(key, build)`` returns the cached value or calls ``build()``
    once and stores it, evicting the least recently used entry beyond ``max_entries``.
    """

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = check_positive_int("max_entries", max_entries)
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"MaskCache key must be hashable, got {type(key).__name__}") from None
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.misses += 1
        value = build()
        self._entries[key] = value
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
