"""The core -> recorder contract: every batch the core emits matches its declaration in
``neuroncore.record_kinds`` (column set, dtypes, equal lengths, metadata class), and a batch that does
not is refused loudly."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import neuroncore as nc
from formats.recorder import ProfileRecorder
from neuroncore.events import EventBatch, EventSink
from neuroncore.parallel import TensorParallelModel
from neuroncore.record_kinds import (
    RECORD_KINDS,
    ExecutionStartMeta,
    HbmUsageMeta,
    InstructionMeta,
    NeuronLinkUsageMeta,
    RecordContractError,
    RecordKind,
    check_batch,
    markdown_table,
)
from neuroncore.workloads import get, random_inputs

DOC = Path(__file__).resolve().parents[2] / "docs" / "execution-core.md"
SMALL_LLAMA = dict(layers=1, hidden=128, heads=8, kv_heads=8, intermediate=256, vocab=256, batch=2, context=8,
                   dtype="fp32")


class Checked:
    """A listener that checks every batch as it arrives (not only the ones a test looks at)."""

    def __init__(self) -> None:
        self.batches: list[EventBatch] = []

    def __call__(self, batch: EventBatch) -> None:
        check_batch(batch)
        self.batches.append(batch)

    @property
    def kinds(self) -> set[RecordKind]:
        return {b.kind for b in self.batches}


def observe(run) -> Checked:  # type: ignore[no-untyped-def]
    sink = EventSink()  # unchecked: the listener checks, so a failure names the batch, not the core
    listener = Checked()
    sink.subscribe(listener)
    run(sink)
    return listener


def test_single_core_workloads_emit_what_they_declare() -> None:
    graph = get("bert-layer").graph()
    program = nc.compile(graph, "trn1")

    def run(sink: EventSink) -> None:
        model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(program)
        model.execute(random_inputs(graph))  # numerics and timing
        model.execute(timing_only=True)
        nc.Instance("trn2.48xlarge", sink=sink).core(3).load(
            nc.compile(get("mlp").graph(), "trn2")).execute(timing_only=True)

    seen = observe(run)
    # the trn2 MLP's matmul bursts are throttled (NC-v3 power throttling); trn1 never throttles
    assert seen.kinds == {RecordKind.PROGRAM_LOADED, RecordKind.EXECUTION_START, RecordKind.INSTRUCTION,
                          RecordKind.DMA_PACKET, RecordKind.SEMAPHORE_UPDATE, RecordKind.HBM_USAGE,
                          RecordKind.THROTTLE, RecordKind.EXECUTION_END}
    assert {b.meta.core for b in seen.batches if b.kind == RecordKind.THROTTLE} == {3}
    assert sum(len(b) for b in seen.batches if b.kind == RecordKind.INSTRUCTION) > 1000


@pytest.mark.parametrize(("workload", "tp", "timing_only"),
                         [("llama-decode", 2, True), ("llama-prefill", 4, False)])
def test_tensor_parallel_workloads_and_their_collectives_emit_what_they_declare(
        workload: str, tp: int, timing_only: bool) -> None:
    graph = get(workload).graph(**SMALL_LLAMA)

    def run(sink: EventSink) -> None:
        group = TensorParallelModel.load(graph, nc.Instance("trn1.32xlarge", sink=sink), tp_degree=tp)
        group.execute(None if timing_only else random_inputs(graph), timing_only=timing_only)

    seen = observe(run)
    # collectives and link traffic included; train_step comes from training steps
    # (tests/collectors/test_training_profile.py), throttle from NC-v3 cores only
    assert seen.kinds == set(RecordKind) - {RecordKind.TRAIN_STEP, RecordKind.THROTTLE}
    cc = [b for b in seen.batches if b.kind == RecordKind.CC_OP]
    assert len(cc) == tp and all(len(b) > 0 for b in cc)


# -- a batch that does not match is refused ------------------------------------------------------


def hbm_batch(**columns: object) -> EventBatch:
    base: dict[str, object] = {"timestamp": np.arange(3, dtype=np.int64),
                               "current_throughput": np.ones(3, np.float32),
                               "total_transfer_bytes": np.arange(3, dtype=np.int64)}
    base.update(columns)
    return EventBatch(RecordKind.HBM_USAGE, {k: v for k, v in base.items() if v is not None},
                      HbmUsageMeta(execution_id=1, model_id=1, core=0))


def test_a_matching_batch_passes() -> None:
    check_batch(hbm_batch())


@pytest.mark.parametrize(("change", "message"), [
    ({"timestamp": np.arange(3, dtype=np.int32)}, "'timestamp' is int32"),
    ({"timestamp": [0, 1, 2]}, "'timestamp' is a list"),
    ({"total_transfer_bytes": None}, "missing ['total_transfer_bytes']"),
    ({"extra": np.zeros(3)}, "undeclared ['extra']"),
    ({"timestamp": np.arange(4, dtype=np.int64)}, "different lengths"),
])
def test_a_batch_that_differs_from_its_declaration_is_refused(change: dict[str, object],
                                                               message: str) -> None:
    with pytest.raises(RecordContractError, match=r"^hbm_usage batch: .*" + re.escape(message)):
        check_batch(hbm_batch(**change))


def test_wrong_metadata_unknown_kinds_and_bad_list_items_are_refused() -> None:
    good = hbm_batch()
    start = ExecutionStartMeta(execution_id=1, model_id=1, core=0, start_ns=0, model_name="m", rank=0,
                               host_start_ns=0, pid=1, thread_id=1)
    with pytest.raises(RecordContractError, match="meta is ExecutionStartMeta, not HbmUsageMeta"):
        check_batch(dataclasses.replace(good, meta=start))
    wrong_core = HbmUsageMeta(execution_id=1, model_id=1, core="0")  # type: ignore[arg-type]
    with pytest.raises(RecordContractError, match=r"meta\.core is '0'"):
        check_batch(dataclasses.replace(good, meta=wrong_core))
    with pytest.raises(RecordContractError, match="'mystery' is not a declared record kind"):
        check_batch(dataclasses.replace(good, kind="mystery"))  # type: ignore[arg-type]


def link_batch(channel_kind: list[object], link_id: list[object]) -> EventBatch:
    i64 = np.int64
    return EventBatch(RecordKind.NEURONLINK_USAGE, {
        "timestamp": np.zeros(2, i64), "duration_ns": np.ones(2, i64), "channel_id": np.arange(2, dtype=i64),
        "channel_kind": channel_kind, "link_id": link_id, "src_device": np.zeros(2, i64),
        "dst_device": np.ones(2, i64), "direction": np.zeros(2, np.int32), "transfer_bytes": np.ones(2, i64),
        "current_throughput": np.ones(2, np.float32), "active_flows": np.ones(2, np.int32),
        "capacity": np.ones(2, np.float32)},
        NeuronLinkUsageMeta(topology="ring", execution_ids=[1], channel_labels={0: "a", 1: "b"}))


def test_list_items_are_checked() -> None:
    check_batch(link_batch(["neuronlink", "on_chip"], [0, None]))  # link_id is declared nullable
    with pytest.raises(RecordContractError, match="'channel_kind' holds 1 \\(int\\), not list\\[str\\]"):
        check_batch(link_batch([1, "on_chip"], [0, None]))
    with pytest.raises(RecordContractError, match="'channel_kind' holds None"):
        check_batch(link_batch([None, "on_chip"], [0, None]))  # text columns are not nullable
    with pytest.raises(RecordContractError, match="'link_id' holds True"):
        check_batch(link_batch(["neuronlink", "on_chip"], [True, None]))  # a bool is not an id


def test_a_checking_sink_refuses_at_emit_and_an_idle_one_costs_nothing() -> None:
    meta = InstructionMeta(execution_id=1, model_id=1, core=0, engine_labels=(), track_labels=(), opcodes=())
    idle = EventSink(check=True)
    idle.emit(RecordKind.INSTRUCTION, {"id": np.arange(3)}, meta)  # nobody listens: nothing is built
    checking = EventSink(check=True)
    received: list[EventBatch] = []
    checking.subscribe(received.append)
    with pytest.raises(RecordContractError, match="instruction batch: columns differ"):
        checking.emit(RecordKind.INSTRUCTION, {"id": np.arange(3)}, meta)
    assert not received


def test_the_suite_checks_every_sink() -> None:
    """tests/conftest.py turns checking on for every sink, so any test that runs the core checks it."""
    assert EventSink.check_all


# -- the consumers follow the declaration --------------------------------------------------------


def test_the_recorder_has_a_handler_for_every_kind() -> None:
    assert set(ProfileRecorder._handlers) == set(RecordKind)


def test_cc_op_columns_are_the_ccop_table_columns() -> None:
    from formats.schema import SCHEMA

    declared = RECORD_KINDS[RecordKind.CC_OP].names
    assert declared <= set(SCHEMA.tables["CcOp"].names)
    assert RECORD_KINDS[RecordKind.NEURONLINK_USAGE].names <= set(SCHEMA.tables["NeuronLinkUsage"].names)


def test_the_docs_table_is_the_declaration() -> None:
    """docs/execution-core.md shows ``markdown_table()`` between its markers (regenerate with
    ``python -m neuroncore.record_kinds``)."""
    text = DOC.read_text(encoding="utf-8")
    begin, end = "<!-- record-kinds:begin -->\n", "<!-- record-kinds:end -->"
    assert begin in text and end in text
    shown = text.split(begin, 1)[1].split(end, 1)[0]
    assert shown.strip() == markdown_table().strip()
