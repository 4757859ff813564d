"""Compare two profiles: their timelines stacked with one time axis, and the Summary deltas.

Both timelines are in relative time (each profile from its own start), and their views are linked
(``setXLink``), so zooming or panning one moves the other: the same moment of the two runs is
always one above the other. The labels name each profile and its instance; profiles from
different instances are compared as they are, with a note saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QMainWindow, QSplitter, QVBoxLayout, QWidget

from explorer.gui.compare import DeltaRow, format_delta, format_value, instance_note, summary_deltas
from explorer.gui.qt_tables import fill_table, make_table
from explorer.gui.rows import discover_rows
from explorer.gui.session import Session, open_session
from explorer.gui.timeline import TimelineWidget, link_time
from explorer.gui.worker import FrameFetcher, TaskRunner


class CompareWindow(QMainWindow):
    def __init__(self, a: Session, b: Session, *, synchronous: bool = False) -> None:
        super().__init__()
        self.sessions = (a, b)
        self.synchronous = synchronous
        self.setWindowTitle(f"neuron-explorer — compare {a.title} with {b.title}")
        self.fetchers: list[FrameFetcher] = []
        self.timelines: list[TimelineWidget] = []
        self.labels: list[QLabel] = []
        stack = QSplitter(Qt.Orientation.Vertical)
        for name, session in (("A", a), ("B", b)):
            rows = discover_rows(session)
            fetcher = FrameFetcher(session, rows)
            timeline = TimelineWidget(session, rows, fetcher)
            label = QLabel(f"<b>{name}</b>: {_describe(session)}")
            label.setStyleSheet("padding: 3px 6px; background: #eef1f6;")
            box = QWidget()
            layout = QVBoxLayout(box)
            layout.setContentsMargins(0, 0, 0, 0)
            layout.setSpacing(0)
            layout.addWidget(label)
            layout.addWidget(timeline, 1)
            stack.addWidget(box)
            self.fetchers.append(fetcher)
            self.timelines.append(timeline)
            self.labels.append(label)
            timeline.status.connect(lambda text, n=name: self.statusBar().showMessage(f"{n}: {text}"))
        a_line, b_line = self.timelines
        span = (min(a_line.span[0], b_line.span[0]), max(a_line.span[1], b_line.span[1]))
        a_line.set_span(span)
        b_line.set_span(span)
        a_line.fit()
        link_time(a_line.view, b_line.view)
        self.note = QLabel(instance_note(a.profiles[0], b.profiles[0]))
        self.note.setStyleSheet("background: #fff4c2; color: #5a4500; padding: 4px 8px;")
        self.note.setVisible(bool(self.note.text()))
        self.table = make_table(["metric", "A", "B", "B − A", "B / A"])
        self.rows_shown: list[DeltaRow] = []
        outer = QSplitter(Qt.Orientation.Vertical)
        outer.addWidget(stack)
        outer.addWidget(self.table)
        outer.setSizes([620, 260])
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.note)
        layout.addWidget(outer, 1)
        self.setCentralWidget(central)
        for fetcher in self.fetchers:
            fetcher.build_lods(synchronous=synchronous)
        self.runner = TaskRunner(1)
        if synchronous:
            self.show_deltas(summary_deltas(a.profiles[0], b.profiles[0]))
        else:
            self.runner.done.connect(lambda _t, rows: self.show_deltas(rows))
            self.runner.failed.connect(lambda _t, msg: self.statusBar().showMessage(f"summary failed: {msg}"))
            self.runner.submit(summary_deltas, a.profiles[0], b.profiles[0])

    def show_deltas(self, rows: Sequence[DeltaRow]) -> None:
        self.rows_shown = list(rows)
        fill_table(
            self.table,
            [
                (r.metric, format_value(r.a, r.unit), format_value(r.b, r.unit), *format_delta(r))
                for r in rows
            ],
            right_align=(1, 2, 3, 4),
        )

    def fetch_now(self) -> None:
        for timeline in self.timelines:
            timeline.fetch_now()

    def release(self) -> None:
        """Stop the background threads and close both sessions' DuckDB connections."""
        for fetcher in self.fetchers:
            fetcher.stop(wait=30.0)
        self.runner.shutdown()
        for session in self.sessions:
            session.close()

    def closeEvent(self, event: Any) -> None:
        for fetcher in self.fetchers:
            fetcher.stop()
        self.runner.shutdown()
        super().closeEvent(event)


def _describe(session: Session) -> str:
    first = session.profiles[0]
    more = (
        f" (+{len(session.profiles) - 1} more profiles; deltas use the first)"
        if len(session.profiles) > 1
        else ""
    )
    return f"{session.title} — {first.label}, {first.instance}, {first.instructions:,} instructions{more}"


def open_compare(a: Session | str, b: Session | str, *, synchronous: bool = False) -> CompareWindow:
    """A compare window for two sessions or paths (a path is opened as its own session)."""
    first = a if isinstance(a, Session) else open_session([a])
    second = b if isinstance(b, Session) else open_session([b])
    return CompareWindow(first, second, synchronous=synchronous)
