"""Compilation errors that name the op, its HLO name, its framework layer and its source line."""

from __future__ import annotations

from neuroncore.ir.graph import Op


class CompileError(Exception):
    """A program the compiler cannot lower or place. ``str()`` is one line a CLI can print."""

    def __init__(self, message: str, op: Op | None = None) -> None:
        self.op = op
        self.reason = message
        super().__init__(f"{message} — {op.describe()}" if op is not None else message)


class UnsupportedOpsError(CompileError):
    """Every op the compiler does not support, found before anything is lowered."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        listing = "; ".join(f"{op.opcode} {op.name} at {op.layer or '<no layer>'} [{op.source}]"
                            for op in ops)
        super().__init__(f"unsupported op{'s' if len(ops) != 1 else ''}: {listing}")
