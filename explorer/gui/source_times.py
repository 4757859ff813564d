"""Source view data: time per line of the framework's files, and the instructions of chosen lines.

    view = load_source_times(loaded)
    view.files[0].path, view.files[0].self_ns          # the file where most time was spent
    view.lines[(path, 42)].inclusive_ns                 # time of everything called from line 42
    view.where([(path, 42)])                            # SQL selecting those instructions

From ``Instruction.stack_frame_ids`` (text lists of ``StackFrame`` ids, outermost first) resolved
through ``StackFrame`` -> ``StackFrameFileLocation`` -> ``StackFrameFileName``: each distinct stack
is read once (one grouped scan: a profile has few distinct stacks). Its lines' times are
``formats.attribution``'s: **inclusive** = the union of the events of every op the line is on the
stack of, **self** = of the ops whose innermost frame it is -- the tree's intervals, so lines and
nodes reconcile (docs/figures.md). Profiles without stack frames fall back to
``bir_debug_info_source_location`` / ``nki_source_location`` (``file.py:line``; self = inclusive).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from explorer.gui.session import LoadedProfile
from formats.read_api import SourceAccess, SourceStatus, TableSource, literal, parse_ids
from formats.read_api import read_source as read_source_text


@dataclass
class LineTime:
    inclusive_ns: int = 0
    self_ns: int = 0
    instructions: int = 0
    function: str = ""


@dataclass
class FileTime:
    path: str
    self_ns: int
    inclusive_ns: int


@dataclass
class SourceTimes:
    lines: dict[tuple[str, int], LineTime] = field(default_factory=dict)
    files: list[FileTime] = field(default_factory=list)
    stacks: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # stack text -> its lines
    by_location: bool = False  # no stack frames: lines come from the location columns
    note: str = ""
    access: SourceAccess = field(default_factory=SourceAccess)  # which files may be read without asking

    def lines_of(self, path: str) -> dict[int, LineTime]:
        return {line: t for (p, line), t in self.lines.items() if p == path}

    def where(self, chosen: Iterable[tuple[str, int]]) -> str:
        """A SQL condition over Instruction selecting the instructions of the chosen lines."""
        chosen = set(chosen)
        if not chosen:
            return "false"
        if self.by_location:
            texts = ", ".join(literal(f"{p}:{n}") for p, n in sorted(chosen))
            return f"(bir_debug_info_source_location IN ({texts}) OR nki_source_location IN ({texts}))"
        stacks = [text for text, lines in self.stacks.items() if chosen & set(lines)]
        if not stacks:
            return "false"
        return "stack_frame_ids IN (" + ", ".join(literal(s) for s in stacks) + ")"


def read_source(path: str, access: SourceAccess | None = None) -> list[str] | None:
    """The file's lines, or None when it is not readable here or not allowed: the one rule of
    ``formats.source_access`` (under the capture's recorded working directory, regular files only,
    size-capped; anything else only once the user confirmed it, which ``access`` carries)."""
    text = read_source_text(path, access if access is not None else SourceAccess())
    return list(text.lines) if text.status is SourceStatus.OK else None


def _frames(loaded: LoadedProfile) -> dict[str, tuple[str, int, str]]:
    """StackFrame id (text) -> (file, line, function)."""
    names = {
        t: TableSource(loaded.profile, t).relation()
        for t in ("StackFrame", "StackFrameFileLocation", "StackFrameFileName", "StackFrameFunctionName")
    }
    rows = loaded.queries.rows(f"""
        SELECT f.id AS id, n.name AS file, l.line_number AS line, fn.name AS func
        FROM {names["StackFrame"]} f
        JOIN {names["StackFrameFileLocation"]} l ON CAST(l.id AS BIGINT) = f.file_location_id
        LEFT JOIN {names["StackFrameFileName"]} n ON CAST(n.id AS BIGINT) = l.file_name_id
        LEFT JOIN {names["StackFrameFunctionName"]} fn ON CAST(fn.id AS BIGINT) = l.function_name_id""")
    return {str(r["id"]): (str(r["file"]), int(r["line"] or 0), str(r["func"] or "")) for r in rows}


def _reconcile(loaded: LoadedProfile, out: SourceTimes) -> None:
    """Line times are ``formats.attribution``'s (docs/figures.md): the union of the events of the ops
    under the line -- the same intervals the tree's op and layer times use, so a line that calls the
    MLP shows the MLP nodes' time (a sum of instruction durations counted overlaps twice and left
    out the ops' DMA). Which lines there are, and the stacks behind them, stay as read above."""
    from formats.read_api import attribute

    if not out.lines:
        return
    with loaded.queries.lock:
        times = attribute(loaded.profile, con=loaded.queries.con).lines
    for place, line in out.lines.items():
        mine = times.get(place)
        if mine is not None:
            line.inclusive_ns, line.self_ns = mine.inclusive_ns, mine.self_ns
            line.instructions = mine.instructions
        else:  # instructions of no HLO op: no op events to measure
            line.inclusive_ns = line.self_ns = 0


