"""The shared vocabularies of ``neuroncore.enums`` are the one list every other spelling follows."""

from __future__ import annotations

import numpy as np

from formats import hierarchy_rollup, lod, schema, summary_scan, trace_export
from formats.schema_tables import ENUMS
from neuroncore import compiler, workloads
from neuroncore.compiler import program as program_module
from neuroncore.enums import (
    ENGINE_NAMES,
    N_TRACKS,
    SEMAPHORE_BUS_SOURCE,
    TRACK_LABELS,
    DmaQueueType,
    Engine,
    Memory,
    Resource,
)
from neuroncore.hardware import Engine as HardwareEngine


def test_engine_codes_labels_and_stems() -> None:
    assert HardwareEngine is Engine
    assert ENGINE_NAMES == ("Tensor", "Vector", "Scalar", "GpSimd", "Sync")
    assert [e.stem for e in Engine] == ["tensor", "vector", "scalar", "gpsimd", "sync"]
    engine_rows = [Resource.TENSOR_LS, Resource.VECTOR, Resource.SCALAR, Resource.GPSIMD, Resource.SYNC]
    assert [int(r) for r in engine_rows] == [int(e) for e in Engine] == list(range(5))
    assert TRACK_LABELS[Resource.TENSOR_MM] == "TensorMatrix" and len(TRACK_LABELS) == N_TRACKS
    assert [r for r in Resource if r.is_instruction] == list(Resource)[:N_TRACKS]
    assert len(ENGINE_NAMES) == SEMAPHORE_BUS_SOURCE


def test_formats_lists_follow_the_enum() -> None:
    """Formats keeps the schema's spellings, derived from (or checked against) the one list."""
    assert schema.ENGINE_NAMES == ENGINE_NAMES
    assert all(schema.canonical_engine(e.stem) == e.label for e in Engine)
    assert schema.canonical_engine("Pool") == "GpSimd" and schema.canonical_engine("PE") == "Tensor"
    assert schema.canonical_engine("AXI") == "AXI"
    assert tuple(summary_scan.ENGINE_STEMS) == ENGINE_NAMES
    assert tuple(e.stem for e in Engine) == hierarchy_rollup.ENGINE_STEMS
    assert lod.ENGINE_LABELS[: len(Engine)] == list(ENGINE_NAMES)
    assert set(trace_export.TRACK_ORDER) == set(TRACK_LABELS)
    assert tuple(q.value for q in DmaQueueType) == ENUMS["DmaQueueType"]


def test_program_codes_are_the_enums() -> None:
    assert (program_module.RES_TENSOR_LS, program_module.RES_TENSOR_MM, program_module.RES_DMA,
            program_module.RES_CC) == (Resource.TENSOR_LS, Resource.TENSOR_MM, Resource.DMA, Resource.CC)
    program = compiler.compile(workloads.get("mlp").graph(), "trn1")
    assert set(np.unique(program.resource)) <= {int(r) for r in Resource}
    assert {q.queue_type for q in program.queues} <= {q.value for q in DmaQueueType}
    assert [program.semaphore_names[int(e)] for e in Engine] == list(ENGINE_NAMES)


def test_memory_names() -> None:
    assert [m.label for m in Memory] == ["SBUF", "PSUM", "HBM"]
    assert Memory("sbuf") is Memory.SBUF and Memory.HBM == "hbm"
