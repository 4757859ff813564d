"""The neuron-top Textual app: the real tool's screen and keys, plus engines, history, processes.

State the user controls (tab, FLOPS mode, tree selection, extras) lives here; data arrives as
immutable frames posted by the collection thread (``FrameReady``). Every change, from a frame or a
key, goes through ``_redraw``, which derives each widget's inputs and hands them over; widgets
repaint only if their inputs changed. Nothing here reads files or processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import replace
from typing import ClassVar

import psutil
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message

from explorer.top import memtree, names, render
from explorer.top.aggregate import Tab, TabData, tab_data, tabs
from explorer.top.collector import Collector, Source
from explorer.top.proctable import SortKey, TableView
from explorer.top.screens import HelpScreen, SignalScreen
from explorer.top.snapshots import Frame, Hardware, HistoryView, SourceStatus, SystemSnapshot
from explorer.top.widgets import (
    RESERVED_ROWS,
    CoreGrid,
    FilterInput,
    MemoryTree,
    Panel,
    ProcessList,
    SectionBar,
)

WIDE_COLUMNS = 130  # from here on the extras sit beside the real tool's layout
SIDE_WIDTH = 58


def placeholder_frame(kind: str = "live", description: str = "") -> Frame:
    """What is on screen before the first frame: the real tool's LOADING state."""
    return Frame(0, 0.0, Hardware("", "", "", 0, 0, 0), SystemSnapshot(), (),
                 SourceStatus(kind, description, message="loading…"), history=HistoryView())


