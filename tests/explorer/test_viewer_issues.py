"""Regression tests for the viewer defects of issues 12 and 14, each driven through Textual's Pilot
(or the viewer's data side) the way a user meets it."""

from __future__ import annotations

import os
from pathlib import Path

from textual.widgets import OptionList

from explorer.viewer.app import ConfirmRead
from explorer.viewer.panes import SourcePane
from explorer.viewer.treetable import HierarchyTable
from formats.source_access import SourceStatus
from tests.fixtures.pilot import settle, sync, type_into, viewer
from tests.fixtures.samples import BERT, LLAMA_TP2, SOURCE_ROOT, bert_copy

MODELS = "/work/main/neuroncore/workloads/models.py"  # the innermost file the bert sample records


# -- issue 14: source files named by a profile -----------------------------------------------------


@sync
async def test_file_name_over_255_bytes_is_a_message(tmp_path: Path) -> None:
    """The source worker met ENAMETOOLONG and the viewer exited; now the pane says why."""
    long_name = "/tmp/" + "x" * 300 + ".py"
    app = viewer(bert_copy(tmp_path, file_names={MODELS: long_name}), source_root=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        pane = app.query_one("#source", SourcePane)
        assert app.is_running and pane.file is not None
        assert pane.file.status is SourceStatus.REFUSED and "255" in pane.file.message
        await pilot.press("c", "enter", "o")
        await settle(pilot)
        assert app.is_running


@sync
async def test_file_outside_the_trusted_roots_is_read_only_after_confirming(tmp_path: Path) -> None:
    app = viewer(bert_copy(tmp_path, file_names={MODELS: "/etc/passwd"}), source_root=SOURCE_ROOT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        pane = app.query_one("#source", SourcePane)
        assert pane.file is not None and pane.file.recorded == "/etc/passwd"
        assert pane.file.status is SourceStatus.NEEDS_CONFIRM and pane.file.lines == ()
        assert "outside" in pane.file.message
        await pilot.press("c", "enter")
        assert isinstance(app.screen, ConfirmRead)
        await pilot.press("n")  # no: nothing is read
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmRead) and pane.file.status is SourceStatus.NEEDS_CONFIRM
        await pilot.press("enter")
        assert isinstance(app.screen, ConfirmRead)
        await pilot.press("y")
        await settle(pilot)
        assert pane.file.status is SourceStatus.OK and pane.file.lines[0].startswith("root:")


@sync
async def test_capture_working_directory_is_trusted(tmp_path: Path) -> None:
    """Code linking keeps working for one's own capture without --source-root: the file is under the
    directory the capture ran in (Metadata.capture_working_dir)."""
    project = tmp_path / "proj"
    (project / "neuroncore" / "workloads").mkdir(parents=True)
    source = SOURCE_ROOT / "neuroncore" / "workloads" / "models.py"
    mine = project / "neuroncore" / "workloads" / "models.py"
    mine.write_text(source.read_text())
    profile = bert_copy(
        tmp_path, file_names={MODELS: str(mine)}, metadata={"capture_working_dir": str(project)}
    )
    app = viewer(profile, source_root=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        pane = app.query_one("#source", SourcePane)
        assert pane.file is not None and pane.file.status is SourceStatus.OK
        assert pane.file.shown_as == os.path.join("neuroncore", "workloads", "models.py")
        assert pane.marked and pane.marked[0][0] == str(mine)


def test_gui_reads_source_files_by_the_same_rule(tmp_path: Path) -> None:
    """neuron-explorer's Source tab reads through formats.source_access too: /etc/passwd named by a
    profile is not read; a file under the capture's working directory is."""
    from explorer.gui.source import read_source as gui_read
    from formats.source_access import SourceAccess

    assert gui_read("/etc/passwd") is None
    assert gui_read("/tmp/" + "x" * 300 + ".py") is None
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "m.py").write_text("x = 1\n")
    access = SourceAccess.for_profile({"capture_working_dir": str(tmp_path / "proj")})
    assert gui_read(str(tmp_path / "proj" / "m.py"), access) == ["x = 1"]


def test_a_capture_records_its_working_directory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What makes code linking work without --source-root: the device profile's Metadata says where
    the capture ran (the one field the viewer's source rule needs from the capture)."""
    import neuroncore as nc
    from collectors.device_profile import profile
    from formats.reader import open_profile
    from neuroncore.events import EventSink
    from neuroncore.workloads import get, random_inputs

    monkeypatch.chdir(tmp_path)
    sink = EventSink()
    graph = get("matmul").graph(m=64, k=64, n=64)
    with profile(tmp_path / "run", sink=sink):
        nc.Instance("trn1.2xlarge", sink=sink).core(0).load(nc.compile(graph, "trn1")).execute(
            random_inputs(graph)
        )
    (path,) = (p.parent for p in (tmp_path / "run").rglob("Metadata.parquet"))
    assert open_profile(path).metadata["capture_working_dir"] == str(tmp_path)


# -- issue 12 §3: terminal viewer defects ----------------------------------------------------------


def title_text(app) -> str:  # type: ignore[no-untyped-def]
    return str(app.query_one("#title").render())


@sync
async def test_problems_pane_has_a_selection_and_enter_jumps() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        options = app.query_one("#problems", OptionList)
        assert options.has_focus and options.highlighted == 0
        await pilot.press("enter")  # no mouse, no arrow key first
        await settle(pilot)
        problem = app.analysis.problems[0]
        assert problem.node is not None and app.state.selected == problem.node
        assert app.query_one("#tree").has_focus


@sync
async def test_search_shows_the_match_count() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "layer_norm")
        await pilot.press("enter")
        await settle(pilot)
        total = len(app.matches)
        assert total >= 2 and f"1/{total}" in title_text(app)
        await pilot.press("n")
        await settle(pilot)
        assert f"2/{total}" in title_text(app)
        await pilot.press("N", "N")
        await settle(pilot)
        assert f"{total}/{total}" in title_text(app)
        await pilot.press("escape")
        assert "/{total}" not in title_text(app)


@sync
async def test_instruction_rows_show_semaphore_wait_and_operands() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "dot.45")
        await pilot.press("enter", "enter")  # jump to the op, open it
        await settle(pilot)
        rows = [r.node for r in app.query_one("#tree", HierarchyTable).rows_shown if r.node.kind == "instr"]
        assert rows
        # dot.45's LDWEIGHTS that waited 8,377 ns for semaphore 1 to reach 76 (values in the sample)
        waited = next(n for n in rows if "wait 8.38 µs" in n.detail)
        assert waited.name == "LDWEIGHTS" and "$S[1]>=76" in waited.detail
        assert all(" wait " in n.detail for n in rows)
        table = app.query_one("#tree", HierarchyTable)
        index = next(i for i, r in enumerate(table.rows_shown) if r.node is waited)
        assert "wait 8.38 µs  $S[1]>=76" in table._line(index)[0]


