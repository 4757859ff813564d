"""Recent history for the sparklines, kept by the collection thread and handed out frozen.

Bounded ring buffers per tab ("all" and each process): per-core utilisation, total HBM traffic and
NeuronLink throughput. Only sources that report traffic (live state) fill the last two. A process
that leaves takes its buffers with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from explorer.top.aggregate import TabData, combine
from explorer.top.snapshots import HistoryView, ProcessSnapshot

DEFAULT_SAMPLES = 60


class History:
    """Appends one sample per update; ``view()`` returns immutable tuples for the frame."""

    def __init__(self, samples: int = DEFAULT_SAMPLES) -> None:
        self.samples = samples
        self._cores: dict[int | None, dict[int, deque[float]]] = {}
        self._hbm: dict[int | None, deque[float]] = {}
        self._links: dict[int | None, deque[float]] = {}
        self._has_hbm = False

    def _ring(self) -> deque[float]:
        return deque(maxlen=self.samples)

    def _record(self, key: int | None, data: TabData) -> None:
        cores = self._cores.setdefault(key, {})
        for core, value in data.utilization.items():
            cores.setdefault(core, self._ring()).append(value)
        for core in set(cores) - set(data.utilization):  # no longer listed: the line drops to nothing
            cores[core].append(0.0)
        if data.hbm_bytes_per_s or data.link_bytes_per_s is not None:
            self._has_hbm = True
            self._hbm.setdefault(key, self._ring()).append(sum(data.hbm_bytes_per_s.values()))
            links = data.link_bytes_per_s or {}
            self._links.setdefault(key, self._ring()).append(links.get("neuronlink", 0.0))

    def record(self, processes: Iterable[ProcessSnapshot]) -> HistoryView:
        """Add the processes' current figures (running ones only) and return the new history."""
        active = [p for p in processes if p.state in ("running", "stale")]
        keys: set[int | None] = {None}
        self._record(None, combine(active))
        for p in active:
            keys.add(p.pid)
            self._record(p.pid, combine([p]))
        for store in (self._cores, self._hbm, self._links):
            for gone in set(store) - keys:
                del store[gone]
        return self.view()

    def view(self) -> HistoryView:
        return HistoryView(
            cores={k: {c: tuple(v) for c, v in cores.items()} for k, cores in self._cores.items()},
            hbm={k: tuple(v) for k, v in self._hbm.items()},
            links={k: tuple(v) for k, v in self._links.items()},
            has_hbm=self._has_hbm)


__all__ = ["DEFAULT_SAMPLES", "History"]
