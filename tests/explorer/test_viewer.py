"""The profile viewer driven through Textual's Pilot: every key binding, search and filter, problems that
jump to where they happen, the title's marks, instruction rows and figures that fit, the bottom-up
view, the real-layout profile, small terminals, and the ``view`` command's bad-input lines (all before
any terminal is taken over). Code linking and the source-file rule are in ``test_viewer_source.py``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import Input, OptionList

from explorer.profile_cli import main
from explorer.viewer import view_command
from explorer.viewer.panes import SourcePane
from explorer.viewer.treetable import HierarchyTable
from explorer.viewer.viewer_app import HelpScreen, ViewerApp
from formats.dataset import find_profiles
from tests.fixtures.pilot import current, goto, settle, sync, tree_names, type_into, viewer
from tests.fixtures.real_layout import Shape, real_layout_profile
from tests.fixtures.samples import BERT, LLAMA_TP2, bert_copy

# -- our profile -------------------------------------------------------------------------------------


@sync
async def test_overview_tree_and_problems(source_root: Path) -> None:
    app = viewer(BERT, source_root)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.overview is not None and app.analysis is not None
        figures = {f.label: f.value for f in app.overview.figures}
        assert figures["Total time"] == "86.1 µs" and figures["MFU"] == "23.6%"
        assert app.overview.missing == ()  # our capture writes every table the viewer uses
        # encoder -> layer.0 is a chain of single layers: opened on arrival
        assert tree_names(app)[:5] == ["encoder", "layer.0", "attention", "output", "intermediate"]
        titles = [p.title for p in app.analysis.problems]
        assert "Tensor engine blocked on semaphores" in titles and "Transposes dominating" in titles
        assert app.hierarchy is not None and app.hierarchy.analysed
        dot = next(n for n in app.hierarchy.nodes.values() if n.name == "dot.51")
        assert dot.stats.counts[0] == 72 and dot.stats.mfu is not None and 0 < dot.stats.mfu < 1


@sync
async def test_expand_collapse_and_instruction_pages(source_root: Path) -> None:
    app = viewer(BERT, source_root)
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
        assert "LayerNorm" in tree_names(app)
        await pilot.press("left")  # closed again: the first "dense" is now the intermediate's
        await settle(pilot)
        await goto(pilot, app, "intermediate")
        await pilot.press("right")
        await settle(pilot)
        await goto(pilot, app, "dense")
        await pilot.press("enter")
        await settle(pilot)
        await goto(pilot, app, "dot.45")  # 403 instructions: pages of 100 and a "more" row
        await pilot.press("enter")
        await settle(pilot)
        rows = app.query_one("#tree", HierarchyTable).rows_shown
        instrs = [r for r in rows if r.node.kind == "instr"]
        more = [r for r in rows if r.node.kind == "more"]
        assert len(instrs) == 100 and len(more) == 1 and "303 more" in more[0].node.name
        for shown in (200, 300, 400):
            await goto(pilot, app, more[0].node.name)
            await pilot.press("enter")
            await settle(pilot)
            rows = app.query_one("#tree", HierarchyTable).rows_shown
            more = [r for r in rows if r.node.kind == "more"]
            assert sum(r.node.kind == "instr" for r in rows) == shown and len(more) == 1
        await goto(pilot, app, more[0].node.name)
        await pilot.press("enter")
        await settle(pilot)
        rows = app.query_one("#tree", HierarchyTable).rows_shown
        assert sum(r.node.kind == "instr" for r in rows) == 403 and not any(
            r.node.kind == "more" for r in rows
        )
        starts = [r.node.stats.start_ts for r in rows if r.node.kind == "instr"]
        assert starts == sorted(starts)
        await goto(pilot, app, next(r.node.name for r in rows if r.node.kind == "instr"))
        await pilot.press("left")  # on a leaf: go to its op
        await settle(pilot)
        assert current(app) == "dot.45"


@sync
async def test_sort_and_reverse(source_root: Path) -> None:
    app = viewer(BERT, source_root)
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
async def test_filter_box(source_root: Path) -> None:
    app = viewer(BERT, source_root)
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
async def test_other_file_and_timeline_toggle(source_root: Path) -> None:
    app = viewer(BERT, source_root)
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
async def test_search_next_previous_with_its_match_count(source_root: Path) -> None:
    app = viewer(BERT, source_root)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "layer_norm")
        await pilot.press("enter")
        await settle(pilot)
        first = current(app)
        total = len(app.matches)
        assert first.startswith("layer_norm.") and total >= 2 and f"1/{total}" in title_text(app)
        await pilot.press("n")
        await settle(pilot)
        second = current(app)
        assert second.startswith("layer_norm.") and second != first and f"2/{total}" in title_text(app)
        await pilot.press("N")
        await settle(pilot)
        assert current(app) == first and f"1/{total}" in title_text(app)
        await pilot.press("N")  # before the first: wraps to the last
        await settle(pilot)
        assert f"{total}/{total}" in title_text(app)
        await pilot.press("escape")
        assert "/{total}" not in title_text(app)
        await pilot.press("slash")
        await type_into(pilot, "zzz")
        await pilot.press("enter")
        await settle(pilot)
        assert app.matches == []


@sync
async def test_problem_jumps_to_its_node(source_root: Path) -> None:
    """The problems pane opens with a selection: enter jumps with no mouse and no arrow key first."""
    app = viewer(BERT, source_root)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        options = app.query_one("#problems", OptionList)
        assert options.has_focus and options.highlighted == 0
        await pilot.press("enter")
        await settle(pilot)
        problem = app.analysis.problems[0]
        assert problem.node is not None and app.state.selected == problem.node
        assert app.query_one("#tree").has_focus
        assert app._timeline_span()[1] == app.hierarchy.nodes[problem.node].stats.span


@sync
async def test_zoom_help_focus_and_quit(source_root: Path) -> None:
    app = viewer(BERT, source_root)
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


# -- the title, instruction rows, figures -------------------------------------------------------------


def title_text(app: ViewerApp) -> str:
    return str(app.query_one("#title").render())


def screen_lines(widget: Widget) -> list[str]:
    """The lines a widget paints (what the terminal shows of it)."""
    width, height = widget.size
    return [strip.text for strip in widget.render_lines(Region(0, 0, width, height))]


@sync
async def test_instruction_rows_show_semaphore_wait_and_operands(source_root: Path) -> None:
    app = viewer(BERT, source_root)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await type_into(pilot, "dot.45")
        await pilot.press("enter", "enter")  # jump to the op, open it
        await settle(pilot)
        rows = [r.node for r in app.query_one("#tree", HierarchyTable).rows_shown if r.node.kind == "instr"]
        assert rows
        # dot.45's LDWEIGHTS that waited 8.38 µs for semaphore 1 to reach 78 (values in the sample)
        waited = next(n for n in rows if "wait 8.38 µs" in n.detail)
        assert waited.name == "LDWEIGHTS" and "$S[1]>=78" in waited.detail
        assert all(" wait " in n.detail for n in rows)
        table = app.query_one("#tree", HierarchyTable)
        index = next(i for i, r in enumerate(table.rows_shown) if r.node is waited)
        assert "wait 8.38 µs  $S[1]>=78" in table._line(index)[0]


@pytest.mark.parametrize(
    ("metadata", "name", "size", "shown", "not_shown"),
    [
        ({"capture_complete": False}, "run.incomplete", (80, 24), "INCOMPLETE", None),
        ({}, "whole", (80, 24), None, "INCOMPLETE"),
        (
            {"warm_up_execution": True, "requested_execution": 3},
            "execution=2",
            (160, 30),
            "warm-up execution 2 (asked for 3)",
            "INCOMPLETE",
        ),
    ],
    ids=["incomplete", "complete", "warm-up"],
)
@sync
async def test_the_title_marks_incomplete_and_warm_up_profiles(
    tmp_path: Path,
    metadata: dict[str, object],
    name: str,
    size: tuple[int, int],
    shown: str | None,
    not_shown: str | None,
) -> None:
    app = viewer(bert_copy(tmp_path, metadata=metadata, name=name), source_root=None)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        assert shown is None or shown in title_text(app)
        assert not_shown is None or not_shown not in title_text(app)


@sync
async def test_summary_at_80x24_never_wraps_inside_a_figure(source_root: Path) -> None:
    app = viewer(BERT, source_root)
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
    from explorer.viewer.treetable import FIGURE_COLUMNS, FIXED_WIDTH, figure_text
    from explorer.viewer.view_model import Node, NodeStats

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


# -- a bottom-up view, and problems that point at where the cost is ---------------------------------


def test_op_kinds_across_layers() -> None:
    from explorer.viewer.bottomup import kind_of, op_kind

    assert op_kind("dot.217") == "dot" and op_kind("layer_norm.3") == "layer_norm" and op_kind("add") == "add"
    a, b = kind_of("model/layers.0/mlp/down_proj", "dot.7"), kind_of("model/layers.9/mlp/down_proj", "dot.90")
    assert a == b and a.label == "down_proj" and a.key == "K:down_proj"
    assert kind_of("model/layers.0/mlp/up_proj", "dot.5") != a and kind_of(None, "dot.1").label == "dot"


@sync
async def test_tensor_idle_points_at_the_kind_where_the_waiting_is() -> None:
    """The finding names the module kind with most of the waiting (q_proj across both decoder
    layers, 28.6 %), not the op with the single largest wait; enter goes there."""
    app = viewer(LLAMA_TP2, source_root=None)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        idle = app.analysis.problems[0]
        assert idle.title == "Tensor engine blocked on semaphores" and idle.kind == "K:q_proj"
        assert ("most in q_proj (28.6% of it, largest model/layers.0/self_attn/q_proj, op dot.19)"
                in idle.detail)
        node = app.analysis.hierarchy.nodes[idle.node]
        assert node.name == "dot.19" and node.layer == "model/layers.0/self_attn/q_proj"
        kind = app.analysis.bottom_up.nodes["K:q_proj"]
        assert kind.detail.startswith("×") and idle.node in app.analysis.bottom_up.children["K:q_proj"]


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
async def test_small_terminals_degrade(size: tuple[int, int], source_root: Path) -> None:
    app = viewer(BERT, source_root)
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


def test_view_launches_the_viewer(monkeypatch: pytest.MonkeyPatch, source_root: Path) -> None:
    ran: list[ViewerApp] = []
    monkeypatch.setattr(view_command, "is_terminal", lambda: True)
    monkeypatch.setattr(ViewerApp, "run", lambda self: ran.append(self))
    assert main(["view", str(LLAMA_TP2), "--source-root", str(source_root)]) == 0
    app = ran[0]
    assert len(app.entries) == 2 and app.source_root == source_root
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


@sync
async def test_why_pane_shows_the_critical_path(source_root: Path) -> None:
    """``w`` opens the analyses pane: the critical path (= device time) and idle by cause."""
    from explorer.viewer.why_screen import WhyScreen

    app = viewer(BERT, source_root)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("w")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, WhyScreen)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.lines is not None
        text = "\n".join(screen.lines)
        assert "= device time" in text and "idle by cause:" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, WhyScreen)