@sync
async def test_incomplete_profile_is_marked_in_the_title(tmp_path: Path) -> None:
    profile = bert_copy(tmp_path, metadata={"capture_complete": False}, name="run.incomplete")
    app = viewer(profile, source_root=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "INCOMPLETE" in title_text(app)
    app = viewer(bert_copy(tmp_path, name="whole"), source_root=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "INCOMPLETE" not in title_text(app)


# -- issue 12 §3: a bottom-up view, and problems that point at where the cost is ---------------------


def test_op_kinds_across_layers() -> None:
    from explorer.viewer.bottomup import kind_of, op_kind

    assert op_kind("dot.217") == "dot" and op_kind("layer_norm.3") == "layer_norm" and op_kind("add") == "add"
    a, b = kind_of("model/layers.0/mlp/down_proj", "dot.7"), kind_of("model/layers.9/mlp/down_proj", "dot.90")
    assert a == b and a.label == "down_proj" and a.key == "K:down_proj"
    assert kind_of("model/layers.0/mlp/up_proj", "dot.5") != a and kind_of(None, "dot.1").label == "dot"


@sync
async def test_tensor_idle_points_at_the_kind_where_the_waiting_is() -> None:
    """The finding names the module kind with most of the waiting (self_attn across both decoder
    layers, 28 %), not the op with the single largest wait; enter goes there."""
    app = viewer(LLAMA_TP2, source_root=None)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        idle = app.analysis.problems[0]
        assert idle.title.startswith("Tensor engine idle") and idle.kind == "K:self_attn"
        assert "most in self_attn (28.3% of it, largest model/layers.0/self_attn, op dot.51)" in idle.detail
        node = app.analysis.hierarchy.nodes[idle.node]
        assert node.name == "dot.51" and node.layer == "model/layers.0/self_attn"
        kind = app.analysis.bottom_up.nodes["K:self_attn"]
        assert kind.detail.startswith("×") and idle.node in app.analysis.bottom_up.children["K:self_attn"]


@sync
async def test_bottom_up_view_and_problem_jump() -> None:
    app = viewer(LLAMA_TP2, source_root=None)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.press("b")
        await settle(pilot)
        assert app.bottom_up and app.hierarchy is app.analysis.bottom_up
        rows = app.query_one("#tree", HierarchyTable).rows_shown
        kinds = {r.node.name: r.node for r in rows if r.node.kind == "kind"}
        down = kinds["down_proj"]
        assert down.detail.startswith("×4")  # a matmul and an add in each decoder layer's down_proj
        instances = [app.analysis.hierarchy.nodes[k] for k in app.analysis.bottom_up.children[down.key]]
        assert len(instances) == 4 and {n.layer for n in instances} == {
            "model/layers.0/mlp/down_proj",
            "model/layers.1/mlp/down_proj",
        }
        from formats.attribution import attribute

        union = attribute(app.data.profile).kinds["down_proj"].inclusive_ns  # the one kind-time definition
        assert down.stats.time_ns == union <= sum(n.stats.time_ns for n in instances)
        assert down.stats.counts[0] == sum(n.stats.counts[0] for n in instances)
        await pilot.press("b")  # back to layers -> ops
        await settle(pilot)
        assert not app.bottom_up and app.hierarchy is app.analysis.hierarchy
        await pilot.press("p", "enter")  # the Tensor-idle finding: its kind, its biggest instance
        await settle(pilot)
        problem = app.analysis.problems[0]
        assert problem.kind is not None and app.bottom_up
        assert app.state.selected == problem.node and problem.kind in app.state.expanded
        assert app.hierarchy.nodes[problem.node].parent == problem.kind


def screen_lines(widget) -> list[str]:  # type: ignore[no-untyped-def]
    """The lines a widget paints (what the terminal shows of it)."""
    from textual.geometry import Region

    width, height = widget.size
    return [strip.text for strip in widget.render_lines(Region(0, 0, width, height))]


@sync
async def test_summary_at_80x24_never_wraps_inside_a_figure() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.pause()
        figures = {f.label: f.value for f in app.overview.figures}
        lines = screen_lines(app.query_one("#figures"))
        for figure in (f"MFU {figures['MFU']}", f"HFU {figures['HFU']}", f"MBU {figures['MBU']}",
                       f"HBM {figures['HBM moved']}", figures["Total time"]):
            assert any(figure in line for line in lines), (figure, lines)
        assert not any(line.rstrip().endswith(("MFU", "HFU", "MBU", "HBM")) for line in lines), lines
        await pilot.resize_terminal(70, 24)
        await settle(pilot)
        await pilot.pause()
        lines = screen_lines(app.query_one("#figures"))
        assert any(f"MBU {figures['MBU']}" in line for line in lines), lines


def test_count_columns_never_run_together() -> None:
    """Per-engine counts past 9,999 used to print in full into 5-wide cells: ``152k1970115098``."""
    from explorer.viewer.model import Node, NodeStats
    from explorer.viewer.treetable import FIGURE_COLUMNS, FIXED_WIDTH, figure_text

    stats = NodeStats(time_ns=125_000, start_ts=0, end_ts=1, hbm_bytes=1_000_000, mfu=1.0,
                      counts=(152_000, 1_970_115, 98, 0, 99_999_999_999), instructions=10)
    text = figure_text(Node("H:1", "hlo", "dot.1", "", stats), 125_000)
    assert len(text) == FIXED_WIDTH - 2  # every row the same width: columns line up under the header
    assert text.split()[-5:] == ["152k", "1.97M", "98", "·", "100G"]
    ends = list(__import__("itertools").accumulate(w for _, _, w in FIGURE_COLUMNS))
    for start in ends[:-1]:  # a blank in front of every column
        assert text[start] == " ", (text, start)
    big = NodeStats(hbm_bytes=1_048_000, counts=stats.counts)
    wide = figure_text(Node("H:1", "hlo", "dot.1", "", big), 1)
    assert " 1023.4 KiB " in wide  # a cell longer than its column still has a blank on each side


@sync
async def test_warm_up_execution_is_marked_in_the_title(tmp_path: Path) -> None:
    profile = bert_copy(tmp_path, metadata={"warm_up_execution": True, "requested_execution": 3},
                        name="execution=2")
    app = viewer(profile, source_root=None)
    async with app.run_test(size=(160, 30)) as pilot:
        await settle(pilot)
        assert "warm-up execution 2 (asked for 3)" in title_text(app)
        assert "INCOMPLETE" not in title_text(app)
