"""What the details panel says about one clicked event: every column of its row, why it waited, the
DMA it triggered, where it came from, and its dependencies with times to jump to.

    details = instruction_details(loaded, instruction_id, start_ts)
    details.fields        # [("opcode", "MATMUL"), ("engine", "Tensor"), ("start", "12.301 µs"), ...]
    details.dependencies  # [Dependency("successor", "dma_block", 37, "DMA_TRIGGER", ...), ...]

Every lookup is one small DuckDB query. The clicked event's start time comes with the click, so its
row is found through the row groups' time statistics instead of a scan for the id; dependencies
found in ``Flow`` are resolved to times (an instruction by id, a DMA transfer by its packets).

Semaphores: an instruction's operand text names what it waited on (``$S[8]>=16``: semaphore 8 at least
16, profile-schema §2.8); the last update of that semaphore reaching the value before the
instruction started is the event that released it -- shown as a predecessor with its source engine
(``AXI`` = a DMA completion written over the bus).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from explorer.gui.session import LoadedProfile
from explorer.gui.timeaxis import format_ns
from formats.read_api import TableSource, fmt_bytes, fmt_gbps, fmt_pct, parse_ids

_WAIT_RE = re.compile(r"\$S\[(\d+)\]\s*(>=|>|==|<=|<)\s*(-?\d+)")
# columns the details panel shows in its own lines above the rest (which follow in schema order)
_SHOWN = frozenset({"opcode", "compiler_opcode", "engine", "timeline_track", "operands", "start_ts", "end_ts",
                    "duration_ns", "evt_wait_time_ns", "hlo_name", "layer", "bir_debug_info_source_location",
                    "nki_source_location", "dma_trigger_start_ts", "dma_trigger_end_ts"})


@dataclass(frozen=True)
class Dependency:
    """One edge to or from the event: what is at the other end and when it ran (absolute ns)."""

    direction: str  # "predecessor" or "successor"
    table: str  # instruction, dma_block, semaphore, ...
    id: int | None
    kind: str
    start_ts: int | None
    end_ts: int | None
    text: str
    lane: tuple[str, str, int] | None = None  # the other end's timeline row: (kind, label, pcore)


@dataclass
class Details:
    """Everything the details panel shows about one event."""

    kind: str
    title: str
    id: int
    start_ts: int
    end_ts: int
    fields: list[tuple[str, str]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    dependencies: list[Dependency] = field(default_factory=list)
    source: tuple[str, int] | None = None  # (file, line)


def _rel(loaded: LoadedProfile, table: str) -> TableSource:
    return TableSource(loaded.profile, table)


def _time(loaded: LoadedProfile, ts: Any) -> str:
    if ts is None:
        return "–"
    return f"{format_ns(int(ts) - loaded.origin)}  (ts {int(ts)})"


def is_identifier(name: str) -> bool:
    """Columns whose values are names for rows (ids, indices, timestamps): shown as plain integers,
    never with thousands separators or in scientific notation (they are searched for and copied)."""
    return name in ("id", "pc") or name.endswith(("_id", "_idx", "_index", "_ts", "_ids"))


def plain_integer(value: Any) -> str | None:
    """``1234567`` / ``1234567.0`` -> ``"1234567"``; None when ``value`` is not a whole number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return None


def _value(name: str, value: Any) -> str:
    if value is None:
        return "–"
    if is_identifier(name):
        plain = plain_integer(value)
        if plain is not None:
            return plain
    if name.endswith("_ns") and isinstance(value, int):
        return format_ns(value)
    if name.endswith("_bytes") and isinstance(value, int):
        return fmt_bytes(value)
    if name.endswith("_percent") and isinstance(value, int | float):
        return fmt_pct(value)  # the schema's *_percent fields are fractions in [0, 1]
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int) and ("flops" in name or name.endswith("count")):
        return f"{value:,}"
    return str(value)


def parse_location(text: str | None) -> tuple[str, int] | None:
    """``file.py:123`` -> (``file.py``, 123)."""
    if not text or ":" not in text:
        return None
    path, _, line = text.rpartition(":")
    return (path, int(line)) if line.isdigit() and path else None


