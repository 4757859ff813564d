"""Code linking in the profile viewer, through Textual's Pilot: a node's source line marked and a line's
nodes marked, and the rule for which files a profile may name (issue 14): too-long names, files outside
the trusted roots (read only after confirming), the capture's working directory; the GUI reads by the
same rule. Source files come from ``tests.fixtures.source_tree``, written at test time."""

from __future__ import annotations

import os
from pathlib import Path

from textual.widgets import DataTable

from explorer.viewer.panes import SourcePane
from explorer.viewer.viewer_app import ConfirmRead
from formats.source_access import SourceStatus
from tests.fixtures.pilot import current, settle, sync, type_into, viewer
from tests.fixtures.real_layout import Shape, real_layout_profile
from tests.fixtures.samples import BERT, bert_copy
from tests.fixtures.source_tree import MODELS, models_stand_in

RECORDED_MODELS = f"/work/main/{MODELS}"  # the innermost file the bert sample records


@sync
async def test_code_linking_both_ways(source_root: Path) -> None:
    app = viewer(BERT, source_root)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "dot.45")
        await pilot.press("enter")
        await settle(pilot)
        pane = app.query_one("#source", SourcePane)
        assert pane.file is not None and pane.file.shown_as == "neuroncore/workloads/models.py"
        assert pane.marked[0] == ("/work/main/neuroncore/workloads/models.py", 29)  # _linear's matmul line
        await pilot.press("c")
        table = app.query_one("#source-table", DataTable)
        assert table.has_focus and table.cursor_row == 28
        await pilot.press("enter")  # line 29 made every linear layer's matmul
        await settle(pilot)
        marked = {app.hierarchy.nodes[k].name for k in app.state.marked or ()}
        assert {"dot.5", "dot.12", "dot.19", "dot.36", "dot.45", "dot.51"} <= marked
        assert current(app) == "dot.45" and table.has_focus  # the biggest; browsing lines goes on
        await pilot.press("escape")
        assert app.state.marked is None
        await pilot.press("c")
        table.move_cursor(row=0)  # the module docstring made nothing
        await pilot.press("enter")
        await settle(pilot)
        assert app.state.marked is None


@sync
async def test_real_layout_with_source_root(tmp_path: Path, source_root: Path) -> None:
    app = viewer(real_layout_profile(tmp_path, Shape.LLAMA), source_root)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "softmax")
        await pilot.press("enter")
        await settle(pilot)
        pane = app.query_one("#source", SourcePane)
        assert pane.file.shown_as == "llama/model.py" and pane.marked[0] == (
            "/home/ubuntu/llama/model.py",
            13,
        )


# -- issue 14: source files named by a profile -----------------------------------------------------


@sync
async def test_file_name_over_255_bytes_is_a_message(tmp_path: Path) -> None:
    """The source worker met ENAMETOOLONG and the viewer exited; now the pane says why."""
    long_name = "/tmp/" + "x" * 300 + ".py"
    app = viewer(bert_copy(tmp_path, file_names={RECORDED_MODELS: long_name}), source_root=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        pane = app.query_one("#source", SourcePane)
        assert app.is_running and pane.file is not None
        assert pane.file.status is SourceStatus.REFUSED and "255" in pane.file.message
        await pilot.press("c", "enter", "o")
        await settle(pilot)
        assert app.is_running


@sync
async def test_file_outside_the_trusted_roots_is_read_only_after_confirming(
    tmp_path: Path, source_root: Path
) -> None:
    app = viewer(bert_copy(tmp_path, file_names={RECORDED_MODELS: "/etc/passwd"}), source_root=source_root)
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
    mine = project / MODELS
    mine.write_text(models_stand_in())
    profile = bert_copy(
        tmp_path, file_names={RECORDED_MODELS: str(mine)}, metadata={"capture_working_dir": str(project)}
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
    from explorer.gui.source_times import read_source as gui_read
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


@sync
async def test_code_with_brackets_shows_as_written() -> None:
    """Source is text, not Rich markup: ``nl.load(a[ix, iy])`` keeps its ``[ix, iy]`` (a str cell
    would read it as a style tag and drop it, as an NKI kernel's lines once showed)."""
    from textual.app import App, ComposeResult
    from textual.coordinate import Coordinate

    from explorer.viewer.view_model import SourceIndex
    from formats.source_access import SourceText

    code = ("x = nl.load(a[ix, iy])", "nl.store(out[i, j], value=x[bold])")

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield SourcePane(id="source")

    app = Host()
    async with app.run_test(size=(100, 20)):
        pane = app.query_one("#source", SourcePane)
        pane.show_file(SourceText("k.py", SourceStatus.OK, code), SourceIndex((), {}, {}, {}, True), "")
        table = app.query_one("#source-table", DataTable)
        shown = [table.get_cell_at(Coordinate(row, 4)) for row in range(len(code))]
        assert [getattr(cell, "plain", None) for cell in shown] == ["  " + line for line in code]
