"""Results remembered by the identity of the objects they were made from, or by a value.

A job builds its ops once and hands out the same Op objects (Job.ops), so what is derived
from them (tensor-parallel shards, DDP bucket plans) can be kept for the next build of the
same job: a range's re-runs, a sweep's points, an advice's candidates. An entry keeps the
objects of its key alive, so no id is reused while the entry lives; a memo holds at most
``limit`` entries and starts afresh past that, so a long search stays bounded. A ``Memo``
keeps results by a hashable value instead (a spec, a job's shape), bounded alike. Every memo
is registered, and ``forget_all`` empties them (api.clear_caches).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_ALL: list[IdentityMemo[Any] | Memo[Any]] = []


class IdentityMemo(Generic[T]):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[tuple[tuple[int, ...], Hashable], tuple[tuple[object, ...], T]] = {}
        _ALL.append(self)

    def get(self, objects: tuple[object, ...], extra: Hashable, make: Callable[[], T]) -> T:
        """What ``make()`` gave for these very objects and ``extra``, made now if new."""
        key = (tuple(map(id, objects)), extra)
        hit = self._entries.get(key)
        if hit is None:
            if len(self._entries) >= self.limit:
                self._entries.clear()
            hit = self._entries[key] = (objects, make())
        return hit[1]

    def clear(self) -> None:
        self._entries.clear()


class Memo(Generic[T]):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[Hashable, T] = {}
        _ALL.append(self)

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """What ``make()`` gave for ``key`` (an equal key), made now if new."""
        try:
            return self._entries[key]
        except KeyError:
            pass
        if len(self._entries) >= self.limit:
            self._entries.clear()
        value = self._entries[key] = make()
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def forget_all() -> None:
    """Empty every memo (for tests that swap a module the results came from)."""
    for memo in _ALL:
        memo.clear()
