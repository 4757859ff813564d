"""Process state the runtime keeps, in the objects that own it: the id source and derived tables."""

from __future__ import annotations

import threading
from dataclasses import replace

import neuroncore as nc
from neuroncore.runtime.ids import PROCESS_IDS, IdSource
from neuroncore.runtime.scheduler import record_layout


def _program() -> nc.Program:
    b = nc.GraphBuilder("tiny")
    x = b.parameter("x", (4, 8), "fp32")
    return nc.compile(b.build([b.exp(x)]), "trn1")


def test_ids_are_unique_across_instances_and_cores() -> None:
    program = _program()
    models = [nc.Instance("trn1.2xlarge", sink=nc.EventSink()).core(c).load(program) for c in (0, 1)]
    models.append(nc.Instance("trn1.2xlarge", sink=nc.EventSink()).core(0).load(program))
    assert len({m.model_id for m in models}) == 3
    runs = [m.execute(timing_only=True) for m in models for _ in range(2)]
    ids = [r.execution_id for r in runs]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert PROCESS_IDS.next_execution_id() > ids[-1]  # one sequence for the whole process


def test_id_source_is_thread_safe() -> None:
    source = IdSource()
    taken: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [source.next_execution_id() for _ in range(2000)]
        with lock:
            taken.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == list(range(1, 8001))
    assert source.next_model_id() == 1  # model ids are their own sequence


def test_derived_tables_are_built_once_and_not_shared_by_copies() -> None:
    program = _program()
    assert program.derived.record_layout is None
    layout = record_layout(program)
    assert program.derived.record_layout is layout
    assert record_layout(program) is layout
    copy = replace(program)
    assert copy.derived.record_layout is None  # a copy may change columns: it derives its own
