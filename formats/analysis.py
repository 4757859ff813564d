"""``neuron-profile analyze``: why a profile is as slow as it is, with evidence.

    from formats.analysis import analyze
    result = analyze(open_profile("out/bert/device/.../execution=2"))
    result.critical_path.length_ns == result.device_time_ns
    result.idle["Tensor"].by_cause            # {"dma:qSyncIO0": 41_250, "engine:Vector": 8_100, ...}
    result.to_json()                          # the documented JSON (docs/analyses.md)

One profile: the critical path through instruction, DMA and collective dependencies and its share by
engine, queue, collective, op kind, layer kind and source line; every engine's idle time by what it
waited for; findings ranked by the time they account for. The definitions are in
``formats.critical_path`` (and docs/analyses.md, with the SQL that reproduces every number); this
module only groups and names. A profile that lacks what an analysis needs (no ``Flow``, no
``Instruction``) gets the analyses it can, and ``skipped`` says which could not run and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from formats import critical_path as cp
from formats import depgraph
from formats.attribution import module_kind
from formats.breakdown import op_kind
from formats.depgraph import CC, DMA, INSTRUCTION, DepGraph
from formats.units import fmt_ns, fmt_pct

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = ["THROTTLE_FINDING", "Analysis", "Contributor", "Finding", "IdleReport", "PathReport", "analyze",
           "critical_path_where"]

MAX_HIGHLIGHT_IDS = 50_000  # instructions a timeline highlight of the path names (the last ones)

TOP = 10  # contributors, ops and layers listed per table
THROTTLE_FINDING = "Power throttling"  # the title of the finding made from Throttle rows


@dataclass(frozen=True)
class Contributor:
    """One op (an instruction's HLO op, or a DMA queue / collective) on the critical path."""

    name: str  # hlo_name, "dma <queue>" or the collective's operation
    layer: str | None
    source: str | None  # file:line of the op's innermost frame
    time_ns: int
    events: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layer": self.layer, "source": self.source, "time_ns": self.time_ns,
                "events": self.events}


@dataclass(frozen=True)
class PathReport:
    """The critical path, summed (``formats.critical_path.Path`` for the definition)."""

    length_ns: int
    events: int
    implicit_events: int  # predecessors inferred from timing, not from a Flow edge
    wait_ns: int  # latency and queueing between a release and a start, Σ over the path
    by_engine: dict[str, int]
    by_queue: dict[str, int]
    by_collective: dict[str, int]
    host_ns: int
    instruction_wait_ns: int  # Σ over the path's instructions of release -> start (not their engine's)
    queue_wait_ns: dict[str, int]  # per queue: the part of its path time before its transfers started
    by_op_kind: dict[str, int]
    by_layer_kind: dict[str, int]
    top: list[Contributor]
    event_ids: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    event_kinds: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int8))

    def share(self) -> dict[str, dict[str, float]]:
        """Fractions of the path length: by engine, queue and collective, host and instruction wait
        (Σ of every fraction = 1)."""
        total = self.length_ns or 1
        return {"engine": {k: v / total for k, v in self.by_engine.items()},
                "queue": {k: v / total for k, v in self.by_queue.items()},
                "collective": {k: v / total for k, v in self.by_collective.items()},
                "host": {"host": self.host_ns / total} if self.host_ns else {},
                "wait": {"wait": self.instruction_wait_ns / total} if self.instruction_wait_ns else {}}


@dataclass(frozen=True)
class IdleReport:
    """One engine's idle time and what it waited for (Σ by_cause = total_ns)."""

    engine: str
    total_ns: int
    by_cause: dict[str, int]
    by_op: dict[str, int]  # the op of the instruction that waited (top TOP)
    by_layer: dict[str, int]
    intervals: int


@dataclass(frozen=True)
class Finding:
    """One ranked finding: what, the evidence (numbers), where, the time it accounts for."""

    title: str
    evidence: str
    where: str | None
    time_ns: int
    source: str = "critical path"  # which analysis found it
    gain_ns: int | None = None  # measured by re-simulation (formats.whatif), when it was

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "evidence": self.evidence, "where": self.where, "time_ns": self.time_ns,
                "source": self.source, "gain_ns": self.gain_ns}


