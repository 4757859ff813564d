"""XLA HLO module text (and the stack-frame table of its proto): a small, dependency-free parser.

``parse_hlo_module`` reads what ``jax.jit(f).lower(...)`` prints with metadata and full constants:
computations, instructions (name, shape, opcode, operands, attributes, ``metadata={...}``). The
stack-frame table is decoded from the serialized ``HloModuleProto`` by hand (no protobuf package),
with a text fallback. Nothing here knows about the IR; the JAX frontend converts what it returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from neuroncore.frontends.tracing import TraceError
from neuroncore.ir.graph import SourceFrame


@dataclass(frozen=True)
class HloShape:
    """An array shape (``dtype`` like ``"f32"``) or a tuple of shapes (``dtype`` is None)."""

    dtype: str | None
    dims: tuple[int, ...] = ()
    elements: tuple[HloShape, ...] = ()

    @property
    def leaves(self) -> list[HloShape]:
        if self.dtype is not None:
            return [self]
        return [leaf for e in self.elements for leaf in e.leaves]


@dataclass
class HloInstruction:
    name: str
    shape: HloShape
    opcode: str
    operands: list[str]
    literal: str  # the text inside the parentheses of constant(...) and parameter(...)
    attrs: dict[str, str]
    metadata: dict[str, str]


@dataclass
class HloComputation:
    name: str
    is_entry: bool
    instructions: list[HloInstruction] = field(default_factory=list)
    root_instruction: HloInstruction | None = None  # the ROOT line (the last one if none is marked)

    @property
    def root(self) -> HloInstruction:
        return self.root_instruction if self.root_instruction is not None else self.instructions[-1]


_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](?:\{[^}]*\})?")
_ASSIGN = re.compile(r"\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"([A-Za-z][\w\-]*)\(")
_META_ITEM = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def _outside_quotes(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, char, bracket depth after it) for each character outside quoted strings."""
    depth, j, quoted = 0, start, False
    while j < len(text):
        c = text[j]
        if quoted:
            if c == "\\":
                j += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        else:
            if c in _CLOSERS:
                depth += 1
            elif c in ")]}":
                depth -= 1
            yield j, c, depth
        j += 1


def _closing(text: str, start: int) -> int:
    """Index just after the bracket that closes ``text[start]`` (quotes respected)."""
    for j, c, depth in _outside_quotes(text, start):
        if c in ")]}" and depth == 0:
            return j + 1
    raise ValueError(f"unbalanced brackets in HLO: {text[start:start + 80]!r}")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes."""
    parts, start = [], 0
    for j, c, depth in _outside_quotes(text):
        if c == sep and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse_shape(text: str, i: int) -> tuple[HloShape, int]:
    if text[i] == "(":
        end = _closing(text, i)
        elements = tuple(_parse_shape(p, 0)[0] for p in _split_top(text[i + 1:end - 1]))
        return HloShape(None, (), elements), end
    m = _ARRAY_SHAPE.match(text, i)
    if m is None:
        raise ValueError(f"cannot read an HLO shape at {text[i:i + 40]!r}")
    try:
        dims = tuple(int(d) for d in m.group(2).split(",") if d.strip())
    except ValueError:
        raise TraceError(f"dynamic shape {m.group(0)} in HLO: only static shapes can be compiled") from None
    return HloShape(m.group(1), dims), m.end()


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _parse_instruction(line: str) -> tuple[HloInstruction, bool]:
    line = _COMMENT.sub("", line)
    m = _ASSIGN.match(line)
    if m is None:
        raise ValueError(f"not an HLO instruction: {line.strip()[:120]!r}")
    shape, i = _parse_shape(line, m.end())
    rest = line[i:].lstrip()
    op = _OPCODE.match(rest)
    if op is None:
        raise ValueError(f"no opcode in HLO instruction: {line.strip()[:120]!r}")
    opcode = op.group(1)
    close = _closing(rest, op.end() - 1)
    inside = rest[op.end():close - 1]
    attrs: dict[str, str] = {}
    for part in _split_top(rest[close:]):
        key, _, value = part.partition("=")
        attrs[key.strip()] = value.strip()
    metadata: dict[str, str] = {}
    if "metadata" in attrs:
        for key, value in _META_ITEM.findall(attrs.pop("metadata").strip()[1:-1]):
            metadata[key] = _unquote(value)
    literal = inside if opcode in ("constant", "parameter") else ""
    operands = [] if literal or opcode in ("constant", "parameter") else [
        p.split()[-1].lstrip("%") for p in _split_top(inside)]
    ins = HloInstruction(m.group(2).lstrip("%"), shape, opcode, operands, literal, attrs, metadata)
    return ins, bool(m.group(1))


def parse_hlo_module(text: str) -> dict[str, HloComputation]:
    """Computations of an HLO module's text, by name (instructions in post order, as printed)."""
    computations: dict[str, HloComputation] = {}
    current: HloComputation | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if current is None:
            if (stripped.endswith("{") and not line[0].isspace()
                    and not stripped.startswith("HloModule")):
                words = stripped.split()
                is_entry = words[0] == "ENTRY"
                name = words[1 if is_entry else 0].lstrip("%")
                current = HloComputation(name, is_entry)
            continue
        if stripped == "}":
            computations[current.name] = current
            current = None
            continue
        ins, is_root = _parse_instruction(line)
        current.instructions.append(ins)
        if is_root:
            current.root_instruction = ins
    return computations


