"""``neuron-profile view DIR``: the interactive profile viewer (Textual).

Layout: summary (figures, engine bars, problems, what is missing) | hierarchy table and source pane,
with the engine timeline strip below. Keys are listed in ``HELP`` (``?`` shows them).

Threading, as memray's live viewer and Textual's own examples do it: every query runs in a worker
thread (``@work(thread=True)``) and comes back as an immutable snapshot (``explorer.viewer.view_model``)
that the UI thread swaps in; the UI thread itself never reads a Parquet file. Results that arrive
after the user switched profiles are dropped (``_generation``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Input, OptionList, Static

from explorer.viewer import tree_build as tree
from explorer.viewer.data import ProfileData
from explorer.viewer.panes import SourcePane, SummaryPane, TimelineStrip
from explorer.viewer.treetable import HierarchyTable, flatten
from explorer.viewer.view_model import Analysis, EngineStrip, Hierarchy, Node, Overview, Problem, SourceFile
from formats.read_api import ProfileEntry, SourceStatus, open_profile

HELP = """\
[b]neuron-profile view[/b] — keys

  ↑ ↓ PgUp PgDn   move in the focused pane        tab / shift+tab   next / previous pane
  → / ←           open / close a node              enter / space     open or close; on "more", next page
  s / r           sort by next column / reverse    /                 search by name (n / N: next, previous)
  f               filter box (esc clears)          t                 timeline: selected node / whole profile
  h  c  p         focus hierarchy, code, problems  enter on a problem  go to where it happens
  enter on a code line   select the nodes that line made (and back: selecting a node marks its lines)
  o               other source file                z                 zoom the focused pane (again: restore)
  b               bottom-up: op kinds across layers (all down_proj), and back to layers -> ops
  [ / ]           previous / next profile          q                 quit
  ?               this help                        esc               close help / clear filter and marks
"""


def one_line(exc: BaseException) -> str:
    """An exception as one short line for the UI (workers report, they do not raise)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def profile_name(entry: ProfileEntry, metadata: dict[str, Any]) -> str:
    """A name without temp or home paths: the dataset partition, or Metadata.profile_name, or the folder."""
    if entry.name != ".":
        return entry.name
    return str(metadata.get("profile_name") or entry.path.name)


class HelpScreen(ModalScreen[None]):
    """The key list; any of escape, q, ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark,h", "dismiss_help", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(Text.from_markup(HELP), id="help")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class ConfirmRead(ModalScreen[bool]):
    """Ask before reading a source file the profile names outside the trusted directories."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Read it"),
        Binding("n,escape,q", "answer(False)", "Do not read"),
    ]

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        text = Text("Read a file outside your source directories?\n\n", style="bold")
        text.append(str(self.path), style="bold yellow")
        text.append(
            "\n\nThe profile names this file, but it is not under --source-root or the directory the "
            "capture ran in. Profiles from other people can name any file.\n\n"
        )
        text.append("y", style="bold")
        text.append(": read it     ")
        text.append("n / esc", style="bold")
        text.append(": do not")
        yield Static(text, id="confirm")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


@dataclass
class ViewState:
    """What the user did (UI-thread only): opened nodes, pages, sort, filter, marks, selection."""

    expanded: set[str]
    pages: dict[str, tuple[Node, ...]]
    sort: str = "time"
    reverse: bool = False
    filter: str = ""
    search: str = ""
    marked: set[str] | None = None
    selected: str | None = None
    whole_timeline: bool = False
    file_index: int = 0


