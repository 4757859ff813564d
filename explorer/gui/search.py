"""Search instructions by opcode, HLO name, layer or operand text: a results list and a highlight.

    result = search(loaded, "hlo_name", "dot", regex=False)
    result.total, result.rows[0]["start_ts"]      # every match counted, the first LIMIT listed
    result.where                                  # the same condition, to highlight on the timeline

Matching is case-insensitive substring (``ILIKE``) or, with ``regex``, ``regexp_matches`` with the
``i`` flag. Values go to DuckDB as bound parameters for the listing; the highlight condition (which
``formats.tracks`` runs as text) quotes them with ``literal``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from explorer.gui.session import LoadedProfile
from formats.read_api import TableSource, literal

FIELDS = {
    "opcode": "opcode",
    "hlo_name": "HLO op",
    "layer": "layer",
    "operands": "operands",
    "any": "any field",
}
LIMIT = 500


class SearchError(ValueError):
    """An invalid pattern; ``str()`` is one line."""


@dataclass
class SearchResult:
    field: str
    text: str
    regex: bool
    total: int
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # not field(): a member's name
    where: str = "false"


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def condition(source: TableSource, field_name: str, text: str, regex: bool) -> tuple[str, list[Any], str]:
    """(SQL with ? parameters, parameters, the same SQL with the values inlined)."""
    columns = list(FIELDS)[:-1] if field_name == "any" else [field_name]
    if field_name not in FIELDS:
        raise SearchError(f"cannot search field {field_name!r}: one of {', '.join(FIELDS)}")
    parts, params, inline = [], [], []
    for column in columns:
        expr = f"CAST({source.col(column, engines=False)} AS VARCHAR)"
        if regex:
            parts.append(f"regexp_matches({expr}, ?, 'i')")
            inline.append(f"regexp_matches({expr}, {literal(text)}, 'i')")
            params.append(text)
        else:
            pattern = f"%{_escape_like(text)}%"
            parts.append(f"{expr} ILIKE ? ESCAPE '\\'")
            inline.append(f"{expr} ILIKE {literal(pattern)} ESCAPE '\\'")
            params.append(pattern)
    return "(" + " OR ".join(parts) + ")", params, "(" + " OR ".join(inline) + ")"


def search(
    loaded: LoadedProfile, field_name: str, text: str, regex: bool = False, limit: int = LIMIT
) -> SearchResult:
    source = TableSource(loaded.profile, "Instruction")
    result = SearchResult(field_name, text, regex, 0)
    if not text or not source.present:
        return result
    if regex:
        import re

        try:
            re.compile(text)
        except re.error as exc:
            raise SearchError(f"not a regular expression: {exc}") from None
    sql, params, inline = condition(source, field_name, text, regex)
    try:
        total = loaded.queries.rows(f"SELECT count(*) AS n FROM {source.relation()} WHERE {sql}", params)
        result.total = int(total[0]["n"])
        result.rows = loaded.queries.rows(
            f"""
            SELECT id, start_ts, end_ts, {source.col("engine")} AS engine,
                   {source.col("timeline_track")} AS track,
                   {source.col("pcore_idx")} AS pcore, opcode, {source.col("hlo_name")} AS hlo_name,
                   {source.col("layer")} AS layer, operands
            FROM {source.relation()} WHERE {sql} ORDER BY start_ts LIMIT {int(limit)}""",
            params,
        )
    except Exception as exc:  # DuckDB rejects some patterns RE2 cannot compile
        if "regex" in str(exc).lower() or "pattern" in str(exc).lower():
            raise SearchError(f"invalid pattern: {' '.join(str(exc).split())[:200]}") from None
        raise
    result.where = inline
    return result