def load_source_times(loaded: LoadedProfile) -> SourceTimes:
    source = TableSource(loaded.profile, "Instruction")
    out = SourceTimes(access=SourceAccess.for_profile(loaded.metadata))
    if not source.present:
        out.note = "no instructions"
        return out
    has_stacks = source.has("stack_frame_ids") and loaded.profile.num_rows("StackFrame") > 0
    if has_stacks:
        frames = _frames(loaded)
        for r in loaded.queries.rows(f"""
                SELECT stack_frame_ids AS stack, count(*) AS n, sum(duration_ns) AS t FROM {source.relation()}
                WHERE stack_frame_ids IS NOT NULL GROUP BY ALL"""):
            ids = [str(i) for i in parse_ids(r["stack"]).ids]
            lines = [(frames[i][0], frames[i][1]) for i in ids if i in frames]
            out.stacks[str(r["stack"])] = lines
            t, n = int(r["t"] or 0), int(r["n"])
            for place in dict.fromkeys(lines):
                line = out.lines.setdefault(place, LineTime())
                line.inclusive_ns += t
                line.instructions += n
            if lines:
                inner = out.lines[lines[-1]]
                inner.self_ns += t
                inner.function = frames[ids[-1]][2] if ids and ids[-1] in frames else inner.function
            for i in ids:
                if i in frames:
                    line = out.lines[(frames[i][0], frames[i][1])]
                    line.function = line.function or frames[i][2]
    if not out.lines:
        out.by_location = True
        location = (
            f"coalesce({source.col('bir_debug_info_source_location')}, {source.col('nki_source_location')})"
        )
        for r in loaded.queries.rows(f"""
                SELECT {location} AS loc, count(*) AS n, sum(duration_ns) AS t FROM {source.relation()}
                WHERE {location} IS NOT NULL GROUP BY ALL"""):
            path, _, number = str(r["loc"]).rpartition(":")
            if not number.isdigit():
                continue
            line = out.lines.setdefault((path, int(number)), LineTime())
            line.inclusive_ns += int(r["t"] or 0)
            line.self_ns += int(r["t"] or 0)
            line.instructions += int(r["n"])
    _reconcile(loaded, out)
    files: dict[str, list[int]] = {}
    for (path, _), line_time in out.lines.items():
        entry = files.setdefault(path, [0, 0])
        entry[0] += line_time.self_ns
        entry[1] = max(entry[1], line_time.inclusive_ns)
    out.files = sorted(
        (FileTime(p, s, i) for p, (s, i) in files.items()),
        key=lambda f: (-f.self_ns, -f.inclusive_ns, f.path),
    )
    if not out.files:
        out.note = "no source locations in this profile (no stack frames, no source-location columns)"
    return out
