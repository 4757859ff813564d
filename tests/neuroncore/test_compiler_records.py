"""The compiler's closed records: counters, node semantics and lowering state reject unknown names.

These were keyword bags and positional tuples; a misspelt counter used to be accepted and record 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

import neuroncore as nc
from neuroncore.compiler import node_semantics as ns
from neuroncore.compiler.counters import COUNTER_NAMES, NodeCounters
from neuroncore.compiler.emitter import Emitter
from neuroncore.compiler.lowering_state import Accumulation, HbmTensorKind, Layout, QueueName
from neuroncore.compiler.program import Buffer, HbmTensor, Ref
from neuroncore.dtypes import DType
from neuroncore.enums import DmaQueueType, Memory
from neuroncore.hardware import Engine
from neuroncore.runtime.interpreter import ExecutionError, Machine


def _ref() -> Ref:
    return Ref(0, 0, 128, 0, 64)


def _memset(em: Emitter, **extra: object) -> int:
    ref = _ref()
    return em.instruction(Engine.VECTOR, "MEMSET", 10.0, reads=[], writes=[(("buf", 0), (0, 128, 0, 64))],
                          text="dst", semantics=ns.Memset(ref, 0.0), **extra)  # type: ignore[arg-type]


def test_misspelt_counter_is_an_error_at_the_call() -> None:
    with pytest.raises(TypeError, match="sbuf_writes_bytes"):
        NodeCounters(sbuf_writes_bytes=999)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="sbuf_writes_bytes"):
        _memset(Emitter(), sbuf_writes_bytes=999)


def test_counters_reach_their_columns() -> None:
    em = Emitter()
    _memset(em, counters=NodeCounters(sbuf_write_bytes=999, raw_flops=3))
    _memset(em)
    counters = em.counter_columns()
    assert counters.table.shape == (2, len(COUNTER_NAMES))  # one row per distinct record
    assert counters.column("sbuf_write_bytes").tolist() == [999, 0]
    assert counters.column("raw_flops").tolist() == [3, 0]
    assert all(counters.column(name).tolist() == [0, 0] for name in COUNTER_NAMES
               if name not in ("sbuf_write_bytes", "raw_flops"))


def test_counters_are_frozen_and_split_between_trigger_and_transfer() -> None:
    c = NodeCounters(hbm_write_bytes=8, sbuf_read_bytes=8, dma_bytes=8, spill_save_bytes=8)
    with pytest.raises(AttributeError):
        c.dma_bytes = 1  # type: ignore[misc]
    assert c.spill_part() == NodeCounters(spill_save_bytes=8)
    assert c.transfer_part() == NodeCounters(hbm_write_bytes=8, sbuf_read_bytes=8, dma_bytes=8)
    assert c.spill_part() + c.transfer_part() == c


def test_emitter_refuses_semantics_that_are_not_records() -> None:
    em = Emitter()
    with pytest.raises(TypeError, match="node semantics must be a record"):
        em.instruction(Engine.VECTOR, "MEMSET", 1.0, reads=[], writes=[], text="",
                       semantics=("memset", _ref(), 0.0))  # type: ignore[arg-type]
    assert em.n_nodes == 0  # nothing half-emitted


def test_semantic_records_are_closed() -> None:
    with pytest.raises(TypeError):
        ns.MatMul(psum=_ref(), moving=_ref())  # type: ignore[call-arg]  # fields missing
    with pytest.raises(TypeError):
        ns.Memset(_ref(), 0.0, 1)  # type: ignore[call-arg]  # one field too many
    with pytest.raises(TypeError):
        ns.Copy(out=_ref(), src=_ref())  # type: ignore[call-arg]  # misspelt field


def _tiny_graph() -> nc.Graph:
    b = nc.GraphBuilder("tiny")
    x = b.parameter("x", (4, 8), "fp32")
    return b.build([b.exp(x)])


def test_interpreter_dispatches_by_type_and_rejects_unknown_records() -> None:
    program = nc.compile(_tiny_graph(), "trn1")
    machine = Machine(program, {})
    assert set(machine.handlers()) == ns.SEMANTIC_KINDS  # every kind has exactly one handler

    @dataclass(frozen=True)
    class Fused:  # a record the interpreter was never taught
        out: Ref

    broken = replace(program, semantics=[Fused(_ref())])
    with pytest.raises(ExecutionError, match=r"node 0 carries .*Fused"):
        Machine(broken, {}).run()


def test_lowering_state_is_closed_and_spelt_as_before() -> None:
    with pytest.raises(ValueError):
        Layout("rwo")
    assert [str(layout) for layout in Layout] == ["row", "col"]  # buffer names keep their spelling
    assert [Accumulation.of(j, 4) for j in range(4)] == [
        Accumulation.FIRST, Accumulation.MIDDLE, Accumulation.MIDDLE, Accumulation.LAST]
    assert Accumulation.of(0, 1) is Accumulation.WHOLE
    assert [a.accumulates for a in Accumulation] == [False, False, True, True]
    program = nc.compile(_tiny_graph(), "trn1")
    assert [q.name for q in program.queues][:len(QueueName)] == [str(q) for q in QueueName]


def test_hbm_tensor_kinds_are_closed() -> None:
    with pytest.raises(ValueError, match="wieght"):
        HbmTensor("w", (2, 2), DType.BF16, "wieght", 0)  # type: ignore[arg-type]
    assert HbmTensor("w", (2, 2), DType.BF16, "weight", 0).kind is HbmTensorKind.WEIGHT  # type: ignore[arg-type]
    program = nc.compile(_tiny_graph(), "trn1")
    assert list(program.hbm_bytes_by_kind()) == ["weight", "input", "output", "scratch"]


def test_buffers_and_values_live_in_a_declared_memory() -> None:
    buf = Buffer(0, "SBUF", 128, 4, DType.BF16, 0, "b")  # type: ignore[arg-type]
    assert buf.memory is Memory.SBUF
    with pytest.raises(ValueError):
        Buffer(0, "SRAM", 128, 4, DType.BF16, 0, "b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not HBM"):
        Buffer(0, Memory.HBM, 128, 4, DType.BF16, 0, "b")
    program = nc.compile(_tiny_graph(), "trn1")
    assert {b.memory for b in program.buffers.values()} <= {Memory.SBUF, Memory.PSUM}
    assert {q.queue_type for q in program.queues} <= set(DmaQueueType)
