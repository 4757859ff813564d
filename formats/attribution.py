"""Op, layer and source-line time, self and inclusive, from one set of event intervals.

    from formats.attribution import attribute
    a = attribute(profile)                  # whole execution; attribute(profile, Window.span(t0, t1))
    a.ops[key].inclusive_ns                 # an HLO op: ∪ of its instructions' and DMA packets' intervals
    a.layers["model/layers.0/mlp"].self_ns  # a layer: inclusive − ∪ of its child layers
    a.lines[("model.py", 191)].inclusive_ns # a line: ∪ of the events of the ops it is on the stack of
    a.kinds["down_proj"]                    # a module name across layers (bottom-up): ∪, largest layer

Why one module: the tree (ops and layers) and the source view used to measure different things (union of
spans vs. sum of instruction durations), so a line that calls the MLP did not add up to the MLP nodes.
Here every figure is the **union of the same op events** (docs/figures.md):

* **op events** = the op's instructions (``Instruction.raw_hlo_id``, else ``hlo_name``) and its DMA packets
  (``DmaPacket.raw_hlo_id``): the spans ``HloInstruction.time_intervals`` stores;
* **op time** = |∪ of its events clipped to the window| (an op has no children: self = inclusive);
* **layer inclusive** = |∪ of the events of every op whose ``layer`` is the path or below it|;
  **layer self** = inclusive − |∪ of its child layers' events| (busy in the layer while no child is);
* **line inclusive** = |∪ of the events of every op whose call stack holds the line| (frames from
  ``stack_frame_ids`` and their parents, else ``bir_debug_info_source_location``/``nki_source_location``);
  **line self** = the same over the ops whose innermost frame is the line;
* an op's stack (and name, layer) is that of any of its instructions (one op is traced from one
  call site).

Per-op spans are merged in time slices (``formats.intervals``), so memory is bounded by the merged
spans, not the instruction count; layers and lines then union those spans, a few thousand per op.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa

from formats import sqlsource
from formats.figures import Window, whole
from formats.intervals import (
    UnionAccumulator,
    key_order,
    merge_slices,
    start_order,
    time_slices,
    union_length,
)
from formats.sqlsource import TableSource
from formats.text_lists import parse_ids

if TYPE_CHECKING:
    from formats.reader import Profile

__all__ = ["Attribution", "KindTime", "LineTime", "NodeTime", "attribute", "module_kind"]

Line = tuple[str, int]


@dataclass(frozen=True)
class NodeTime:
    """An op or a layer: ``inclusive_ns``, ``self_ns`` (see the module docstring), the instructions
    of it (and below it) starting in the window, and its parent layer ('' at the top)."""

    key: str
    name: str
    kind: str  # "op" or "layer"
    inclusive_ns: int
    self_ns: int
    instructions: int
    parent: str
    length_ns: float | None

    @property
    def fraction(self) -> float | None:
        return None if not self.length_ns else self.inclusive_ns / self.length_ns


@dataclass(frozen=True)
class LineTime:
    """A source line: ``inclusive_ns`` (ops it is on the stack of), ``self_ns`` (ops it is the
    innermost frame of), instructions of those ops starting in the window, the ops themselves."""

    file: str
    line: int
    function: str
    inclusive_ns: int
    self_ns: int
    instructions: int
    ops: tuple[str, ...]


@dataclass(frozen=True)
class KindTime:
    """A module name across layers (``down_proj`` of every decoder layer): ∪ of their events, how
    many layers, and the layer contributing the most (its inclusive time)."""

    name: str
    inclusive_ns: int
    layers: int
    largest: str
    largest_ns: int


@dataclass
class Attribution:
    """Op, layer, line and module-kind times of one window."""

    window: Window
    ops: dict[str, NodeTime] = field(default_factory=dict)
    layers: dict[str, NodeTime] = field(default_factory=dict)
    lines: dict[Line, LineTime] = field(default_factory=dict)
    kinds: dict[str, KindTime] = field(default_factory=dict)
    by_location: bool = False  # lines came from the single-location columns, not stack frames

    def op_of_name(self, name: str) -> NodeTime | None:
        return next((o for o in self.ops.values() if o.name == name), None)


# -- op events -------------------------------------------------------------------------------------


@dataclass
class _Ops:
    keys: list[str]
    names: list[str]
    layers: list[str]
    stacks: list[str | None]
    locations: list[str | None]
    instructions: np.ndarray  # per op, starting in the window
    segments: tuple[np.ndarray, np.ndarray, np.ndarray]  # (op index, start, end), merged per op


def _op_table(profile: Profile, con: duckdb.DuckDBPyConnection) -> tuple[pa.Table, str] | None:
    """One row per op: key column value, name, layer, most common stack and location."""
    source = TableSource(profile, "Instruction")
    if not source.present:
        return None
    col = source.col
    by_id = source.has("raw_hlo_id") and con.execute(
        f"SELECT count({col('raw_hlo_id')}) FROM {source.relation()}").fetchall()[0][0] > 0
    key = col("raw_hlo_id") if by_id else col("hlo_name")
    table = con.sql(f"""
        SELECT {key} AS k, any_value({col('hlo_name')}) AS name, any_value({col('layer')}) AS layer,
               any_value({col('stack_frame_ids')}) AS stack,
               any_value(coalesce({col('bir_debug_info_source_location')},
                                  {col('nki_source_location')})) AS loc
        FROM {source.relation()} WHERE {key} IS NOT NULL GROUP BY 1 ORDER BY 1""").to_arrow_table()
    table = table.append_column("idx", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table, ("raw_hlo_id" if by_id else "hlo_name")


def _ops(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection, use_stored: bool = True
         ) -> _Ops | None:
    found = _op_table(profile, con)
    if found is None:
        return None
    table, key_column = found
    n = table.num_rows
    if n == 0:
        return None
    by_id = key_column == "raw_hlo_id"
    ids = np.asarray(table.column("k").to_numpy(zero_copy_only=False), np.int64) if by_id else np.zeros(0)
    stored = _stored_spans(profile, window, con, ids) if by_id and use_stored else None
    if stored is not None:
        return _ops_of(table, *stored)
    con.register("__ops", table)
    acc = UnionAccumulator(keep_segments=True)
    counts = np.zeros(n, np.int64)
    try:
        sources = [(TableSource(profile, "Instruction"), True)]
        packets = TableSource(profile, "DmaPacket")
        if key_column == "raw_hlo_id" and packets.present and packets.has("raw_hlo_id"):
            sources.append((packets, False))
        filters = {}
        for source, _ in sources:
            conditions, params = [], []
            if window.t1 is not None:
                conditions.append("t.start_ts < ?")
                params.append(window.t1)
            if window.t0 is not None:
                longest = con.execute(
                    f"SELECT max(end_ts - start_ts) FROM {source.relation()}").fetchall()[0][0]
                conditions += ["(t.end_ts > ? OR t.start_ts >= ?)", "t.start_ts >= ?"]
                params += [window.t0, window.t0, window.t0 - int(longest or 0)]
            filters[source.name] = (conditions, params)
        # one slice of every table at a time, fed to the accumulator together: it needs start order
        slices = merge_slices(*(time_slices(source.files, "start_ts", 2_000_000) for source, _ in sources))
        for low, high in slices:
            keys, starts, ends = [], [], []
            for source, is_instruction in sources:
                cond, args = list(filters[source.name][0]), list(filters[source.name][1])
                if low is not None:
                    cond.append("t.start_ts >= ?")
                    args.append(low)
                if high is not None:
                    cond.append("t.start_ts < ?")
                    args.append(high)
                where = " AND ".join(cond) or "true"
                if by_id:  # integer op ids: mapped to op indices in NumPy (cheaper than a join)
                    cols = con.execute(f"""SELECT t.key AS k, t.start_ts AS s, t.end_ts AS e
                                           FROM (SELECT {source.col(key_column)} AS key, start_ts, end_ts
                                                 FROM {source.relation()}) t
                                           WHERE t.key IS NOT NULL AND {where}""", args).fetchnumpy()
                    if not len(cols["s"]):
                        continue
                    raw = np.asarray(cols["k"], np.int64)
                    k = np.minimum(np.searchsorted(ids, raw), n - 1)
                    known = ids[k] == raw
                    k, s0, e0 = k[known], np.asarray(cols["s"], np.int64)[known], \
                        np.asarray(cols["e"], np.int64)[known]
                else:
                    cols = con.execute(f"""SELECT o.idx AS k, t.start_ts AS s, t.end_ts AS e
                                           FROM (SELECT {source.col(key_column)} AS key, start_ts, end_ts
                                                 FROM {source.relation()}) t
                                           JOIN __ops o ON o.k = t.key WHERE {where}""", args).fetchnumpy()
                    if not len(cols["s"]):
                        continue
                    k = np.asarray(cols["k"], np.int64)
                    s0, e0 = np.asarray(cols["s"], np.int64), np.asarray(cols["e"], np.int64)
                if is_instruction:
                    inside = np.ones(s0.size, bool)
                    if window.t0 is not None:
                        inside &= s0 >= window.t0
                    if window.t1 is not None:
                        inside &= s0 < window.t1
                    counts += np.bincount(k[inside], minlength=n)
                s = s0 if window.t0 is None else np.maximum(s0, window.t0)
                e = e0 if window.t1 is None else np.minimum(e0, window.t1)
                keys.append(k)
                starts.append(s)
                ends.append(np.maximum(e, s))
            if keys:
                k, s, e = np.concatenate(keys), np.concatenate(starts), np.concatenate(ends)
                acc.add(k, s, e, key_order(k, start_order(s)))
    finally:
        con.unregister("__ops")
    return _ops_of(table, counts, acc.segments())


def _ops_of(table: pa.Table, counts: np.ndarray, segments: tuple[np.ndarray, np.ndarray, np.ndarray]) -> _Ops:
    columns = table.to_pydict()
    keys = [str(v) for v in columns["k"]]
    names = [str(v) if v is not None else keys[i] for i, v in enumerate(columns["name"])]
    return _Ops(keys, names, [str(v or "") for v in columns["layer"]], columns["stack"], columns["loc"],
                counts, segments)


def _stored_spans(profile: Profile, window: Window, con: duckdb.DuckDBPyConnection, ids: np.ndarray
                  ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """The whole execution's op spans as our recorder stored them (``HloInstruction.time_intervals``:
    the union of each op's instructions and DMA packets per execution -- this module's definition,
    checked by tests/formats/test_attribution.py) and its ``instruction_count``: no scan of the
    event tables. None for a window, or a profile whose HloInstruction another writer made."""
    hlo = TableSource(profile, "HloInstruction")
    if window.bounded or not hlo.present or not (hlo.has("time_intervals") and hlo.has("instruction_count")
                                                 and hlo.has("active_time_ns")):
        return None
    try:
        cols = con.execute(f"""SELECT raw_hlo_id AS k, x[1] AS s, x[2] AS e FROM (
                                   SELECT raw_hlo_id, unnest(CAST(time_intervals AS BIGINT[][])) AS x
                                   FROM {hlo.relation()} WHERE raw_hlo_id IS NOT NULL)""").fetchnumpy()
        counted = con.execute(f"SELECT raw_hlo_id, sum(instruction_count) FROM {hlo.relation()} "
                              f"WHERE raw_hlo_id IS NOT NULL GROUP BY 1").fetchall()
    except duckdb.Error:
        return None  # time_intervals not in our text form: scan the events instead
    n = ids.size
    raw = np.asarray(cols["k"], np.int64)
    k = np.minimum(np.searchsorted(ids, raw), n - 1)
    if raw.size and not bool(np.all(ids[k] == raw)):
        return None  # ops the instructions do not know: not ours, scan instead
    counts = np.zeros(n, np.int64)
    for key, count in counted:
        i = int(np.searchsorted(ids, key))
        if i < n and ids[i] == key:
            counts[i] += int(count or 0)
    acc = UnionAccumulator(keep_segments=True)
    s, e = np.asarray(cols["s"], np.int64), np.asarray(cols["e"], np.int64)
    acc.add(k, s, e, key_order(k, start_order(s)))  # spans of several executions: merged per op
    return counts, acc.segments()


# -- frames ----------------------------------------------------------------------------------------


def _frames(profile: Profile, con: duckdb.DuckDBPyConnection) -> tuple[dict[str, tuple[str, int, str]],
                                                                        dict[str, str]]:
    """StackFrame id (text) -> (file, line, function), and id -> parent id."""
    if not profile.num_rows("StackFrame"):
        return {}, {}
    rel = {t: TableSource(profile, t).relation() for t in
           ("StackFrame", "StackFrameFileLocation", "StackFrameFileName", "StackFrameFunctionName")}
    rows = con.execute(f"""
        SELECT f.id::VARCHAR, n.name, l.line_number, fn.name, f.parent_frame_id::VARCHAR
        FROM {rel['StackFrame']} f
        JOIN {rel['StackFrameFileLocation']} l ON CAST(l.id AS BIGINT) = f.file_location_id
        LEFT JOIN {rel['StackFrameFileName']} n ON CAST(n.id AS BIGINT) = l.file_name_id
        LEFT JOIN {rel['StackFrameFunctionName']} fn ON CAST(fn.id AS BIGINT) = l.function_name_id
        """).fetchall()
    frames = {str(r[0]): (str(r[1] or ""), int(r[2] or 0), str(r[3] or "")) for r in rows}
    parents = {str(r[0]): str(r[4]) for r in rows if r[4] not in (None, "", "0")}
    return frames, parents


def _stack_lines(text: str | None, frames: Mapping[str, tuple[str, int, str]],
                 parents: Mapping[str, str]) -> list[tuple[str, int, str]]:
    """Lines of a stack text (``[1, 2, 3]``, outermost first), innermost LAST, parents followed (a
    writer may list only the leaf), each line once."""
    if not text:
        return []
    ids = [str(i) for i in parse_ids(text).ids]
    chain: list[str] = []
    seen: set[str] = set()
    for frame in reversed(ids):  # innermost first while walking up
        while frame and frame not in seen:
            seen.add(frame)
            chain.append(frame)
            frame = parents.get(frame, "")
    out: list[tuple[str, int, str]] = []
    for frame in reversed(chain):
        where = frames.get(frame)
        if where is not None and where[0] and all((w[0], w[1]) != where[:2] for w in out):
            out.append(where)
    return out


_LOCATION = re.compile(r"^(?P<file>.+):(?P<line>\d+)(?::\d+)?$")


def _location_line(text: str | None) -> tuple[str, int, str] | None:
    match = _LOCATION.match(str(text or "").strip())
    return (match["file"], int(match["line"]), "") if match else None


# -- unions over groups of ops -----------------------------------------------------------------------


class _Spans:
    """Merged spans grouped by op, to union any set of ops quickly."""

    def __init__(self, segments: tuple[np.ndarray, np.ndarray, np.ndarray], n: int) -> None:
        key, s, e = segments
        order = np.lexsort((s, key))
        self.key, self.s, self.e = key[order], s[order], e[order]
        self.bounds = np.searchsorted(self.key, np.arange(n + 1))

    def of(self, op: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.bounds[op], self.bounds[op + 1]
        return self.s[a:b], self.e[a:b]

    def union(self, ops: Sequence[int]) -> int:
        if not ops:
            return 0
        if len(ops) == 1:
            s, e = self.of(ops[0])
            return int((e - s).sum())  # merged per op already
        parts = [self.of(o) for o in ops]
        return union_length(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def module_kind(layer: str) -> str:
    """The module name of a layer path: its last component without a list index (``down_proj``;
    ``model/layers.3`` -> ``layers``)."""
    last = layer.rpartition("/")[2]
    return re.sub(r"\.\d+$", "", last)


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def attribute(profile: Profile, window: Window | None = None,
              con: duckdb.DuckDBPyConnection | None = None, *, use_stored: bool = True) -> Attribution:
    """Op, layer, source-line and module-kind times of ``window`` (default: the whole execution).
    The whole execution of one of our profiles reads the op spans ``HloInstruction`` stores (the
    same union); ``use_stored=False`` scans the event tables anyway."""
    own = con is None
    con = con or sqlsource.connect(memory_limit="1GB")
    try:
        window = window if window is not None else whole(profile, con)
        out = Attribution(window)
        ops = _ops(profile, window, con, use_stored)
        if ops is None:
            return out
        n = len(ops.keys)
        spans = _Spans(ops.segments, n)
        length = window.length_ns
        for i in range(n):
            time = spans.union([i])
            out.ops[ops.keys[i]] = NodeTime(ops.keys[i], ops.names[i], "op", time, time,
                                            int(ops.instructions[i]), ops.layers[i], length)
        _layers(out, ops, spans)
        _lines(out, ops, spans, *_frames(profile, con))
        return out
    finally:
        if own:
            con.close()


def _layers(out: Attribution, ops: _Ops, spans: _Spans) -> None:
    under: dict[str, list[int]] = {}  # layer -> ops in it or below
    below: dict[str, list[int]] = {}  # layer -> ops strictly in its child layers
    for i, layer in enumerate(ops.layers):
        if not layer:
            continue
        prefixes = _prefixes(layer)
        for path in prefixes:
            under.setdefault(path, []).append(i)
        for path in prefixes[:-1]:
            below.setdefault(path, []).append(i)
    for path, members in under.items():
        inclusive = spans.union(members)
        children = spans.union(below.get(path, []))
        out.layers[path] = NodeTime(path, path.rpartition("/")[2], "layer", inclusive, inclusive - children,
                                    int(ops.instructions[members].sum()), path.rpartition("/")[0],
                                    out.window.length_ns)
    kinds: dict[str, list[str]] = {}
    for path in under:
        kinds.setdefault(module_kind(path), []).append(path)
    for name, paths in kinds.items():
        members = sorted({i for p in paths for i in under[p]})
        largest = max(paths, key=lambda p: (out.layers[p].inclusive_ns, p))
        out.kinds[name] = KindTime(name, spans.union(members), len(paths), largest,
                                   out.layers[largest].inclusive_ns)


def _lines(out: Attribution, ops: _Ops, spans: _Spans, frames: Mapping[str, tuple[str, int, str]],
           parents: Mapping[str, str]) -> None:
    inclusive: dict[Line, list[int]] = {}
    innermost: dict[Line, list[int]] = {}
    functions: dict[Line, str] = {}
    for i in range(len(ops.keys)):
        lines = _stack_lines(ops.stacks[i], frames, parents) if frames else []
        if not lines:
            located = _location_line(ops.locations[i])
            if located is None:
                continue
            lines = [located]
            out.by_location = out.by_location or not frames
        for file, number, function in lines:
            inclusive.setdefault((file, number), []).append(i)
            functions.setdefault((file, number), function)
        innermost.setdefault(lines[-1][:2], []).append(i)
    for line, members in inclusive.items():
        out.lines[line] = LineTime(line[0], line[1], functions.get(line, ""), spans.union(members),
                                   spans.union(innermost.get(line, [])),
                                   int(ops.instructions[members].sum()),
                                   tuple(ops.keys[i] for i in members))
