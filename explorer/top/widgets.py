"""Textual widgets of neuron-top: thin shells around ``render`` that redraw only on change.

Each widget keeps the immutable inputs it was last drawn from and refreshes only when new inputs
differ (frozen dataclasses compare by value), so a frame in which only utilisation moved repaints
the grid and bars, not the tree or the summary. Drawing itself is ``explorer.top.render``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input

from explorer.top import memtree, render
from explorer.top.proctable import TableView, ordered
from explorer.top.snapshots import Frame, Hardware, ProcessSnapshot

# rows the other regions need besides the memory summary and status line: title, four section bars,
# two vCPU bars, the tree's column header and two tree rows, tabs, hints
RESERVED_ROWS = 12


class LinesWidget(Widget):
    """A widget drawn as lines of Rich ``Text`` through Textual's line API, cached as strips.

    ``render_line`` is Textual's cheap path: no markup, wrapping or content conversion per frame,
    just the cached strips of the last drawing. ``_text()`` is asked again only after ``_invalidate``
    (new data) or a width change."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._strips: list[Strip] | None = None
        self._keys: list[tuple] = []
        self._strip_width = -1
        self.draws = 0  # how often it was drawn (tests check that unchanged data costs nothing)
        self.lines_drawn = 0  # lines turned into strips (only the changed ones after the first)

    def _text(self, width: int) -> Text:
        raise NotImplementedError

    def _strip(self, line: Text, width: int) -> Strip:
        self.lines_drawn += 1
        return (Strip(list(line.render(self.app.console)), line.cell_len)
                .adjust_cell_length(width).apply_style(self.rich_style))

    @staticmethod
    def _key(line: Text) -> tuple:
        return line.plain, tuple(line.spans), line.style

    def _invalidate(self, layout: bool = False) -> None:
        """New inputs. With the same height, only lines whose text or styles changed are redrawn and
        repainted (a frame that moves one bar repaints one line); otherwise everything."""
        width = self.size.width
        if layout or self._strips is None or width <= 0 or width != self._strip_width:
            self._strips = None
            self.refresh(layout=layout)
            return
        self.draws += 1
        lines = self._text(width).split("\n", allow_blank=True)
        keys = [self._key(line) for line in lines]
        if len(keys) != len(self._keys):
            self._strips = [self._strip(line, width) for line in lines]
            self._keys = keys
            self.refresh(layout=True)
            return
        changed = [i for i, (new, old) in enumerate(zip(keys, self._keys)) if new != old]
        for i in changed:
            self._strips[i] = self._strip(lines[i], width)
        self._keys = keys
        if changed:
            self.refresh(*(Region(0, i, width, 1) for i in changed))

    def _lines(self) -> list[Strip]:
        width = max(self.size.width, 1)
        if self._strips is None or self._strip_width != width:
            self.draws += 1
            lines = self._text(width).split("\n", allow_blank=True)
            self._keys = [self._key(line) for line in lines]
            self._strips = [self._strip(line, width) for line in lines]
            self._strip_width = width
        return self._strips

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(self._text(max(width, 1)).plain.count("\n") + 1, 1)

    def render_line(self, y: int) -> Strip:
        lines = self._lines()
        if y < len(lines):
            return lines[y]
        return Strip.blank(self.size.width, self.rich_style)