@dataclass(frozen=True)
class Analysis:
    """Everything ``neuron-profile analyze`` reports for one profile."""

    profile: str
    device_time_ns: int
    critical_path: PathReport | None
    idle: dict[str, IdleReport]
    findings: list[Finding]
    skipped: list[tuple[str, str]]  # (analysis, why it could not run)
    notes: list[str]  # what the profile lacked that the analyses worked around
    graph_events: int
    temporal: Any = None  # formats.breakdown.Temporal
    dma_queues: list[Any] = field(default_factory=list)  # formats.breakdown.DmaQueue
    bottom_up: list[Any] = field(default_factory=list)  # formats.breakdown.OpKind
    dma_ceiling_bytes_per_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        path = self.critical_path
        return {
            "profile": self.profile,
            "device_time_ns": self.device_time_ns,
            "critical_path": None if path is None else {
                "length_ns": path.length_ns,
                "events": path.events,
                "implicit_events": path.implicit_events,
                "wait_ns": path.wait_ns,
                "share": path.share(),
                "time_ns": {"engine": path.by_engine, "queue": path.by_queue,
                            "collective": path.by_collective, "host": path.host_ns,
                            "wait": path.instruction_wait_ns},
                "queue_wait_ns": path.queue_wait_ns,
                "by_op_kind": path.by_op_kind,
                "by_layer_kind": path.by_layer_kind,
                "top": [c.as_dict() for c in path.top],
            },
            "idle": {name: {"total_ns": r.total_ns, "by_cause": r.by_cause, "by_op": r.by_op,
                            "by_layer": r.by_layer, "intervals": r.intervals}
                     for name, r in self.idle.items()},
            "temporal": None if self.temporal is None else self.temporal.as_dict(),
            "dma_queues": [q.as_dict(self.dma_ceiling_bytes_per_s) for q in self.dma_queues],
            "bottom_up": [o.as_dict() for o in self.bottom_up],
            "findings": [f.as_dict() for f in self.findings],
            "skipped": [{"analysis": a, "reason": r} for a, r in self.skipped],
            "notes": self.notes,
        }




def _top(values: Mapping[str, int], n: int = TOP) -> dict[str, int]:
    return dict(sorted(((k, int(v)) for k, v in values.items() if v), key=lambda kv: (-kv[1], kv[0]))[:n])


def _group(codes: np.ndarray, weights: np.ndarray, names: list[str]) -> dict[str, int]:
    """Σ weights by text code (codes -1 dropped)."""
    keep = codes >= 0
    if not keep.any():
        return {}
    sums = np.bincount(codes[keep], weights=weights[keep], minlength=len(names))
    return {names[i]: int(v) for i, v in enumerate(sums) if v}


