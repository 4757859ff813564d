"""The one hierarchy loader (formats.hierarchy_read) and the one text-list parser (formats.text_lists):
junk in ``children_ids`` / ``stack_frame_ids`` / ``time_intervals`` is skipped and counted, never raised."""

from __future__ import annotations

import numpy as np
import pytest

from formats.hierarchy_read import FrameworkHierarchy, Malformed, from_rows
from formats.text_lists import (
    format_intervals,
    format_list,
    parse_ids,
    parse_intervals,
    union_length,
)


@pytest.mark.parametrize(
    ("value", "ids", "malformed"),
    [
        (None, (), 0),
        ("", (), 0),
        ("[]", (), 0),
        ("[ ]", (), 0),
        ("[1, 2, 30]", (1, 2, 30), 0),
        ("[-4]", (-4,), 0),
        ("7", (7,), 0),
        ("[1, x, 3]", (1, 3), 1),
        ("[1,,2]", (1, 2), 1),
        ("[1, 2,]", (1, 2), 1),
        ("[null, 1.5, --2, ²]", (), 4),
        ("[[1, 2]]", (), 2),
        ([4, 5], (4, 5), 0),
        (np.array([6, 7]), (6, 7), 0),
        ([1, "2", None], (1, 2), 1),
        (3.5, (), 1),
    ],
)
def test_parse_ids_skips_and_counts_junk(value: object, ids: tuple[int, ...], malformed: int) -> None:
    parsed = parse_ids(value)
    assert (parsed.ids, parsed.malformed) == (ids, malformed)


def test_parse_ids_reads_what_the_writer_writes() -> None:
    assert parse_ids(format_list([3, 1, 2])).ids == (3, 1, 2)


def test_intervals_union_and_junk() -> None:
    good = parse_intervals("[[1, 10], [5, 12], [20, 30]]")
    assert good.malformed == 0 and good.spans.shape == (3, 2) and good.union_ns == 21
    assert parse_intervals(format_intervals([1, 5], [2, 9])).spans.tolist() == [[1, 2], [5, 9]]
    assert parse_intervals([[1, 2]]).spans.tolist() == [[1, 2]]
    for junk in ("garbage", "[[1, 2, 3]]", "[[1, x]]", "{}", 5):
        bad = parse_intervals(junk)
        assert bad.malformed == 1 and bad.spans.shape == (0, 2), junk
    assert parse_intervals(None).malformed == 0 and parse_intervals("[]").spans.shape == (0, 2)
    assert union_length(np.array([[0, 5], [5, 7]], np.int64)) == 7


FRAMEWORK = [
    {"node_name": "model/block", "parent_name": "model", "children_ids": "[2, junk, 3]", "start_ts": 10,
     "end_ts": 60, "time_intervals": "[[10, 20], [40, 60]]", "mfu": 50.0,
     "tensor_engine_instruction_count": 4, "vector_engine_instruction_count": 1},
    {"node_name": "model", "parent_name": "", "children_ids": "[1]", "start_ts": 0, "end_ts": 100,
     "time_intervals": "not json", "active_time_ns": 90, "instruction_count": 9},
    {"node_name": None, "parent_name": "", "children_ids": "[]", "start_ts": 5},
]
HLO = [
    {"raw_hlo_id": 7, "raw_framework_id": 2, "hlo_name": "dot.7", "start_ts": 40, "end_ts": 60,
     "time_intervals": "[[40, 60]]", "hbm_read_bytes": 3, "hbm_write_bytes": 1, "instruction_count": 2},
    {"raw_hlo_id": 7, "raw_framework_id": 2, "hlo_name": "dot.7", "start_ts": 10, "end_ts": 20,
     "time_intervals": "[[10, 20]]", "hbm_read_bytes": 3, "hbm_write_bytes": 1, "instruction_count": 2},
    {"raw_hlo_id": None, "raw_framework_id": 1, "hlo_name": "copy", "start_ts": 70, "end_ts": 75,
     "active_time_ns": 5},
    {"raw_hlo_id": 9, "raw_framework_id": 99, "hlo_name": "add.9", "start_ts": 80, "end_ts": 85,
     "time_intervals": "[[80, 85]]"},
]