class Panel(LinesWidget):
    """A region drawn by ``draw(data, width)``; ``show(data)`` repaints only if ``data`` changed.

    ``layout_key(data)`` says what decides its height; a new layout pass happens only when that
    changes (a frame that only moves numbers repaints lines, it does not lay the screen out again)."""

    DEFAULT_CSS = "Panel { height: auto; }"

    def __init__(self, draw: Callable[[Any, int], Text], data: Any = None,
                 layout_key: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._draw = draw
        self._data = data
        self._layout_key = layout_key or (lambda d: d)

    @property
    def data(self) -> Any:
        return self._data

    def show(self, data: Any) -> bool:
        """New inputs; True if they differ (and a repaint was asked for)."""
        if data == self._data:
            return False
        old = self._data
        self._data = data
        self._invalidate(layout=old is None or self._layout_key(old) != self._layout_key(data))
        return True

    def _text(self, width: int) -> Text:
        if self._data is None:
            return Text("")
        return self._draw(self._data, width)


class SectionBar(Panel):
    """A black-on-cyan section header whose label may change (the utilisation average)."""

    DEFAULT_CSS = "SectionBar { height: 1; }"

    def __init__(self, label: str, **kwargs: Any) -> None:
        super().__init__(render.section, label, layout_key=lambda d: 0, **kwargs)


class CoreGrid(Panel):
    """The utilisation grid; packs several devices per line when the terminal is short. Its data is
    ``(hardware, tab data, flops mode, highlighted cores, rows it may use)``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(self._grid, layout_key=lambda d: (d[0], d[4]), **kwargs)

    @staticmethod
    def _grid(data: Any, width: int) -> Text:
        hardware, tab, flops, highlight, rows = data
        return render.grid(hardware, tab, flops, width, rows, highlight)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self._data is None:
            return 1
        hardware: Hardware = self._data[0]
        return render.grid_rows_needed(hardware, self._data[4])


class MemoryTree(LinesWidget, can_focus=True):
    """The memory details tree with the real tool's keys; the rows and state live in the app."""

    DEFAULT_CSS = "MemoryTree { height: 1fr; min-height: 2; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "up", show=False),
        Binding("down", "move(1)", "down", show=False),
        Binding("left", "left", "collapse", show=False),
        Binding("right", "right", "expand", show=False),
        Binding("enter", "toggle_node", "expand/collapse", show=False),
    ]

    class Changed(Message):
        """The user changed the selection or expansion."""

        def __init__(self, state: memtree.TreeState) -> None:
            super().__init__()
            self.state = state

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows: tuple[memtree.TreeRow, ...] = ()
        self.state = memtree.TreeState()
        self.empty_message = ""
        self._offset = 0

    def show(self, rows: tuple[memtree.TreeRow, ...], state: memtree.TreeState, empty_message: str) -> None:
        if (rows, state, empty_message) == (self.rows, self.state, self.empty_message):
            return
        self.rows, self.state, self.empty_message = rows, state, empty_message
        self._invalidate()

    def _apply(self, state: memtree.TreeState) -> None:
        self.state = state
        self.post_message(self.Changed(state))
        self._invalidate()

    def action_move(self, step: int) -> None:
        self._apply(memtree.move(self.rows, self.state, step))

    def action_left(self) -> None:
        self._apply(memtree.left(self.rows, self.state))

    def action_right(self) -> None:
        self._apply(memtree.right(self.rows, self.state))

    def action_toggle_node(self) -> None:  # not action_toggle: Textual's DOMNode has one (an attribute flip)
        self._apply(memtree.toggle(self.rows, self.state))

    def on_resize(self) -> None:
        self._invalidate()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(len(memtree.visible_rows(self.rows, self.state)), 1)

    def _text(self, width: int) -> Text:
        visible = memtree.visible_rows(self.rows, self.state)
        height = max(self.size.height, 1)
        index = next((i for i, r in enumerate(visible) if r.key == self.state.selected), 0)
        if index < self._offset:
            self._offset = index
        elif index >= self._offset + height:
            self._offset = index - height + 1
        self._offset = max(0, min(self._offset, max(len(visible) - height, 0)))
        return render.tree_lines(visible, self.state, width, height, self._offset, self.empty_message)


class ProcessList(LinesWidget, can_focus=True):
    """The process table, sorted and filtered by the app's ``TableView``; arrows move its cursor
    when it has focus (Tab moves focus here). The cursor follows its process when the order
    changes."""

    VISIBLE_ROWS = 10
    DEFAULT_CSS = "ProcessList { height: auto; max-height: 11; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "up", show=False),
        Binding("down", "move(1)", "down", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.frame: Frame | None = None
        self.view = TableView()
        self.rows: tuple[ProcessSnapshot, ...] = ()
        self.cursor = 0

    @property
    def selected_pid(self) -> int | None:
        if not self.rows:
            return None
        return self.rows[min(self.cursor, len(self.rows) - 1)].pid

    def show(self, frame: Frame, view: TableView | None = None) -> None:
        view = self.view if view is None else view
        old, old_rows = self.frame, self.rows
        if (old is not None and view == self.view and frame.processes == old.processes
                and frame.taken_at == old.taken_at):
            return
        pid = self.selected_pid
        self.frame, self.view = frame, view
        self.rows = ordered(frame.processes, view, frame.taken_at)
        pids = [p.pid for p in self.rows]
        self.cursor = pids.index(pid) if pid in pids else min(self.cursor, max(len(pids) - 1, 0))
        self._invalidate(layout=old is None or len(old_rows) != len(self.rows))

    def action_move(self, step: int) -> None:
        if not self.rows:
            return
        self.cursor = (self.cursor + step) % len(self.rows)
        self._invalidate()

    def on_focus(self) -> None:
        self._invalidate()

    def on_blur(self) -> None:
        self._invalidate()

    def _text(self, width: int) -> Text:
        if self.frame is None:
            return Text("")
        cursor = self.cursor if self.has_focus else None
        return render.processes(self.frame, width, cursor, self.VISIBLE_ROWS + 1, self.view)


class FilterInput(Input):
    """The process filter line (``/``): Enter keeps the filter (the app handles ``Submitted``),
    Esc clears it; both close it."""

    DEFAULT_CSS = """
    FilterInput { height: 1; border: none; padding: 0 1; background: $boost; }
    FilterInput:focus { border: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "clear_filter", "clear filter", show=False)]

    class Closed(Message):
        """The user left the filter line (``keep`` False: with Esc, the filter cleared)."""

        def __init__(self, keep: bool) -> None:
            super().__init__()
            self.keep = keep

    def action_clear_filter(self) -> None:
        self.value = ""
        self.post_message(self.Closed(keep=False))


__all__ = ["RESERVED_ROWS", "CoreGrid", "FilterInput", "MemoryTree", "Panel", "ProcessList", "SectionBar"]
