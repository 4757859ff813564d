"""The hierarchy pane: a tree drawn as a table (indent + expander in the name column, one column per
figure), so the figures line up under one header and the columns can be sorted.

The widget keeps no tree of its own: the app owns the state (expanded keys, loaded instruction pages,
sort, filter, marks) and ``flatten`` turns that plus the current ``Hierarchy`` snapshot into rows.
Drawing uses Textual's line API (``ScrollView.render_line``): a new row list costs one Python pass,
and only the lines on screen are turned into text, with each row's text cached -- so opening an op
in a tree of thousands of rows redraws in about a millisecond (a ``DataTable`` rebuild of 500 rows
costs over 100 ms).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from explorer.viewer.text import ellipsize, fmt_bytes, fmt_count, fmt_ns, fmt_pct
from explorer.viewer.tree_build import ordered
from explorer.viewer.view_model import ENGINE_SHORT, Hierarchy, Node

# widths include one leading space: the longest usual text of each (formats.units: "1.23 µsΣ",
# "100.0%", "999.9 KiB", counts at most 5 characters) leaves a blank before it; a longer one
# ("1000.5 KiB") gets a blank in front anyway, so neighbours never meet
FIGURE_COLUMNS = (
    ("time", "Time", 9),
    ("share", "Share", 7),
    ("mfu", "MFU", 7),
    ("hbm", "HBM", 10),
    *((s, s, 6) for s in ENGINE_SHORT),
)
FIXED_WIDTH = sum(w for _, _, w in FIGURE_COLUMNS) + 2


@dataclass(frozen=True)
class Row:
    node: Node
    depth: int
    expanded: bool
    marked: bool


def flatten(
    hierarchy: Hierarchy,
    pages: Mapping[str, tuple[Node, ...]],
    expanded: set[str],
    *,
    sort: str,
    reverse: bool,
    visible: set[str] | None,
    marked: set[str],
) -> list[Row]:
    """Rows in display order. ``visible`` (a filter's matches and their ancestors) limits layers and
    ops and opens the ancestors; ``pages`` are the loaded instruction rows of opened ops."""
    rows: list[Row] = []

    def walk(keys: Iterable[str], depth: int) -> None:
        for key in ordered(hierarchy, list(keys), sort, reverse):
            if visible is not None and key not in visible:
                continue
            node = hierarchy.nodes[key]
            kids = hierarchy.children.get(key, ())
            opened = key in expanded or (visible is not None and any(k in visible for k in kids))
            rows.append(Row(node, depth, opened, key in marked))
            if not opened:
                continue
            if node.kind == "hlo":
                rows.extend(
                    Row(child, depth + 1, False, False)
                    for child in pages.get(key, (Node(f"X:{key}", "info", "loading…", key),))
                )
            else:
                walk(kids, depth + 1)

    walk(hierarchy.children.get("", ()), 0)
    return rows


STYLES = {
    "layer": Style(bold=True),
    "hlo": Style(),
    "instr": Style(dim=True),
    "more": Style(italic=True, color="cyan"),
    "info": Style(italic=True, color="yellow"),
    "kind": Style(bold=True, color="magenta"),
}
MARKED = Style(bold=True, color="yellow")
HEADER = Style(bold=True, bgcolor="grey19")
CURSOR = Style(bgcolor="dodger_blue3", color="white", bold=True)
CURSOR_BLURRED = Style(bgcolor="grey30")
FIGURES = Style(color="grey82")


def name_text(row: Row, width: int) -> str:
    node = row.node
    expander = ("▾ " if row.expanded else "▸ ") if node.expandable else "  "
    mark = "● " if row.marked else ""
    label = node.name + (f"  {node.detail}" if node.detail and node.kind in ("instr", "kind") else "")
    return ellipsize(" " + "  " * row.depth + expander + mark + label, width).ljust(width)


def figure_text(node: Node, total_ns: int | None, summed_ns: int | None = None) -> str:
    """The figure columns of one row, each right-aligned in its width. A summed time (Σ: instruction
    durations added up, when the profile has no hierarchy tables) is shown as a share of all
    instructions' summed time, since against the run's wall time it could pass 100 %."""
    s = node.stats
    if node.kind in ("more", "info"):
        return " " * (FIXED_WIDTH - 2)
    time = fmt_ns(s.time_ns) + ("Σ" if s.summed and s.time_ns is not None else "")
    base = summed_ns if s.summed else total_ns
    share = fmt_pct(s.time_ns / base) if s.time_ns is not None and base else "-"
    cells = [time, share, fmt_pct(s.mfu), fmt_bytes(s.hbm_bytes)]
    cells += [fmt_count(c) if c else ("-" if c is None else "·") for c in s.counts]
    return "".join(
        text.rjust(w) if len(text) < w else " " + text for text, (_, _, w) in zip(cells, FIGURE_COLUMNS)
    )


class HierarchyTable(ScrollView, can_focus=True):
    """The hierarchy as a scrolling row list with a fixed header line and a row cursor.

    Posts ``Highlighted`` when the cursor moves, ``Selected`` on enter or a click on the cursor row,
    and ``Toggle`` for right / left / space; the app decides what they do."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "cursor(-1000000000)", "Top", show=False),
        Binding("end", "cursor(1000000000)", "Bottom", show=False),
        Binding("enter", "select", "Open/close", show=False),
        Binding("right", "expand", "Expand", show=False),
        Binding("left", "collapse", "Collapse", show=False),
        Binding("space", "toggle_node", "Open/close", show=False),
    ]

    class Toggle(Message):
        def __init__(self, key: str, want: bool | None) -> None:
            super().__init__()
            self.key, self.want = key, want  # want: True open, False close, None toggle

    class Highlighted(Message):
        """The cursor moved to another row (or the rows changed under it)."""

    class Selected(Message):
        """Enter (or a click) on the cursor row."""

    def __init__(self, *, name: str | None = None, id: str | None = None,  # noqa: A002 (Textual's name)
                 classes: str | None = None, disabled: bool = False) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self.rows_shown: list[Row] = []
        self.cursor_row = 0
        self.message = ""
        self._name_width = 0
        self._lines: dict[int, tuple[str, str]] = {}
        self._shown_with: tuple[int | None, str, bool] = (None, "time", False)
        self._summed: int | None = None

    # -- data -----------------------------------------------------------------------------------
    def name_width(self) -> int:
        width = self.size.width or 80
        return max(14, min(72, width - FIXED_WIDTH))

    def show(
        self, rows: list[Row], total_ns: int | None, cursor_key: str | None, sort: str, reverse: bool
    ) -> None:
        """Show ``rows``; the cursor stays on ``cursor_key`` when it is still shown."""
        self._shown_with = (total_ns, sort, reverse)
        self._summed = (
            sum(r.node.stats.time_ns or 0 for r in rows if r.depth == 0 and r.node.stats.summed) or None
        )
        self.rows_shown = rows
        self.message = ""
        self._lines.clear()
        self._name_width = self.name_width()
        index = next((i for i, r in enumerate(rows) if r.node.key == cursor_key), None)
        self.virtual_size = Size(1, len(rows) + 1)
        self._set_cursor(
            index if index is not None else min(self.cursor_row, max(0, len(rows) - 1)), notify=True
        )
        self.refresh()

    def show_message(self, message: str) -> None:
        """No rows, one line saying why (nothing matches the filter, loading, an error)."""
        total_ns, sort, reverse = self._shown_with
        self.show([], total_ns, None, sort, reverse)
        self.message = message
        self.refresh()

    def current(self) -> Row | None:
        if not self.rows_shown or not (0 <= self.cursor_row < len(self.rows_shown)):
            return None
        return self.rows_shown[self.cursor_row]

    # -- cursor ---------------------------------------------------------------------------------
    def move_cursor(self, *, row: int) -> None:
        self._set_cursor(row, notify=True)

    def _set_cursor(self, row: int, notify: bool) -> None:
        row = max(0, min(row, len(self.rows_shown) - 1)) if self.rows_shown else 0
        changed = row != self.cursor_row
        self.cursor_row = row
        visible = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False, immediate=True)
        self.refresh()
        if notify or changed:
            self.post_message(self.Highlighted())

    def action_cursor(self, step: int) -> None:
        self._set_cursor(self.cursor_row + step, notify=False)

    def action_page(self, step: int) -> None:
        self._set_cursor(self.cursor_row + step * max(1, self.size.height - 2), notify=False)

    def action_select(self) -> None:
        if self.current() is not None:
            self.post_message(self.Selected())

    def action_expand(self) -> None:
        row = self.current()
        if row is not None:
            self.post_message(self.Toggle(row.node.key, True))

    def action_collapse(self) -> None:
        row = self.current()
        if row is not None:
            self.post_message(self.Toggle(row.node.key, False))

    def action_toggle_node(self) -> None:  # not action_toggle: Textual's DOMNode has one (an attribute flip)
        row = self.current()
        if row is not None:
            self.post_message(self.Toggle(row.node.key, None))

    def on_click(self, event: events.Click) -> None:
        row = int(self.scroll_offset.y) + event.y - 1
        if event.y < 1 or not (0 <= row < len(self.rows_shown)):
            return
        if row == self.cursor_row:
            self.post_message(self.Selected())
        else:
            self._set_cursor(row, notify=False)

    def on_resize(self) -> None:
        """The name column takes what the figure columns leave: new width, new lines."""
        if self.name_width() != self._name_width:
            self._name_width = self.name_width()
            self._lines.clear()
            self.virtual_size = Size(1, len(self.rows_shown) + 1)
        self._set_cursor(self.cursor_row, notify=False)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- drawing --------------------------------------------------------------------------------
    def _header(self) -> str:
        _, sort, reverse = self._shown_with
        arrow = "↑" if reverse else "↓"
        name = "Name" + (arrow if sort == "name" else f"  (sort: {sort}{arrow})")
        labels = "".join(
            (label + (arrow if key == sort else "")).rjust(w) for key, label, w in FIGURE_COLUMNS
        )
        return ellipsize(name, self._name_width).ljust(self._name_width) + labels

    def _line(self, index: int) -> tuple[str, str]:
        found = self._lines.get(index)
        if found is None:
            row = self.rows_shown[index]
            found = (
                name_text(row, self._name_width),
                figure_text(row.node, self._shown_with[0], self._summed),
            )
            self._lines[index] = found
        return found

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return Strip([Segment(self._header().ljust(width)[:width], HEADER)]).crop(0, width)
        index = int(self.scroll_offset.y) + y - 1
        if index >= len(self.rows_shown):
            if index == 0 and self.message:
                return Strip([Segment(ellipsize(" " + self.message, width).ljust(width), STYLES["info"])])
            return Strip.blank(width)
        row = self.rows_shown[index]
        name, figures = self._line(index)
        name_style = MARKED if row.marked else STYLES[row.node.kind]
        segments = [
            Segment(name, name_style),
            Segment(figures, FIGURES),
            Segment(" " * max(0, width - len(name) - len(figures))),
        ]
        if index == self.cursor_row:
            cursor = CURSOR if self.has_focus else CURSOR_BLURRED
            segments = [Segment(text, (style or Style()) + cursor) for text, style, _ in segments]
        return Strip(segments).crop(0, width)
