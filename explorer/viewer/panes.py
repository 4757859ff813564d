"""The viewer's other panes: summary (figures, engine bars, problems, what is missing), source with its
per-line gutter, and the engine timeline strip. Each draws a snapshot it is given; none loads data.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option

from explorer.viewer.engine_strip import bar
from explorer.viewer.text import fmt_count, fmt_ns, fmt_pct
from explorer.viewer.view_model import EngineStrip, Line, Overview, Problem, SourceFile, SourceIndex

SEVERITY = {3: ("●", "bold red"), 2: ("●", "yellow"), 1: ("●", "cyan")}
SHORT_ENGINE = {"Tensor": "T", "Vector": "V", "Scalar": "S", "GpSimd": "G", "Sync": "Y", "DMA": "DMA"}


def engine_bar(fraction: float | None, width: int) -> Text:
    if fraction is None:
        return Text("-".ljust(width), style="dim")
    full = max(0.0, min(1.0, fraction)) * width
    blocks = int(full)
    text = "█" * blocks + ("▌" if full - blocks >= 0.5 else "")
    return Text(text.ljust(width), style="green")


class SummaryPane(Vertical):
    """Figures, per-engine active bars, the problem list (enter jumps to where it happens), notes."""

    ALLOW_MAXIMIZE = True  # ``z`` zooms the pane as a whole, not the focused list inside it

    def compose(self) -> ComposeResult:
        yield Static("loading…", id="figures")
        with Vertical(id="problems-box"):
            yield Static("Problems", id="problems-title")
            yield OptionList(id="problems")
        yield Static("", id="notes")

    _last: tuple[Overview, bool] | None = None

    def on_resize(self) -> None:
        """Re-pack the figures for the new width (the packing depends on it)."""
        if self._last is not None:
            self.show_overview(*self._last)

    def show_overview(self, overview: Overview, compact: bool) -> None:
        self._last = (overview, compact)
        text = Text()
        if compact:
            text = self._compact(overview)
        else:
            for figure in overview.figures:
                text.append(f"{figure.label:<11}", style="bold")
                text.append(f"{figure.value}\n")
            text.append("\nActive time per engine\n", style="bold")
            for engine, fraction in overview.engine_active:
                text.append(f"{engine:<7}")
                text.append_text(engine_bar(fraction, 16))
                text.append(f" {fmt_pct(fraction)}\n")
            text.append(f"({overview.summary_source})", style="dim")
        self.query_one("#figures", Static).update(text)
        notes = Text()
        for line in overview.missing:
            notes.append(line + "\n", style="yellow")
        for line in overview.notes:
            notes.append(line + "\n", style="dim")
        self.query_one("#notes", Static).update(notes)

    def _compact(self, overview: Overview) -> Text:
        """The figures of a narrow terminal, packed into lines of whole figures: a line breaks
        between two figures, never inside one ("MBU" on one line and its value on the next)."""
        values = {f.label: f.value for f in overview.figures}
        chunks: list[tuple[str, str]] = [
            (values["Total time"], "bold"),
            (f"MFU {values['MFU']}", ""),
            (f"HFU {values['HFU']}", ""),
            (f"MBU {values['MBU']}", ""),
            (f"HBM {values['HBM moved']}", ""),
            (f"CC {values['CC time'].split(' (')[0]}", ""),
        ]
        chunks += [
            (f"{SHORT_ENGINE.get(e, e)} {'-' if v is None else f'{100 * v:.0f}%'}", "")
            for e, v in overview.engine_active
        ]
        missing = [m.split(":")[0] for m in overview.missing]
        if missing:
            chunks.append(("\n", ""))
            chunks += [(("missing: " if i == 0 else "") + name, "yellow") for i, name in enumerate(missing)]
        width = (self.query_one("#figures", Static).size.width or max(20, (self.size.width or 80) // 2)) - 2
        text = Text(no_wrap=True, overflow="ellipsis")
        used = 0
        for chunk, style in chunks:
            gap = 2 if used else 0
            if chunk == "\n" or (used and used + gap + len(chunk) > width):
                text.append("\n")
                used, gap = 0, 0
                if chunk == "\n":
                    continue
            text.append(" " * gap)
            text.append(chunk, style=style)
            used += gap + len(chunk)
        return text

    def show_problems(self, problems: tuple[Problem, ...] | None) -> None:
        options = self.query_one("#problems", OptionList)
        options.clear_options()
        if problems is None:
            options.add_option(Option(Text("analysing instructions…", style="dim italic"), disabled=True))
            return
        if not problems:
            options.add_option(Option(Text("no problems found by the rules", style="dim"), disabled=True))
            return
        for i, problem in enumerate(problems):
            mark, style = SEVERITY.get(problem.severity, ("●", ""))
            prompt = Text(f"{mark} ", style=style)
            prompt.append(problem.title, style="bold")
            prompt.append(f" — {problem.detail}")
            options.add_option(Option(prompt, id=f"problem-{i}"))
        options.highlighted = 0  # focused with ``p``, enter acts on the first (biggest) problem


class SourcePane(Vertical):
    """A source file with per-line time and instruction counts in the gutter; the selected node's lines
    are marked; enter on a line selects the nodes it made."""

    ALLOW_MAXIMIZE = True

    def compose(self) -> ComposeResult:
        yield Static("Source", id="source-title")
        yield DataTable(id="source-table", cursor_type="row", show_header=True, cell_padding=0)

    def on_mount(self) -> None:
        self.file: SourceFile | None = None
        self.marked: tuple[Line, ...] = ()

    def _reset(self, code_width: int) -> DataTable:
        """An empty table whose code column is ``code_width`` wide (set, not measured, so the
        picture never depends on when the table measured its rows)."""
        table = self.query_one("#source-table", DataTable)
        table.clear(columns=True)
        for key, label, width in (("mark", " ", 1), ("time", "time", 9), ("n", "instr", 7), ("line", "#", 6)):
            table.add_column(Text(label, justify="right"), width=width, key=key)
        table.add_column(" code", width=max(8, code_width), key="code")
        return table

    def show_message(self, title: str, message: str) -> None:
        self.file = None
        self.query_one("#source-title", Static).update(Text(title, style="bold"))
        self._reset(len(message)).add_row("", "", "", "", Text(message, style="yellow"))

    def show_file(self, file: SourceFile, index: SourceIndex, files_note: str) -> None:
        self.file = file
        title = Text(file.shown_as or file.recorded, style="bold")
        if files_note:
            title.append(f"  {files_note}", style="dim")
        self.query_one("#source-title", Static).update(title)
        if file.message:
            self._reset(len(file.message)).add_row("", "", "", "", Text(file.message, style="yellow"))
            return
        table = self._reset(2 + max((len(line) for line in file.lines), default=0))
        rows = []
        for number, code in enumerate(file.lines, start=1):
            stat = index.lines.get((file.recorded, number))
            rows.append(
                [
                    " ",
                    Text(fmt_ns(stat.time_ns) if stat else "", justify="right", style="cyan"),
                    Text(fmt_count(stat.instructions) if stat else "", justify="right", style="cyan"),
                    Text(str(number), justify="right", style="dim"),
                    Text("  " + code),  # a str cell is Rich markup: "a[ix, iy]" would lose "[ix, iy]"
                ]
            )
        table.add_rows(rows)
        self.marked = ()

    def mark(self, lines: tuple[Line, ...], move: bool) -> None:
        """Mark ``lines`` of this file (the selected node's) and move the cursor to the first."""
        if self.file is None or not self.file.lines:
            return
        table = self.query_one("#source-table", DataTable)
        mine = tuple(ln for ln in lines if ln[0] == self.file.recorded and 1 <= ln[1] <= len(self.file.lines))
        for line in self.marked:
            if line not in mine:
                table.update_cell_at(Coordinate(line[1] - 1, 0), " ")
        for i, line in enumerate(mine):
            marker = Text("▶" if i == 0 else "▸", style="bold yellow")
            table.update_cell_at(Coordinate(line[1] - 1, 0), marker)
        self.marked = mine
        if move and mine:
            row = mine[0][1] - 1
            table.move_cursor(row=row, animate=False, scroll=False)
            # scroll so the line sits a third down the pane, once the table knows its size: where it
            # lands must not depend on whether the pane was laid out when the file arrived
            self.scroll_pending = row
            self.call_after_refresh(self._scroll_to_line, row, 100)

    scroll_pending: int | None = None  # a marked line waiting for the table to know its height

    def _scroll_to_line(self, row: int, tries: int) -> None:
        """Put ``row`` a third down the pane once the table has measured its new rows (DataTable
        does that when idle; scrolling before would be clamped to the old height)."""
        if self.scroll_pending != row:
            return  # another file or line came in the meantime
        table = self.query_one("#source-table", DataTable)
        if table.virtual_size.height < table.row_count and tries > 0:
            self.call_after_refresh(self._scroll_to_line, row, tries - 1)
            return
        visible = max(1, table.size.height - 1)  # the header line
        table.scroll_to(y=max(0, row - visible // 3), animate=False, immediate=True)
        self.scroll_pending = None

    def cursor_line(self) -> Line | None:
        if self.file is None or not self.file.lines:
            return None
        table = self.query_one("#source-table", DataTable)
        return (self.file.recorded, table.cursor_row + 1)


class TimelineStrip(Static):
    """Per-engine occupancy of the selected node's time range, one character per time bucket
    (exact busy fraction per cell; the figure on the right is the row's busy share of the range)."""

    LABEL = 9
    SUFFIX = 18

    class CellsChanged(Message):
        """The strip's width changed: the app asks for a timeline with the new number of cells."""

    _cells = 0

    def on_resize(self) -> None:
        if self.cells() != self._cells:
            self._cells = self.cells()
            self.post_message(self.CellsChanged())

    def cells(self) -> int:
        return max(4, (self.size.width or 80) - self.LABEL - self.SUFFIX - 2)

    def show_timeline(self, title: str, timeline: EngineStrip | None, origin: int) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("Timeline ", style="bold")
        if timeline is None:
            text.append(f"{title}  loading…", style="dim")
            self.update(text)
            return
        t0, t1 = timeline.t0 - origin, timeline.t1 - origin
        text.append(f"{title}  {fmt_ns(t0)} → {fmt_ns(t1)} ({fmt_ns(timeline.t1 - timeline.t0)})", style="")
        rows = list(timeline.rows)
        lines = max(1, (self.size.height or 8) - 2)  # the border and the title line
        if len(rows) > lines:
            rows = [r for r in rows if not r.detail]
        if any(r.engine.startswith("Tensor∪") for r in rows):
            text.append("  Tensor∪ = both PE rows (the Summary's Tensor)", style="dim")
        text.append("\n")
        if not timeline.rows:
            text.append("no instructions to draw" if timeline.source == "exact" else timeline.source,
                        style="yellow")
        for row in rows:
            text.append(f"{row.engine:<{self.LABEL}}", style="dim bold" if row.detail else "bold")
            text.append(bar(row.occupancy), style="green on grey11")
            text.append(f" {fmt_pct(row.busy):>7} {row.top_opcode[:9]}\n")
        self.update(text)