def instruction_details(
    loaded: LoadedProfile, instruction_id: int, start_ts: int | None = None
) -> Details | None:
    """The Instruction row ``id`` (found via its start time when given) with its context."""
    source = _rel(loaded, "Instruction")
    if not source.present:
        return None
    where = f"{source.col('id')} = ?" + (" AND start_ts = ?" if start_ts is not None else "")
    params: list[Any] = [int(instruction_id)] + ([int(start_ts)] if start_ts is not None else [])
    found = loaded.queries.rows(f"SELECT * FROM ({source.conformed_select()}) WHERE {where} LIMIT 1", params)
    if not found and start_ts is not None:
        found = loaded.queries.rows(
            f"SELECT * FROM ({source.conformed_select()}) WHERE id = ? LIMIT 1", [int(instruction_id)]
        )
    if not found:
        return None
    row = found[0]
    start, end = int(row["start_ts"]), int(row["end_ts"])
    details = Details(
        "instruction", f"{row.get('opcode')} on {row.get('engine')}", int(row["id"]), start, end, raw=row
    )
    f = details.fields
    f.append(("opcode", _value("opcode", row.get("opcode"))))
    if row.get("compiler_opcode") and row.get("compiler_opcode") != row.get("opcode"):
        f.append(("compiler opcode", str(row["compiler_opcode"])))
    f.append(
        (
            "engine",
            f"{row.get('engine')}"
            + (
                f" / {row['timeline_track']}"
                if row.get("timeline_track") and row["timeline_track"] != row.get("engine")
                else ""
            ),
        )
    )
    f.append(("operands", _value("operands", row.get("operands"))))
    f.append(("start", _time(loaded, start)))
    f.append(("duration", format_ns(end - start)))
    f.append(("end", _time(loaded, end)))
    wait = row.get("evt_wait_time_ns")
    f.append(("semaphore wait", format_ns(int(wait)) if wait is not None else "–"))
    if row.get("dma_trigger_start_ts") is not None:
        f.append(
            (
                "DMA triggered",
                f"{_time(loaded, row['dma_trigger_start_ts'])} → "
                f"{format_ns(int(row['dma_trigger_end_ts'] or 0) - loaded.origin)}",
            )
        )
    f.append(("HLO op", _value("hlo_name", row.get("hlo_name"))))
    f.append(("layer", _value("layer", row.get("layer"))))
    location = row.get("bir_debug_info_source_location") or row.get("nki_source_location")
    details.source = parse_location(location) or innermost_frame(loaded, row.get("stack_frame_ids"))
    f.append(
        ("source line", location or (f"{details.source[0]}:{details.source[1]}" if details.source else "–"))
    )
    for name, value in row.items():
        if name not in _SHOWN and value is not None:
            f.append((name, _value(name, value)))
    details.dependencies = flow_dependencies(loaded, "instruction", int(row["id"]))
    details.dependencies += semaphore_waits(loaded, row)
    return details


def innermost_frame(loaded: LoadedProfile, stack_frame_ids: str | None) -> tuple[str, int] | None:
    """(file, line) of the innermost frame of a ``stack_frame_ids`` text list."""
    if not stack_frame_ids:
        return None
    ids = [str(i) for i in parse_ids(stack_frame_ids).ids]
    if not ids or not loaded.profile.has("StackFrame"):
        return None
    frame, location, name = (
        _rel(loaded, t).relation() for t in ("StackFrame", "StackFrameFileLocation", "StackFrameFileName")
    )
    found = loaded.queries.rows(
        f"""
        SELECT n.name AS file, l.line_number AS line
        FROM {frame} f JOIN {location} l ON CAST(l.id AS BIGINT) = f.file_location_id
                       JOIN {name} n ON CAST(n.id AS BIGINT) = l.file_name_id
        WHERE f.id = ?""",
        [ids[-1]],
    )
    if not found or found[0]["file"] is None:
        return None
    return str(found[0]["file"]), int(found[0]["line"] or 0)


def flow_dependencies(loaded: LoadedProfile, table: str, row_id: int) -> list[Dependency]:
    """Edges of ``Flow`` into and out of (table, id), each resolved to its other end's times."""
    flow = _rel(loaded, "Flow")
    if not flow.present:
        return []
    edges = loaded.queries.rows(
        f"""
        SELECT in_id, out_id, in_table, out_table, dependency_type, gap_time FROM {flow.relation()}
        WHERE (lower(in_table) = ? AND in_id = ?) OR (lower(out_table) = ? AND out_id = ?) LIMIT 200""",
        [table, row_id, table, row_id],
    )
    out = []
    for edge in edges:
        successor = str(edge["in_table"]).lower() == table and int(edge["in_id"]) == row_id
        other_table = str(edge["out_table"] if successor else edge["in_table"]).lower()
        other_id = int(edge["out_id"] if successor else edge["in_id"])
        start, end, text, lane = resolve(loaded, other_table, other_id)
        kind = str(edge["dependency_type"] or "")
        out.append(
            Dependency(
                "successor" if successor else "predecessor", other_table, other_id, kind, start, end, text,
                lane,
            )
        )
    return out


