"""Everything the viewer asks of one profile, as immutable snapshots; safe to call from worker threads.

The UI thread never runs a query: it starts a worker that calls one of these methods and hands the
returned snapshot back (``explorer.viewer.viewer_app``). Big tables are never loaded whole:

* ``overview()`` -- the Summary row (stored, or computed by ``formats.summary`` when a real profile has
  none), the small hierarchy tables, what is missing. Cheap whatever the instruction count: this is
  what "open-to-interactive" waits for.
* ``analyse()`` -- one grouped DuckDB scan of ``Instruction`` (per op x engine x stack: counts, time,
  FLOPs, bytes, waits) plus two small ones of ``DmaPacket`` and ``CcOp``; the result is a few thousand
  rows however big the profile, from which come per-engine counts, MFU per node, code linking and
  the problem list.
* ``instruction_page()`` -- one page of an op's instructions (``LIMIT``/``OFFSET`` in time order), so
  expanding an op with a million instructions costs one page.

Each call opens its own DuckDB cursor (DuckDB cursors may run concurrently on different threads), so
an expand does not wait behind the analysis scan.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb

from explorer.viewer import bottomup, code_links, engine_strip, problems
from explorer.viewer import tree_build as tree
from explorer.viewer.summary_figures import engine_active, figures, total_ns
from explorer.viewer.text import fmt_ns
from explorer.viewer.view_model import (
    ENGINES,
    Analysis,
    EngineStrip,
    LineStat,
    Node,
    NodeStats,
    Overview,
    SourceFile,
    SourceIndex,
    frozen_map,
)
from formats.read_api import (
    Attribution,
    Profile,
    ProfileError,
    SourceAccess,
    TableSource,
    capture_state,
    connect,
    literal,
    load_hierarchy,
    read_source,
)

PAGE = 100
FEATURES = (  # (table, what the viewer loses without it) -- for the "missing" lines
    ("Summary", "summary computed from the event tables"),
    ("FrameworkNode", "layers built from Instruction.layer"),
    ("HloInstruction", "ops built from Instruction; op times are sums of instruction durations"),
    ("StackFrame", "no stack frames: code linking from source-location columns only"),
    ("Instruction", "no instructions: no per-engine counts, timeline or instruction rows"),
    ("DmaPacket", "no DMA packets: no DMA figures or small-transfer check"),
)


class ProfileData:
    """One opened profile (``formats.reader.Profile``) and the viewer's queries over it."""

    def __init__(self, profile: Profile, name: str, source_root: Path | None = None) -> None:
        self.profile = profile
        self.name = name
        self.source_root = source_root
        self.access = SourceAccess.for_profile(profile.metadata, source_root)
        self.instr = TableSource(profile, "Instruction")
        self.con = connect(memory_limit="1GB")
        self._lock = threading.Lock()
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        self._summary: dict[str, Any] | None = None
        self._tensor_split: bool | None = None
        meta = profile.metadata
        try:
            self.peak_flops_per_s: float | None = (
                2.0
                * float(meta["tensor_engine_num_rows"])
                * float(meta["tensor_engine_num_cols"])
                * float(meta["tensor_engine_clock_freq"])
                * 1e9
            )
        except (KeyError, TypeError, ValueError):
            self.peak_flops_per_s = None

    def close(self) -> None:
        """Close the connection when the viewer quits, stopping any worker's query. DuckDB reports a
        connection with a running query "busy with another call" (a second close says "already
        closed"); neither may escape the app's unmount."""
        with self._lock:
            # Closing does not stop a running query (DuckDB refuses, "busy"), so each worker's cursor
            # is interrupted first; one taken but not yet run is closed, so its execute() fails at
            # once instead of running its query to the end after the viewer has gone.
            for cursor in list(self._cursors):
                with contextlib.suppress(duckdb.Error):
                    cursor.interrupt()
                with contextlib.suppress(duckdb.Error):
                    cursor.close()
            with contextlib.suppress(duckdb.Error):
                self.con.close()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            cursor = self.con.cursor()
            self._cursors.add(cursor)
            return cursor

    def _rows(self, sql: str) -> list[dict[str, Any]]:
        cur = self._cursor()
        try:
            result = cur.execute(sql)
            names = [d[0] for d in result.description]
            return [dict(zip(names, row)) for row in result.fetchall()]
        except duckdb.Error as exc:
            raise ProfileError(
                f"{self.profile.path}: cannot read the profile: {' '.join(str(exc).split())[:200]}"
            ) from None
        finally:
            cur.close()

    # -- overview --------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        from formats.read_api import summary_row

        if self._summary is None:
            self._summary = (
                dict(summary_row(self.profile))
                if self.profile.has("Instruction") or self.profile.has("Summary")
                else {}
            )
        return self._summary

    def overview(self) -> Overview:
        row = self.summary()
        hierarchy = tree.from_hierarchy(load_hierarchy(self.profile))
        missing = []
        for table, loss in FEATURES:
            if self.profile.num_rows(table) == 0:
                if table == "StackFrame" and not self.instr.present:
                    continue
                missing.append(f"{table}: missing -- {loss}")
        notes = list(self.profile.notes)
        state = capture_state(self.profile.path)
        complete = self.profile.complete and not state.incomplete
        mark = "" if complete else "INCOMPLETE" + (f": {state.reason}" if state.reason else "")
        if not complete:
            notes.insert(
                0, "incomplete profile: the capture was interrupted; figures cover what was recorded"
            )
        if state.warm_up:
            asked = f" (asked for {state.requested_execution})" if state.requested_execution else ""
            warm = f"warm-up execution {state.execution or '?'}{asked}: the program ran the model fewer times"
            notes.insert(0, warm)
            mark = f"{mark}; {warm}" if mark else warm
        notes += [f"{w.category}: {w.message}" for w in self.profile.warnings[:3]]
        return Overview(
            self.name,
            figures(row),
            engine_active(row),
            tuple(missing),
            tuple(notes),
            total_ns(row),
            self._span(),
            hierarchy,
            "stored Summary" if self.profile.num_rows("Summary") else "Summary computed from events",
            complete,
            mark,
        )

    def _small(self, name: str) -> list[dict[str, Any]]:
        return self.profile.table(name).to_pylist() if self.profile.num_rows(name) else []

    def _span(self) -> tuple[int, int] | None:
        meta = self.profile.metadata
        first, last = meta.get("first_hw_timestamp"), meta.get("last_hw_timestamp")
        if first is not None and last is not None and int(last) > int(first):
            return int(first), int(last)
        if not self.instr.present:
            return None
        row = self._rows(f"SELECT min(start_ts) AS a, max(end_ts) AS b FROM {self.instr.relation()}")[0]
        if row["a"] is None or row["b"] is None or row["b"] <= row["a"]:
            return None
        return int(row["a"]), int(row["b"])

    # -- analysis --------------------------------------------------------------------------------
    def analyse(self, overview: Overview) -> Analysis:
        ops = self._op_aggregates() if self.instr.present else []
        frames = code_links.Frames(
            self._small("StackFrame"),
            self._small("StackFrameFileLocation"),
            self._small("StackFrameFileName"),
        )
        builder = code_links.IndexBuilder(frames)
        aggregates: dict[str, tree.OpAggregate] = {}
        for row in ops:
            raw, name = row.get("raw_hlo_id"), row.get("hlo_name")
            ref: tuple[str, str | int] | None = (
                ("raw_hlo_id", int(raw))
                if raw is not None
                else (("hlo_name", str(name)) if name is not None else None)
            )
            key = tree.hlo_key(ref)
            agg = aggregates.get(key)
            if agg is None:
                label = str(name) if name is not None else (str(raw) if raw is not None else "(no HLO op)")
                agg = aggregates[key] = tree.OpAggregate(ref, label, None)
            agg.add(row)
            builder.add(key, row.get("stack"), row.get("loc"), int(row["dur"] or 0), int(row["n"]))
        for agg in aggregates.values():
            agg.layer = agg.main_layer
        dma_hbm = self._dma_hbm_by_op()
        hierarchy = tree.merge_scan(
            overview.hierarchy, list(aggregates.values()), self.peak_flops_per_s, dma_hbm
        )
        for key, agg in aggregates.items():  # the layer the tree shows the op under (kinds group by it)
            node = hierarchy.nodes.get(key)
            if node is not None and node.layer:
                agg.layer = node.layer
        parents = {key: hierarchy.ancestors(key) for key in aggregates if key in hierarchy.nodes}
        available = (
            bool(frames)
            or self.instr.has("nki_source_location")
            or self.instr.has("bir_debug_info_source_location")
        )
        index = builder.build(
            parents,
            available,
            "" if builder.lines else "no source lines: the profile has no stack frames or source locations",
        )
        from formats.read_api import attribute, find, from_summary

        attribution = attribute(self.profile)  # the figures' op/layer/line/kind times (one definition)
        index = self._line_times(index, attribution)
        # the whole execution's figures as the Summary holds them (= formats.figures over the whole
        # execution, without scanning the events again)
        whole = from_summary(self.summary(), self.profile.metadata)
        found = problems.from_findings(find(self.profile, whole, attribution), hierarchy)
        waits = {key: agg.tensor_wait_ns for key, agg in aggregates.items()}
        kinds = {name: kind.inclusive_ns for name, kind in attribution.kinds.items()}
        return Analysis(hierarchy, index, found, bottomup.build(hierarchy, waits, kinds))

    @staticmethod
    def _line_times(index: SourceIndex, attribution: Attribution) -> SourceIndex:
        """Line times from ``formats.attribution`` (docs/figures.md): the union of the events of the
        ops under each line, the intervals the tree's nodes use, so lines and nodes reconcile."""
        if not index.lines:
            return index
        times = attribution.lines
        lines = {}
        for line in index.lines:
            mine = times.get(line)  # absent: instructions of no HLO op, no op events to measure
            lines[line] = LineStat(0, 0) if mine is None else LineStat(mine.inclusive_ns, mine.instructions)
        return replace(index, lines=frozen_map(lines))

    def _op_aggregates(self) -> list[dict[str, Any]]:
        col, has = self.instr.col, self.instr.has
        pe = (
            f"greatest(coalesce({col('raw_flops')}, 0), coalesce({col('flops_transpose')}, 0))"
            if has("raw_flops") or has("flops_transpose")
            else "NULL::BIGINT"
        )
        transpose = (
            f"coalesce({col('flops_transpose')}, CASE WHEN {col('tensor_instruction_type')} = 'TRANSPOSE' "
            f"THEN {col('raw_flops')} END, 0)"
            if has("raw_flops") or has("flops_transpose")
            else "NULL::BIGINT"
        )
        hbm = (
            f"coalesce({col('hbm_read_bytes')}, 0) + coalesce({col('hbm_write_bytes')}, 0)"
            if has("hbm_read_bytes") or has("hbm_write_bytes")
            else "NULL::BIGINT"
        )
        loc = f"coalesce({col('nki_source_location')}, {col('bir_debug_info_source_location')})"
        return self._rows(f"""
            SELECT layer, hlo_name, raw_hlo_id, stack, loc, engine, count(*) AS n,
                   sum(duration_ns) AS dur, min(start_ts) AS t0, max(end_ts) AS t1,
                   sum(pe) AS pe, sum(ft) AS ft, sum(pe - ft) AS model,
                   sum(hbm) AS hbm, sum(spill) AS spill, sum(wait) AS wait
            FROM (SELECT {col("layer")} AS layer, {col("hlo_name")} AS hlo_name,
                         {col("raw_hlo_id")} AS raw_hlo_id, {col("stack_frame_ids")} AS stack, {loc} AS loc,
                         {col("engine")} AS engine, {col("duration_ns")} AS duration_ns, start_ts, end_ts,
                         {pe} AS pe, {transpose} AS ft, {hbm} AS hbm, {col("spill_reload_bytes")} AS spill,
                         {col("evt_wait_time_ns")} AS wait
                  FROM {self.instr.relation()})
            GROUP BY ALL ORDER BY ALL""")

    def _dma_hbm_by_op(self) -> dict[int, int]:
        """HBM bytes the DMA packets of each op move (our ``DmaPacket.raw_hlo_id`` extension)."""
        packets = TableSource(self.profile, "DmaPacket")
        if not packets.present or not (packets.has("hbm_read_bytes") or packets.has("hbm_write_bytes")):
            return {}
        hbm = f"coalesce({packets.col('hbm_read_bytes')}, 0) + coalesce({packets.col('hbm_write_bytes')}, 0)"
        rows = self._rows(f"""
            SELECT {packets.col("raw_hlo_id")} AS op, sum({hbm}) AS hbm
            FROM {packets.relation()} GROUP BY ALL""")
        return {int(r["op"]): int(r["hbm"]) for r in rows if r["op"] is not None and r["hbm"] is not None}

    # -- on demand -------------------------------------------------------------------------------
    def instruction_page(self, node: Node, offset: int = 0, limit: int = PAGE) -> tuple[Node, ...]:
        """Instructions ``offset .. offset+limit`` of op ``node`` in time order, then a "more" row if any."""
        if not self.instr.present:
            return (Node(f"X:{node.key}", "info", "no Instruction table in this profile", node.key),)
        col = self.instr.col
        ref = node.hlo_ref
        if ref is None:
            where = f"{col('raw_hlo_id')} IS NULL AND {col('hlo_name')} IS NULL"
        elif ref[0] == "raw_hlo_id":
            where = f"{col('raw_hlo_id')} = {int(ref[1])}"
        else:
            where = f"{col('hlo_name')} = {literal(str(ref[1]))}"
        if node.stats.span is not None:  # lets DuckDB skip row groups outside the op's span
            where += f" AND start_ts BETWEEN {node.stats.start_ts} AND {node.stats.end_ts}"
        flops = (
            f"greatest(coalesce({col('raw_flops')}, 0), coalesce({col('flops_transpose')}, 0)) - "
            f"coalesce({col('flops_transpose')}, 0)"
        )
        hbm = f"coalesce({col('hbm_read_bytes')}, 0) + coalesce({col('hbm_write_bytes')}, 0)"
        rows = self._rows(f"""
            SELECT id, {col("engine")} AS engine, {col("opcode")} AS opcode, start_ts, end_ts,
                   {col("duration_ns")} AS dur, {hbm} AS hbm, {flops} AS model,
                   {col("evt_wait_time_ns")} AS wait, {col("operands")} AS operands
            FROM {self.instr.relation()} WHERE {where}
            ORDER BY start_ts, id LIMIT {limit + 1} OFFSET {int(offset)}""")
        out = []
        for i, row in enumerate(rows[:limit]):
            engine = str(row["engine"])
            counts = tuple(1 if e == engine else 0 for e in ENGINES)
            dur = int(row["dur"] if row["dur"] is not None else row["end_ts"] - row["start_ts"])
            stats = NodeStats(
                time_ns=dur,
                start_ts=int(row["start_ts"]),
                end_ts=int(row["end_ts"]),
                hbm_bytes=int(row["hbm"]) if self.instr.has("hbm_read_bytes") else None,
                mfu=tree.mfu(row["model"], dur, self.peak_flops_per_s)
                if self.instr.has("raw_flops")
                else None,
                counts=counts,
                instructions=1,
            )
            out.append(
                Node(
                    f"I:{node.key}:{offset + i}",
                    "instr",
                    str(row["opcode"]),
                    node.key,
                    stats,
                    detail=instruction_detail(engine, row["id"], row["wait"], row["operands"]),
                )
            )
        if len(rows) > limit:
            total = node.stats.instructions
            left = f"{total - offset - limit:,} more" if total is not None else "more"
            out.append(
                Node(
                    f"M:{node.key}:{offset + limit}",
                    "more",
                    f"… {left} (enter loads {PAGE})",
                    node.key,
                    offset=offset + limit,
                )
            )
        return tuple(out)

    def source_file(self, recorded: str, confirmed: Collection[Path] = ()) -> SourceFile:
        """A source file under ``formats.source_access``'s rule; ``confirmed``: real paths the user
        agreed to read although they are outside the trusted roots."""
        return read_source(recorded, replace(self.access, confirmed=frozenset(confirmed)))

    def timeline(self, t0: int, t1: int, cells: int) -> EngineStrip:
        if not self.instr.present:
            return EngineStrip(t0, t1, (), "no Instruction table")
        return engine_strip.strip(self.profile, t0, t1, cells, split_tensor=self._split_tensor())

    def _split_tensor(self) -> bool:
        """Whether the Tensor engine has its two timeline rows here (LoadStationary and MATMUL)."""
        if self._tensor_split is None:
            self._tensor_split = self.instr.has("timeline_track") and bool(
                self._rows(f"SELECT 1 AS x FROM {self.instr.relation()} "
                           f"WHERE {self.instr.col('timeline_track')} = 'TensorMatrix' LIMIT 1")
            )
        return self._tensor_split


def instruction_detail(engine: str, ident: Any, wait_ns: Any, operands: Any) -> str:
    """What an instruction row says after its opcode: engine and id, how long it waited on semaphores
    (``evt_wait_time_ns``; "-" when the profile has no such column) and its operand text."""
    wait = "-" if wait_ns is None else fmt_ns(int(wait_ns))
    text = f"{engine} #{ident}  wait {wait}"
    if operands:
        shown = " ".join(str(operands).split())[:240]
        text += "  " + "".join(c if c.isprintable() else "\ufffd" for c in shown)
    return text
