"""Code linking: instruction stacks -> source lines, per-line figures, and finding the files on disk.

A profile names source lines three ways (profile-schema §2.6, §3.6): ``Instruction.stack_frame_ids``
(a text list into the interned ``StackFrame`` -> ``StackFrameFileLocation`` -> ``StackFrameFileName``
tables, outermost frame first), and the single-location columns ``nki_source_location`` /
``bir_debug_info_source_location`` (``file.py:29``). Lines are counted *inclusively*: an instruction
counts on every line of its stack in that file, so the line that calls a layer shows the layer's whole
cost, and the innermost line (where the op was written) is what the tree links to first.

Finding and reading the files themselves is ``formats.source_access`` (one rule for both viewers: a
file is read without asking only under ``--source-root`` or the capture's recorded working directory).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from explorer.viewer.view_model import Line, LineStat, SourceIndex, frozen_map
from formats.read_api import parse_ids


class Frames:
    """The interned stack-frame tables as dicts: frame id -> (file, line), and the parent chain."""

    def __init__(
        self,
        frames: Sequence[Mapping[str, Any]],
        locations: Sequence[Mapping[str, Any]],
        files: Sequence[Mapping[str, Any]],
    ) -> None:
        file_names = {_id(r.get("id")): str(r.get("name") or "") for r in files}
        where = {
            _id(r.get("id")): (file_names.get(_id(r.get("file_name_id")), ""), int(r.get("line_number") or 0))
            for r in locations
        }
        self.line: dict[int, Line] = {}
        self.parent: dict[int, int] = {}
        for row in frames:
            frame = _id(row.get("id"))
            loc = where.get(_id(row.get("file_location_id")))
            if frame is None or loc is None or not loc[0]:
                continue
            self.line[frame] = loc
            parent = _id(row.get("parent_frame_id"))
            if parent:
                self.parent[frame] = parent

    def __bool__(self) -> bool:
        return bool(self.line)

    def stack(self, ids: Sequence[int]) -> list[Line]:
        """Lines of a stack, innermost first, each once. ``ids`` may list the whole chain (ours) or only
        the leaf; parents are followed either way."""
        out: list[Line] = []
        seen: set[int] = set()
        for frame in reversed(ids):
            while frame and frame not in seen:
                seen.add(frame)
                line = self.line.get(frame)
                if line is not None and line not in out:
                    out.append(line)
                frame = self.parent.get(frame, 0)
        return out


def _id(value: Any) -> int | None:
    """Frame ids are text in the tables and int32 in the columns pointing at them (§2.4): both here."""
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def location(text: str | None) -> Line | None:
    """``file.py:29`` -> (``file.py``, 29)."""
    if not text or ":" not in text:
        return None
    name, _, number = text.rpartition(":")
    return (name, int(number)) if number.strip().isdigit() and name else None


class IndexBuilder:
    """Accumulates per-line figures and node <-> line links from the grouped Instruction scan."""

    def __init__(self, frames: Frames) -> None:
        self.frames = frames
        self.lines: dict[Line, list[int]] = {}
        self.node_weight: dict[str, dict[Line, int]] = {}
        self.innermost: dict[str, dict[Line, int]] = {}
        self.file_time: dict[str, int] = {}
        self._cache: dict[str, list[Line]] = {}

    def add(
        self, node: str, stack_text: str | None, loc_text: str | None, duration_ns: int, count: int
    ) -> None:
        lines = self._lines(stack_text, loc_text)
        if not lines:
            return
        weight = max(duration_ns, count)
        for line in lines:
            stat = self.lines.setdefault(line, [0, 0])
            stat[0] += duration_ns
            stat[1] += count
            per_node = self.node_weight.setdefault(node, {})
            per_node[line] = per_node.get(line, 0) + weight
        inner = self.innermost.setdefault(node, {})
        inner[lines[0]] = inner.get(lines[0], 0) + weight
        self.file_time[lines[0][0]] = self.file_time.get(lines[0][0], 0) + weight

    def _lines(self, stack_text: str | None, loc_text: str | None) -> list[Line]:
        key = f"{stack_text}|{loc_text}"
        found = self._cache.get(key)
        if found is None:
            found = self.frames.stack(list(parse_ids(stack_text).ids)) if stack_text and self.frames else []
            if not found:
                loc = location(loc_text)
                found = [loc] if loc else []
            self._cache[key] = found
        return found

    def build(self, parents: Mapping[str, Iterable[str]], available: bool, message: str = "") -> SourceIndex:
        """The index; ``parents`` maps each op to its ancestor layers, which get their ops' lines."""
        node_lines: dict[str, tuple[Line, ...]] = {}
        line_nodes: dict[Line, list[str]] = {}
        layer_weight: dict[str, dict[Line, int]] = {}
        for node, weights in self.node_weight.items():
            inner = self.innermost.get(node, {})
            ranked = sorted(weights, key=lambda ln: (-inner.get(ln, 0), -weights[ln], ln))
            node_lines[node] = tuple(ranked)
            for line in weights:
                line_nodes.setdefault(line, []).append(node)
            for layer in parents.get(node, ()):
                mine = layer_weight.setdefault(layer, {})
                for line, w in inner.items():
                    mine[line] = mine.get(line, 0) + w
        for layer, weights in layer_weight.items():
            node_lines[layer] = tuple(sorted(weights, key=lambda ln: (-weights[ln], ln))[:64])
        # files where ops were written first (innermost frames), then the callers' files
        inclusive: dict[str, int] = {}
        for (name, _), stat in self.lines.items():
            inclusive[name] = max(inclusive.get(name, 0), stat[0])
        files = tuple(sorted(inclusive, key=lambda f: (-self.file_time.get(f, 0), -inclusive[f], f)))
        return SourceIndex(
            files,
            frozen_map({k: LineStat(v[0], v[1]) for k, v in self.lines.items()}),
            frozen_map(node_lines),
            frozen_map({k: tuple(v) for k, v in line_nodes.items()}),
            available,
            message,
        )