def ints(value: str | None) -> tuple[int, ...]:
    if not value:
        return ()
    return tuple(int(v) for v in re.findall(r"-?\d+", value))


def literal_values(literal: str) -> np.ndarray:
    tokens = re.findall(r"[^\s{},]+", literal)
    if tokens == ["..."]:
        raise TraceError("HLO text has elided constants ({...}); cannot read closed-over arrays")
    mapped = [("1" if t == "true" else "0" if t == "false" else t) for t in tokens]
    return np.asarray(mapped, dtype=np.float64)


# =============================================================================================
# Stack frames (HloModuleProto.stack_frame_index, field 17)
# =============================================================================================


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


def _proto_fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) pairs of one protobuf message (wire format, no schema needed): a varint
    field's value is an int, every other field's is its bytes."""
    i, n = 0, len(buf)
    value: int | memoryview
    while i < n:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i:i + length], i + length
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, value


def _bytes_field(value: int | memoryview) -> memoryview:
    if isinstance(value, int):
        raise ValueError("malformed HloModuleProto: a varint where a message or string belongs")
    return value


def _varint_fields(buf: memoryview) -> dict[int, int]:
    """The varint fields of one message by number (the last of a repeated one, as protobuf reads)."""
    return {number: value for number, value in _proto_fields(buf) if isinstance(value, int)}


FrameTable = dict[int, tuple[SourceFrame, int]]  # frame id -> (frame, parent id; 0 = none)


def frames_from_proto(data: bytes) -> FrameTable:
    """StackFrameIndexProto: file_names=1, function_names=2, file_locations=3 (file_name_id=1,
    function_name_id=2, line=3), stack_frames=4 (file_location_id=1, parent_frame_id=2); ids are
    1-based, parent 0 means none."""
    found = next((v for n, v in _proto_fields(memoryview(data)) if n == 17), None)
    if found is None:
        return {}
    index = _bytes_field(found)
    files: list[str] = []
    functions: list[str] = []
    locations: list[tuple[int, int, int]] = []
    frames: list[tuple[int, int]] = []
    for number, value in _proto_fields(index):
        if number == 1:
            files.append(bytes(_bytes_field(value)).decode())
        elif number == 2:
            functions.append(bytes(_bytes_field(value)).decode())
        elif number == 3:
            loc = _varint_fields(_bytes_field(value))
            locations.append((loc.get(1, 0), loc.get(2, 0), loc.get(3, 0)))
        elif number == 4:
            frame = _varint_fields(_bytes_field(value))
            frames.append((frame.get(1, 0), frame.get(2, 0)))
    table: FrameTable = {}
    for frame_id, (location_id, parent) in enumerate(frames, 1):
        file_id, function_id, line = locations[location_id - 1]
        table[frame_id] = (SourceFrame(files[file_id - 1], line, functions[function_id - 1]), parent)
    return table


def frames_from_text(text: str) -> FrameTable:
    """The same table from the module text (fallback). XLA 0.10's printer writes
    ``parent_frame_id`` plus one (a root frame shows its own id), which is detected and undone."""
    sections: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        word = line.strip()
        if word in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = sections.setdefault(word, {})
        elif current is not None and re.match(r"\d+ ", word):
            key, _, value = word.partition(" ")
            current[int(key)] = value
        elif word:
            current = None
    if "StackFrames" not in sections:
        return {}

    def items(value: str) -> dict[str, int]:
        return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", value)}

    raw = {k: items(v) for k, v in sections["StackFrames"].items()}
    shift = 1 if any(f.get("parent_frame_id") == k for k, f in raw.items()) else 0
    table: FrameTable = {}
    for frame_id, frame in raw.items():
        loc = items(sections["FileLocations"][frame["file_location_id"]])
        file = _unquote(sections["FileNames"][loc["file_name_id"]])
        function = _unquote(sections["FunctionNames"][loc["function_name_id"]])
        table[frame_id] = (SourceFrame(file, loc.get("line", 0), function),
                           max(frame.get("parent_frame_id", 0) - shift, 0))
    return table
