"""The profile viewer driven through Textual's Pilot: every key binding, code linking both ways,
problems that jump to where they happen, the real-layout profile, small terminals, and the ``view``
command's bad-input lines (all before any terminal is taken over)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from textual.widgets import DataTable, Input, OptionList

from explorer.profile_cli import main
from explorer.viewer import cli as viewer_cli
from explorer.viewer.app import HelpScreen, ViewerApp
from explorer.viewer.panes import SourcePane
from explorer.viewer.treetable import HierarchyTable
from formats.dataset import find_profiles
from tests.fixtures.pilot import settle, sync, type_into, viewer
from tests.fixtures.real_layout import Shape, real_layout_profile
from tests.fixtures.samples import BERT, LLAMA_TP2, SOURCE_ROOT


def tree_names(app: ViewerApp) -> list[str]:
    return [r.node.name for r in app.query_one("#tree", HierarchyTable).rows_shown]


def current(app: ViewerApp) -> str:
    row = app.query_one("#tree", HierarchyTable).current()
    assert row is not None
    return row.node.name


async def goto(pilot, app: ViewerApp, name: str) -> None:  # type: ignore[no-untyped-def]
    """Move the tree cursor down to the row called ``name``."""
    table = app.query_one("#tree", HierarchyTable)
    table.focus()
    names = tree_names(app)
    table.move_cursor(row=names.index(name))
    await settle(pilot)


# -- our profile -------------------------------------------------------------------------------------


@sync
async def test_overview_tree_and_problems() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.overview is not None and app.analysis is not None
        figures = {f.label: f.value for f in app.overview.figures}
        assert figures["Total time"] == "132 µs" and figures["MFU"] == "15.3%"
        assert app.overview.missing == ()  # our capture writes every table the viewer uses
        # encoder -> layer.0 is a chain of single layers: opened on arrival
        assert tree_names(app)[:5] == ["encoder", "layer.0", "attention", "output", "intermediate"]
        titles = [p.title for p in app.analysis.problems]
        assert "Tensor engine idle waiting on DMA" in titles and "Transposes dominating" in titles
        assert app.hierarchy is not None and app.hierarchy.analysed
        dot = next(n for n in app.hierarchy.nodes.values() if n.name == "dot.51")
        assert dot.stats.counts[0] == 120 and dot.stats.mfu is not None and 0 < dot.stats.mfu < 1


@sync
async def test_expand_collapse_and_instruction_pages() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await goto(pilot, app, "output")
        await pilot.press("right")
        await settle(pilot)
        assert "dense" in tree_names(app)
        await pilot.press("left")  # close "output"
        await settle(pilot)
        assert current(app) == "output" and "LayerNorm" not in tree_names(app)
        await pilot.press("space")  # and open it again
        await settle(pilot)
        await goto(pilot, app, "dense")
        await pilot.press("enter")
        await settle(pilot)
        await goto(pilot, app, "dot.51")  # 147 instructions: one page of 100 and a "more" row
        await pilot.press("enter")
        await settle(pilot)
        rows = app.query_one("#tree", HierarchyTable).rows_shown
        instrs = [r for r in rows if r.node.kind == "instr"]
        more = [r for r in rows if r.node.kind == "more"]
        assert len(instrs) == 100 and len(more) == 1 and "47 more" in more[0].node.name
        await goto(pilot, app, more[0].node.name)
        await pilot.press("enter")
        await settle(pilot)
        rows = app.query_one("#tree", HierarchyTable).rows_shown
        assert sum(r.node.kind == "instr" for r in rows) == 147 and not any(
            r.node.kind == "more" for r in rows
        )
        starts = [r.node.stats.start_ts for r in rows if r.node.kind == "instr"]
        assert starts == sorted(starts)
        await goto(pilot, app, next(r.node.name for r in rows if r.node.kind == "instr"))
        await pilot.press("left")  # on a leaf: go to its op
        await settle(pilot)
        assert current(app) == "dot.51"


@sync
async def test_sort_and_reverse() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        layers = ["attention", "output", "intermediate"]
        assert [n for n in tree_names(app) if n in layers] == layers  # by time, largest first
        await pilot.press("s")  # start
        assert app.state.sort == "start"
        await pilot.press("s")  # name
        assert app.state.sort == "name"
        assert [n for n in tree_names(app) if n in layers] == ["attention", "intermediate", "output"]
        await pilot.press("r")
        assert [n for n in tree_names(app) if n in layers] == ["output", "intermediate", "attention"]
        for _ in range(4):  # mfu, hbm, instructions, back to time
            await pilot.press("s")
        assert app.state.sort == "time"


@sync
async def test_filter_box() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("f")
        box = app.query_one("#query", Input)
        assert box.has_focus
        await type_into(pilot, "softmax")
        names = tree_names(app)
        assert "softmax.31" in names and "self" in names and "intermediate" not in names
        await pilot.press("enter")  # keep the filter, back to the tree
        assert app.state.filter == "softmax" and app.query_one("#tree").has_focus
        await pilot.press("f", "escape")  # esc in the box clears it
        assert app.state.filter == "" and "intermediate" in tree_names(app)
        await pilot.press("f")
        await type_into(pilot, "nothing-like-this")
        await pilot.press("enter")
        assert tree_names(app) == []
        await pilot.press("escape")  # esc in the tree clears too
        assert app.state.filter == "" and "intermediate" in tree_names(app)


@sync
async def test_search_next_previous() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "layer_norm")
        await pilot.press("enter")
        await settle(pilot)
        first = current(app)
        assert first.startswith("layer_norm.")
        await pilot.press("n")
        await settle(pilot)
        second = current(app)
        assert second.startswith("layer_norm.") and second != first
        await pilot.press("N")
        await settle(pilot)
        assert current(app) == first
        await pilot.press("slash")
        await type_into(pilot, "zzz")
        await pilot.press("enter")
        await settle(pilot)
        assert app.matches == []


@sync
async def test_code_linking_both_ways() -> None:
    app = viewer(BERT)
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
async def test_other_file_and_timeline_toggle() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        files = app.analysis.source.files
        assert files[0].endswith("models.py") and len(files) >= 2
        await pilot.press("o")
        await settle(pilot)
        assert app.query_one("#source", SourcePane).file.recorded == files[1]
        await goto(pilot, app, "intermediate")
        title, span = app._timeline_span()
        assert (
            title == "intermediate"
            and app.timeline is not None
            and (app.timeline.t0, app.timeline.t1) == span
        )
        assert [r.engine for r in app.timeline.rows] == [
            "Tensor∪", "╰LoadSt", "╰MATMUL", "Vector", "Scalar", "GpSimd", "Sync"
        ]
        await pilot.press("t")
        await settle(pilot)
        assert app._timeline_span() == ("whole profile", app.overview.span)
        assert (app.timeline.t0, app.timeline.t1) == app.overview.span
        await pilot.press("t")
        await settle(pilot)
        assert app._timeline_span()[0] == "intermediate"


@sync
async def test_problem_jumps_to_its_node() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        options = app.query_one("#problems", OptionList)
        assert options.has_focus
        problem = app.analysis.problems[0]
        options.highlighted = 0
        await pilot.press("enter")
        await settle(pilot)
        assert app.state.selected == problem.node and app.query_one("#tree").has_focus
        assert app._timeline_span()[1] == app.hierarchy.nodes[problem.node].stats.span


@sync
async def test_zoom_help_focus_and_quit() -> None:
    app = viewer(BERT)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("z")
        assert app.screen.maximized is app.query_one("#tree")
        await pilot.press("z")
        assert app.screen.maximized is None
        await pilot.press("c", "z")
        assert app.screen.maximized is app.query_one("#source")
        await pilot.press("escape")
        assert app.screen.maximized is None
        await pilot.press("h")
        assert app.query_one("#tree").has_focus
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("bracketright")  # one profile: a notice, nothing else
        await pilot.press("q")
    assert app.return_code == 0


@sync
async def test_switch_profiles_of_a_dataset() -> None:
    app = viewer(LLAMA_TP2, source_root=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.overview.name == "model=llama_decode/core=0/execution=2"
        assert any(p.title.startswith("Collectives") for p in app.analysis.problems) or app.overview.figures[
            -1
        ].value.endswith("ops)")
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert app.overview.name == "model=llama_decode/core=1/execution=2" and app.analysis is not None
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert app.overview.name.endswith("core=0/execution=2")


# -- the real tool's layout ------------------------------------------------------------------------------


@sync
async def test_real_layout_says_what_is_missing(tmp_path: Path) -> None:
    app = viewer(real_layout_profile(tmp_path, Shape.LLAMA), source_root=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        missing = " ".join(app.overview.missing)
        assert "Summary" in missing and "FrameworkNode" in missing and "HloInstruction" in missing
        assert app.overview.summary_source == "Summary computed from events"
        assert tree_names(app)[:2] == ["NeuronLlamaDecoderLayer[0]", "NeuronAttention[0]"]
        layer = app.hierarchy.nodes["L:NeuronLlamaDecoderLayer[0]"]
        assert layer.stats.summed and layer.stats.counts == (180, 120, 60, 30, 30)  # PE/tensor, DVE, ACT...
        pane = app.query_one("#source", SourcePane)
        assert pane.file is not None and "source file not found" in pane.file.message
        assert "--source-root" in pane.file.message


@sync
async def test_real_layout_with_source_root(tmp_path: Path) -> None:
    app = viewer(real_layout_profile(tmp_path, Shape.LLAMA))
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


@sync
async def test_profile_without_instructions(tmp_path: Path) -> None:
    root = tmp_path / "bare"
    root.mkdir()
    pq.write_table(pa.table({"total_time": pa.array([1e-5], pa.float32())}), root / "Summary.parquet")
    app = viewer(root, source_root=None)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert any(m.startswith("Instruction: missing") for m in app.overview.missing)
        assert app.hierarchy is not None and not app.hierarchy.nodes
        assert app.timeline is not None and app.timeline.rows == ()
        await pilot.press("enter", "right", "left", "s", "t", "o", "slash", "x", "enter")
        await settle(pilot)


@pytest.mark.parametrize("size", [(30, 8), (70, 14)])
@sync
async def test_small_terminals_degrade(size: tuple[int, int]) -> None:
    app = viewer(BERT)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("down", "right", "c", "enter", "h", "z", "z", "t")
        await pilot.resize_terminal(20, 6)
        await settle(pilot)
        await pilot.resize_terminal(160, 50)
        await settle(pilot)
        assert app.analysis is not None and app.error is None


# -- the command ---------------------------------------------------------------------------------------


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    return err


def test_view_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path / "nowhere")]) == 2
    assert "no such profile directory" in one_line(capsys.readouterr().err)
    (tmp_path / "notes.txt").write_text("x")
    assert main(["view", str(tmp_path)]) == 2
    assert "not a profile" in one_line(capsys.readouterr().err)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "Instruction.parquet").write_bytes(b"PAR1 not really")
    assert main(["view", str(bad)]) == 2
    assert "not a readable Parquet file" in one_line(capsys.readouterr().err)
    assert main(["view", str(BERT), "--source-root", str(tmp_path / "none")]) == 2
    assert "--source-root" in one_line(capsys.readouterr().err)
    assert main(["view", str(BERT)]) == 2  # pytest's stdout is no terminal
    assert "needs a terminal" in one_line(capsys.readouterr().err)


def test_view_launches_the_viewer(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[ViewerApp] = []
    monkeypatch.setattr(viewer_cli, "is_terminal", lambda: True)
    monkeypatch.setattr(ViewerApp, "run", lambda self: ran.append(self))
    assert main(["view", str(LLAMA_TP2), "--source-root", str(SOURCE_ROOT)]) == 0
    app = ran[0]
    assert len(app.entries) == 2 and app.source_root == SOURCE_ROOT
    assert app.data is not None and app.data.name == "model=llama_decode/core=0/execution=2"


def test_view_export_formats_still_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(BERT), "--output-format", "summary-text"]) == 0
    assert "total_time" in capsys.readouterr().out
    target = tmp_path / "t.pftrace"
    assert main(["view", str(BERT), "--output-format", "perfetto", "-o", str(target)]) == 0
    assert target.stat().st_size > 0


@sync
async def test_switch_to_a_broken_profile_shows_the_error(tmp_path: Path) -> None:
    import shutil

    good = find_profiles(BERT)[0][0].path
    shutil.copytree(good, tmp_path / "run=1")
    (tmp_path / "run=2").mkdir()
    (tmp_path / "run=2" / "Instruction.parquet").write_bytes(b"PAR1 truncated")
    app = viewer(tmp_path, source_root=None)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.overview is not None and app.overview.name == "run=1"
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert app.error is not None and "not a readable Parquet file" in app.error
        assert app.is_running
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert app.error is None and app.analysis is not None
