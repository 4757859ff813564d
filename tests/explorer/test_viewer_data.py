"""The viewer's data side without a terminal: hierarchy building (real-tool tables joined by
``children_ids``), code-linking lookups, the problem rules, the occupancy strip against a brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from explorer.viewer import tree_build as tree
from explorer.viewer.code_links import Frames, IndexBuilder, location
from explorer.viewer.data import ProfileData
from explorer.viewer.engine_strip import bar
from explorer.viewer.engine_strip import strip as timeline_strip
from explorer.viewer.tree_build import OpAggregate
from formats.dataset import find_profiles
from formats.hierarchy_read import from_rows
from formats.reader import open_profile
from formats.source_access import SourceAccess, locate, read_source
from tests.fixtures.samples import BERT


def test_real_tool_tables_join_by_children_ids() -> None:
    """FrameworkNode names that are not paths, parents by name, ops linked by raw_framework_id; an op no
    layer claims goes under "(no layer)"; two rows of one op (two executions) add up."""
    framework = [
        {
            "node_name": "NeuronLlamaModel",
            "parent_name": "",
            "children_ids": "[]",
            "start_ts": 0,
            "end_ts": 100,
            "time_intervals": "[[0, 100]]",
            "mfu": 25.0,
            "tensor_engine_instruction_count": 3,
        },
        {
            "node_name": "NeuronLlamaDecoderLayer",
            "parent_name": "NeuronLlamaModel",
            "children_ids": "[501, 502]",
            "start_ts": 0,
            "end_ts": 60,
            "time_intervals": "[[0, 20], [30, 60]]",
            "hbm_read_bytes": 10,
            "hbm_write_bytes": 5,
        },
    ]
    hlo = [
        {
            "raw_hlo_id": 1,
            "raw_framework_id": 501,
            "hlo_name": "dot.1",
            "start_ts": 0,
            "end_ts": 20,
            "time_intervals": "[[0, 20]]",
            "hbm_read_bytes": 4,
            "hbm_write_bytes": 0,
        },
        {
            "raw_hlo_id": 1,
            "raw_framework_id": 501,
            "hlo_name": "dot.1",
            "start_ts": 50,
            "end_ts": 60,
            "time_intervals": "[[50, 60]]",
            "hbm_read_bytes": 4,
            "hbm_write_bytes": 0,
        },
        {
            "raw_hlo_id": 2,
            "raw_framework_id": 502,
            "hlo_name": "add.2",
            "start_ts": 30,
            "end_ts": 40,
            "time_intervals": "[[30, 40]]",
            "hbm_read_bytes": 0,
            "hbm_write_bytes": 0,
        },
        {
            "raw_hlo_id": 3,
            "raw_framework_id": 999,
            "hlo_name": "copy.3",
            "start_ts": 90,
            "end_ts": 95,
            "time_intervals": "[[90, 95]]",
            "hbm_read_bytes": 0,
            "hbm_write_bytes": 0,
        },
    ]
    h = tree.from_hierarchy(from_rows(framework, hlo))
    assert h.children[""] == ("L:NeuronLlamaModel", "L:(no layer)")
    assert h.children["L:NeuronLlamaModel"] == ("L:NeuronLlamaDecoderLayer",)
    assert h.children["L:NeuronLlamaDecoderLayer"] == ("H:1", "H:2")
    layer = h.nodes["L:NeuronLlamaDecoderLayer"]
    assert layer.stats.time_ns == 50 and layer.stats.hbm_bytes == 15 and not layer.stats.summed
    assert h.nodes["L:NeuronLlamaModel"].stats.mfu == pytest.approx(0.25)  # 0-100 in the table
    dot = h.nodes["H:1"]
    assert (
        dot.stats.time_ns == 30
        and (dot.stats.start_ts, dot.stats.end_ts) == (0, 60)
        and dot.stats.hbm_bytes == 8
    )
    assert h.ancestors("H:1") == ["L:NeuronLlamaModel", "L:NeuronLlamaDecoderLayer"]
    # the Instruction scan then adds per-engine counts and MFU, keeping the tables' times
    agg = OpAggregate(("raw_hlo_id", 1), "dot.1", None)
    agg.add(
        {
            "engine": "Tensor",
            "n": 4,
            "dur": 40,
            "t0": 0,
            "t1": 60,
            "model": 1000,
            "pe": 1000,
            "ft": 0,
            "hbm": 8,
            "spill": 0,
            "wait": 5,
            "layer": "x",
        }
    )
    merged = tree.merge_scan(h, [agg], peak_flops_per_s=1e9)
    node = merged.nodes["H:1"]
    assert node.stats.counts == (4, 0, 0, 0, 0) and node.stats.time_ns == 30
    assert node.stats.mfu == pytest.approx(1000 / (1e9 * 30e-9))


def test_ordering_and_matching() -> None:
    h = tree.from_hierarchy(from_rows(
        [],
        [
            {
                "raw_hlo_id": i,
                "hlo_name": name,
                "start_ts": s,
                "end_ts": s + d,
                "time_intervals": f"[[{s}, {s + d}]]",
                "hbm_read_bytes": 0,
                "hbm_write_bytes": 0,
            }
            for i, (name, s, d) in enumerate([("b.1", 0, 30), ("a.2", 10, 50), ("c.3", 5, 10)])
        ],
    ))
    roots = list(h.children[""])
    names = lambda keys: [h.nodes[k].name for k in keys]  # noqa: E731
    assert names(tree.ordered(h, roots, "time", False)) == ["a.2", "b.1", "c.3"]
    assert names(tree.ordered(h, roots, "start", False)) == ["b.1", "c.3", "a.2"]
    assert names(tree.ordered(h, roots, "name", True)) == ["c.3", "b.1", "a.2"]
    assert {h.nodes[k].name for k in tree.matches(h, "A.")} == {"a.2"}


def test_frames_locations_and_source_root(tmp_path: Path) -> None:
    frames = Frames(
        [
            {"id": "1", "file_location_id": 1, "parent_frame_id": "0"},
            {"id": "2", "file_location_id": 2, "parent_frame_id": "1"},
        ],
        [{"id": "1", "file_name_id": 1, "line_number": 5}, {"id": "2", "file_name_id": 2, "line_number": 9}],
        [{"id": "1", "name": "/old/run.py"}, {"id": "2", "name": "/old/pkg/model.py"}],
    )
    assert frames.stack([2]) == [("/old/pkg/model.py", 9), ("/old/run.py", 5)]  # leaf only: parents followed
    assert frames.stack([1, 2]) == frames.stack([2])  # the whole chain: the same lines once
    assert location("model.py:12") == ("model.py", 12) and location("nothing") is None
    builder = IndexBuilder(frames)
    builder.add("H:1", "[2]", None, 100, 3)
    builder.add("H:2", None, "other.py:4", 50, 1)  # no stack: the source-location column
    index = builder.build({"H:1": ["L:a"]}, True)
    assert index.lines[("/old/run.py", 5)].instructions == 3  # inclusive: callers count too
    assert index.node_lines["H:1"][0] == ("/old/pkg/model.py", 9) and index.node_lines["L:a"][0][1] == 9
    assert index.line_nodes[("other.py", 4)] == ("H:2",)
    assert index.files[0] == "/old/pkg/model.py"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("a = 1\n\tb = 2\n")
    assert locate("/old/pkg/model.py", tmp_path) == tmp_path / "pkg" / "model.py"
    shown = read_source("/old/pkg/model.py", SourceAccess(tmp_path))
    assert shown.shown_as == "pkg/model.py" and shown.lines == ("a = 1", "    b = 2")
    assert "not found" in read_source("/old/missing.py", SourceAccess(tmp_path)).message


def test_occupancy_strip_is_exact() -> None:
    """The strip's cells are exact busy fractions and its figures are formats.figures' busy
    fractions of the same range: the mean of a row's cells is its figure (issue 12: the strip said
    "lod level N, lower bound" and 0.4 % where the Summary said 31.6 %)."""
    from formats.figures import Window, engine_busy, track_busy

    entry = find_profiles(BERT)[0][0]
    profile = open_profile(entry.path)
    t0, t1 = profile.metadata["first_hw_timestamp"], profile.metadata["last_hw_timestamp"]
    strip = timeline_strip(profile, t0, t1, 61, split_tensor=True)
    labels = ["Tensor∪", "╰LoadSt", "╰MATMUL", "Vector", "Scalar", "GpSimd", "Sync"]
    assert [r.engine for r in strip.rows] == labels
    assert [r.detail for r in strip.rows] == [False, True, True, False, False, False, False]
    engines, tracks = engine_busy(profile, Window.span(t0, t1)), track_busy(profile, Window.span(t0, t1))
    rows = {r.engine: r for r in strip.rows}
    assert rows["Tensor∪"].busy == pytest.approx(engines["Tensor"].fraction)
    assert rows["╰MATMUL"].busy == pytest.approx(tracks["TensorMatrix"].fraction)
    for row in strip.rows:
        assert np.mean(row.occupancy) == pytest.approx(row.busy, abs=1e-9), row.engine
    # the Summary's Tensor figure is the union row's, over the whole execution
    summary = ProfileData(profile, "bert").summary()
    assert summary["tensor_engine_active_time_percent"] * summary["total_time"] * 1e9 == pytest.approx(
        engines["Tensor"].busy_ns, rel=1e-3
    )
    assert bar((0.0, 0.01, 0.5, 1.0)) == " ▁▄█"


def test_queries_on_our_profile() -> None:
    entry = find_profiles(BERT)[0][0]
    data = ProfileData(open_profile(entry.path), "bert")
    overview = data.overview()
    analysis = data.analyse(overview)
    dot = next(n for n in analysis.hierarchy.nodes.values() if n.name == "dot.51")
    page = data.instruction_page(dot, 0, limit=10)
    assert len(page) == 11 and page[-1].kind == "more" and page[-1].offset == 10
    assert sum(n.stats.counts[0] for n in page[:10]) >= 1 and all(n.parent == dot.key for n in page)
    rest = data.instruction_page(dot, 70, limit=10)
    assert len(rest) == 9 and rest[-1].kind == "instr"  # 79 instructions: the last page, no "more"
    strip = data.timeline(*overview.span, cells=30)
    assert [len(r.occupancy) for r in strip.rows] == [30] * 7  # Tensor∪, its two rows, four engines
    data.close()


def test_closing_while_a_worker_still_queries() -> None:
    """The viewer quits while a worker thread runs a query: DuckDB refuses to close a busy connection,
    so close() interrupts the query and closes instead of raising out of the app's unmount."""
    import threading
    import time

    entry = find_profiles(BERT)[0][0]
    data = ProfileData(open_profile(entry.path), entry.name)
    outcome: list[str] = []

    def long_query() -> None:
        try:
            data._cursor().execute("SELECT count(*) FROM range(100000000000)").fetchall()
            outcome.append("finished")
        except Exception as exc:  # interrupted: what a worker of a closing viewer gets
            outcome.append(type(exc).__name__)

    worker = threading.Thread(target=long_query)
    worker.start()
    time.sleep(1.0)  # the query is running: DuckDB's close() alone neither stops it nor succeeds
    data.close()  # raised ResourceInUseException before; then left the query running
    worker.join(timeout=30)
    assert not worker.is_alive() and outcome