def test_from_rows_builds_one_typed_tree() -> None:
    tree = from_rows(FRAMEWORK, HLO)
    assert isinstance(tree, FrameworkHierarchy) and tree.source == "FrameworkNode + HloInstruction"
    assert [layer.path for layer in tree.layers] == ["model", "model/block"]  # by first activity
    model, block = tree.layers
    assert (block.parent, block.name, block.depth, block.op_ids) == ("model", "block", 1, (2, 3))
    assert block.time_ns == 30 and block.mfu == pytest.approx(0.5) and block.instructions == 5
    assert block.counts == (4, 1, None, None, None)
    assert model.time_ns == 90 and model.spans.shape == (0, 2) and model.instructions == 9
    dot, copy, add = tree.ops
    assert (dot.name, dot.layer, dot.executions) == ("dot.7", "model/block", 2)
    assert (dot.start_ts, dot.end_ts, dot.time_ns, dot.hbm_bytes, dot.instructions) == (10, 60, 30, 8, 4)
    assert dot.spans.tolist() == [[10, 20], [40, 60]]
    assert (copy.key.column, copy.key.value, copy.layer, copy.time_ns) == ("hlo_name", "copy", "model", 5)
    assert add.layer is None  # no layer lists framework op 99
    assert tree.malformed == Malformed(ids=1, intervals=1, rows=1)
    assert tree.malformed.note() == "1 malformed ids skipped; 1 malformed time_intervals skipped; " \
                                    "1 malformed rows skipped"


def test_model_is_immutable() -> None:
    tree = from_rows(FRAMEWORK, HLO)
    with pytest.raises(ValueError):
        tree.ops[0].spans[0, 0] = 1
    with pytest.raises(AttributeError):
        tree.layers[0].path = "x"  # type: ignore[misc]


def test_empty_and_clean() -> None:
    assert from_rows([], []).source == "nothing yet" and from_rows([], []).empty
    assert Malformed().note() == "" and from_rows([], HLO[:1]).source == "HloInstruction"


def test_rollup_sums_are_a_closed_record() -> None:
    """``hierarchy_rollup.events`` takes its per-event sums as a closed record: a misspelt name is an
    error at the call (it used to be a ``**sums`` bag that recorded 0 for an unknown key)."""
    from formats.hierarchy_rollup import SUMS, EventSums, events, hlo_rows, merge

    with pytest.raises(TypeError):
        EventSums(hbm_reads=np.ones(2, np.int64))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        events(np.zeros(1, np.int64), np.zeros(1), np.ones(1), rid=np.zeros(1), hr=np.ones(1))  # type: ignore[call-arg]
    op = np.array([0, 0, -1])
    spans = merge(events(op, np.array([0, 5, 0]), np.array([10, 20, 9]), rid=np.arange(3),
                         engine=np.array([0, 1, 0]),
                         sums=EventSums(hbm_read=np.array([1, 2, 4]), instructions=np.ones(3, np.int64))))
    assert set(SUMS) <= set(spans) and spans["hbm_read"].tolist() == [3]
    assert spans["n_tensor"].tolist() == [1] and spans["n_vector"].tolist() == [1]
    row = hlo_rows(spans, 0, 0, {0: "dot"})
    assert row["hbm_read_bytes"] == [3] and row["instruction_count"] == [2] and row["sbuf_read_bytes"] == [0]
    assert parse_intervals(row["time_intervals"][0]).spans.tolist() == [[0, 20]]


def test_from_instructions_rebuilds_the_tree_of_a_real_layout_profile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real-tool profile without FrameworkNode/HloInstruction: layers are the ``layer`` paths and
    their prefixes, ops hang under their layer, op times are the sums of their instructions'."""
    from formats import sqlsource
    from formats.hierarchy_read import from_instructions, load_hierarchy
    from formats.reader import open_profile
    from tests.fixtures.real_layout import Shape, real_layout_profile

    profile = open_profile(real_layout_profile(tmp_path, Shape.LLAMA))
    assert load_hierarchy(profile).empty
    con = sqlsource.connect()
    try:
        tree = from_instructions(profile, con)
        relation = sqlsource.TableSource(profile, "Instruction").relation()
        truth = {(layer, hlo): (int(n), int(t)) for layer, hlo, n, t in con.execute(
            f"SELECT layer, hlo_name, count(*), sum(duration_ns) FROM {relation} "
            "WHERE hlo_name IS NOT NULL GROUP BY ALL").fetchall()}
    finally:
        con.close()
    assert tree.scanned and tree.source == "Instruction (layer, hlo_name)"
    paths = {layer.path for layer in tree.layers}
    assert paths and all(layer.parent in paths or layer.parent == "" for layer in tree.layers)
    assert {(op.layer, op.name): (op.instructions, op.time_ns) for op in tree.ops} == truth
    assert all(op.layer is None or op.layer in paths for op in tree.ops)
    for node in (*tree.layers, *tree.ops):
        assert node.spans.shape[1] == 2 and node.spans.size and not node.spans.flags.writeable