Lane = tuple[str, str, int]


def resolve(
    loaded: LoadedProfile, table: str, row_id: int
) -> tuple[int | None, int | None, str, Lane | None]:
    """(start, end, one-line description, timeline row) of a Flow endpoint."""
    if table == "instruction":
        source = _rel(loaded, "Instruction")
        engine = source.col("engine")
        found = loaded.queries.rows(
            f"SELECT start_ts, end_ts, {engine} AS engine, opcode, "
            f"{source.col('hlo_name')} AS hlo, coalesce({source.col('timeline_track')}, {engine}) AS track, "
            f"coalesce({source.col('pcore_idx')}, 0) AS pcore FROM {source.relation()} WHERE id = ? LIMIT 1",
            [row_id],
        )
        if found:
            r = found[0]
            lane = ("instruction", str(r["track"]), int(r["pcore"]))
            text = f"{r['opcode']} on {r['engine']} ({r['hlo'] or '–'})"
            return int(r["start_ts"]), int(r["end_ts"]), text, lane
        return None, None, f"instruction {row_id} (not in this profile)", None
    if table in ("dma_block", "dma", "dmapacketaggregated"):
        source = _rel(loaded, "DmaPacket")
        found = loaded.queries.rows(
            f"""
            SELECT min(start_ts) AS s, max(end_ts) AS e, any_value({source.col("queue_name")}) AS q,
                   sum(transfer_bytes) AS nbytes, count(*) AS n,
                   any_value(coalesce({source.col("pcore_idx")}, 0)) AS pcore
            FROM {source.relation()} WHERE packet_aggregation_id = ?""",
            [row_id],
        )
        if found and found[0]["s"] is not None:
            r = found[0]
            return (
                int(r["s"]),
                int(r["e"]),
                f"DMA transfer {row_id} on {r['q']}: {fmt_bytes(r['nbytes'] or 0)} in {r['n']} packet(s)",
                None if r["q"] is None else ("dma", str(r["q"]), int(r["pcore"] or 0)),
            )
        return None, None, f"DMA transfer {row_id} (no packets recorded)", None
    return None, None, f"{table} {row_id}", None


def semaphore_waits(loaded: LoadedProfile, row: dict[str, Any]) -> list[Dependency]:
    """The semaphore updates that released each ``$S[n] >= v`` condition of the instruction."""
    operands = str(row.get("operands") or "") + " " + str(row.get("compiler_operands") or "")
    source = _rel(loaded, "SemaphoreUpdate")
    if not source.present:
        return []
    start = int(row["start_ts"])
    wait = int(row.get("evt_wait_time_ns") or 0)
    out = []
    for number, op, value in _WAIT_RE.findall(operands)[:4]:
        if op not in (">=", ">", "=="):
            continue
        found = loaded.queries.rows(
            f"""
            SELECT timestamp, value, {source.col("update_source")} AS src FROM {source.relation()}
            WHERE id = ? AND timestamp <= ? AND timestamp >= ? AND value {op} ?
            ORDER BY timestamp DESC LIMIT 1""",
            [number, start, start - max(wait, 0) - 1_000_000, int(value)],
        )
        if found:
            r = found[0]
            t = int(r["timestamp"])
            out.append(
                Dependency(
                    "predecessor",
                    "semaphore",
                    int(number),
                    f"S[{number}] {op} {value}",
                    t,
                    t,
                    f"S[{number}] reached {r['value']} (update from {r['src']}), "
                    f"{format_ns(start - t)} before the start",
                )
            )
    return out


