"""Modal screens: the key help, and the confirmation before a signal is sent to a process.

Each dialog is a bordered box of ``width: auto`` whose text widget is ``width: auto`` too: with the
default (``1fr``) an auto-sized container measures its child as 0 cells wide and Textual 8 draws an
empty 4x2 box (borders and padding only) while the dialog still takes keys. The help scrolls when the
terminal is shorter than it (80x24).
"""

from __future__ import annotations

import signal
import textwrap
from typing import ClassVar

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]neuron-top[/b]: NeuronCores, their memory and the processes using them

[b]The real tool's keys[/b]
  q, Q          quit (Ctrl-C too)
  up / down     move the tree selection (wraps around)
  left          collapse the selected item, or go to its parent
  right         expand the selected item, or go to its first child
  Enter         expand or collapse the selected item
  x, X          expand or collapse the whole tree
  a / d         previous / next tab (A / D too)
  1-9           select tab N; 1 is always "all"
  f, F          core grid: utilisation %% <-> TFLOPS

[b]Processes[/b] (as htop / nvitop)
  Tab           focus the memory tree / the process table
  < > or , .    sort the process table by the previous / next column
  I             invert the sort order (the sorted column shows ▲ or ▼)
  P M T N       sort by NC%%, DEV MEM, AGE, PID
  / or \\        filter the table (pid, user, command, model);
                Enter keeps the filter, Esc clears it
  k             signal a process (the table's row, else the tab's):
                TERM, INT, KILL, STOP or CONT
  v             show / hide the extras (engines, history, processes)
  h, ?          this help

[b]Reading the screen[/b]
  [  --  ]      no process lists this core (no runtime), not 0.00%%;
                the average is over the cores in use
  simulated     live utilisation is simulated device time per second
                of this host's clock: a faster host shows more
  STOPPED       stopped (SIGSTOP, Ctrl-Z): its cores are idle
  STALE         alive but no longer publishing (stuck, or holding the GIL)
  EXITED        the process went away (shown for 10 s)
  PARTIAL       some of its report groups carry errors
  "all" tab     utilisation summed over processes and capped at 100 %%;
                everything else summed

Press Esc, q or h to close; arrows scroll."""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: auto; max-width: 100%; height: auto; max-height: 100%;
                                  border: round cyan; background: $surface; padding: 0 1; }
    HelpScreen #help-text { width: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,h,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP.replace("%%", "%"), id="help-text")


SIGNALS = {"t": signal.SIGTERM, "i": signal.SIGINT, "9": signal.SIGKILL, "s": signal.SIGSTOP,
           "c": signal.SIGCONT}


DIALOG_TEXT_WIDTH = 72  # the dialog fits an 80-column terminal with its border and padding


def _wrap(text: str) -> list[str]:
    """Lines of at most ``DIALOG_TEXT_WIDTH`` (a long command line or warning is wrapped, not cut)."""
    return textwrap.wrap(text, DIALOG_TEXT_WIDTH, break_long_words=True, break_on_hyphens=False) or [""]


class SignalScreen(ModalScreen[int | None]):
    """Asks which signal to send (or none); returns the signal number, or None to cancel."""

    DEFAULT_CSS = """
    SignalScreen { align: center middle; }
    SignalScreen > Vertical { width: auto; max-width: 100%; height: auto; border: round red;
                              background: $surface; padding: 0 1; }
    SignalScreen #signal-text { width: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "choose('t')", "SIGTERM"),
        Binding("i", "choose('i')", "SIGINT"),
        Binding("9", "choose('9')", "SIGKILL"),
        Binding("s", "choose('s')", "SIGSTOP"),
        Binding("c", "choose('c')", "SIGCONT"),
        Binding("escape,n,q", "cancel", "cancel"),
    ]

    def __init__(self, pid: int, description: str, warning: str = "") -> None:
        super().__init__()
        self.pid = pid
        self.description = description
        self.warning = warning

    def compose(self) -> ComposeResult:
        lines = [f"[b]Send a signal to pid {self.pid}?[/b]"]
        lines += [escape(line) for part in self.description.splitlines() for line in _wrap(part)]
        if self.warning:
            lines += [f"[yellow]{escape(line)}[/yellow]" for line in _wrap(self.warning)]
        lines.append("")
        lines.append("t: TERM   i: INT   9: KILL   s: STOP   c: CONT   Esc/n: cancel")
        with Vertical():
            yield Static("\n".join(lines), id="signal-text", markup=True)

    def action_choose(self, key: str) -> None:
        self.dismiss(int(SIGNALS[key]))

    def action_cancel(self) -> None:
        self.dismiss(None)


__all__ = ["SIGNALS", "HelpScreen", "SignalScreen"]
