"""Across ranks: per-rank device time, collective wait skew, who arrives last, stragglers and why.

    report = rank_report(profiles, analyses)   # {name: Profile}, {name: Analysis} of one folder
    report.stragglers                          # [Straggler(rank, collective, late_ns, cause)]

The profiles of one folder (a capture's ``device/``: one per rank) run the same program, so their
collectives match by position: the k-th ``CcOp`` of every rank (by start) is one collective. A
rank **arrives** at a collective when it is ready to run it -- ``CcOp.trigger_start_ts`` (the
triggering instruction's start), else the op's own ``start_ts`` -- and every rank leaves it together,
so the ranks that arrive early wait. Per collective:

* ``skew_ns`` = last arrival - first arrival (what the earliest rank waited);
* the **last** rank and ``late_ns`` = its arrival - the second-to-last arrival (the time the whole
  group waited for that rank alone).

A rank is a **straggler** at a collective when ``late_ns`` >= ``STRAGGLER_FRACTION`` of the
collectives' median duration-free spacing -- concretely, of the group's median device time divided by
the number of collectives -- and at least ``STRAGGLER_MIN_NS``. Its **cause** is read from that rank's
own profile over the stretch since the previous collective: its instructions there took ``ratio`` x
the time the same instructions (by id) took on the other ranks (a slow core), or, if not slower,
the resource holding most of its critical path in that stretch; plus power throttling when its
``Throttle`` table has rows in the stretch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from formats.units import fmt_ns

if TYPE_CHECKING:
    from formats.analysis import Analysis
    from formats.reader import Profile

__all__ = ["RankReport", "Straggler", "rank_report"]

STRAGGLER_FRACTION = 0.05
STRAGGLER_MIN_NS = 500


@dataclass(frozen=True)
class Straggler:
    rank: str
    collective: str  # "AllReduce #3" (operation, position)
    late_ns: int
    cause: str

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "collective": self.collective, "late_ns": self.late_ns,
                "cause": self.cause}


@dataclass(frozen=True)
class CollectiveArrival:
    collective: str
    first_rank: str
    last_rank: str
    skew_ns: int
    late_ns: int
    arrivals: dict[str, int]  # rank -> arrival, ns relative to the earliest


@dataclass(frozen=True)
class RankReport:
    """The across-ranks view of one folder of profiles."""

    device_time_ns: dict[str, int]
    collectives: list[CollectiveArrival]
    wait_ns: dict[str, int]  # per rank: Σ over collectives of (last arrival - its arrival)
    stragglers: list[Straggler]
    throttled: dict[str, int]  # per rank: Σ Throttle durations (power throttling), where any

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": {"device_time_ns": self.device_time_ns, "collective_wait_ns": self.wait_ns,
                      "throttled_ns": self.throttled},
            "collectives": [{"collective": c.collective, "first_rank": c.first_rank, "last_rank": c.last_rank,
                             "skew_ns": c.skew_ns, "late_ns": c.late_ns} for c in self.collectives],
            "stragglers": [s.as_dict() for s in self.stragglers],
        }

    def text_lines(self) -> Iterator[str]:
        yield f"{len(self.device_time_ns)} ranks"
        for rank, ns in self.device_time_ns.items():
            extra = f", throttled {fmt_ns(self.throttled[rank])}" if self.throttled.get(rank) else ""
            waited = fmt_ns(self.wait_ns.get(rank, 0))
            yield f"  {rank}: device time {fmt_ns(ns)}, waited in collectives {waited}{extra}"
        if self.collectives:
            worst = max(self.collectives, key=lambda c: c.skew_ns)
            yield (f"collectives: {len(self.collectives)}; largest arrival skew {fmt_ns(worst.skew_ns)} at "
                   f"{worst.collective} (last: {worst.last_rank})")
        if self.stragglers:
            yield "stragglers:"
            for s in self.stragglers:
                yield f"  {s.rank} late {fmt_ns(s.late_ns)} at {s.collective}: {s.cause}"
        else:
            yield "stragglers: none"


def _arrivals(profile: Profile) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Operation, arrival, start and end of each CcOp by start (empty if none)."""
    if not profile.num_rows("CcOp"):
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    t = profile.table("CcOp", ["start_ts", "end_ts", "operation", "trigger_start_ts"])
    start = np.asarray(t.column("start_ts").to_numpy(zero_copy_only=False), np.int64)
    order = np.argsort(start, kind="stable")
    trig = t.column("trigger_start_ts").to_pylist()
    arrive = np.array([start[i] if trig[i] is None else int(trig[i]) for i in range(start.size)], np.int64)
    end = np.asarray(t.column("end_ts").to_numpy(zero_copy_only=False), np.int64)
    ops = t.column("operation").to_pylist()
    return [str(ops[i]) for i in order], arrive[order], start[order], end[order]