def dma_details(loaded: LoadedProfile, transfer_id: int, start_ts: int | None = None) -> Details | None:
    """A DMA transfer (packets sharing ``packet_aggregation_id``)."""
    source = _rel(loaded, "DmaPacket")
    if not source.present:
        return None
    rows = loaded.queries.rows(
        f"SELECT * FROM ({source.conformed_select()}) WHERE packet_aggregation_id = ? "
        f"ORDER BY start_ts LIMIT 1000",
        [int(transfer_id)],
    )
    if not rows:
        return None
    start = min(int(r["start_ts"]) for r in rows)
    end = max(int(r["end_ts"]) for r in rows)
    first = rows[0]
    details = Details(
        "dma",
        f"DMA transfer {transfer_id} on {first.get('queue_name')}",
        int(transfer_id),
        start,
        end,
        raw=first,
    )
    total = sum(int(r["transfer_bytes"] or 0) for r in rows)
    details.fields += [
        ("queue", f"{first.get('queue_name')} ({first.get('queue_type')})"),
        ("start", _time(loaded, start)),
        ("duration", format_ns(end - start)),
        ("end", _time(loaded, end)),
        ("packets", f"{len(rows)}"),
        ("bytes", fmt_bytes(total)),
        ("throughput", fmt_gbps(total / max(1, end - start) * 1e9)),
        ("DMA engines", ", ".join(sorted({str(r.get("engine_idx")) for r in rows}))),
    ]
    for name in ("variable", "raw_hlo_id", "hbm_read_bytes", "hbm_write_bytes"):
        if first.get(name) is not None:
            details.fields.append(
                (
                    name,
                    _value(
                        name, sum(int(r[name] or 0) for r in rows) if name.endswith("bytes") else first[name]
                    ),
                )
            )
    details.dependencies = flow_dependencies(loaded, "dma_block", int(transfer_id))
    return details


def cc_details(loaded: LoadedProfile, op_id: int, start_ts: int | None = None) -> Details | None:
    """A collective operation (``CcOp`` row)."""
    source = _rel(loaded, "CcOp")
    if not source.present:
        return None
    where = "op_id = ?" + (" AND start_ts = ?" if start_ts is not None else "")
    params = [int(op_id)] + ([int(start_ts)] if start_ts is not None else [])
    rows = loaded.queries.rows(f"SELECT * FROM ({source.conformed_select()}) WHERE {where} LIMIT 1", params)
    if not rows:
        return None
    r = rows[0]
    details = Details(
        "cc",
        f"{r.get('operation')} ({r.get('algorithm')})",
        int(op_id),
        int(r["start_ts"]),
        int(r["end_ts"]),
        raw=r,
    )
    details.fields += [
        ("start", _time(loaded, r["start_ts"])),
        ("duration", format_ns(int(r["duration_ns"]))),
        ("end", _time(loaded, r["end_ts"])),
    ]
    details.fields += [
        (k, _value(k, v))
        for k, v in r.items()
        if v is not None and k not in ("start_ts", "end_ts", "duration_ns")
    ]
    return details


def details_for(loaded: LoadedProfile, kind: str, row_id: int, start_ts: int | None) -> Details | None:
    """Dispatch on the row kind of a clicked event."""
    if kind == "instruction":
        return instruction_details(loaded, row_id, start_ts)
    if kind == "dma":
        return dma_details(loaded, row_id, start_ts)
    if kind == "cc":
        return cc_details(loaded, row_id, start_ts)
    if kind == "active":
        return active_details(loaded, start_ts)
    return None


def active_details(loaded: LoadedProfile, start_ts: int | None) -> Details | None:
    """A busy stretch of the Tensor engine (``ActiveTime``): the union of its two rows' instructions."""
    source = _rel(loaded, "ActiveTime")
    if not source.present or start_ts is None:
        return None
    rows = loaded.queries.rows(
        f"SELECT * FROM ({source.conformed_select()}) WHERE start_ts = ? LIMIT 1", [int(start_ts)]
    )
    if not rows:
        return None
    r = rows[0]
    start, end = int(r["start_ts"]), int(r["end_ts"])
    details = Details("active", "Tensor engine busy (LoadStationary ∪ MATMUL)", start, start, end, raw=r)
    details.fields += [
        ("start", _time(loaded, start)),
        ("duration", format_ns(end - start)),
        ("end", _time(loaded, end)),
        ("engine", str(r.get("engine"))),
        ("pcore_idx", _value("pcore_idx", r.get("pcore_idx"))),
        ("what", "a stretch in which at least one Tensor instruction (either row) ran: the union the "
                 "Summary's Tensor active time adds up"),
    ]
    return details


__all__ = ["Dependency", "Details", "details_for", "instruction_details", "parse_location"]
