"""Shared helpers for the op and tiling tests: compile + execute + reference, tolerances, lowering.

Helpers are handed out as session fixtures (``run``, ``assert_close``, ``nodes_of``) so that the test
modules never import this file by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

import neuroncore as nc
from neuroncore.compiler.node_semantics import NodeSemantics
from neuroncore.compiler.program import RES_DMA
from neuroncore.dtypes import DType, as_dtype
from neuroncore.hardware import Engine

INSTANCE = "trn1.2xlarge"

# (rtol, atol as a fraction of max |reference|) per output dtype
TOLERANCES = {
    DType.FP32: (1e-5, 1e-5),
    DType.BF16: (2e-2, 2e-2),
    DType.FP16: (2e-3, 2e-3),
}


@dataclass(frozen=True)
class Node:
    """One program node, decoded from the Program's columns."""

    index: int
    opcode: str
    engine: int  # Engine value (for DMA: the queue's trigger engine)
    is_dma: bool
    queue: str | None
    op_index: int
    activation_fn: str | None
    tensor_instruction_type: str | None
    operands: str
    semantics: NodeSemantics


def decode(program: nc.Program) -> list[Node]:
    nodes = []
    for i in range(program.n_nodes):
        is_dma = int(program.resource[i]) == RES_DMA
        nodes.append(Node(
            index=i,
            opcode=program.opcodes[program.opcode_id[i]],
            engine=int(program.engine[i]),
            is_dma=is_dma,
            queue=program.queues[program.queue[i]].name if is_dma else None,
            op_index=int(program.op_index[i]),
            activation_fn=program.activation_fn[i],
            tensor_instruction_type=program.tensor_instruction_type[i],
            operands=program.operands[i],
            semantics=program.semantics[i],
        ))
    return nodes


def nodes_for(program: nc.Program, op) -> list[Node]:
    """Nodes emitted while lowering IR op ``op`` (by ``op_index``)."""
    return [n for n in decode(program) if n.op_index == op.index]


def check_program_invariants(program: nc.Program) -> None:
    """Structural facts every compiled program must satisfy (checked on every run)."""
    graph = program.graph
    n = program.n_nodes
    assert n > 0
    for column in ("resource", "engine", "queue", "op_index", "opcode_id", "sem_increment", "trigger"):
        assert len(getattr(program, column)) == n, column
    assert len(program.operands) == n and len(program.semantics) == n
    sem_of = np.where(program.resource == RES_DMA,
                      [program.queues[q].semaphore if q >= 0 else -1 for q in program.queue],
                      program.engine.astype(np.int64))
    for i in range(n):
        # every node names the IR op (and so the HLO name) it was lowered from
        assert 0 <= program.op_index[i] < len(graph.ops), (i, program.operands[i])
        assert program.engine[i] in [int(e) for e in Engine]
        if program.resource[i] == RES_DMA:
            trig = int(program.trigger[i])
            assert 0 <= trig < i, "a DMA transfer is triggered by an earlier instruction"
            assert program.resource[trig] != RES_DMA
            assert program.engine[trig] == program.queues[program.queue[i]].trigger_engine
            assert program.op_index[trig] == program.op_index[i]
        else:
            assert program.queue[i] == -1
        text = program.operands[i]
        for d in program.deps(i):
            d = int(d)
            assert d < i, "dependencies point backwards in the global order"
            s = int(sem_of[d])
            # a cross-engine dependency is a semaphore: the producer increments, the consumer waits
            assert program.sem_increment[d] == s
            assert "++@complete" in program.operands[d]
            assert f"S[{s}]" in program.operands[d]
            waits = {int(a): int(b) for a, b in _waits(text)}
            assert s in waits, (i, d, text)
            assert waits[s] >= program.sem_value[d]
        if program.sem_increment[i] >= 0:
            assert "++@complete" in text


def _waits(text: str) -> list[tuple[str, str]]:
    return re.findall(r"\$S\[(\d+)\]>=(\d+)", text)


@dataclass
class RunResult:
    outputs: list[np.ndarray]
    reference: list[np.ndarray]
    program: nc.Program
    result: object

    @property
    def out(self) -> np.ndarray:
        return self.outputs[0]

    @property
    def ref(self) -> np.ndarray:
        return self.reference[0]

    def nodes(self, op=None) -> list[Node]:
        return decode(self.program) if op is None else nodes_for(self.program, op)


def _run(graph: nc.Graph, inputs, target="trn1", instance: str = INSTANCE) -> RunResult:
    program = nc.compile(graph, target)
    check_program_invariants(program)
    result = nc.Instance(instance).core(0).load(program).execute(inputs)
    assert result.outputs is not None
    assert len(result.outputs) == len(graph.outputs)
    for out, op in zip(result.outputs, graph.outputs):
        assert out.shape == op.shape
        assert out.dtype == op.dtype.numpy
    reference = nc.run_reference(graph, inputs)
    return RunResult(list(result.outputs), reference, program, result)


def _assert_close(actual, expected, dtype: DType | str = DType.FP32, *, rtol: float | None = None,
                  atol: float | None = None, scale: float | None = None) -> None:
    """Compare in FP32 with a dtype-appropriate tolerance; atol is relative to max |expected|."""
    dtype = as_dtype(dtype)
    a = np.asarray(actual).astype(np.float32)
    e = np.asarray(expected).astype(np.float32)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert np.isfinite(e).all(), "reference has non-finite values; choose other inputs"
    default_rtol, atol_frac = TOLERANCES[dtype]
    magnitude = scale if scale is not None else max(float(np.abs(e).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(
        a, e, rtol=default_rtol if rtol is None else rtol,
        atol=atol_frac * magnitude if atol is None else atol,
    )


@pytest.fixture(scope="session")
def run():
    """``run(graph, inputs, target="trn1")`` -> RunResult (outputs, reference, program)."""
    return _run


@pytest.fixture(scope="session")
def assert_close():
    return _assert_close


@pytest.fixture(scope="session")
def nodes_of():
    """``nodes_of(program, op=None)``: decoded nodes (of one IR op, when given)."""
    def nodes(program, op=None):
        return decode(program) if op is None else nodes_for(program, op)
    return nodes


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