def _by_name(names: Iterable[str], weights: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, w in zip(names, weights.tolist()):
        out[name] = out.get(name, 0) + int(w)
    return out


def path_report(graph: DepGraph, path: cp.Path, lookup: Any = None) -> PathReport:
    """Sum the path by engine, queue, collective, op kind, layer kind; its top contributors.
    ``lookup(ids, column)`` gives instructions' text by id (the source lines of the contributors)."""
    ev, contrib = path.events, path.contribution_ns
    kind = graph.kind[ev]
    by_engine: dict[str, int] = {}
    instr = kind == INSTRUCTION
    # an instruction's engine gets the time it ran; the time between its release and its start (a
    # wait the profile has no edge for) is "wait" -- a transfer's or collective's stays theirs
    instr_wait = int(path.wait_ns[instr].sum())
    if instr.any():
        sums = np.bincount(graph.engine[ev[instr]].astype(np.int64) + 1,
                           weights=(contrib - path.wait_ns)[instr])
        from formats.schema import ENGINE_NAMES
        by_engine = {(ENGINE_NAMES[i - 1] if i else "?"): int(v) for i, v in enumerate(sums) if v}
    lanes = graph.lanes
    by_queue = _group(np.where(kind == DMA, graph.lane[ev], -1), contrib, lanes)
    queue_wait = _group(np.where(kind == DMA, graph.lane[ev], -1), path.wait_ns, lanes)
    by_cc = _group(np.where(kind == CC, graph.lane[ev], -1), contrib, lanes)
    # op kinds, layer kinds and contributors: instructions by their HLO op; DMA and collectives by lane
    hlo = graph.text_codes.get("hlo_name")
    layer = graph.text_codes.get("layer")
    n_instr = graph.n_instr
    ops_idx = np.where(instr, ev, 0)
    none = np.full(ev.size, -1, np.int32)
    at = np.minimum(ops_idx, max(n_instr - 1, 0))
    hlo_codes = np.where(instr, hlo[at], -1) if hlo is not None and n_instr else none
    layer_codes = np.where(instr, layer[at], -1) if layer is not None and n_instr else none
    hlo_names = graph.text_values.get("hlo_name", [])
    layer_names = graph.text_values.get("layer", [])
    per_op = _group(hlo_codes, contrib, hlo_names)
    by_op_kind: dict[str, int] = {}
    for name, ns in per_op.items():
        by_op_kind[op_kind(name)] = by_op_kind.get(op_kind(name), 0) + ns
    unattributed = int(contrib[instr & (hlo_codes < 0)].sum())
    if unattributed:
        by_op_kind["(no op)"] = unattributed
    for name, ns in by_queue.items():
        by_op_kind[f"dma {name}"] = ns
    for name, ns in by_cc.items():
        by_op_kind[f"collective {name}"] = ns
    by_layer_kind: dict[str, int] = {}
    for name, ns in _group(layer_codes, contrib, layer_names).items():
        k = module_kind(name)
        by_layer_kind[k] = by_layer_kind.get(k, 0) + ns
    # contributors: per HLO op (with its layer and source line), DMA queues and collectives
    contributors: list[Contributor] = []
    if hlo is not None and (hlo_codes >= 0).any():
        codes = hlo_codes[hlo_codes >= 0]
        sums = np.bincount(codes, weights=contrib[hlo_codes >= 0], minlength=len(hlo_names))
        counts = np.bincount(codes, minlength=len(hlo_names))
        first_event: dict[int, int] = {}
        for e, c in zip(ev[hlo_codes >= 0].tolist(), codes.tolist()):
            first_event.setdefault(c, e)
        chosen = [int(graph.ident[first_event[int(c)]]) for c in np.argsort(-sums)[:TOP] if sums[c] > 0]
        sources = lookup(chosen, "bir_debug_info_source_location") if lookup is not None else {}
        for c in np.argsort(-sums)[:TOP]:
            if sums[c] <= 0:
                break
            e = first_event[int(c)]
            contributors.append(Contributor(hlo_names[int(c)], graph.text("layer", e),
                                            sources.get(int(graph.ident[e])), int(sums[c]), int(counts[c])))
    for lane_kind, table, label in ((DMA, by_queue, "dma"), (CC, by_cc, "collective")):
        for name, ns in table.items():
            count = int(((kind == lane_kind) & (graph.lane[ev] == lanes.index(name))).sum())
            contributors.append(Contributor(f"{label} {name}", None, None, ns, count))
    contributors.sort(key=lambda c: (-c.time_ns, c.name))
    return PathReport(
        length_ns=path.length_ns, events=int(ev.size), implicit_events=int(path.implicit.sum()),
        wait_ns=int(path.wait_ns.sum()), by_engine=_top(by_engine, 99), by_queue=_top(by_queue, 99),
        by_collective=_top(by_cc, 99), host_ns=int(path.host_ns.sum()), instruction_wait_ns=instr_wait,
        queue_wait_ns=queue_wait,
        by_op_kind=_top(by_op_kind),
        by_layer_kind=_top(by_layer_kind), top=contributors[:TOP], event_ids=graph.ident[ev],
        event_kinds=kind)


@njit(cache=True, nogil=True)
def _idle_sums(lo: int, hi: int, g_start: np.ndarray, g_end: np.ndarray, cause: np.ndarray,
               waiter: np.ndarray, hlo: np.ndarray, layer: np.ndarray, n_causes: int, n_ops: int,
               n_layers: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Gaps ``lo .. hi - 1`` (one engine's): Σ length, and Σ length by cause, by the waiting
    instruction's op and layer code (float64 added in gap order, as ``np.bincount`` adds them)."""
    by_cause = np.zeros(n_causes, np.float64)
    by_op = np.zeros(n_ops, np.float64)
    by_layer = np.zeros(n_layers, np.float64)
    total = 0
    for g in range(lo, hi):
        length = g_end[g] - g_start[g]
        total += length
        if cause[g] >= 0:
            by_cause[cause[g]] += length
        w = waiter[g]
        if w < 0:
            continue
        if hlo.size and hlo[w] >= 0:
            by_op[hlo[w]] += length
        if layer.size and layer[w] >= 0:
            by_layer[layer[w]] += length
    return total, by_cause, by_op, by_layer


def _named(sums: np.ndarray, names: list[str]) -> dict[str, int]:
    return {names[i]: int(v) for i, v in enumerate(sums) if v}


def idle_report(graph: DepGraph, gaps: cp.IdleGaps) -> dict[str, IdleReport]:
    """Per engine: Σ idle, by cause, by the waiting instruction's op and layer (one compiled pass over
    each engine's gaps, which ``idle_gaps`` lists engine by engine)."""
    from formats.schema import ENGINE_NAMES

    out: dict[str, IdleReport] = {}
    none = np.zeros(0, np.int32)
    hlo = graph.text_codes.get("hlo_name", none)
    layer = graph.text_codes.get("layer", none)
    ops = graph.text_values.get("hlo_name", [])
    layers = graph.text_values.get("layer", [])
    for name in gaps.engines:
        code = gaps.engine.dtype.type(ENGINE_NAMES.index(name))  # the array's type: no cast of the array
        lo = int(np.searchsorted(gaps.engine, code, side="left"))
        hi = int(np.searchsorted(gaps.engine, code, side="right"))
        total, by_cause, by_op, by_layer = _idle_sums(lo, hi, gaps.start, gaps.end, gaps.cause, gaps.waiter,
                                                      hlo, layer, len(gaps.causes), len(ops), len(layers))
        out[name] = IdleReport(name, int(total), _top(_named(by_cause, gaps.causes), 99),
                               _top(_named(by_op, ops)), _top(_named(by_layer, layers)), hi - lo)
    return out


def _findings(device_ns: int, path: PathReport | None, idle: Mapping[str, IdleReport]) -> list[Finding]:
    """Ranked by the time each accounts for: the path's largest resources and op kinds, and every
    engine's largest idle cause when it is a real share of the device time."""
    found: list[Finding] = []
    if path is not None and path.length_ns:
        total = path.length_ns
        for label, table in (("DMA queue", path.by_queue), ("collective", path.by_collective),
                             ("engine", path.by_engine)):
            for name, ns in list(table.items())[:2]:
                if ns >= 0.15 * total:
                    found.append(Finding(
                        f"{label} {name} holds {fmt_pct(ns / total)} of the critical path",
                        f"{fmt_ns(ns)} of {fmt_ns(total)} on the critical path is {label} {name}"
                        + (f" ({fmt_ns(path.queue_wait_ns[name])} of it between trigger and transfer start)"
                           if label == "DMA queue" and path.queue_wait_ns.get(name) else ""),
                        name, ns))
        ops = [c for c in path.top if not c.name.startswith(("dma ", "collective "))]
        if ops and ops[0].time_ns >= 0.10 * total:
            top = ops[0]
            where = ", ".join(x for x in (top.layer, top.source) if x) or None
            found.append(Finding(f"op {top.name} is the largest op on the critical path",
                                 f"{fmt_ns(top.time_ns)} ({fmt_pct(top.time_ns / total)}) over "
                                 f"{top.events} instructions", where, top.time_ns))
    for name, report in idle.items():
        # the question users ask is "why is my Tensor engine idle"; other engines' idle is reported
        # when it waits on collectives
        if not device_ns or not report.by_cause:
            continue
        cause, ns = next(iter(report.by_cause.items()))
        if name != "Tensor" and not cause.startswith("collective:"):
            continue
        if ns >= 0.10 * device_ns and cause not in (cp.STARVED,):
            op = next(iter(report.by_op), None)
            found.append(Finding(
                f"{name} engine idle waiting on {cause}",
                f"{name} idle {fmt_ns(report.total_ns)} ({fmt_pct(report.total_ns / device_ns)} of device "
                f"time), "
                f"{fmt_ns(ns)} of it waiting on {cause}", f"before op {op}" if op else None, ns, "idle"))
    found.sort(key=lambda f: (-f.time_ns, f.title))
    return found


def analyze(profile: Profile, con: Any = None) -> Analysis:
    """Every single-profile analysis of ``profile`` (module docstring)."""
    from formats import sqlsource
    from formats.figures import device_time_ns

    own = con is None
    con = con or sqlsource.connect(memory_limit="2GB")
    try:
        graph = depgraph.load_graph(profile, con)
        t, _ = device_time_ns(profile, con)
        result = _analyze(profile, graph, t,
                          lambda ids, column: depgraph.instruction_text(profile, ids, column, con))
        from formats import breakdown

        ceiling = profile.metadata.get("dma_ddr_bandwidth")
        throttle = _throttle_finding(profile, con, result.device_time_ns, graph)
        if throttle is not None:
            result = replace(result, findings=sorted([*result.findings, throttle],
                                                     key=lambda f: (-f.time_ns, f.title)))
        return replace(result, temporal=breakdown.temporal(graph, result.device_time_ns) if graph.n else None,
                       dma_queues=breakdown.dma_efficiency(graph),
                       bottom_up=breakdown.bottom_up(graph, profile, con, profile.metadata),
                       dma_ceiling_bytes_per_s=float(ceiling) if ceiling else None)
    finally:
        if own:
            con.close()


def _throttle_finding(profile: Profile, con: Any, device_ns: int, graph: DepGraph | None) -> Finding | None:
    """Power throttling the profile recorded (``Throttle`` rows: the real tool's "Active FLOPS
    Throttling"): Σ duration, the tightest limit k/n and its cost, the Tensor-engine time the
    matmuls under it lost (``formats.throttling``); ranked by that cost."""
    from formats.throttling import throttling

    t = throttling(profile, con, graph)
    if t is None:
        return None
    share = f" ({fmt_pct(t.duration_ns / device_ns)} of device time)" if device_ns else ""
    cap = f", limit down to {fmt_pct(t.limit)} of peak activity" if t.limit is not None else ""
    cost = (f"; cost: the Tensor engine's matmuls ran {fmt_ns(t.tensor_lost_ns)} longer than at full "
            f"speed" if t.tensor_lost_ns else "")
    return Finding(THROTTLE_FINDING,
                   f"{t.periods} throttling periods for {fmt_ns(t.duration_ns)}{share}{cap}{cost}",
                   f"first at {t.first_ns} ns" if t.first_ns is not None else None,
                   t.tensor_lost_ns or t.duration_ns, "throttle")


def _analyze(profile: Profile, graph: DepGraph, t: float | None, lookup: Any) -> Analysis:
    device_ns = int(t or graph.device_time_ns)
    skipped: list[tuple[str, str]] = []
    notes = [g for g in graph.gaps if not g.startswith("no Instruction")]
    if not graph.n_instr:
        reason = "the profile has no Instruction rows"
        skipped += [("critical path", reason), ("idle attribution", reason)]
        return Analysis(str(profile.path), device_ns, None, {}, [], skipped, notes, graph.n)
    rel = cp.release(graph)
    path = path_report(graph, cp.critical_path(graph, rel), lookup)
    idle = idle_report(graph, cp.idle_gaps(graph, rel))
    if not graph.flow_edges:
        skipped.append(("dependency edges", "the profile has no Flow table; the critical path and idle "
                                            "causes are inferred from timing alone (implicit predecessors)"))
    return Analysis(str(profile.path), device_ns, path, idle, _findings(device_ns, path, idle), skipped,
                    notes, graph.n)


def critical_path_where(analysis: Analysis) -> tuple[str, str] | None:
    """The critical path's instructions as an SQL condition over ``Instruction`` (``id IN (...)``)
    and a one-line description, for a viewer's timeline highlight; None when there is no path. At most
    ``MAX_HIGHLIGHT_IDS`` ids (the ones nearest the end of the execution) -- the description says so."""
    path = analysis.critical_path
    if path is None:
        return None
    ids = path.event_ids[path.event_kinds == INSTRUCTION]
    if not ids.size:
        return None
    shown = ids[:MAX_HIGHLIGHT_IDS]
    more = f" (the last {len(shown):,} of {ids.size:,})" if ids.size > shown.size else ""
    other = path.events - int(ids.size)
    extra = f"; {other:,} DMA/collective events on it" if other else ""
    where = "id IN (" + ", ".join(str(int(i)) for i in shown) + ")"
    return where, f"critical path: {ids.size:,} instructions{more}{extra}, {fmt_ns(path.length_ns)}"