class ViewerApp(App[None]):
    """The profile viewer over the profiles ``entries`` (one, or a dataset's; ``[``/``]`` switch)."""

    TITLE = "neuron-profile view"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #title { height: 1; background: $primary-background; color: $text; padding: 0 1; }
    #body { height: 1fr; }
    #summary { width: 38; border-right: solid $primary-background-lighten-2; padding: 0 1; }
    #figures { height: auto; }
    #problems-box { height: 1fr; min-height: 3; }
    #problems-title { text-style: bold; margin-top: 1; }
    #problems { height: 1fr; border: none; padding: 0; }
    #notes { height: auto; max-height: 8; }
    #main { width: 1fr; }
    #tree { height: 3fr; overflow-x: hidden; }
    #source { height: 2fr; border-top: solid $primary-background-lighten-2; }
    #source-title { height: 1; padding: 0 1; }
    #source-table { height: 1fr; }
    #timeline { height: 10; padding: 0 1; border-top: solid $primary-background-lighten-2;
                text-wrap: nowrap; text-overflow: ellipsis; }
    #query { dock: bottom; display: none; height: 3; }
    #query.shown { display: block; }
    #help { width: auto; height: auto; padding: 1 2; border: thick $primary; background: $surface; }
    HelpScreen { align: center middle; }
    #confirm { width: 72; max-width: 100%; height: auto; padding: 1 2; border: thick $warning;
               background: $surface; }
    ConfirmRead { align: center middle; }
    .narrow #body { layout: vertical; }
    .narrow #summary { width: 1fr; height: 6; border-right: none; layout: horizontal;
                       border-bottom: solid $primary-background-lighten-2; }
    .narrow #figures { width: 1fr; }
    .narrow #problems-box { width: 1fr; height: 1fr; min-height: 1; }
    .narrow #problems-title { display: none; }
    .narrow #notes { display: none; }
    .narrow #source { display: none; }
    .narrow #timeline { height: 7; }
    .narrow.code #source { display: block; height: 2fr; }
    .narrow.code #tree { height: 1fr; }
    .narrow.code #timeline { display: none; }
    .short #timeline { height: 7; }
    .tiny #summary, .tiny #timeline { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("slash", "search", "Search"),
        Binding("f", "filter", "Filter"),
        Binding("n", "next_match", "Next", show=False),
        Binding("N", "previous_match", "Previous", show=False),
        Binding("s", "cycle_sort", "Sort"),
        Binding("r", "reverse_sort", "Reverse", show=False),
        Binding("t", "toggle_timeline", "Timeline"),
        Binding("b", "bottom_up", "Bottom-up"),
        Binding("o", "other_file", "Other file", show=False),
        Binding("z", "zoom", "Zoom"),
        Binding("h", "focus('tree')", "Hierarchy", show=False),
        Binding("c", "focus('source-table')", "Code", show=False),
        Binding("p", "focus('problems')", "Problems", show=False),
        Binding("left_square_bracket", "switch_profile(-1)", "Prev profile", show=False),
        Binding("right_square_bracket", "switch_profile(1)", "Next profile", show=False),
        Binding("escape", "clear", "Clear", show=False),
        Binding("w", "why", "Why", show=False),
    ]

    def __init__(
        self,
        entries: Sequence[ProfileEntry],
        *,
        source_root: Path | None = None,
        first: ProfileData | None = None,
    ) -> None:
        super().__init__()
        if not entries:
            raise ValueError("no profiles to view")
        self.entries = list(entries)
        self.source_root = source_root
        self.current = 0
        self.data: ProfileData | None = first
        self.overview: Overview | None = None
        self.analysis: Analysis | None = None
        self._top_down: Hierarchy | None = None
        self.bottom_up = False  # the tree shows op kinds across layers (``b``)
        self.timeline: EngineStrip | None = None
        self.state = ViewState(set(), {})
        self.matches: list[str] = []
        self.match_index = -1
        self.error: str | None = None
        self.confirmed_sources: set[Path] = set()  # files outside the trusted roots the user allowed
        self._generation = 0
        self._query_mode = "filter"
        self._source_shown: str | None = None
        self._timeline_wanted: tuple[int, int] | None = None
        self._timeline_override: tuple[str, tuple[int, int]] | None = None  # a problem's time range

    @property
    def hierarchy(self) -> Hierarchy | None:
        """The tree on screen: layers -> ops (top-down), or op kinds -> ops (bottom-up, ``b``)."""
        if self.bottom_up and self.analysis is not None and self.analysis.bottom_up is not None:
            return self.analysis.bottom_up
        return self._top_down

    @hierarchy.setter
    def hierarchy(self, value: Hierarchy | None) -> None:
        self._top_down = value

    # -- layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="title")
        with Horizontal(id="body"):
            yield SummaryPane(id="summary")
            with Vertical(id="main"):
                yield HierarchyTable(id="tree")
                yield SourcePane(id="source")
                yield TimelineStrip("", id="timeline")
        yield Input(id="query")
        yield Footer()

    def on_mount(self) -> None:
        self._size_classes()
        self.query_one("#summary", SummaryPane).show_problems(None)
        self.query_one("#source", SourcePane).show_message("Source", "loading…")
        self.query_one("#tree", HierarchyTable).focus()
        self._draw_title()
        self._load(self.current, self.data)

    def on_resize(self) -> None:
        self._size_classes()
        if self.overview is not None:
            self.query_one("#summary", SummaryPane).show_overview(
                self.overview, self.screen.has_class("narrow")
            )

    def on_descendant_focus(self) -> None:
        """In a narrow terminal the source pane replaces the timeline while it has the focus."""
        focused = self.focused
        self.screen.set_class(focused is not None and focused.id == "source-table", "code")

    async def action_focus(self, widget_id: str) -> None:
        if widget_id == "source-table":
            self.screen.add_class("code")  # narrow terminals: show the (hidden) source pane first
        await super().action_focus(widget_id)

    def _size_classes(self) -> None:
        width, height = self.size
        self.screen.set_class(width < 120, "narrow")
        self.screen.set_class(height < 34, "short")
        self.screen.set_class(width < 60 or height < 16, "tiny")

    def _draw_title(self) -> None:
        parts = [Text("neuron-profile view", style="bold")]
        name = self.overview.name if self.overview else self.entries[self.current].name
        parts.append(Text(f"  {name}"))
        if len(self.entries) > 1:
            parts.append(Text(f"  ({self.current + 1}/{len(self.entries)}, [ ] switch)", style="dim"))
        if self.hierarchy is not None:
            parts.append(Text(f"  tree: {self.hierarchy.source}", style="dim"))
            if self.hierarchy.malformed:
                parts.append(Text(f" ({self.hierarchy.malformed})", style="yellow"))
        mark = self._capture_mark()
        if mark:
            parts.append(Text(f"  [{mark}]", style="bold white on dark_red"))
        if self.state.filter:
            parts.append(Text(f"  filter: {self.state.filter}", style="yellow"))
        if self.state.search and self.matches:
            parts.append(Text(f"  search: {self.state.search} {self.match_index + 1}/{len(self.matches)}",
                              style="cyan"))
        if self.error:
            parts.append(Text(f"  {self.error}", style="bold red"))
        self.query_one("#title", Static).update(Text.assemble(*parts))

    def _capture_mark(self) -> str:
        """How the profile on screen was cut short, if it was: its folder says so
        (``<dir>.incomplete``) or its own Metadata/warnings do (``formats.dataset.capture_state``,
        read into ``Overview.mark``); a warm-up execution kept in place of the one asked for too."""
        if self.overview is not None and self.overview.mark:
            return self.overview.mark
        return "" if self.entries[self.current].complete else "INCOMPLETE"

    # -- loading (workers) ---------------------------------------------------------------------------
    def _post(self, generation: int, fn: Callable[..., None], *args: Any) -> None:
        """Hand a worker's result to the UI thread unless the user moved on to another profile."""
        if generation != self._generation:
            return
        with contextlib.suppress(RuntimeError):  # the app is shutting down
            self.call_from_thread(fn, generation, *args)

    def _load(self, index: int, data: ProfileData | None = None) -> None:
        self._generation += 1
        self.overview = self.analysis = self.hierarchy = None
        self.timeline = None
        self.state = ViewState(set(), {}, sort=self.state.sort, reverse=self.state.reverse)
        self._source_shown = None
        self._load_profile(self._generation, index, data)

    @work(thread=True, exclusive=True, group="profile")
    def _load_profile(self, generation: int, index: int, data: ProfileData | None) -> None:
        try:
            if data is None:
                entry = self.entries[index]
                profile = open_profile(entry.path, left_out=[])  # left out: shown as missing
                data = ProfileData(profile, profile_name(entry, profile.metadata), self.source_root)
            self._post(generation, self._set_data, data)
            overview = data.overview()
            self._post(generation, self._show_overview, overview)
            analysis = data.analyse(overview)
            self._post(generation, self._show_analysis, analysis)
        except Exception as exc:  # a corrupt page met mid-scan, a closed profile: a line, never a crash
            self._post(generation, self._show_error, one_line(exc))

    def _set_data(self, generation: int, data: ProfileData) -> None:
        old, self.data = self.data, data
        if old is not None and old is not data:
            old.close()

    def _show_error(self, generation: int, message: str) -> None:
        self.error = message
        self._draw_title()
        if self.hierarchy is None:
            self.query_one("#tree", HierarchyTable).show_message(message)

    def _show_overview(self, generation: int, overview: Overview) -> None:
        self.overview = overview
        self.hierarchy = overview.hierarchy
        self.error = None
        self.query_one("#summary", SummaryPane).show_overview(overview, self.screen.has_class("narrow"))
        self._open_single_chain()
        self._redraw_tree()
        self._draw_title()
        self._selection_changed(force=True)

    def _open_single_chain(self) -> None:
        """Open a chain of single layers from the root (what a person would click through first)."""
        if self.hierarchy is None or self.state.expanded:
            return
        children = self.hierarchy.children
        roots = children.get("", ())
        while len(roots) == 1 and roots[0] in children:
            self.state.expanded.add(roots[0])
            roots = children.get(roots[0], ())

    def _show_analysis(self, generation: int, analysis: Analysis) -> None:
        self.analysis = analysis
        self.hierarchy = analysis.hierarchy
        self._open_single_chain()
        self.query_one("#summary", SummaryPane).show_problems(analysis.problems)
        self._redraw_tree()
        self._draw_title()
        self._selection_changed(force=True)

    @work(thread=True, group="page")
    def _load_page(self, generation: int, node: Node, offset: int) -> None:
        data = self.data
        if data is None:
            return
        try:
            rows = data.instruction_page(node, offset)
        except Exception as exc:
            rows = (Node(f"X:{node.key}", "info", one_line(exc), node.key),)
        self._post(generation, self._add_page, node.key, offset, rows)

    def _add_page(self, generation: int, key: str, offset: int, rows: tuple[Node, ...]) -> None:
        kept = tuple(n for n in self.state.pages.get(key, ()) if n.kind == "instr") if offset else ()
        self.state.pages[key] = kept + rows
        self._redraw_tree()

    @work(thread=True, exclusive=True, group="timeline")
    def _load_timeline(self, generation: int, span: tuple[int, int], cells: int) -> None:
        data = self.data
        if data is None:
            return
        try:
            result: EngineStrip | None = data.timeline(span[0], span[1], cells)
        except Exception as exc:
            result = EngineStrip(span[0], span[1], (), f"error: {one_line(exc)}")
        self._post(generation, self._show_timeline, result)

    def _show_timeline(self, generation: int, timeline: EngineStrip) -> None:
        if (timeline.t0, timeline.t1) != self._timeline_wanted:
            return  # an older request, overtaken by a newer selection
        strip = self.query_one("#timeline", TimelineStrip)
        if timeline.rows and len(timeline.rows[0].occupancy) != strip.cells():
            self._request_timeline()  # the strip was resized while this one was computed
            return
        self.timeline = timeline
        self._draw_timeline()

    @on(TimelineStrip.CellsChanged)
    def _timeline_resized(self) -> None:
        if self.overview is not None:
            self._request_timeline()

    @work(thread=True, exclusive=True, group="source")
    def _load_source(self, generation: int, recorded: str) -> None:
        data = self.data
        if data is None:
            return
        try:
            file = data.source_file(recorded, frozenset(self.confirmed_sources))
        except Exception as exc:  # source_access never raises; this guard keeps it so for the UI
            file = SourceFile(recorded, SourceStatus.UNREADABLE, message=f"cannot read: {one_line(exc)}")
        self._post(generation, self._show_source, file)

    def _show_source(self, generation: int, file: SourceFile) -> None:
        if self.analysis is None or file.recorded != self._source_shown:
            return
        files = self.analysis.source.files
        note = (
            f"(file {files.index(file.recorded) + 1}/{len(files)}, o: next)"
            if file.recorded in files and len(files) > 1
            else ""
        )
        pane = self.query_one("#source", SourcePane)
        pane.show_file(file, self.analysis.source, note)
        self._source_shown = file.recorded
        pane.mark(self._node_lines(), move=True)

    # -- drawing -------------------------------------------------------------------------------------
    def _visible(self) -> set[str] | None:
        if not self.state.filter or self.hierarchy is None:
            return None
        found = tree.matches(self.hierarchy, self.state.filter)
        visible = set(found)
        for key in found:
            visible.update(self.hierarchy.ancestors(key))
        return visible

    def _redraw_tree(self) -> None:
        if self.hierarchy is None:
            return
        rows = flatten(
            self.hierarchy,
            self.state.pages,
            self.state.expanded,
            sort=self.state.sort,
            reverse=self.state.reverse,
            visible=self._visible(),
            marked=self.state.marked or set(),
        )
        table = self.query_one("#tree", HierarchyTable)
        if not rows:
            message = (
                f"nothing matches {self.state.filter!r}"
                if self.state.filter
                else (
                    "no layers or ops in this profile"
                    if self.analysis is not None
                    else "building the hierarchy from the Instruction table…"
                )
            )
            table.show_message(message)
            return
        total = self.overview.total_ns if self.overview else None
        table.show(rows, total, self.state.selected, self.state.sort, self.state.reverse)

    def _selected_node(self) -> Node | None:
        if self.hierarchy is None or self.state.selected is None:
            return None
        node = self.hierarchy.nodes.get(self.state.selected)
        if node is None:
            for page in self.state.pages.values():
                node = next((n for n in page if n.key == self.state.selected), None)
                if node is not None:
                    break
        return node

    def _timeline_span(self) -> tuple[str, tuple[int, int] | None]:
        if self._timeline_override is not None:
            return self._timeline_override
        node = self._selected_node()
        whole = self.overview.span if self.overview else None
        if self.state.whole_timeline or node is None or node.stats.span is None:
            return "whole profile", whole
        return node.name, node.stats.span

    def _request_timeline(self) -> None:
        title, span = self._timeline_span()
        strip = self.query_one("#timeline", TimelineStrip)
        if span is None:
            self.timeline = EngineStrip(0, 1, (), "no time range")
            strip.show_timeline(title, self.timeline, 0)
            return
        self.timeline = None
        self._timeline_wanted = (span[0], max(span[1], span[0] + 1))
        self._draw_timeline()
        self._load_timeline(self._generation, span, strip.cells())

    def _draw_timeline(self) -> None:
        title, _ = self._timeline_span()
        origin = self.overview.span[0] if self.overview and self.overview.span else 0
        self.query_one("#timeline", TimelineStrip).show_timeline(title, self.timeline, origin)

    def _node_lines(self) -> tuple[tuple[str, int], ...]:
        if self.analysis is None or self.state.selected is None:
            return ()
        key = self.state.selected
        node = self._selected_node()
        if node is not None and node.kind in ("instr", "more", "info"):
            key = node.parent
        return self.analysis.source.node_lines.get(key, ())

    def _sync_source(self) -> None:
        pane = self.query_one("#source", SourcePane)
        if self.analysis is None:
            return
        index = self.analysis.source
        if not index.files:
            message = index.message or "no source lines recorded"
            if not index.available:
                message = (
                    "no code linking: the profile has no StackFrame tables and no source-location columns"
                )
            pane.show_message("Source", message)
            self._source_shown = None
            return
        lines = self._node_lines()
        wanted = lines[0][0] if lines else index.files[self.state.file_index % len(index.files)]
        if wanted != self._source_shown:
            self.state.file_index = index.files.index(wanted) if wanted in index.files else 0
            self._source_shown = wanted
            self._load_source(self._generation, wanted)
        else:
            pane.mark(lines, move=True)

    def _selection_changed(self, force: bool = False) -> None:
        row = self.query_one("#tree", HierarchyTable).current()
        key = row.node.key if row is not None else None
        if key == self.state.selected and not force:
            return
        self.state.selected = key
        self._timeline_override = None
        self._request_timeline()
        self._sync_source()

    # -- events --------------------------------------------------------------------------------------
    @on(HierarchyTable.Highlighted)
    def _tree_moved(self) -> None:
        self._selection_changed()

    @on(HierarchyTable.Selected)
    def _tree_enter(self) -> None:
        row = self.query_one("#tree", HierarchyTable).current()
        if row is not None:
            self._toggle(row.node.key, None)

    @on(HierarchyTable.Toggle)
    def _tree_toggle(self, event: HierarchyTable.Toggle) -> None:
        self._toggle(event.key, event.want)

    def _toggle(self, key: str, want: bool | None) -> None:
        node = self._find(key)
        if node is None:
            return
        if node.kind == "more":
            parent = self.hierarchy.nodes.get(node.parent) if self.hierarchy else None
            if parent is not None:
                self.state.selected = key
                self._load_page(self._generation, parent, node.offset)
            return
        if not node.expandable:
            if want is False and node.parent:  # left on a leaf: go to its parent
                self._select(node.parent)
            return
        opened = key in self.state.expanded
        target = (not opened) if want is None else want
        if target == opened:
            if want is False and node.parent:
                self._select(node.parent)
            return
        if target:
            self.state.expanded.add(key)
            if node.kind == "hlo" and key not in self.state.pages:
                self._load_page(self._generation, node, 0)
        else:
            self.state.expanded.discard(key)
        self._redraw_tree()

    def _find(self, key: str) -> Node | None:
        if self.hierarchy is not None and key in self.hierarchy.nodes:
            return self.hierarchy.nodes[key]
        for page in self.state.pages.values():
            for node in page:
                if node.key == key:
                    return node
        return None

    def _select(self, key: str) -> None:
        """Move the tree cursor to ``key``, opening its ancestors."""
        if self.hierarchy is None:
            return
        for ancestor in self.hierarchy.ancestors(key):
            self.state.expanded.add(ancestor)
        if self.state.filter and key not in (self._visible() or set()):
            self.state.filter = ""
            self._draw_title()
        self.state.selected = key
        self._redraw_tree()
        self._selection_changed(force=True)

    @on(DataTable.RowSelected, "#source-table")
    def _source_enter(self, event: DataTable.RowSelected) -> None:
        """A code line selects the ops it made (marked in the tree; the cursor goes to the biggest).
        On a file outside the trusted directories, enter asks whether to read it."""
        pending = self.query_one("#source", SourcePane).file
        if pending is not None and pending.status is SourceStatus.NEEDS_CONFIRM and pending.path:
            self.push_screen(ConfirmRead(pending.path), self._confirmed(pending.recorded, pending.path))
            return
        if self.analysis is None or self.hierarchy is None:
            return
        line = self.query_one("#source", SourcePane).cursor_line()
        keys = self.analysis.source.line_nodes.get(line, ()) if line else ()
        if not keys:
            self.notify("no instructions were attributed to this line", severity="warning", timeout=3)
            return
        self.state.marked = set(keys)
        nodes = self.hierarchy.nodes
        best = max((k for k in keys if k in nodes), key=lambda k: nodes[k].stats.time_ns or 0, default=None)
        for key in keys:
            for ancestor in self.hierarchy.ancestors(key):
                self.state.expanded.add(ancestor)
        if best is not None:
            self._select(best)

    @on(OptionList.OptionSelected, "#problems")
    def _problem_chosen(self, event: OptionList.OptionSelected) -> None:
        if self.analysis is None or event.option_id is None:
            return
        problem: Problem = self.analysis.problems[int(event.option_id.split("-")[1])]
        kinds = self.analysis.bottom_up
        if problem.kind and kinds is not None and problem.kind in kinds.nodes:
            self._set_bottom_up(True)  # the kind the finding adds up over, its biggest instance selected
        if problem.node and self.hierarchy is not None and problem.node in self.hierarchy.nodes:
            self.state.whole_timeline = False
            self._select(problem.node)
            self.query_one("#tree", HierarchyTable).focus()
        elif problem.t0 is not None and problem.t1 is not None:
            self._timeline_override = (problem.title, (problem.t0, problem.t1))
            self._request_timeline()

    @on(Input.Changed, "#query")
    def _query_changed(self, event: Input.Changed) -> None:
        if self._query_mode == "filter":
            self.state.filter = event.value.strip()
            self._redraw_tree()
            self._draw_title()

    @on(Input.Submitted, "#query")
    def _query_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self._hide_query()
        if self._query_mode == "search":
            self.state.search = text
            self._find_matches()
            self.action_next_match()

    def _hide_query(self) -> None:
        box = self.query_one("#query", Input)
        box.remove_class("shown")
        self.query_one("#tree", HierarchyTable).focus()

    def _find_matches(self) -> None:
        self.matches, self.match_index = [], -1
        if not self.state.search or self.hierarchy is None:
            return
        found = tree.matches(self.hierarchy, self.state.search)
        everything = set(self.hierarchy.nodes)
        order = flatten(
            self.hierarchy,
            {},
            everything,
            sort=self.state.sort,
            reverse=self.state.reverse,
            visible=None,
            marked=set(),
        )
        self.matches = [r.node.key for r in order if r.node.key in found]
        if not self.matches:
            self.notify(f"no layer or op named like {self.state.search!r}", severity="warning", timeout=3)
            self._draw_title()

    def _confirmed(self, recorded: str, path: Path) -> Callable[[bool | None], None]:
        def done(yes: bool | None) -> None:
            if yes:
                self.confirmed_sources.add(path)
                self._source_shown = recorded
                self._load_source(self._generation, recorded)

        return done

    # -- actions -------------------------------------------------------------------------------------
    def action_why(self) -> None:
        """The analyses pane (critical path, idle by cause) of the profile on screen."""
        if self.data is None:
            self.notify("the profile is still opening", timeout=2)
            return
        from explorer.viewer.why_screen import WhyScreen

        self.push_screen(WhyScreen(self.data.profile, self.data.name))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def _open_query(self, mode: str, placeholder: str, value: str) -> None:
        self._query_mode = mode
        box = self.query_one("#query", Input)
        box.placeholder = placeholder
        box.value = value
        box.add_class("shown")
        box.focus()

    def action_search(self) -> None:
        self._open_query(
            "search",
            "search layers and ops by name, enter to jump (n / N: next, previous)",
            self.state.search,
        )

    def action_filter(self) -> None:
        self._open_query(
            "filter", "filter layers and ops by name (enter: keep, esc: clear)", self.state.filter
        )

    def action_next_match(self) -> None:
        self._step_match(1)

    def action_previous_match(self) -> None:
        self._step_match(-1)

    def _step_match(self, step: int) -> None:
        if not self.matches:
            return
        self.match_index = (self.match_index + step) % len(self.matches)
        self._select(self.matches[self.match_index])
        self._draw_title()  # the title says "search: text 3/17"

    def action_bottom_up(self) -> None:
        self._set_bottom_up(not self.bottom_up)
        self.notify(
            "bottom-up: op kinds across layers" if self.bottom_up else "top-down: layers and ops", timeout=2
        )

    def _set_bottom_up(self, on: bool) -> None:
        """Switch the tree between layers -> ops and op kinds -> ops; the selected op stays selected."""
        if self.analysis is None or self.analysis.bottom_up is None:
            if on:
                self.notify("the bottom-up view needs the instruction scan; it is still running", timeout=2)
            return
        if on == self.bottom_up:
            return
        keep = self.state.selected
        self.bottom_up = on
        self.matches, self.match_index = [], -1
        if keep is not None and self.hierarchy is not None and keep in self.hierarchy.nodes:
            self._select(keep)
        else:
            self.state.selected = None
            self._redraw_tree()
            self._selection_changed(force=True)
        self._draw_title()

    def action_cycle_sort(self) -> None:
        keys = tree.SORT_KEYS
        self.state.sort = keys[(keys.index(self.state.sort) + 1) % len(keys)]
        self._redraw_tree()
        self.notify(f"sorted by {self.state.sort}", timeout=1.5)

    def action_reverse_sort(self) -> None:
        self.state.reverse = not self.state.reverse
        self._redraw_tree()

    def action_toggle_timeline(self) -> None:
        self.state.whole_timeline = not self.state.whole_timeline
        self._timeline_override = None
        self._request_timeline()

    def action_other_file(self) -> None:
        if self.analysis is None or not self.analysis.source.files:
            return
        files = self.analysis.source.files
        self.state.file_index = (self.state.file_index + 1) % len(files)
        self._source_shown = files[self.state.file_index]
        self._load_source(self._generation, self._source_shown)

    def action_zoom(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
            return
        focused = self.focused
        if focused is not None:
            target = focused.parent if focused.id == "source-table" else focused
            if focused.id == "problems":
                target = self.query_one("#summary")
            if isinstance(target, Widget):
                self.screen.maximize(target, container=False)

    def action_switch_profile(self, step: int) -> None:
        if len(self.entries) < 2:
            self.notify("this folder holds one profile", timeout=2)
            return
        self.current = (self.current + step) % len(self.entries)
        self._load(self.current)
        self._draw_title()

    def action_clear(self) -> None:
        if self.query_one("#query", Input).has_class("shown"):
            if self._query_mode == "filter":
                self.state.filter = ""
                self._redraw_tree()
            self._hide_query()
        elif self.screen.maximized is not None:
            self.screen.minimize()
        else:
            self.state.filter = ""
            self.state.search = ""
            self.state.marked = None
            self.matches, self.match_index = [], -1
            self._redraw_tree()
        self._draw_title()

    async def action_quit(self) -> None:
        self.exit()

    def on_unmount(self) -> None:
        if self.data is not None:
            self.data.close()
