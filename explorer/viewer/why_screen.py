"""The viewer's "why" pane (key ``w``): the analyses of ``neuron-profile analyze`` for the profile on
screen -- ranked findings with evidence, the critical path's shares and every engine's idle time by
cause (docs/analyses.md).

Thread rules: the analysis runs in a Textual thread worker on its own DuckDB connection (``analyze``
opens one), never on the UI thread and never on the viewer's ``ProfileData`` connection; the result
reaches the screen through ``call_from_thread``. Closing the pane while it runs drops the result.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from formats.read_api import Profile, analyze, profile_lines

__all__ = ["WhyScreen"]


class WhyScreen(ModalScreen[None]):
    """Critical path, idle by cause and findings of one profile; escape, q or w closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,w", "close_why", "Close")]
    DEFAULT_CSS = """
    WhyScreen { align: center middle; }
    #why { width: 95%; height: 90%; border: thick $primary; background: $surface; padding: 0 1; }
    """

    def __init__(self, profile: Profile, name: str) -> None:
        super().__init__()
        self.profile = profile
        self.profile_name = name
        self.lines: list[str] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="why"):
            yield Static("analysing: critical path, idle time by cause…", id="why-text")

    def on_mount(self) -> None:
        self._analyse()

    @work(thread=True, exclusive=True)
    def _analyse(self) -> None:
        try:
            lines = list(profile_lines(self.profile_name, analyze(self.profile)))
        except Exception as exc:  # one line on the pane, never a crash of the viewer
            lines = [f"the analysis failed: {type(exc).__name__}: {exc}"]
        self.app.call_from_thread(self._show, lines)

    def _show(self, lines: list[str]) -> None:
        if not self.is_attached:
            return
        self.lines = lines
        self.query_one("#why-text", Static).update(Text("\n".join(lines)))

    def action_close_why(self) -> None:
        self.dismiss(None)
