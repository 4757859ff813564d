"""The process table's order and filter, as htop and nvitop users expect them (pure functions).

Keys cycle the sort column (``<`` ``>``, as htop's; ``,`` ``.``, as nvitop's), invert it (``I``) or
jump to one (``P`` NC%, ``M`` memory, ``T`` time, ``N`` pid: htop's letters); ``/`` filters. Numbers
sort largest first and names A to Z, as both tools do; unknown values (a stream has no user or RSS)
always go last, and exited processes stay below the living ones whatever the order, since they are
only kept for a few seconds to say that they went away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from explorer.top import names
from explorer.top.aggregate import mean_utilization
from explorer.top.snapshots import EXITED, ProcessSnapshot


class SortKey(Enum):
    """A sortable column; the value is its heading in the table."""

    PID = "PID"
    USER = "USER"
    COMMAND = "COMMAND"
    CORES = "CORES"
    NC = "NC%"
    HOST_MEM = "HOST MEM"
    DEV_MEM = "DEV MEM"
    AGE = "AGE"
    STATE = "STATE"


# keys of the columns: smaller first for names, larger first for quantities (as htop)
_ASCENDING = {SortKey.PID, SortKey.USER, SortKey.COMMAND, SortKey.STATE}


def utilization(p: ProcessSnapshot) -> float | None:
    """A process's NC%: the mean utilisation of the cores it lists (the header's rule)."""
    return mean_utilization({c: u.utilization for c, u in (p.cores or {}).items()})


def _key(key: SortKey, now: float) -> Callable[[ProcessSnapshot], Any]:
    def age(p: ProcessSnapshot) -> float | None:
        return None if p.started_at is None else now - p.started_at

    keys: dict[SortKey, Callable[[ProcessSnapshot], Any]] = {
        SortKey.PID: lambda p: p.pid,
        SortKey.USER: lambda p: p.user.lower() if p.user else None,
        SortKey.COMMAND: lambda p: str(names.program(p.command) or names.command_text(p)).lower(),
        SortKey.CORES: lambda p: len(p.held_cores),
        SortKey.NC: utilization,
        SortKey.HOST_MEM: lambda p: p.host_bytes,
        SortKey.DEV_MEM: lambda p: p.device_memory_bytes,
        SortKey.AGE: age,
        SortKey.STATE: lambda p: p.state,
    }
    return keys[key]


@dataclass(frozen=True)
class TableView:
    """How the table is ordered and filtered (what the user chose with the keys)."""

    sort: SortKey = SortKey.PID
    reverse: bool = False  # against the column's natural direction (``I``)
    filter: str = ""

    @property
    def descending(self) -> bool:
        return (self.sort not in _ASCENDING) != self.reverse

    def cycle(self, step: int, columns: Iterable[SortKey] = tuple(SortKey)) -> TableView:
        """The previous / next sortable column (of those shown), in their screen order."""
        order = list(columns) or list(SortKey)
        index = order.index(self.sort) if self.sort in order else -step if step > 0 else 0
        return replace(self, sort=order[(index + step) % len(order)], reverse=False)

    def by(self, key: SortKey) -> TableView:
        """Sort by ``key``; the same key again inverts (htop's ``P`` ``M`` ``T``)."""
        return replace(self, reverse=not self.reverse) if key == self.sort else replace(self, sort=key,
                                                                                        reverse=False)

    def inverted(self) -> TableView:
        return replace(self, reverse=not self.reverse)


def matches(p: ProcessSnapshot, text: str) -> bool:
    """Whether ``text`` (case-insensitive, every word) is in the pid, user, tag, command or models."""
    words = text.lower().split()
    if not words:
        return True
    hay = " ".join([str(p.pid), p.user or "", p.tag, p.command or "", names.command_text(p),
                    *names.model_names(p.models), p.state]).lower()
    return all(w in hay for w in words)


def ordered(processes: Iterable[ProcessSnapshot], view: TableView, now: float) -> tuple[ProcessSnapshot, ...]:
    """The processes the table shows, in its order: filtered, sorted, unknowns and exited last."""
    key = _key(view.sort, now)
    shown = [p for p in processes if matches(p, view.filter)]
    known = [p for p in shown if key(p) is not None]
    unknown = [p for p in shown if key(p) is None]
    known.sort(key=lambda p: p.pid)  # ties in pid order, whatever the direction
    known.sort(key=key, reverse=view.descending)
    rows = known + unknown
    return tuple([p for p in rows if p.state != EXITED] + [p for p in rows if p.state == EXITED])


__all__ = ["SortKey", "TableView", "matches", "ordered", "utilization"]
