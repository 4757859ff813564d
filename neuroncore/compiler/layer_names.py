"""Renaming a layer's names for another layer: tensor, buffer and view names and operand strings.

The compiler derives every name from an op's name (``dot.81``, ``spill.add.74``, ``dot.81.t3``), a
weight's label (``weight.model/layers.1/mlp/up_proj/weight``) or a parameter's or output's position
(``input5.past_key.1``, ``output3.concatenate.52``), and a DMA trigger's text carries its node index
(``block_id=1234``). A :class:`Renamer` finds those pieces in a string once and renders the string
for any op mapping and node shift after that, so relocating a layer costs a join, not a search.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from neuroncore.ir.graph import Graph

# one piece of a split string: text as is, or a reference to rewrite
#   ("op", prefix kind or "", op index, is_label) / ("block", node index)
Piece = str | tuple[str, str, int, bool] | tuple[str, int]


class Renamer:
    """Finds the names of ``ops`` (and their labels) inside strings."""

    def __init__(self, graph: Graph, ops: Iterable[int]) -> None:
        self.graph = graph
        self.lookup: dict[str, tuple[int, bool]] = {}
        for index in ops:
            op = graph.ops[index]
            self.lookup[op.name] = (index, False)
            label = op.attrs.get("label")
            if isinstance(label, str):
                self.lookup.setdefault(label, (index, True))
        names = sorted(self.lookup, key=len, reverse=True)
        alternation = "|".join(re.escape(n) for n in names) or r"(?!x)x"
        self.pattern = re.compile(r"block_id=(?P<block>\d+)|(?:(?P<pre>input|output)\d+\.)?"
                                  rf"(?<![\w])(?P<name>{alternation})(?![\w])")
        self.outputs = {o.index: i for i, o in enumerate(graph.outputs)}
        self._cache: dict[str, tuple[Piece, ...] | None] = {}

    def split(self, text: str) -> tuple[Piece, ...] | None:
        """The pieces of ``text``, or None when it names nothing of these ops (kept as is)."""
        cached = self._cache.get(text, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        pieces: list[Piece] = []
        last = 0
        for match in self.pattern.finditer(text):
            pieces.append(text[last:match.start()])
            if match.group("block") is not None:
                pieces.append(("block", int(match.group("block"))))
            else:
                index, is_label = self.lookup[match.group("name")]
                pieces.append(("op", match.group("pre") or "", index, is_label))
            last = match.end()
        result: tuple[Piece, ...] | None = None
        if pieces:
            pieces.append(text[last:])
            result = tuple(pieces)
        self._cache[text] = result
        return result

    def op_text(self, prefix: str, index: int, is_label: bool) -> str:
        op = self.graph.ops[index]
        name = op.attrs["label"] if is_label else op.name
        if prefix == "input":
            return f"input{op.attrs['number']}.{name}"
        if prefix == "output":
            return f"output{self.outputs[index]}.{name}"
        return str(name)

    def render(self, text: str, op_map: Callable[[int], int], node_map: Callable[[int], int]) -> str:
        pieces = self.split(text)
        if pieces is None:
            return text
        return self.render_pieces(pieces, op_map, node_map)

    def render_pieces(self, pieces: tuple[Piece, ...], op_map: Callable[[int], int],
                      node_map: Callable[[int], int]) -> str:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                out.append(piece)
            elif piece[0] == "block":
                out.append(f"block_id={node_map(piece[1])}")  # type: ignore[arg-type]
            else:
                _, prefix, index, is_label = piece  # type: ignore[misc]
                out.append(self.op_text(prefix, op_map(index), is_label))
        return "".join(out)

    def canonical(self, text: str, token: Callable[[int], object]) -> object:
        """``text`` with each op reference replaced by ``token(op)`` (positions dropped)."""
        pieces = self.split(text)
        if pieces is None:
            return text
        return tuple(p if isinstance(p, str) else ("block",) if p[0] == "block"
                     else (p[1], token(p[2]), p[3]) for p in pieces)  # type: ignore[misc]


__all__ = ["Piece", "Renamer"]
