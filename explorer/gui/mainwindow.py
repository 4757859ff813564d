"""The main window: banner, timeline over the hierarchy flame chart, panels on the right.

It owns the wiring and nothing else: a click on the timeline asks ``details`` (on the query pool) and
shows the answer; a box asks ``region``; the flame chart, the source panel and the search panel each
produce a ``Highlight`` for the timeline and a range to zoom to. Every query runs off the UI thread
(``worker.TaskRunner``) unless ``synchronous`` -- headless screenshots and tests want the finished
picture, not a responsive one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from explorer.gui import colors
from explorer.gui.details import Dependency, Details, details_for
from explorer.gui.details_panel import DetailsPanel
from explorer.gui.flame import FlameWidget
from explorer.gui.flame_tree import FlameNode, FlameTree, load_flame_tree
from explorer.gui.frames import Highlight
from explorer.gui.legend import LegendEntry, legend_entries, legend_html
from explorer.gui.qt_tables import fill_table, make_table
from explorer.gui.region import RegionSummary, region_summary
from explorer.gui.region_panel import RegionPanel
from explorer.gui.rows import DMA, INSTRUCTION, Row, discover_rows
from explorer.gui.search import SearchError, search
from explorer.gui.search_panel import SearchPanel
from explorer.gui.session import LoadedProfile, Session
from explorer.gui.source_panel import SourcePanel
from explorer.gui.source_times import SourceTimes, load_source_times
from explorer.gui.timeaxis import format_ns
from explorer.gui.timeline import Arrow, EventRef, TimelineWidget, link_time
from explorer.gui.worker import FrameFetcher, TaskRunner

BANNER_LINES = 6


class Banner(QLabel):
    """What could not be opened or is missing, one line each; click to dismiss."""

    def __init__(self, lines: Sequence[str]) -> None:
        shown = list(lines[:BANNER_LINES])
        if len(lines) > BANNER_LINES:
            shown.append(f"… and {len(lines) - BANNER_LINES} more")
        super().__init__("\n".join(f"⚠ {line}" for line in shown))
        self.setWordWrap(True)
        self.setStyleSheet(
            "background: #fff4c2; color: #5a4500; padding: 4px 8px; border-bottom: 1px solid #e0c860;"
        )
        self.setToolTip("click to dismiss")
        self.setVisible(bool(lines))

    def mousePressEvent(self, event: Any) -> None:
        self.hide()


class MainWindow(QMainWindow):
    def __init__(
        self, session: Session, rows: Sequence[Row] | None = None, *, synchronous: bool = False
    ) -> None:
        super().__init__()
        self.session = session
        rows = list(rows) if rows is not None else discover_rows(session)
        self.synchronous = synchronous
        self.focus = 0  # the profile the hierarchy, source and summary tabs show
        self.runner = TaskRunner()
        self._callbacks: dict[int, Callable[[Any], None]] = {}
        self.runner.done.connect(self._task_done)
        self.runner.failed.connect(self._task_failed)
        self.hierarchy: FlameTree | None = None
        self.source_times: SourceTimes | None = None
        self.details: Details | None = None
        self.opened: list[MainWindow] = []  # windows opened from File > Open
        self.setWindowTitle(window_title(session))

        self.fetcher = FrameFetcher(session, rows)
        self.timeline = TimelineWidget(session, rows, self.fetcher)
        self.flame = FlameWidget()
        link_time(self.timeline.view, self.flame.view)
        self.details_panel = DetailsPanel()
        self.region_panel = RegionPanel()
        self.search_panel = SearchPanel([p.label for p in session.profiles])
        self.source_panel = SourcePanel()
        self.summary_table = make_table(["metric", "value"])
        self.tabs = QTabWidget()
        self.tabs.addTab(self.details_panel, "Details")
        self.tabs.addTab(self.region_panel, "Selection")
        self.tabs.addTab(self.search_panel, "Search")
        self.tabs.addTab(self.source_panel, "Source")
        self.tabs.addTab(self.summary_table, "Summary")
        self.banner = Banner(session.banner)

        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setStyleSheet("padding: 2px 6px; background: #fafafa; border-bottom: 1px solid #ddd;")
        self.legend_entries: list[LegendEntry] = []
        timeline_box = QWidget()
        timeline_layout = QVBoxLayout(timeline_box)
        timeline_layout.setContentsMargins(0, 0, 0, 0)
        timeline_layout.setSpacing(0)
        timeline_layout.addWidget(self.legend)
        timeline_layout.addWidget(self.timeline, 1)
        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(timeline_box)
        left.addWidget(self.flame)
        left.setSizes([640, 160])
        main = QSplitter(Qt.Orientation.Horizontal)
        main.addWidget(left)
        main.addWidget(self.tabs)
        main.setSizes([1100, 420])
        main.setStretchFactor(0, 1)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.banner)
        layout.addWidget(main, 1)
        self.setCentralWidget(central)
        self._toolbar()
        self._menus()
        self._shortcuts()
        incomplete = [p.label for p in session.profiles if p.incomplete]
        if incomplete:
            self.incomplete_mark = QLabel(f" INCOMPLETE capture: {', '.join(incomplete)} ")
            self.incomplete_mark.setStyleSheet("background: #c0392b; color: white; font-weight: bold;")
            self.incomplete_mark.setToolTip(
                "the capture was interrupted: the tables hold what was recorded up to then"
            )
            self.statusBar().addPermanentWidget(self.incomplete_mark)

        self.timeline.event_clicked.connect(self._event_clicked)
        self.timeline.region_selected.connect(self._region_selected)
        self.timeline.status.connect(lambda text: self.statusBar().showMessage(text))
        self.timeline.frame_shown.connect(lambda _frame: self.update_legend())
        self.update_legend()
        self.timeline.plot.scene().sigMouseMoved.connect(self._mouse_moved)
        self.details_panel.jump.connect(self.jump_to_dependency)
        self.details_panel.show_source.connect(self._show_source)
        self.flame.node_clicked.connect(self.highlight_node)
        self.source_panel.lines_selected.connect(self.highlight_lines)
        self.search_panel.requested.connect(self.run_search)
        self.search_panel.activated.connect(self.jump_to_result)
        self.search_panel.cleared.connect(lambda: self.timeline.set_highlight(None))
        if synchronous:
            self.fetcher.build_lods(synchronous=True)
            self.load_focus()
        else:  # the first frame waits for the levels of detail: nothing else competes for the cores
            self.fetcher.lods_done.connect(self.load_focus)
            self.fetcher.build_lods()
        self.timeline.plot.setFocus()

    # -- chrome ------------------------------------------------------------------------------
    @property
    def rows(self) -> tuple[Row, ...]:
        """The rows the timeline shows now (its current snapshot)."""
        return self.timeline.rows

    def _toolbar(self) -> None:
        bar = QToolBar("view")
        bar.setMovable(False)
        self.addToolBar(bar)
        bar.addWidget(QLabel(" Colour by "))
        self.mode_box = QComboBox()
        for mode in colors.COLOR_MODES:
            self.mode_box.addItem(colors.MODE_LABELS[mode], mode)
        self.mode_box.currentIndexChanged.connect(lambda _i: self.set_mode(str(self.mode_box.currentData())))
        # a toolbar combo keeps no keyboard focus: W/S/A/D keep steering the timeline after it is used
        self.mode_box.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.mode_box.activated.connect(lambda _i: self.timeline.plot.setFocus())
        bar.addWidget(self.mode_box)
        bar.addSeparator()
        fit = QAction("Fit", self)
        fit.setToolTip("show the whole profile (F)")
        fit.triggered.connect(self.timeline.fit)
        bar.addAction(fit)
        clear = QAction("Clear highlight", self)
        clear.triggered.connect(self.clear_highlight)
        bar.addAction(clear)
        if len(self.session.profiles) > 1:
            bar.addSeparator()
            bar.addWidget(QLabel(" Hierarchy/source of "))
            self.focus_box = QComboBox()
            for p in self.session.profiles:
                self.focus_box.addItem(p.label)
            self.focus_box.currentIndexChanged.connect(self._focus_changed)
            self.focus_box.setFocusPolicy(Qt.FocusPolicy.NoFocus)
            self.focus_box.activated.connect(lambda _i: self.timeline.plot.setFocus())
            bar.addWidget(self.focus_box)
        bar.addSeparator()
        self.hint = QLabel(
            "  wheel/W/S zoom · drag/A/D pan · Shift+drag select region · click for details · F1 keys"
        )
        self.hint.setStyleSheet("color: #666;")
        bar.addWidget(self.hint)

    def _menus(self) -> None:
        menu = self.menuBar().addMenu("&File")
        open_action = QAction("Open…", self)
        open_action.setShortcut(QKeySequence.StandardKey.Open)
        open_action.triggered.connect(self._open_dialog)
        menu.addAction(open_action)
        compare = QAction("Compare with…", self)
        compare.triggered.connect(self._compare_dialog)
        menu.addAction(compare)
        shot = QAction("Save screenshot…", self)
        shot.triggered.connect(self._save_screenshot)
        menu.addAction(shot)
        menu.addSeparator()
        quit_action = QAction("Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        menu.addAction(quit_action)
        analyze_menu = self.menuBar().addMenu("&Analyze")
        path = QAction("Highlight critical path", self)
        path.setShortcut(QKeySequence("Ctrl+Shift+P"))
        path.setToolTip("the chain of dependencies whose length is the device time (docs/analyses.md)")
        path.triggered.connect(self.highlight_critical_path)
        analyze_menu.addAction(path)
        help_menu = self.menuBar().addMenu("&Help")
        keys = QAction("Keyboard and mouse…", self)
        keys.setShortcuts([QKeySequence(Qt.Key.Key_F1), QKeySequence("?")])
        keys.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        keys.triggered.connect(self.show_shortcuts)
        help_menu.addAction(keys)
        self.addAction(keys)

    def _shortcuts(self) -> None:
        """W/S/A/D/F steer the timeline wherever the focus is in this window (a combo, a table, a
        panel), except in a text field, which takes typed letters first (Qt's shortcut override)."""
        self.timeline_keys: list[QShortcut] = []
        for key in (Qt.Key.Key_W, Qt.Key.Key_S, Qt.Key.Key_A, Qt.Key.Key_D, Qt.Key.Key_F):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
            shortcut.activated.connect(lambda k=key: self.timeline.handle_key(k))
            self.timeline_keys.append(shortcut)

    def show_shortcuts(self) -> None:
        """The keyboard and mouse reference (F1 or ?)."""
        self.shortcuts_dialog = ShortcutsDialog(self)
        self.shortcuts_dialog.show()

    def _mouse_moved(self, pos: Any) -> None:
        point = self.timeline.view.mapSceneToView(pos)
        x0, x1 = self.timeline.time_range()
        self.statusBar().showMessage(
            f"t = {format_ns(point.x())}   view {format_ns(x0)} → {format_ns(x1)} "
            f"({format_ns(x1 - x0)} wide)",
            3000,
        )

    # -- tasks -------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, then: Callable[[Any], None]) -> None:
        """``then(fn(*args))``: on the query pool, or at once when synchronous."""
        if self.synchronous:
            then(fn(*args))
            return
        token = self.runner.submit(fn, *args)
        if token is not None:  # None: the window was released (a late signal asked for work)
            self._callbacks[token] = then

    def _task_done(self, token: int, result: Any) -> None:
        callback = self._callbacks.pop(token, None)
        if callback is not None:
            callback(result)

    def _task_failed(self, token: int, message: str) -> None:
        self._callbacks.pop(token, None)
        self.statusBar().showMessage(f"query failed: {message}", 10000)

    # -- focus profile: hierarchy, source, summary -------------------------------------------
    def _focus_changed(self, index: int) -> None:
        self.focus = max(0, index)
        self.load_focus()

    def load_focus(self) -> None:
        loaded = self.session.profiles[self.focus]
        self.run(load_flame_tree, loaded, then=self._hierarchy_ready)
        self.run(load_source_times, loaded, then=self._source_ready)
        self.run(_summary_lines, loaded, then=lambda lines: fill_table(self.summary_table, lines))

    def _hierarchy_ready(self, tree: FlameTree) -> None:
        self.hierarchy = tree
        loaded = self.session.profiles[self.focus]
        self.flame.set_tree(tree, loaded.origin, loaded.label if len(self.session.profiles) > 1 else "")

    def _source_ready(self, times: SourceTimes) -> None:
        self.source_times = times
        self.source_panel.set_times(times)

    # -- colour, highlight -------------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        index = self.mode_box.findData(mode)
        if index >= 0 and index != self.mode_box.currentIndex():
            self.mode_box.setCurrentIndex(index)
        self.timeline.set_mode(mode)
        self.update_legend()

    def update_legend(self) -> None:
        """What the colours mean for the current mode and frame."""
        entries, hidden = legend_entries(self.timeline.frame, self.rows, self.timeline.mode)
        self.legend_entries = entries
        self.legend.setText(legend_html(entries, hidden))

    def clear_highlight(self) -> None:
        self.timeline.set_highlight(None)
        self.timeline.set_arrows([])
        self.flame.mark(None)

    def zoom_to(self, t0: float, t1: float, pad: float = 0.05) -> None:
        width = max(10.0, t1 - t0)
        self.timeline.set_range(t0 - width * pad, t1 + width * pad)

    def highlight_node(self, node: FlameNode) -> None:
        if self.hierarchy is None:
            return
        loaded = self.session.profiles[self.focus]
        bounds = (node.start - loaded.origin, node.end - loaded.origin)
        kind = "layer" if node.kind == "layer" else "HLO op"
        self.timeline.set_highlight(
            Highlight(f"{kind} {node.name}", self.hierarchy.where(node), self.focus, bounds)
        )
        self.zoom_to(*bounds)
        self.statusBar().showMessage(f"highlighting the instructions of {kind} {node.name}", 5000)

    def highlight_lines(self, lines: list[tuple[str, int]]) -> None:
        if not lines or self.source_times is None:
            self.timeline.set_highlight(None)
            return
        where = self.source_times.where(lines)
        loaded = self.session.profiles[self.focus]
        description = ", ".join(f"{p.rsplit('/', 1)[-1]}:{n}" for p, n in lines[:3])
        self.timeline.set_highlight(Highlight(f"lines {description}", where, self.focus))
        self.run(_time_range, loaded, where, then=self._zoom_to_absolute)

    def highlight_critical_path(self) -> None:
        """Emphasise the critical path's instructions of the focused profile (Analyze menu); the
        analysis runs on the query pool (``formats.analysis``, through the read API)."""
        loaded = self.session.profiles[self.focus]
        self.statusBar().showMessage(f"computing the critical path of {loaded.label}…")
        self.run(_critical_path, loaded, then=lambda found: self._critical_path_ready(self.focus, found))

    def _critical_path_ready(self, profile: int, found: tuple[str, str] | str) -> None:
        if isinstance(found, str):
            self.statusBar().showMessage(found, 8000)
            return
        where, description = found
        self.timeline.set_highlight(Highlight(description, where, profile))
        self.statusBar().showMessage(description, 8000)

    def _zoom_to_absolute(self, span: tuple[int, int] | None) -> None:
        if span is None:
            return
        origin = self.session.profiles[self.focus].origin
        self.zoom_to(span[0] - origin, span[1] - origin)

    def _show_source(self, path: str, line: int) -> None:
        self.tabs.setCurrentWidget(self.source_panel)
        self.source_panel.show_file(path, line)

    # -- search ------------------------------------------------------------------------------
    def run_search(self, profile: int, field: str, text: str, regex: bool) -> None:
        loaded = self.session.profiles[profile]

        def guarded() -> Any:
            try:
                return search(loaded, field, text, regex)
            except SearchError as exc:
                return exc

        self.run(guarded, then=functools.partial(self._search_done, profile))

    def _search_done(self, profile: int, result: Any) -> None:
        if isinstance(result, Exception):
            self.search_panel.show_error(str(result))
            return
        loaded = self.session.profiles[profile]
        self.search_panel.show_result(result, loaded.origin)
        if result.total:
            self.timeline.set_highlight(Highlight(f"search {result.text!r}", result.where, profile))
        else:
            self.timeline.set_highlight(None)

    def jump_to_result(self, profile: int, row: dict[str, Any]) -> None:
        self.reveal_instruction(profile, int(row["id"]), int(row["start_ts"]), int(row["end_ts"]))

    # -- selection ---------------------------------------------------------------------------
    def _event_clicked(self, ref: EventRef | None) -> None:
        if ref is None:
            self.details_panel.show_details(None)
            return
        self.tabs.setCurrentWidget(self.details_panel)
        loaded = self.session.profiles[ref.profile]
        self.details_panel.title.setText("reading…")
        self.run(
            details_for,
            loaded,
            ref.kind,
            ref.id,
            ref.start_ts,
            then=functools.partial(self._details_ready, ref.profile),
        )

    def _details_ready(self, profile: int, details: Details | None) -> None:
        self.details = details
        self.details_panel.show_details(details, self.session.profiles[profile].origin)
        self._details_profile = profile
        self.timeline.set_arrows(self.dependency_arrows(profile, details))

    def _lane_row(self, profile: int, lane: tuple[str, str, int] | None) -> int | None:
        """The timeline row of a (kind, label, pcore) lane."""
        if lane is None:
            return None
        kind, label, pcore = lane
        for i, row in enumerate(self.rows):
            same = row.kind == kind and row.label == label and (row.pcore or 0) == pcore
            if same and row.profile == profile:
                return i
        return None

    def dependency_arrows(self, profile: int, details: Details | None) -> list[Arrow]:
        """Arrows for the event's Flow edges whose other end is on a row: from each predecessor's end
        to the event's start, and from the event's end to each successor's start."""
        if details is None or details.kind not in (INSTRUCTION, DMA):
            return []
        origin = self.session.profiles[profile].origin
        if details.kind == INSTRUCTION:
            raw = details.raw
            track = raw.get("timeline_track") or raw.get("engine")
            here = self._lane_row(profile, (INSTRUCTION, str(track), int(raw.get("pcore_idx") or 0)))
        else:
            here = self._lane_row(profile, (DMA, str(details.raw.get("queue_name")),
                                            int(details.raw.get("pcore_idx") or 0)))
        if here is None:
            return []
        arrows = []
        for dep in details.dependencies:
            there = self._lane_row(profile, dep.lane)
            if there is None or dep.start_ts is None:
                continue
            if dep.direction == "predecessor":
                end = dep.end_ts if dep.end_ts is not None else dep.start_ts
                arrows.append(Arrow(end - origin, there, details.start_ts - origin, here, dep.kind))
            else:
                arrows.append(Arrow(details.end_ts - origin, here, dep.start_ts - origin, there, dep.kind))
        return arrows

    def reveal_instruction(self, profile: int, instruction_id: int, start: int, end: int) -> None:
        """Bring an instruction into view (keeping the zoom when it fits), outline it, show its details."""
        loaded = self.session.profiles[profile]
        a, b = start - loaded.origin, end - loaded.origin
        x0, x1 = self.timeline.time_range()
        pixels = max(1, self.timeline.view.width())
        visible = x0 <= a and b <= x1 and (b - a) * pixels / max(1.0, x1 - x0) >= 2
        if not visible:
            width = max(2000.0, (b - a) * 40)
            center = (a + b) / 2
            self.timeline.set_range(center - width / 2, center + width / 2)

        def shown(details: Details | None) -> None:
            self._details_ready(profile, details)
            if details is not None:
                index = self.row_of_instruction(profile, details.raw)
                if index is not None:
                    self.timeline.ensure_row_visible(index)
                    self.timeline.select(
                        EventRef(index, profile, INSTRUCTION, details.id, details.start_ts, details.end_ts)
                    )

        self.tabs.setCurrentWidget(self.details_panel)
        self.run(details_for, loaded, INSTRUCTION, instruction_id, start, then=shown)

    def row_of_instruction(self, profile: int, raw: dict[str, Any]) -> int | None:
        pcore = int(raw.get("pcore_idx") or 0)
        track = raw.get("timeline_track") or raw.get("engine")
        for i, row in enumerate(self.rows):
            if (
                row.profile == profile
                and row.kind == INSTRUCTION
                and (row.pcore or 0) == pcore
                and row.label == track
            ):
                return i
        return None

    def jump_to_dependency(self, dep: Dependency) -> None:
        profile = getattr(self, "_details_profile", 0)
        if dep.table == "instruction" and dep.id is not None and dep.start_ts is not None:
            self.reveal_instruction(profile, dep.id, dep.start_ts, dep.end_ts or dep.start_ts)
            return
        if dep.start_ts is None:
            return
        loaded = self.session.profiles[profile]
        a, b = dep.start_ts - loaded.origin, (dep.end_ts or dep.start_ts) - loaded.origin
        x0, x1 = self.timeline.time_range()
        if not (x0 <= a and b <= x1):
            half = (x1 - x0) / 2
            self.timeline.set_range((a + b) / 2 - half, (a + b) / 2 + half)
        if dep.table == "dma_block" and dep.id is not None:
            self.run(details_for, loaded, DMA, dep.id, None, then=functools.partial(self._show_dma, profile))

    def _show_dma(self, profile: int, details: Details | None) -> None:
        self._details_ready(profile, details)
        if details is None:
            return
        queue = details.raw.get("queue_name")
        pcore = int(details.raw.get("pcore_idx") or 0)
        for i, row in enumerate(self.rows):
            if (
                row.profile == profile
                and row.kind == DMA
                and row.label == queue
                and (row.pcore or 0) == pcore
            ):
                self.timeline.ensure_row_visible(i)
                self.timeline.select(EventRef(i, profile, DMA, details.id, details.start_ts, details.end_ts))
                break

    def _region_selected(self, t0: int, t1: int, rows: list[int]) -> None:
        chosen = [self.rows[i] for i in rows]
        if not chosen:
            return
        profile = chosen[0].profile
        mine = [r for r in chosen if r.profile == profile]
        loaded = self.session.profiles[profile]
        self.tabs.setCurrentWidget(self.region_panel)
        self.region_panel.computing(f"summarising {format_ns(t1 - t0)} of {loaded.label}…")
        self.run(
            region_summary,
            loaded,
            mine,
            t0 + loaded.origin,
            t1 + loaded.origin,
            then=functools.partial(self._show_region_summary, loaded),
        )

    def _show_region_summary(self, loaded: LoadedProfile, summary: RegionSummary) -> None:
        self.region_panel.show_summary(summary, loaded.label, loaded.origin)

    # -- dialogs -----------------------------------------------------------------------------
    def _open_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a profile (or a capture's device/ folder)")
        if path:
            self.open_paths([path])

    def open_paths(self, paths: Sequence[str]) -> MainWindow | None:
        """Open ``paths`` in a new window (this one stays); a path that does not open is reported in
        the status bar and a message box, not raised."""
        from explorer.gui.session import SessionError, open_session
        from formats.read_api import ProfileError

        try:
            session = open_session(list(paths))
        except (SessionError, ProfileError, OSError) as exc:
            self.statusBar().showMessage(f"could not open {', '.join(paths)}: {exc}", 15000)
            if not self.synchronous:
                QMessageBox.warning(self, "neuron-explorer", f"Could not open {', '.join(paths)}:\n{exc}")
            return None
        window = MainWindow(session, synchronous=self.synchronous)
        window.set_mode(self.timeline.mode)
        window.resize(self.size())
        window.show()
        self.opened.append(window)
        return window

    def _compare_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Profile to compare with")
        if not path:
            return
        from explorer.gui.compare_window import open_compare

        self._compare = open_compare(self.session, path)
        self._compare.show()

    def _save_screenshot(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save screenshot", "neuron-explorer.png", "PNG (*.png)")
        if path:
            self.grab().save(path, "PNG")

    def release(self) -> None:
        """Stop the background threads and close the session's DuckDB connections."""
        self.fetcher.stop(wait=30.0)
        self.runner.shutdown()
        self.session.close()

    def closeEvent(self, event: Any) -> None:
        self.fetcher.stop()
        self.runner.shutdown()
        super().closeEvent(event)


def window_title(session: Session) -> str:
    """``neuron-explorer — PATHS``, marked ``[INCOMPLETE]`` when a profile is an interrupted capture."""
    mark = " [INCOMPLETE capture]" if any(p.incomplete for p in session.profiles) else ""
    if any(p.warm_up for p in session.profiles):
        mark += " [warm-up execution]"
    return f"neuron-explorer — {session.title}{mark}"


SHORTCUTS = (
    ("wheel · W / S · ↑ ↓ · + −", "zoom in / out (around the cursor for the wheel)"),
    ("drag · Shift+wheel · A / D · ← →", "pan"),
    ("Ctrl+wheel · scroll bar", "scroll rows"),
    ("click", "select an event: Details (its dependencies drawn as arrows)"),
    ("Shift+drag · right-drag", "box-select a region: Selection summary"),
    ("F", "fit the whole profile"),
    ("Esc", "clear the selection, the arrows and the highlight"),
    ("Ctrl+O", "open a profile in a new window"),
    ("F1 · ?", "this list"),
    ("Ctrl+Q", "quit"),
)


class ShortcutsDialog(QDialog):
    """Every key and mouse gesture the window understands, one per line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("neuron-explorer — keys and mouse")
        table = make_table(["input", "does"])
        fill_table(table, SHORTCUTS)
        self.table = table
        close = QPushButton("Close")
        close.clicked.connect(self.accept)
        layout = QVBoxLayout(self)
        layout.addWidget(table)
        layout.addWidget(close)
        self.resize(620, 360)


def _summary_lines(loaded: Any) -> list[tuple[str, str]]:
    """The focus profile's whole-execution figures (``formats.figures``, from its Summary row)."""
    from explorer.gui.compare import figure_lines, profile_figures
    from formats.read_api import fmt_count

    lines = [
        ("profile", loaded.label + ("  [INCOMPLETE capture]" if loaded.incomplete else "")),
        ("instance", loaded.instance),
        ("instructions", fmt_count(loaded.instructions)),
    ]
    return lines + figure_lines(profile_figures(loaded)) + _training_lines(loaded)


def _training_lines(loaded: Any) -> list[tuple[str, str]]:
    """A training step's figures (the Summary's training columns, ``formats.summary.training_summary``:
    the same numbers summary-text's "training step" line prints); none for other profiles."""
    from formats.read_api import fmt_ns, fmt_pct, summary_row

    row = summary_row(loaded.profile)
    step = row.get("training_step_time")
    if step is None:
        return []
    lines = [("training step time", fmt_ns(float(step) * 1e9)),
             ("training seq/s", f"{float(row.get('training_seq_per_s') or 0):,.1f}")]
    if row.get("training_tokens_per_s"):
        lines.append(("training tokens/s", f"{float(row['training_tokens_per_s']):,.0f}"))
    mfu = row.get("training_mfu_percent")
    lines.append(("training MFU", fmt_pct(None if mfu is None else float(mfu))))
    return lines


def _critical_path(loaded: Any) -> tuple[str, str] | str:
    """(SQL condition, description) of the profile's critical path, or why there is none."""
    from formats.read_api import analyze, critical_path_where

    found = critical_path_where(analyze(loaded.profile))
    return found if found is not None else "no critical path: the profile has no instructions"


def _time_range(loaded: Any, where: str) -> tuple[int, int] | None:
    from formats.read_api import TableSource

    source = TableSource(loaded.profile, "Instruction")
    found = loaded.queries.rows(
        f"SELECT min(start_ts) AS s, max(end_ts) AS e FROM {source.relation()} WHERE {where}"
    )
    if not found or found[0]["s"] is None:
        return None
    return int(found[0]["s"]), int(found[0]["e"])


__all__ = ["MainWindow"]