def _instr_time(profile: Profile, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and durations of the instructions that start in [t0, t1)."""
    import pyarrow.compute as pc

    t = profile.table("Instruction", ["id", "start_ts", "duration_ns"])
    start = t.column("start_ts")
    mask = pc.and_(pc.greater_equal(start, t0), pc.less(start, t1))
    t = t.filter(mask)
    return (np.asarray(t.column("id").to_numpy(zero_copy_only=False), np.int64),
            np.asarray(t.column("duration_ns").to_numpy(zero_copy_only=False), np.int64))


def _throttle_ns(profile: Profile, t0: int | None = None, t1: int | None = None) -> int:
    if not profile.num_rows("Throttle"):
        return 0
    t = profile.table("Throttle", ["timestamp", "duration"])
    ts = np.asarray(t.column("timestamp").to_numpy(zero_copy_only=False), np.int64)
    d = np.asarray(t.column("duration").to_numpy(zero_copy_only=False), np.int64)
    if t0 is not None and t1 is not None:
        keep = (ts < t1) & (ts + d > t0)
        ts, d = ts[keep], d[keep]
    return int(d.sum())


def _cause(name: str, profiles: Mapping[str, Profile], analyses: Mapping[str, Analysis],
           windows: Mapping[str, tuple[int, int]]) -> str:
    """Why ``name`` arrived late: its instructions in the stretch vs the same ones on the others."""
    ids, dur = _instr_time(profiles[name], *windows[name])
    others = [n for n in profiles if n != name]
    ratios = []
    for other in others:
        o_ids, o_dur = _instr_time(profiles[other], *windows[other])
        common, mine, theirs = np.intersect1d(ids, o_ids, return_indices=True)
        if common.size and o_dur[theirs].sum() > 0:
            ratios.append(dur[mine].sum() / o_dur[theirs].sum())
    parts = []
    ratio = float(np.median(ratios)) if ratios else 1.0
    throttle = _throttle_ns(profiles[name], *windows[name])
    if ratio >= 1.05:
        parts.append(f"its instructions took {ratio:.2f}x as long as the same instructions on the other "
                     f"ranks (a slow core)")
    if throttle:
        parts.append(f"power throttling for {fmt_ns(throttle)} in this stretch")
    path = analyses[name].critical_path
    if path is not None and path.length_ns:
        tables = {**{f"engine {k}": v for k, v in path.by_engine.items()},
                  **{f"queue {k}": v for k, v in path.by_queue.items()}}
        if tables:
            top = max(tables, key=lambda k: tables[k])
            parts.append(f"its critical path is mostly {top} ({tables[top] * 100 // path.length_ns}%)")
    return "; ".join(parts) or "no visible cause on this rank"


def rank_report(profiles: Mapping[str, Profile], analyses: Mapping[str, Analysis]) -> RankReport:
    """The across-ranks report of one folder (module docstring)."""
    names = list(profiles)
    device = {n: analyses[n].device_time_ns for n in names}
    arrivals = {n: _arrivals(profiles[n]) for n in names}
    count = min((len(a[0]) for a in arrivals.values()), default=0)
    collectives: list[CollectiveArrival] = []
    wait = {n: 0 for n in names}
    stragglers: list[Straggler] = []
    median_device = float(np.median(list(device.values()))) if device else 0.0
    threshold = max(STRAGGLER_MIN_NS, STRAGGLER_FRACTION * median_device / max(count, 1))
    previous_end: dict[str, int] = {}  # where each rank's stretch before the next collective begins
    for n in names:
        t = profiles[n].table("Instruction", ["start_ts"]).column("start_ts")
        previous_end[n] = int(np.min(t.to_numpy())) if len(t) else 0
    for k in range(count if len(names) > 1 else 0):
        arrive = {n: int(arrivals[n][1][k]) for n in names}
        op = arrivals[names[0]][0][k]
        ordered = sorted(names, key=lambda n: (arrive[n], n))
        first, last = ordered[0], ordered[-1]
        skew = arrive[last] - arrive[first]
        late = arrive[last] - arrive[ordered[-2]]
        label = f"{op} #{k}"
        collectives.append(CollectiveArrival(label, first, last, skew, late,
                                             {n: arrive[n] - arrive[first] for n in names}))
        for n in names:
            wait[n] += arrive[last] - arrive[n]
        if late >= threshold:
            windows = {n: (previous_end[n], arrive[n]) for n in names}
            stragglers.append(Straggler(last, label, late, _cause(last, profiles, analyses, windows)))
        for n in names:
            previous_end[n] = int(arrivals[n][3][k])
    throttled = {n: ns for n in names if (ns := _throttle_ns(profiles[n]))}
    return RankReport(device, collectives, wait, stragglers, throttled)
