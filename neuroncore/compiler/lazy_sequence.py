"""The sequence protocol of a program column whose items are made on first read.

Two program columns are lazy (operand strings, relocated layers' node records): timing-only runs
never read them, and making them eagerly cost as much as lowering several layers. Both behave
exactly like the list an eager build would have made, so indexing, slicing, iteration and
equality live here once; a subclass says only how many items there are and how item ``i`` is
made.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

T = TypeVar("T")


class LazySequence(Sequence[T]):
    """A read-only sequence whose item ``i`` is ``_item(i)`` (which may cache what it makes)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _item(self, i: int) -> T: ...

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._item(index)

    def __iter__(self) -> Iterator[T]:
        for i in range(len(self)):
            yield self._item(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


__all__ = ["LazySequence"]