class FrameReady(Message):
    """A new frame from the collection thread."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame


class SourceFailed(Message):
    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


class NeuronTopApp(App[None]):
    """``neuron-top``. ``source`` is polled every ``interval`` s; or pass ``frame`` (tests, demos)."""

    TITLE = "neuron-top"
    CSS = f"""
    Screen {{ layout: vertical; }}
    #body {{ height: 1fr; }}
    #main {{ width: 1fr; height: 100%; }}
    #side {{ width: {SIDE_WIDTH}; height: 100%; border-left: vkey $primary-darken-2; }}
    #history {{ height: 1fr; }}
    #status {{ height: auto; }}
    #tabs, #hints, #title {{ height: 1; }}
    #filter {{ display: none; }}
    #filter.-open {{ display: block; }}
    Screen.-narrow #side {{ display: none; }}
    Screen.-narrow.-extras #side {{ display: block; width: 1fr; border-left: none; }}
    Screen.-narrow.-extras #main {{ display: none; }}
    Screen.-wide.-extras #side {{ display: none; }}
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,Q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("x,X", "toggle_tree", "expand/collapse all"),
        Binding("a,A", "tab(-1)", "previous tab"),
        Binding("d,D", "tab(1)", "next tab"),
        Binding("f,F", "flops", "FLOPS on/off"),
        Binding("h,question_mark", "help", "help"),
        Binding("v", "extras", "extras"),
        Binding("k", "signal", "signal"),
        Binding("less_than_sign,comma", "sort(-1)", "sort by the previous column", show=False),
        Binding("greater_than_sign,full_stop", "sort(1)", "sort by the next column", show=False),
        Binding("I", "invert_sort", "invert the sort", show=False),
        Binding("P", "sort_by('NC%')", "sort by NC%", show=False),
        Binding("M", "sort_by('DEV MEM')", "sort by device memory", show=False),
        Binding("T", "sort_by('AGE')", "sort by age", show=False),
        Binding("N", "sort_by('PID')", "sort by pid", show=False),
        Binding("slash,backslash", "filter", "filter processes", show=False),
        *[Binding(str(n), f"select_tab({n})", f"tab {n}", show=False) for n in range(1, 10)],
    ]

    def __init__(self, source: Source | None = None, *, interval: float = 1.0, version: str | None = None,
                 frame: Frame | None = None) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        self.version = version or render.tool_version()
        kind = source.kind if source is not None else "live"
        self.frame = frame or placeholder_frame(kind)
        self.tab_pid: int | None = None
        self.flops_mode = False
        self.tree_state = memtree.TreeState()
        self.rows: tuple[memtree.TreeRow, ...] = ()
        self.collector: Collector | None = None
        self.first_frame_shown = False
        self.signals_sent: list[tuple[int, int]] = []
        self.table_view = TableView()
        self._cache: tuple[tuple[int, int | None], TabData] | None = None
        self._rows_cache: tuple[tuple, int] | None = None

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        version = self.version
        yield Panel(lambda d, w: render.title(d[0], d[1], version, w), layout_key=lambda d: 0, id="title")
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield Panel(render.util_section, ("NeuronCore Utilization", "NeuronCore Utilization", ()),
                            layout_key=lambda d: 0, id="util-header")
                yield CoreGrid(id="grid")
                yield SectionBar("vCPU Utilization", id="vcpu-header")
                yield Panel(lambda d, w: render.vcpu(d[0], d[1], w), layout_key=lambda d: 0, id="vcpu")
                yield SectionBar("Memory Usage Summary", id="mem-header")
                yield Panel(render.summary_text, id="mem-summary",
                            layout_key=lambda d: tuple(len(k) + len(v) for part in d for k, v in part))
                yield SectionBar("Memory Usage Details", id="tree-header")
                yield Panel(lambda d, w: render.tree_header(w), True, id="tree-columns")
                yield MemoryTree(id="tree")
            with Vertical(id="side"):
                yield SectionBar("Processes", id="procs-header")
                yield ProcessList(id="procs")
                yield SectionBar("Engines", id="engines-header")
                yield Panel(lambda d, w: render.engines(d[0], d[1], d[2], w, d[3]),
                            layout_key=lambda d: (d[2], d[3], bool(d[2]) and d[2][0] in d[1].engine_busy),
                            id="engines")
                yield SectionBar("History", id="history-header")
                yield Panel(lambda d, w: render.history(d[0], d[1], d[2], w),
                            layout_key=lambda d: (d[0].hardware, d[0].history.has_hbm), id="history")
        yield Panel(lambda d, w: render.status_line_of(d[0], d[1], d[2], w, d[3]) or Text(""),
                    layout_key=lambda d: 0, id="status")
        yield FilterInput(placeholder="filter processes: pid, user, command, model (Enter keeps, Esc clears)",
                          id="filter")
        yield Panel(lambda d, w: render.tab_bar(d[0], d[1], w), layout_key=lambda d: 0, id="tabs")
        yield Panel(lambda d, w: render.hint_bar(w), True, id="hints")

    def on_mount(self) -> None:
        self._layout_mode(self.size.width)
        self.query_one(MemoryTree).focus()
        self._redraw()
        if self.source is not None:
            self.collector = Collector(self.source, self.interval, lambda f: self.post_message(FrameReady(f)),
                                       lambda e: self.post_message(SourceFailed(e)))
            self.collector.start()

    def on_resize(self, event: events.Resize) -> None:
        self._layout_mode(event.size.width)
        self._redraw()

    def _layout_mode(self, width: int) -> None:
        wide = width >= WIDE_COLUMNS
        self.screen.set_class(wide, "-wide")
        self.screen.set_class(not wide, "-narrow")

    async def on_unmount(self) -> None:
        if self.collector is not None:
            self.collector.stop()

    # -- data ----------------------------------------------------------------------------------

    def on_frame_ready(self, message: FrameReady) -> None:
        self.apply_frame(message.frame)

    def on_source_failed(self, message: SourceFailed) -> None:
        status = self.frame.status
        error = f"source failed: {type(message.error).__name__}: {message.error}"
        status = replace(status, errors=(*status.errors, error)[-5:])
        self.apply_frame(replace(self.frame, status=status))

    def apply_frame(self, frame: Frame) -> None:
        """Show a new frame (the collection thread's, or a test's)."""
        self.frame = frame
        self._redraw()
        self.first_frame_shown = self.first_frame_shown or frame.sequence > 0

    @property
    def tabs(self) -> tuple[Tab, ...]:
        return tabs(self.frame)

    @property
    def tab_index(self) -> int:
        return next((i for i, t in enumerate(self.tabs) if t.pid == self.tab_pid), 0)

    def data(self) -> TabData:
        key = (self.frame.sequence, self.tab_pid)
        if self._cache is None or self._cache[0] != key or self.frame.sequence == 0:
            self._cache = (key, tab_data(self.frame, self.tab_pid))
        return self._cache[1]

    def _redraw(self) -> None:
        with contextlib.suppress(NoMatches):  # a frame arriving at shutdown: the widgets are gone
            self._redraw_widgets()

    def _redraw_widgets(self) -> None:
        frame = self.frame
        if self.tab_pid is not None and all(t.pid != self.tab_pid for t in self.tabs):
            self.tab_pid = None  # its process went away: back to "all", tree reset (as the real tool)
            self.tree_state = memtree.TreeState()
        data = self.data()
        hw = frame.hardware
        self.rows = memtree.build_rows(hw, data)
        self.tree_state = memtree.settle(self.rows, self.tree_state)
        highlight = memtree.selected_cores(self.tree_state, hw)
        self.query_one("#title", Panel).show((frame.hardware, frame.host_name))
        flops = self.flops_mode
        self.query_one("#util-header", Panel).show((render.util_header(frame, data, flops),
                                                    render.util_header(frame, data, flops, short=True),
                                                    render.util_notes(frame)))
        self.query_one(CoreGrid).show((hw, data, self.flops_mode, highlight, self._grid_rows(frame, data)))
        self.query_one("#vcpu", Panel).show((frame, data))
        self.query_one("#mem-summary", Panel).show(render.summary_fields(frame, data))
        empty = ("no Neuron activity: no process holds device memory" if render.no_activity(frame)
                 else "this process holds no device memory")
        self.query_one(MemoryTree).show(self.rows, self.tree_state, empty)
        procs = self.query_one(ProcessList)
        procs.show(frame, self.table_view)
        self.query_one("#procs-header", SectionBar).show(
            render.process_section(self.table_view, len(procs.rows), len(frame.processes)))
        engine_cores = highlight or tuple(sorted(data.engine_busy))[:1]
        self.query_one("#engines", Panel).show((hw, data, engine_cores, frame.status.kind))
        self.query_one("#history", Panel).show((frame, data, self.tab_pid))
        status = self.query_one("#status", Panel)
        status.show((frame.status, frame.hardware, bool(frame.active), render.news_note(frame)))
        shown = render.status_line(frame, max(self.size.width, 1)) is not None
        if status.display != shown:
            status.display = shown
        self.query_one("#tabs", Panel).show((self.tabs, self.tab_index))

    def main_width(self) -> int:
        """Columns of the real tool's part of the screen (the extras take the rest when wide)."""
        width = self.size.width
        side_shown = self.screen.has_class("-wide") and not self.screen.has_class("-extras")
        return max(width - SIDE_WIDTH - 1 if side_shown else width, 1)

    def _grid_rows(self, frame: Frame, data: TabData) -> int:
        """Rows the grid may take: what the other regions leave at this size (at least 2)."""
        width = self.main_width()
        key = (width, self.size.height, data.host_memory, data.device_memory, frame.system, frame.status,
               bool(frame.active), frame.hardware, render.news_note(frame))
        if self._rows_cache is None or self._rows_cache[0] != key:
            summary = render.memory_summary(frame, data, width).plain.count("\n") + 1
            status = 1 if render.status_line(frame, width) is not None else 0
            self._rows_cache = (key, max(self.size.height - RESERVED_ROWS - summary - status, 2))
        return self._rows_cache[1]

    # -- keys ----------------------------------------------------------------------------------

    def on_memory_tree_changed(self, message: MemoryTree.Changed) -> None:
        self.tree_state = message.state
        self._redraw()

    def action_toggle_tree(self) -> None:
        self.tree_state = memtree.toggle_all(self.rows, self.tree_state)
        self._redraw()

    def action_tab(self, step: int) -> None:
        items = self.tabs
        self._select(items[(self.tab_index + step) % len(items)].pid)

    def action_select_tab(self, number: int) -> None:
        items = self.tabs
        if number <= len(items):
            self._select(items[number - 1].pid)

    def _select(self, pid: int | None) -> None:
        if pid != self.tab_pid:
            self.tab_pid = pid
            self.tree_state = memtree.TreeState()
            self._redraw()

    def action_flops(self) -> None:
        self.flops_mode = not self.flops_mode
        self._redraw()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_extras(self) -> None:
        self.screen.toggle_class("-extras")
        side_open = (self.screen.has_class("-narrow") == self.screen.has_class("-extras"))
        focused = self.query_one(ProcessList) if side_open and self.screen.has_class("-narrow") else None
        (focused or self.query_one(MemoryTree)).focus()

    # -- process table: sort and filter --------------------------------------------------------

    def _set_view(self, view: TableView) -> None:
        self.table_view = view
        self._redraw()

    def _show_table(self) -> None:
        """Make the process table visible (it is an extra: hidden on narrow screens until ``v``)."""
        narrow = self.screen.has_class("-narrow")
        if narrow != self.screen.has_class("-extras"):
            self.screen.toggle_class("-extras")

    def action_sort(self, step: int) -> None:
        width = self.query_one(ProcessList).size.width or SIDE_WIDTH
        self._set_view(self.table_view.cycle(step, render.sort_columns(width)))

    def action_sort_by(self, column: str) -> None:
        self._set_view(self.table_view.by(SortKey(column)))

    def action_invert_sort(self) -> None:
        self._set_view(self.table_view.inverted())

    def action_filter(self) -> None:
        self._show_table()
        line = self.query_one(FilterInput)
        line.value = self.table_view.filter
        line.add_class("-open")
        line.focus()

    def on_input_changed(self, message: FilterInput.Changed) -> None:
        if message.input.id == "filter":
            self._set_view(replace(self.table_view, filter=message.value.strip()))

    def on_input_submitted(self, message: FilterInput.Submitted) -> None:
        if message.input.id == "filter":
            self._close_filter()

    def on_filter_input_closed(self, message: FilterInput.Closed) -> None:
        self._set_view(replace(self.table_view, filter=""))
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one(FilterInput).remove_class("-open")
        procs = self.query_one(ProcessList)
        (procs if procs.region.width > 0 else self.query_one(MemoryTree)).focus()

    def _signal_target(self) -> int | None:
        procs = self.query_one(ProcessList)
        if procs.has_focus and procs.selected_pid is not None:
            return procs.selected_pid
        return self.tab_pid

    def action_signal(self) -> None:
        pid = self._signal_target()
        if pid is None:
            self.notify("Pick a process first: Tab to the process table (v shows it), or select its tab.",
                        severity="warning")
            return
        process = self.frame.process(pid)
        description = ""
        if process is not None:  # what the user knows it by, then the whole command line to be sure
            description = "\n".join(filter(None, (names.describe(process), process.command)))
        warning = ""
        if self.frame.status.kind == "monitor":
            warning = ("This pid comes from a neuron-monitor stream: "
                       "it may belong to another host or namespace.")
        if pid == os.getpid():
            self.notify("That is neuron-top itself.", severity="warning")
            return
        self.push_screen(SignalScreen(pid, fmt_description(description), warning),
                         lambda sig: self._send(pid, sig))

    def _send(self, pid: int, sig: int | None) -> None:
        if sig is None:
            return
        try:
            if not psutil.pid_exists(pid):
                raise ProcessLookupError(f"no process {pid} on this host")
            os.kill(pid, sig)
        except (OSError, ProcessLookupError) as exc:
            self.notify(f"{signal_name(sig)} to {pid} failed: {exc}", severity="error")
            return
        self.signals_sent.append((pid, sig))
        self.notify(f"sent {signal_name(sig)} to {pid}")

    async def action_quit(self) -> None:  # async, as App.action_quit it overrides
        if self.collector is not None:
            with contextlib.suppress(Exception):
                self.collector.stop()
        self.exit()


def signal_name(sig: int) -> str:
    """``SIGCONT`` rather than ``18`` (numbers differ between platforms)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def fmt_description(text: str) -> str:
    return text if len(text) <= 200 else text[:199] + "…"


__all__ = ["FrameReady", "NeuronTopApp", "placeholder_frame"]
