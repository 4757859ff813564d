"""Immutable snapshots the profile viewer draws: what the loader threads hand to the UI thread.

Every object here is frozen and holds only tuples, strings, numbers and read-only mappings, so a worker
thread can build one while the UI keeps drawing the previous one, and hand it over by swapping a
reference (memray's live viewer does the same with its snapshots). Nothing here touches a file, a
DuckDB connection or a widget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from formats.read_api import SourceText as SourceFile  # noqa: F401  (one file as a pane shows it)

ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "Sync")
ENGINE_SHORT = ("T", "V", "S", "G", "Y")  # column headers: Y = sYnc (S is Scalar)

NodeKind = Literal["layer", "hlo", "instr", "more", "info", "kind"]  # kind: bottom-up op kind
Line = tuple[str, int]  # (recorded file name, 1-based line number)


def frozen_map(items: Mapping | None = None) -> Mapping:
    """A read-only view of a private copy (snapshots must not change under the UI)."""
    return MappingProxyType(dict(items or {}))


@dataclass(frozen=True)
class NodeStats:
    """The figures of one hierarchy row. ``None`` = the profile cannot tell (never a made-up 0)."""

    time_ns: int | None = None  # busy time: union of the node's spans (or a sum when ``summed``)
    summed: bool = False  # time is a sum of instruction durations, not a union (no hierarchy table)
    start_ts: int | None = None
    end_ts: int | None = None
    hbm_bytes: int | None = None
    mfu: float | None = None  # fraction of the PE peak over the node's busy time
    counts: tuple[int | None, ...] = (None,) * len(ENGINES)  # instructions per engine, ENGINES order
    instructions: int | None = None

    @property
    def span(self) -> tuple[int, int] | None:
        if self.start_ts is None or self.end_ts is None or self.end_ts <= self.start_ts:
            return None
        return self.start_ts, self.end_ts


@dataclass(frozen=True)
class Node:
    """One row of the hierarchy: a framework layer, an HLO op, an instruction, or a "more..." pager."""

    key: str
    kind: NodeKind
    name: str
    parent: str  # "" for roots
    stats: NodeStats = field(default_factory=NodeStats)
    expandable: bool = False
    detail: str = ""  # instructions: engine/opcode; info rows: the message
    hlo_ref: tuple[str, str | int] | None = None  # ("raw_hlo_id", 42) or ("hlo_name", "dot.1")
    layer: str | None = None  # framework layer path of an HLO op (None: unattributed)
    offset: int = 0  # "more" rows: the next page's offset


@dataclass(frozen=True)
class Hierarchy:
    """Layers and HLO ops of a profile (instructions are paged in separately, on demand)."""

    nodes: Mapping[str, Node]
    children: Mapping[str, tuple[str, ...]]  # parent key ("" = roots) -> child keys
    source: str  # where the tree came from, e.g. "FrameworkNode + HloInstruction"
    analysed: bool = False  # per-engine counts and FLOPs from the Instruction scan are in
    malformed: str = ""  # what the hierarchy reader skipped, e.g. "2 malformed ids skipped"

    def ancestors(self, key: str) -> list[str]:
        out = []
        node = self.nodes.get(key)
        while node is not None and node.parent:
            out.append(node.parent)
            node = self.nodes.get(node.parent)
        return out[::-1]


@dataclass(frozen=True)
class Figure:
    """One summary line: a label, a formatted value, and the formula or source it came from."""

    label: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class Problem:
    """A rule-based finding and where it happens (a node to select and/or a time range to show)."""

    title: str
    detail: str
    severity: int  # 1 (info) .. 3 (big)
    node: str | None = None  # the biggest instance (an HLO op key)
    t0: int | None = None
    t1: int | None = None
    kind: str | None = None  # the op kind (bottom-up key) the finding adds up over


@dataclass(frozen=True)
class Overview:
    """The first thing shown: summary figures, what the profile holds and lacks, the hierarchy."""

    name: str
    figures: tuple[Figure, ...]
    engine_active: tuple[tuple[str, float | None], ...]  # (engine, fraction of total time)
    missing: tuple[str, ...]  # one line per missing table that costs a feature
    notes: tuple[str, ...]
    total_ns: int | None
    span: tuple[int, int] | None  # first and last timestamps of the profile
    hierarchy: Hierarchy
    summary_source: str  # "stored Summary" / "computed from the event tables"
    complete: bool = True  # False: the capture was interrupted (formats.dataset.capture_state)
    mark: str = ""  # what the title says about how the capture ended ("" for a normal one)


@dataclass(frozen=True)
class LineStat:
    time_ns: int
    instructions: int


@dataclass(frozen=True)
class SourceIndex:
    """Code linking: per-line time and counts, and the lines <-> hierarchy nodes maps."""

    files: tuple[str, ...]  # recorded file names, most time first
    lines: Mapping[Line, LineStat]
    node_lines: Mapping[str, tuple[Line, ...]]  # node key -> its lines, innermost frame first
    line_nodes: Mapping[Line, tuple[str, ...]]  # line -> HLO node keys
    available: bool  # False: no StackFrame tables and no source-location columns
    message: str = ""


@dataclass(frozen=True)
class Analysis:
    """What the full Instruction scan adds: a richer hierarchy, code linking, the problem list."""

    hierarchy: Hierarchy
    source: SourceIndex
    problems: tuple[Problem, ...]
    bottom_up: Hierarchy | None = None  # the same ops grouped by kind across layers


@dataclass(frozen=True)
class StripRow:
    engine: str  # the row's label: an engine, "Tensor∪" (both PE rows), or one of the PE rows
    occupancy: tuple[float, ...]  # per cell, busy fraction of the cell (exact: busy_rows)
    busy: float  # over the whole strip (formats.figures' busy fraction of the range)
    top_opcode: str
    detail: bool = False  # one of the Tensor engine's two rows under its union (dropped when short)


@dataclass(frozen=True)
class EngineStrip:
    t0: int
    t1: int
    rows: tuple[StripRow, ...]
    source: str  # "exact", or why there is nothing to draw
